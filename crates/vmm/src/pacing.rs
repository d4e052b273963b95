//! Guest time against the wall clock: the rate at which guest time
//! advances per instruction while the VM is busy (a new `ClockRate` when
//! the host's speed says so), where the wall clock stands in timebase
//! ticks (what `ClockAdvance` moves an idle guest to), and how far guest
//! time may run ahead of the wall clock before the VM waits for it.
//!
//! The rate is a forecast: it takes the host's speed over the last
//! interval for the next. A forecast can be wrong (an interval that
//! translated code or tracked dirty pages runs far slower than the next),
//! and a rate set from a slow interval races guest time ahead while the
//! next runs fast. Behind is harmless (the next correction and every idle
//! spell bring guest time back), ahead is not: the guest's date is seen by
//! its clients, cannot be taken back, and goes with the machine to a
//! backup that takes over. So the lead is bounded outright: a run never
//! goes past the instruction where guest time, at the rate in force, would
//! be [`LEAD_MOST`] ahead. A guest more than half that ahead gets a new
//! rate at once, from the host's speed over the last few milliseconds
//! (which costs nothing), and only one near the bound waits for the wall
//! clock (which costs the guest the wait). Pure arithmetic on the numbers a host
//! loop passes in (no clocks read here), so the model tests below drive
//! it with a host whose speed they choose.

use ftvm_machine::layout::TIMEBASE_HZ;
use std::time::{Duration, Instant};

/// How often the clock rate is corrected.
pub const PACE_INTERVAL: Duration = Duration::from_millis(100);
/// Over how long a correction closes the gap between guest and wall time.
const PACE_HORIZON: Duration = Duration::from_secs(1);
/// A guest more than half the bound ahead is corrected sooner, from the
/// host's speed over as little as this (a host speeding up as code gets
/// translated outruns any forecast from 100 ms ago) ...
const HURRY_INTERVAL: Duration = Duration::from_millis(10);
/// ... and its lead closed over this: a new rate costs nothing, a wait
/// at the bound costs the guest the time waited.
const HURRY_HORIZON: Duration = Duration::from_millis(100);
/// How far guest time may run ahead of the wall clock: far more than the
/// jitter of a good forecast (which only ever costs a wait), far less
/// than a client could tell.
pub const LEAD_MOST: Duration = Duration::from_millis(50);
/// The longest wait for the wall clock in one go: the host loop looks at
/// its events between waits.
const WAIT_MOST: Duration = Duration::from_millis(10);
/// How far behind the RTC's date a starting machine's guest time may be
/// and still be brought to it (VMware's tools give up catching up past
/// 60 s too): a machine restored `--paused` from an old snapshot keeps
/// its date, as the user chose.
pub const CATCH_UP_MOST: Duration = Duration::from_secs(60);
/// A lead this large is a defect, not jitter: said in a warning (which
/// only a way around the bound, an idle spell's advance say, could cause).
const LEAD_WARNED: Duration = Duration::from_secs(1);

fn ticks(d: Duration) -> u64 {
    (d.as_secs_f64() * TIMEBASE_HZ as f64) as u64
}

pub struct Pacer {
    start: Instant,
    /// Guest time at `start`.
    start_ticks: u64,
    last: Instant,
    last_icount: u64,
    /// This thread's CPU time spent running the machine since `last`: what
    /// the host's speed is measured over. Wall time would count the pauses
    /// between runs (a checkpoint, the lag control's, a protection's final
    /// pause, I/O let finish), and even wall time inside the runs counts
    /// the moments a starved host took the core away: either takes the
    /// host for slower than it runs, and sets a rate that races guest time
    /// ahead of the wall clock once the machine runs unimpeded. The pauses
    /// did (a guest's date up to 114 s ahead after a minute of protection
    /// under load, whose rate bounds, taken from the same speed, kept it
    /// from coming back); the starved runs did in CI (a guest's date 4 and
    /// 9 s ahead after a protection on a loaded host, the transfer's
    /// compression and the disks' hashing beside it). With CPU time a
    /// starved guest's time can only fall behind, which the next
    /// correction and every idle spell bring back. Idle spells count in
    /// neither: guest time is brought to the wall clock's across them by
    /// `ClockAdvance`.
    running: Duration,
}

impl Pacer {
    /// Pacing from `now`, where guest time reads `time` at instruction
    /// `icount`: the wall clock's ticks count on from `time`.
    pub fn new(time: u64, icount: u64, now: Instant) -> Pacer {
        Pacer { start: now, start_ticks: time, last: now, last_icount: icount, running: Duration::ZERO }
    }

    /// Pacing that also brings guest time `behind` forward (the rate and
    /// the idle spells close it as any gap): a backup that took over is
    /// behind by the time the failure took to find, and a new VM by the
    /// time from its RTC's base to its first run. Without it each takeover
    /// left the guest's date that much further behind, for good.
    pub fn catching_up(mut self, behind: Duration) -> Pacer {
        if behind <= CATCH_UP_MOST {
            self.start_ticks += ticks(behind);
        }
        self
    }

    /// The machine ran for `busy` (host CPU time).
    pub fn ran(&mut self, busy: Duration) {
        self.running += busy;
    }

    /// The wall clock at `now`, in guest timebase ticks.
    pub fn wall_ticks(&self, now: Instant) -> u64 {
        self.start_ticks + ticks(now.saturating_duration_since(self.start))
    }

    /// A new rate (32.32 ticks per instruction) so guest time meets wall
    /// time one horizon from now, given how fast the host has been
    /// executing guest instructions; None to keep `rate`, the one in force.
    pub fn correct(&mut self, rate: u64, time: u64, icount: u64, now: Instant) -> Option<u64> {
        let dt = now.saturating_duration_since(self.last);
        let gap = self.wall_ticks(now) as f64 - time as f64;
        let hurry = -gap > ticks(LEAD_MOST / 2) as f64;
        let (interval, horizon) = if hurry { (HURRY_INTERVAL, HURRY_HORIZON) } else { (PACE_INTERVAL, PACE_HORIZON) };
        if dt < interval {
            return None;
        }
        let executed = icount - self.last_icount;
        if hurry && (executed < 1000 || self.running < HURRY_INTERVAL / 10) {
            // Too little run to tell the speed by: measure on.
            return None;
        }
        let running = std::mem::take(&mut self.running).as_secs_f64();
        self.last = now;
        self.last_icount = icount;
        if executed < 1000 || running <= 0.0 {
            return None;
        }
        let ips = executed as f64 / running;
        let horizon = horizon.as_secs_f64();
        if -gap > ticks(LEAD_WARNED) as f64 {
            tracing::warn!(
                lead_ms = (-gap * 1000.0 / TIMEBASE_HZ as f64) as u64,
                "guest time is ahead of the wall clock beyond the bound"
            );
        }
        let ticks_wanted = (TIMEBASE_HZ as f64 * horizon + gap).max(0.0);
        let wanted = ticks_wanted / (ips * horizon);
        // Bound the rate so one odd interval cannot make time stall; the
        // lead bound keeps it from racing.
        let nominal = TIMEBASE_HZ as f64 / ips;
        let wanted = wanted.clamp(nominal * 0.1, nominal * 10.0);
        let fixed = (wanted * (1u64 << 32) as f64) as u64;
        tracing::trace!(
            gap_ms = (gap * 1000.0 / TIMEBASE_HZ as f64) as i64,
            mips = ips / 1e6,
            running_ms = (running * 1000.0) as u64,
            wall_ms = dt.as_millis() as u64,
            rate_of_nominal = wanted / nominal,
            "pacing guest time"
        );
        (fixed != rate).then_some(fixed)
    }

    /// How many instructions may run from where guest time reads `time`,
    /// at `rate`, before it stands [`LEAD_MOST`] ahead of the wall clock.
    pub fn instructions_to_bound(&self, rate: u64, time: u64, now: Instant) -> u64 {
        let bound = self.wall_ticks(now) + ticks(LEAD_MOST);
        if rate == 0 {
            return u64::MAX;
        }
        let room = bound.saturating_sub(time) as u128;
        ((room << 32) / rate as u128).min(u64::MAX as u128) as u64
    }

    /// How long to wait for the wall clock before running on, where guest
    /// time reads `time`: none until it is near the bound (three quarters
    /// of it ahead), then until it is half the bound ahead.
    pub fn wait_for_wall(&self, time: u64, now: Instant) -> Option<Duration> {
        let lead = time.saturating_sub(self.wall_ticks(now));
        (lead > ticks(LEAD_MOST * 3 / 4)).then(|| {
            let over = lead - ticks(LEAD_MOST / 2);
            Duration::from_secs_f64(over as f64 / TIMEBASE_HZ as f64).min(WAIT_MOST)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftvm_machine::clock::VirtualClock;

    /// A model of the host loop's busy path: runs of at most `chunk`
    /// instructions (cut at the lead bound when `bounded`), a correction
    /// after each, a wait for the wall clock when asked; the host runs
    /// `speed(t)` instructions per second of its own time at wall time t.
    /// Returns the largest lead of guest time over the wall clock seen, and
    /// the share of the time spent waiting.
    fn run_model(speed: impl Fn(f64) -> f64, seconds: f64, bounded: bool) -> (Duration, f64) {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut clock = VirtualClock::new(VirtualClock::rate_for(100_000_000, TIMEBASE_HZ));
        let (mut icount, mut wall, mut waited) = (0u64, 0.0f64, 0.0f64);
        let mut pacer = Pacer::new(clock.ticks_at(icount), icount, at(0.0));
        let mut lead_most = 0i64;
        while wall < seconds {
            let mut n = 200_000;
            if bounded {
                n = n.min(pacer.instructions_to_bound(clock.rate(), clock.ticks_at(icount), at(wall)));
            }
            let busy = n as f64 / speed(wall);
            icount += n;
            wall += busy;
            pacer.ran(Duration::from_secs_f64(busy));
            let now = at(wall);
            lead_most = lead_most.max(clock.ticks_at(icount) as i64 - pacer.wall_ticks(now) as i64);
            if let Some(rate) = pacer.correct(clock.rate(), clock.ticks_at(icount), icount, now) {
                clock.set_rate(icount, rate);
            }
            if bounded {
                if let Some(d) = pacer.wait_for_wall(clock.ticks_at(icount), now) {
                    wall += d.as_secs_f64();
                    waited += d.as_secs_f64();
                }
            }
        }
        (Duration::from_secs_f64(lead_most.max(0) as f64 / TIMEBASE_HZ as f64), waited / wall)
    }

    /// The host runs its first second at a 50th of its speed (code being
    /// translated, every page's first write tracked), then at full speed:
    /// the rate set from the slow second races guest time ahead by whole
    /// seconds unless runs stop at the bound.
    fn slow_then_fast(t: f64) -> f64 {
        if t < 1.0 {
            4e6
        } else {
            200e6
        }
    }

    #[test]
    fn a_rate_forecast_from_a_slow_interval_does_not_race_guest_time_ahead() {
        // Runs not cut at the bound: the forecast alone, hurried as it is
        // once ahead, lets guest time race (5 s ahead before it hurried).
        let (unbounded, _) = run_model(slow_then_fast, 5.0, false);
        assert!(unbounded > LEAD_MOST * 4, "the model shows the race: {unbounded:?}");
        let (bounded, waited) = run_model(slow_then_fast, 5.0, true);
        assert!(bounded <= LEAD_MOST, "guest time ran {bounded:?} ahead");
        assert!(waited < 0.02, "waited {:.1} % of the time", waited * 100.0);
    }

    #[test]
    fn a_host_whose_speed_swings_every_interval_keeps_guest_time_within_the_bound() {
        let swinging = |t: f64| if ((t / 0.13) as u64).is_multiple_of(2) { 10e6 } else { 300e6 };
        let (lead, _) = run_model(swinging, 10.0, true);
        assert!(lead <= LEAD_MOST, "guest time ran {lead:?} ahead");
    }

    /// The CPU job's host: 500 M instructions a second at first, 1700 M
    /// after 1.5 s as its code gets translated (bench/ft-overhead's job,
    /// seen through the primary's status). Each forecast is too slow; a
    /// bound kept by waits alone (no hurried rate) waits 5.3 % of the time
    /// here.
    #[test]
    fn a_host_speeding_up_keeps_the_bound_without_waiting_much() {
        let warming = |t: f64| 500e6 + 1200e6 * (t / 1.5).min(1.0);
        let (lead, waited) = run_model(warming, 3.0, true);
        assert!(lead <= LEAD_MOST, "guest time ran {lead:?} ahead");
        assert!(waited < 0.02, "waited {:.1} % of the time", waited * 100.0);
    }

    #[test]
    fn a_machine_behind_its_date_is_brought_forward_unless_far_behind() {
        let t0 = Instant::now();
        let p = Pacer::new(1000, 0, t0).catching_up(Duration::from_millis(800));
        assert_eq!(p.wall_ticks(t0), 1000 + ticks(Duration::from_millis(800)));
        let p = Pacer::new(1000, 0, t0).catching_up(CATCH_UP_MOST + Duration::from_secs(1));
        assert_eq!(p.wall_ticks(t0), 1000);
        // Closed like any gap: a busy guest's rate runs faster meanwhile.
        let mut p = Pacer::new(0, 0, t0).catching_up(Duration::from_millis(800));
        let nominal = VirtualClock::rate_for(100_000_000, TIMEBASE_HZ);
        p.ran(Duration::from_millis(100));
        let rate = p.correct(nominal, 0, 10_000_000, t0 + Duration::from_millis(100)).expect("a new rate");
        assert!(rate > nominal * 3 / 2, "{rate} against {nominal}");
    }

    #[test]
    fn a_steady_host_is_never_made_to_wait() {
        let t0 = Instant::now();
        let mut p = Pacer::new(0, 0, t0);
        let now = t0 + Duration::from_secs(1);
        let wall = p.wall_ticks(now);
        assert_eq!(p.wait_for_wall(wall + ticks(LEAD_MOST / 2), now), None);
        assert!(p.wait_for_wall(wall + ticks(LEAD_MOST), now).is_some());
        // A run from the wall clock may go a whole bound's worth on.
        let rate = VirtualClock::rate_for(100_000_000, TIMEBASE_HZ);
        let n = p.instructions_to_bound(rate, wall, now);
        let c = VirtualClock::new(rate);
        assert!(c.ticks_at(n) <= ticks(LEAD_MOST) && c.ticks_at(n + 20) > ticks(LEAD_MOST), "{n}");
        assert_eq!(p.correct(rate, wall, 0, t0 + Duration::from_millis(50)), None, "too soon to correct");
        p.ran(Duration::from_millis(100));
    }
}
