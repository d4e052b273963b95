//! The primary's side of epoch mode: lockstep (`lockstep::primary`),
//! with inputs held to the end of each epoch and delivered there (P1,
//! P2), the end marks in the log, and under the original protocol the
//! wait for the backup's acknowledgement at every end.

use super::{EpochMode, EpochProtocol};
use crate::control::ControlEntry;
use crate::error::ProtectionError;
use crate::lockstep::primary::Lockstep;
use crate::primary::{Alone, HandOver, Primary, Request};
use crate::status::{EpochStatus, PairStatus, PrimaryMode};
use ftvm_machine::{DeterministicEngine, Event, IoCompletion, RunExit};
use ftvm_replication::channel::Failure;
use std::time::{Duration, Instant};

/// How often a primary waiting for an acknowledgement at an epoch end
/// looks whether the backup failed meanwhile.
const ACK_POLL: Duration = Duration::from_millis(10);

/// The primary's epochs while it runs: inputs waiting for the end of the
/// current epoch, and counts for status.
pub struct Epochs {
    /// The epoch mode.
    pub mode: EpochMode,
    deferred: Vec<Event>,
    /// Epoch ends passed (run through or stopped at).
    pub ends: u64,
    /// Of them, the idle ends.
    pub idle_ends: u64,
    /// Inputs delivered at epoch ends: those buffered during an epoch and
    /// those that arrived while the machine stood at an end (an idle one,
    /// mostly), which need no buffering.
    pub delivered: u64,
    /// Of them, those that arrived inside an epoch and waited for its end.
    pub buffered: u64,
    /// Under the original protocol: time spent waiting for the backup's
    /// acknowledgement at epoch ends (what the protocol costs).
    pub ack_wait: Duration,
    /// The epoch the last end stopped at closed (`icount / length`).
    last_epoch: Option<u64>,
}

impl Epochs {
    /// Epochs of `mode`, none ended yet.
    pub fn new(mode: EpochMode) -> Epochs {
        Epochs {
            mode,
            deferred: Vec::new(),
            ends: 0,
            idle_ends: 0,
            delivered: 0,
            buffered: 0,
            ack_wait: Duration::ZERO,
            last_epoch: None,
        }
    }

    /// Buffers an input that arrived inside an epoch (P1).
    pub fn defer(&mut self, ev: Event) {
        self.buffered += 1;
        self.deferred.push(ev);
    }

    /// Counts an input delivered at an epoch end.
    pub fn delivered_one(&mut self) {
        self.delivered += 1;
    }

    /// Whether inputs wait for the end of the current epoch.
    pub fn inputs_waiting(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// Notes an epoch end at `icount` (and those the run went through
    /// since the last) and hands out the inputs to deliver there (P2).
    pub fn end(&mut self, icount: u64, exit: &RunExit) -> Vec<Event> {
        let epoch = icount / self.mode.length;
        let at_multiple = icount.is_multiple_of(self.mode.length);
        let crossed = match self.last_epoch {
            Some(last) => epoch - last,
            None => at_multiple as u64,
        };
        self.last_epoch = Some(epoch);
        self.ends += crossed + !at_multiple as u64;
        if matches!(exit, RunExit::Idle { .. }) {
            self.idle_ends += 1;
        }
        std::mem::take(&mut self.deferred)
    }

    /// The inputs still buffered, when epochs stop (the backup is lost).
    pub fn take_deferred(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.deferred)
    }

    /// Under the original protocol, the time waited for acknowledgements
    /// at epoch ends, in all (ms) and per end (µs).
    fn ack_waits(&self) -> Option<(u128, u128)> {
        (self.mode.protocol == EpochProtocol::Original)
            .then(|| (self.ack_wait.as_millis(), self.ack_wait.as_nanos() / self.ends.max(1) as u128 / 1000))
    }

    /// The epochs of the whole run, for the primary's last words.
    pub fn summary(&self) -> String {
        let waits = self.ack_waits().map_or(String::new(), |(total, mean)| {
            format!(", {total} ms waiting for acknowledgements ({mean} us an end)")
        });
        format!("{} epochs ended ({} where the guest idled){waits}", self.ends, self.idle_ends)
    }

    /// The epochs, as status shows them.
    pub fn status(&self) -> EpochStatus {
        let waits = self.ack_waits();
        EpochStatus {
            setting: self.mode.setting(),
            ends: self.ends,
            idle_ends: self.idle_ends,
            inputs_delivered: self.delivered,
            inputs_buffered: self.buffered,
            inputs_waiting: self.deferred.len() as u64,
            ack_wait_total_ms: waits.map(|(total, _)| total as u64),
            ack_wait_mean_us: waits.map(|(_, mean)| mean as u64),
        }
    }
}

/// Epoch-mode protection: lockstep whose inputs wait for epoch ends.
pub struct Epoch {
    lockstep: Lockstep,
    epochs: Epochs,
    /// Whether the machine stands where inputs may be delivered: at an
    /// epoch end.
    at_end: bool,
    /// Where the last end's frame was logged.
    last_end_at: Option<u64>,
}

impl Epoch {
    /// Wraps `lockstep` with epochs of `mode`; under the original protocol
    /// its outputs are released at once.
    pub fn new(mut lockstep: Lockstep, mode: EpochMode) -> Epoch {
        if mode.protocol == EpochProtocol::Original {
            lockstep.release_outputs_at_once();
        }
        Epoch { lockstep, epochs: Epochs::new(mode), at_end: true, last_end_at: None }
    }
}

impl<E: DeterministicEngine> Primary<E> for Epoch {
    fn run_target(&self, icount: u64, look_at: u64) -> u64 {
        self.epochs.mode.run_target(icount, look_at, self.epochs.inputs_waiting())
    }

    /// At every epoch end, the log's frame closes with its end mark;
    /// under the original protocol the primary then waits for the backup
    /// to acknowledge it.
    fn before_run(&mut self, m: &mut E, paused: bool) -> Result<(), ProtectionError> {
        self.lockstep.channel().send_if_due();
        if !self.at_end || paused {
            return Ok(());
        }
        self.lockstep.recorder().end_epoch(m)?;
        self.last_end_at = Some(m.icount());
        if self.epochs.mode.protocol == EpochProtocol::Original {
            let logged = self.lockstep.recorder().logged();
            let channel = self.lockstep.channel();
            let started = Instant::now();
            // A failed backup ends the wait; its loss is handled with the
            // host's events.
            while !channel.wait_acked(logged, ACK_POLL) && channel.failure().is_none() {}
            self.epochs.ack_wait += started.elapsed();
        }
        Ok(())
    }

    /// Whether the run stopped at an epoch end, and if so, the inputs
    /// buffered during the epoch (P2).
    fn after_run(&mut self, m: &E, exit: &RunExit) -> Vec<Event> {
        let at = m.icount();
        // A run that stops again where the last end's frame was logged,
        // with no instruction run (an I/O request to hand out first), is
        // still in the epoch that began there: the backup runs on from an
        // end it has taken (P5), so no second frame may come at that
        // instruction. An idle machine is the exception: there it has
        // not run on either.
        let again = self.last_end_at == Some(at) && !matches!(exit, RunExit::Idle { .. });
        self.at_end = self.epochs.mode.is_end(at, exit) && !again;
        if self.at_end {
            self.epochs.end(at, exit)
        } else {
            Vec::new()
        }
    }

    fn accepts_inputs(&self) -> bool {
        self.at_end
    }

    /// Inside an epoch an input waits for its end (P1). A received frame
    /// goes to the backup at once as well, beside the log: if this side
    /// dies before the end, the backup gives it to its guest as it goes
    /// live, rather than leave the client to send it again after its
    /// retransmission timer (200 ms at the least). Only frames: the
    /// network may deliver one late or twice, while a disk completion
    /// belongs to the request the backup issues again itself.
    fn input(&mut self, icount: u64, ev: Event) -> Option<Event> {
        if !self.at_end {
            if let Event::Io { slot, completion: IoCompletion::NetRx { frame } } = &ev {
                // The channel's sink takes every write (a failed backup's
                // bytes go nowhere): nothing to handle here.
                let _ = self.lockstep.recorder().waiting(*slot, frame.clone());
                self.lockstep.channel().send_now();
            }
            self.epochs.defer(ev);
            return None;
        }
        self.epochs.delivered_one();
        Primary::<E>::input(&mut self.lockstep, icount, ev)
    }

    fn gate(&mut self, requests: Vec<Request>, icount: u64) -> Vec<Request> {
        Primary::<E>::gate(&mut self.lockstep, requests, icount)
    }

    fn after_slice(&mut self, m: &mut E, busy: Duration, idle: bool) -> Result<Duration, ProtectionError> {
        self.lockstep.after_slice(m, busy, idle)
    }

    fn paused(&mut self, slept: Duration) {
        Primary::<E>::paused(&mut self.lockstep, slept);
    }

    fn wake_within(&self, now: Instant) -> Option<Duration> {
        Primary::<E>::wake_within(&self.lockstep, now)
    }

    fn before_sleep(&mut self) {
        Primary::<E>::before_sleep(&mut self.lockstep);
    }

    fn may_pause(&self) -> bool {
        Primary::<E>::may_pause(&self.lockstep)
    }

    /// Alone now: inputs buffered for the epoch's end go in at once.
    fn peer_lost(&mut self, failure: &Failure) -> Result<Alone, ProtectionError> {
        let mut alone = Primary::<E>::peer_lost(&mut self.lockstep, failure)?;
        alone.inputs = self.epochs.take_deferred();
        Ok(alone)
    }

    /// At an epoch end (the loop hands over only where inputs may be
    /// delivered), with this end's inputs delivered and logged.
    fn hand_over(&mut self, _m: &mut E) -> Result<Vec<Request>, ProtectionError> {
        Ok(self.lockstep.hand_over_outputs())
    }

    fn hand_over_end(&mut self, m: &mut E) -> Result<HandOver, ProtectionError> {
        let mut end = self.lockstep.hand_over_log_end(m)?;
        if let HandOver::Kept(alone) = &mut end {
            alone.inputs = self.epochs.take_deferred();
        }
        Ok(end)
    }

    fn stream_failed(&self) -> bool {
        self.lockstep.channel().failure().is_some()
    }

    fn control(&mut self, _m: &mut E, entry: ControlEntry) -> Result<(), ProtectionError> {
        self.lockstep.send_control(entry);
        Ok(())
    }

    fn unprotect(mut self: Box<Self>, m: &mut E) -> Result<Alone, ProtectionError> {
        let inputs = self.epochs.take_deferred();
        let outputs = self.lockstep.stop_protection(m)?;
        Ok(Alone { outputs, inputs })
    }

    fn status(&mut self) -> Option<PairStatus> {
        let epochs = self.epochs.status();
        Some(self.lockstep.pair_status(|log| PrimaryMode::Epoch { epochs, log }))
    }

    fn summary(&self) -> Option<String> {
        Some(format!("{}; {}", self.lockstep.lag_summary(), self.epochs.summary()))
    }

    fn finish(self: Box<Self>, m: &mut E, status: Option<u32>) -> Result<(), ProtectionError> {
        Box::new(self.lockstep).finish(m, status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferred_inputs_come_out_at_the_end_in_order() {
        let mut e = Epochs::new(EpochMode::new(1024, EpochProtocol::Revised).unwrap());
        e.defer(Event::ClockRate(1));
        e.defer(Event::ClockRate(2));
        let out = e.end(1024, &RunExit::Reached);
        assert!(matches!(out[..], [Event::ClockRate(1), Event::ClockRate(2)]));
        assert!(e.end(1500, &RunExit::Idle { wake_at: None }).is_empty());
        assert_eq!((e.ends, e.idle_ends, e.buffered), (2, 1, 2));
        // A run through three ends to a fourth counts all four.
        e.end(5 * 1024, &RunExit::Reached);
        assert_eq!(e.ends, 6);
    }
}
