//! The live host loop of a running VM: runs the machine in chunks, feeds
//! console input to it, shows its output, and keeps guest time close to
//! the wall clock.
//!
//! Time is steered only through machine events (`ClockRate` while busy,
//! `ClockAdvance` while idle), so a recording of those events is enough to
//! replay the run exactly. While every hart is idle the loop sleeps until
//! the guest's next timer deadline or until input arrives: an idle guest
//! does not burn a host core.

use crate::console::{self, Input, RawTerminal};
use crate::exec::OutputFilter;
use ftvm_machine::layout::TIMEBASE_HZ;
use ftvm_machine::{Event, Machine, RunExit};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// Instructions run between looks at the host (input, output, pacing).
const CHUNK: u64 = 2_000_000;
/// How often the clock rate is corrected.
const PACE_INTERVAL: Duration = Duration::from_millis(100);
/// Over how long a correction closes the gap between guest and wall time.
const PACE_HORIZON_S: f64 = 1.0;

const STUCK_IDLE: &str = "the guest is idle with no timer armed and no input left";

pub struct Options {
    /// Skip idle time at once and never slow down for the wall clock.
    pub fast_time: bool,
    /// Running `--exec`: filter console output, exit with the guest's status.
    pub exec: bool,
    pub show_boot: bool,
}

struct Pacer {
    start: Instant,
    /// Timer value at `start`.
    start_ticks: u64,
    last: Instant,
    last_icount: u64,
}

impl Pacer {
    fn wall_ticks(&self) -> u64 {
        self.start_ticks + (self.start.elapsed().as_secs_f64() * TIMEBASE_HZ as f64) as u64
    }

    /// A new rate so guest time meets wall time one horizon from now, given
    /// how fast the host has been executing guest instructions.
    fn correct(&mut self, m: &mut Machine) {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        if dt < PACE_INTERVAL.as_secs_f64() {
            return;
        }
        let executed = m.icount() - self.last_icount;
        self.last = now;
        self.last_icount = m.icount();
        if executed < 1000 {
            return;
        }
        let ips = executed as f64 / dt;
        let gap = self.wall_ticks() as f64 - m.time() as f64;
        let ticks_wanted = (TIMEBASE_HZ as f64 * PACE_HORIZON_S + gap).max(0.0);
        let rate = ticks_wanted / (ips * PACE_HORIZON_S);
        // Bound the rate so one odd interval cannot make time race or stall.
        let nominal = TIMEBASE_HZ as f64 / ips;
        let rate = rate.clamp(nominal * 0.1, nominal * 10.0);
        let fixed = (rate * (1u64 << 32) as f64) as u64;
        if fixed != m.clock().rate() {
            m.inject(Event::ClockRate(fixed));
        }
    }
}

pub fn run(mut m: Machine, opts: Options) -> Result<u32, String> {
    let interactive = !opts.exec;
    let _term = if interactive { Some(RawTerminal::enter()) } else { None };
    let input: Option<Receiver<Input>> = if interactive { Some(console::spawn_reader()) } else { None };
    let mut filter = opts.exec.then(|| OutputFilter::new(opts.show_boot));
    let mut pacer = Pacer { start: Instant::now(), start_ticks: m.time(), last: Instant::now(), last_icount: 0 };
    let stdout = std::io::stdout();
    let mut input_closed = input.is_none();
    // Typed or pasted input waiting for room in the guest's UART.
    let mut pending: VecDeque<u8> = VecDeque::new();
    loop {
        let exit = m.run_until(m.icount() + CHUNK);
        let out = m.take_console_output();
        if !out.is_empty() {
            let shown = match &mut filter {
                Some(f) => f.feed(&out),
                None => out,
            };
            let mut lock = stdout.lock();
            let _ = lock.write_all(&shown);
            let _ = lock.flush();
        }
        if let Some(rx) = &input {
            if !input_closed {
                loop {
                    match rx.try_recv() {
                        Ok(Input::Bytes(b)) => pending.extend(b),
                        Ok(Input::Quit) => return Ok(0),
                        Ok(Input::Eof) | Err(TryRecvError::Disconnected) => {
                            input_closed = true;
                            break;
                        }
                        Err(TryRecvError::Empty) => break,
                    }
                }
            }
        }
        feed_console(&mut m, &mut pending);
        match exit {
            RunExit::Reached => {
                if !opts.fast_time {
                    pacer.correct(&mut m);
                }
            }
            RunExit::PowerOff(code) => return Ok(code),
            RunExit::Reset => return Err("the guest asked to reboot; reboot is not supported yet".into()),
            RunExit::Idle { wake_at } => {
                if opts.fast_time {
                    if let Some(t) = wake_at {
                        m.inject(Event::ClockAdvance(t));
                        continue;
                    }
                    if input_closed {
                        return Err(STUCK_IDLE.into());
                    }
                }
                // Sleep until wall time reaches the deadline, or input comes.
                let now = pacer.wall_ticks();
                let wait = wake_at
                    .map(|t| Duration::from_secs_f64(t.saturating_sub(now) as f64 / TIMEBASE_HZ as f64));
                let got = match (&input, input_closed) {
                    (Some(rx), false) => match wait {
                        Some(d) => match rx.recv_timeout(d) {
                            Ok(i) => Some(i),
                            Err(RecvTimeoutError::Timeout) => None,
                            Err(RecvTimeoutError::Disconnected) => Some(Input::Eof),
                        },
                        None => Some(rx.recv().unwrap_or(Input::Eof)),
                    },
                    _ => match wait {
                        Some(d) => {
                            std::thread::sleep(d);
                            None
                        }
                        None => return Err(STUCK_IDLE.into()),
                    },
                };
                let target = match wake_at {
                    Some(t) if got.is_none() => t,
                    _ => pacer.wall_ticks(),
                };
                m.inject(Event::ClockAdvance(target));
                match got {
                    Some(Input::Bytes(b)) => {
                        pending.extend(b);
                        feed_console(&mut m, &mut pending);
                    }
                    Some(Input::Quit) => return Ok(0),
                    Some(Input::Eof) => input_closed = true,
                    None => {}
                }
                pacer.last = Instant::now();
                pacer.last_icount = m.icount();
            }
        }
    }
}

/// Hand the guest as much waiting input as its UART has room for.
fn feed_console(m: &mut Machine, pending: &mut VecDeque<u8>) {
    let n = pending.len().min(m.console_room());
    if n > 0 {
        m.inject(Event::ConsoleInput(pending.drain(..n).collect()));
    }
}
