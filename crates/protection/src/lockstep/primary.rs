//! The primary's side of lockstep protection (VMware FT): every input is
//! logged at the instruction where it took effect and the log streams to
//! the backup (`ftvm_replay::recorder` over the logging channel); requests
//! that are outputs are held by the Output Rule (§2.2) and released as
//! the backup acknowledges the log that produced them; the execution-lag
//! feedback loop (§3.2) keeps the backup near; and when the backup is
//! declared failed the arbiter decides who goes on (§2.3). Which requests
//! are outputs depends on the disks (§4.1): a write to a shared disk is
//! one, a write to this host's own copy is not. Epoch mode wraps this
//! (`epoch::primary`); under the original epoch protocol nothing is
//! held, since every input was acknowledged before the primary delivered
//! it.

use crate::control::ControlEntry;
use crate::error::ProtectionError;
use crate::events::Events;
use crate::events::PairEvent;
use crate::lockstep::KEEPALIVE;
use crate::pair::DiskPolicy;
use crate::primary::{
    apply_control, await_claim, backup_lost, protection_stopped, Alone, HandOver, Primary, Request, END_ACK_WAIT,
    HAND_OVER_WAIT,
};
use crate::status::{LagControl, LogStatus, PairStatus, PrimaryMode, PrimaryStatus};
use ftvm_machine::{BlkOp, DeterministicEngine, Event, IoRequest};
use ftvm_replay::recorder::Recorder;
use ftvm_replication::arbiter::Arbiter;
use ftvm_replication::channel::{Failure, LogSender};
use ftvm_replication::lag::{LagMeter, Throttle};
use ftvm_replication::output_rule::OutputGate;
use std::time::{Duration, Instant};

/// How old the backup's last report may be before its age counts in the
/// lag: a report follows every frame, and frames go at least every
/// [`crate::lockstep::BUSY_GO_LIVE`] (or [`crate::lockstep::KEEPALIVE`] when idle),
/// so one twice that old means the backup (or the way to it) is slow.
const REPORT_GRACE: Duration = crate::lockstep::BUSY_GO_LIVE.saturating_mul(2);

/// Lockstep protection, the primary's side: the log to the backup, the
/// outputs it holds, and the execution-lag control.
pub struct Lockstep {
    /// The log, streaming to the backup.
    recorder: Recorder<LogSender>,
    gate: OutputGate<(usize, IoRequest)>,
    lag: LagMeter,
    throttle: Throttle,
    arbiter: Arbiter,
    /// This host's name in the arbiter's record.
    me: String,
    events: Events,
    last_lag: Duration,
    /// The largest lag measured so far.
    lag_max: Duration,
    /// For the log bandwidth in status: (when, bytes sent) at the last look.
    rate_mark: (Instant, u64),
    rate: f64,
    disks: DiskPolicy,
    /// With the backup reading a shared disk itself (§4.2): reads it may
    /// not have performed yet, as (instruction count, slot, byte range).
    backup_reads: Vec<(u64, usize, std::ops::Range<u64>)>,
    /// Whether outputs wait for the backup's acknowledgement: always but
    /// under the original epoch protocol, which waits at every epoch end.
    hold_outputs: bool,
    /// When a handover stopped the guest.
    handing_over: Option<Instant>,
}

/// Whether a request changes the world outside the VM: a sent frame, or a
/// write to a shared disk (a flush orders writes, so it waits with them).
fn is_output(req: &IoRequest, disks: DiskPolicy) -> bool {
    match req {
        IoRequest::NetTx { .. } => true,
        IoRequest::Disk { op, .. } => disks.writes_are_outputs() && matches!(op, BlkOp::Write { .. } | BlkOp::Flush),
        IoRequest::Entropy { .. } => false,
    }
}

fn byte_range(op: &BlkOp) -> Option<std::ops::Range<u64>> {
    match op {
        BlkOp::Read { offset, len } => Some(*offset..offset + *len as u64),
        BlkOp::Write { offset, data } => Some(*offset..offset + data.len() as u64),
        _ => None,
    }
}

impl Lockstep {
    /// `recorder` logs to the backup (its header acknowledged).
    pub fn new(
        recorder: Recorder<LogSender>,
        arbiter: Arbiter,
        me: String,
        events: Events,
        lag_threshold: Duration,
        disks: DiskPolicy,
    ) -> Lockstep {
        Lockstep {
            recorder,
            gate: OutputGate::default(),
            lag: LagMeter::default(),
            throttle: Throttle::new(lag_threshold),
            arbiter,
            me,
            events,
            last_lag: Duration::ZERO,
            lag_max: Duration::ZERO,
            rate_mark: (Instant::now(), 0),
            rate: 0.0,
            disks,
            backup_reads: Vec::new(),
            hold_outputs: true,
            handing_over: None,
        }
    }

    /// Under the original epoch protocol: every input was acknowledged
    /// before it was delivered, so no output waits.
    pub fn release_outputs_at_once(&mut self) {
        self.hold_outputs = false;
    }

    /// The log.
    pub fn recorder(&mut self) -> &mut Recorder<LogSender> {
        &mut self.recorder
    }

    /// The logging channel.
    pub fn channel(&self) -> &LogSender {
        self.recorder.sink()
    }

    /// The machine's new requests, made by instruction `icount`: outputs
    /// are held until the log written so far (`logged` bytes) is
    /// acknowledged; the rest are returned, to go out now with whatever
    /// the acknowledgements have let go.
    fn hold_outputs(&mut self, requests: Vec<Request>, icount: u64) -> Vec<Request> {
        let logged = self.recorder.logged();
        let channel = self.recorder.sink();
        let mut now = Vec::new();
        let executed = channel.backup_icount();
        self.backup_reads.retain(|(at, _, _)| *at > executed);
        for (slot, req) in requests {
            if let (true, IoRequest::Disk { op: op @ BlkOp::Read { .. }, .. }) =
                (self.disks.writes_wait_for_backup_reads(), &req)
            {
                self.backup_reads.push((icount, slot, byte_range(op).expect("a read")));
            }
            if is_output(&req, self.disks) && self.hold_outputs {
                // A write waits for the backup to have read what the
                // guest read there before it (§4.2).
                let after = match &req {
                    IoRequest::Disk { op, .. } => byte_range(op).map_or(0, |w| {
                        let overlapping = self
                            .backup_reads
                            .iter()
                            .filter(|(_, s, r)| *s == slot && r.start < w.end && w.start < r.end);
                        overlapping.map(|(at, _, _)| *at).max().unwrap_or(0)
                    }),
                    _ => 0,
                };
                self.gate.hold_until(logged, after, (slot, req));
            } else {
                now.push((slot, req));
            }
        }
        let mut out = self.gate.release(channel.acked(), executed);
        if !self.gate.is_empty() {
            // Held outputs wait for this log: it goes out now (§3.5).
            channel.send_now();
        }
        out.extend(now);
        out
    }

    /// After the machine ran for `busy` to `icount`: updates the lag and
    /// returns how long to pause to keep to the CPU share.
    fn after_chunk(&mut self, icount: u64, busy: Duration) -> Duration {
        let channel = self.recorder.sink();
        let now = Instant::now();
        self.lag.note(icount, now - busy, now);
        let (backup, age) = channel.backup_report();
        // The lag as of the backup's last report: it reports on receipt of
        // each frame (every BUSY_GO_LIVE at least while the guest runs),
        // and measuring from now would add the report's age, 0-50 ms, to
        // every sample. A report later than expected counts again.
        let reported = now.checked_sub(age).unwrap_or(now);
        self.last_lag = self.lag.lag(backup, reported) + age.saturating_sub(REPORT_GRACE);
        self.throttle.ran_to(icount, busy);
        self.lag_max = self.lag_max.max(self.last_lag);
        self.throttle.update(self.last_lag, backup, now);
        self.throttle.pause_after(busy)
    }

    /// Protection stops on purpose (see [`Primary::unprotect`]): the log
    /// ends, and what it held goes once the backup has acknowledged that.
    pub fn stop_protection(self, m: &mut dyn DeterministicEngine) -> Result<Vec<Request>, ProtectionError> {
        let Lockstep { recorder, mut gate, arbiter, me, events, .. } = self;
        let fence = recorder.sink().fence();
        let mut acknowledged = false;
        recorder.finish(m, None, |channel: LogSender| {
            let end = channel.written();
            acknowledged = channel.wait_acked(end, END_ACK_WAIT);
            Ok(end)
        })?;
        protection_stopped(acknowledged, &arbiter, &me, &events, &fence, || gate.release_all())
    }

    /// A handover's first step (see [`Primary::hand_over`]): the log so
    /// far goes now, and every held output is waited for.
    pub fn hand_over_outputs(&mut self) -> Vec<Request> {
        let started = Instant::now();
        self.handing_over = Some(started);
        let channel = self.recorder.sink();
        self.events
            .emit(PairEvent::HandingOver { backup: channel.peer().to_string(), generation: self.arbiter.generation() });
        eprintln!("ftvm: handing the VM over to the backup at {}", channel.peer());
        channel.send_now();
        let mut out = Vec::new();
        loop {
            let channel = self.recorder.sink();
            out.extend(self.gate.release(channel.acked(), channel.backup_icount()));
            // A failed backup, or one that does not catch up, is the
            // second step's to handle.
            if self.gate.is_empty() || channel.failure().is_some() || started.elapsed() >= HAND_OVER_WAIT {
                return out;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// A handover's second step (see [`Primary::hand_over_end`]).
    pub fn hand_over_log_end(&mut self, m: &mut dyn DeterministicEngine) -> Result<HandOver, ProtectionError> {
        let since = self.handing_over.take().unwrap_or_else(Instant::now);
        let channel = self.recorder.sink();
        let mark_sent = channel.failure().is_none();
        if mark_sent {
            if !self.gate.is_empty() {
                return Err(ProtectionError::HandOverTimedOut(HAND_OVER_WAIT));
            }
            self.recorder.hand_over(m)?;
            let channel = self.recorder.sink();
            channel.send_now();
            // Not acknowledged in time: the claim's wait decides.
            channel.wait_acked(channel.written(), HAND_OVER_WAIT);
        }
        let channel = self.recorder.sink();
        let fence = channel.fence();
        let (failure, held) = (|| channel.failure(), || self.gate.release_all());
        await_claim(&self.arbiter, &self.me, &self.events, &fence, mark_sent, failure, held, since)
    }

    /// What the lag control did over the whole run, for the primary's
    /// last words: a slow protected run says whether the backup held it
    /// back.
    pub fn lag_summary(&self) -> String {
        format!(
            "the backup's lag reached {} ms at most; the lag control engaged {} times and paused the VM {} ms in all",
            self.lag_max.as_millis(),
            self.throttle.engagements(),
            self.throttle.paused_total().as_millis()
        )
    }

    /// Makes the change on this side and logs the entry: it goes with
    /// the next frame (an epoch's end in epoch mode).
    pub fn send_control(&mut self, entry: ControlEntry) {
        apply_control(&self.recorder.sink().watch(), entry, &self.events);
        self.recorder.control(entry.encode());
    }

    /// The primary's part of status, with `mode` made of its log's
    /// figures.
    pub fn pair_status(&mut self, mode: impl FnOnce(LogStatus) -> PrimaryMode) -> PairStatus {
        let channel = self.recorder.sink();
        let now = Instant::now();
        let dt = now.duration_since(self.rate_mark.0).as_secs_f64();
        if dt >= 0.5 {
            self.rate = (channel.sent() - self.rate_mark.1) as f64 * 8.0 / dt / 1e6;
            self.rate_mark = (now, channel.sent());
        }
        let (primary_rate, backup_rate) = self.throttle.rates();
        let log = LogStatus {
            disks: self.disks.sharing.name().to_string(),
            backup_reads: self.disks.backup_reads,
            lag_ms: self.last_lag.as_millis() as u64,
            lag_max_ms: self.lag_max.as_millis() as u64,
            log_mbit_s: self.rate,
            log_bytes: channel.sent(),
            acked: channel.acked(),
            held: self.gate.len() as u64,
            outputs_held_total: self.gate.total_held(),
            cpu_share_percent: self.throttle.share() * 100.0,
            lag_control: if self.throttle.engaged() {
                LagControl::Engaged
            } else if self.throttle.trimming() {
                LagControl::Trim
            } else {
                LagControl::Off
            },
            lag_control_engaged: self.throttle.engagements(),
            paused_total_ms: self.throttle.paused_total().as_millis() as u64,
            mips_primary: primary_rate.map(|r| r / 1e6),
            mips_backup: backup_rate.map(|r| r / 1e6),
        };
        PairStatus::Primary(PrimaryStatus::of(&channel.watch(), self.arbiter.generation(), mode(log)))
    }
}

impl<E: DeterministicEngine> Primary<E> for Lockstep {
    fn before_run(&mut self, m: &mut E, _paused: bool) -> Result<(), ProtectionError> {
        self.channel().send_if_due();
        Ok(self.recorder.close_frame(m)?)
    }

    fn input(&mut self, icount: u64, ev: Event) -> Option<Event> {
        self.recorder.event(icount, &ev);
        Some(ev)
    }

    fn gate(&mut self, requests: Vec<Request>, icount: u64) -> Vec<Request> {
        self.hold_outputs(requests, icount)
    }

    fn after_slice(&mut self, m: &mut E, busy: Duration, _idle: bool) -> Result<Duration, ProtectionError> {
        Ok(self.after_chunk(m.icount(), busy))
    }

    fn paused(&mut self, slept: Duration) {
        self.throttle.paused(slept);
    }

    fn wake_within(&self, _now: Instant) -> Option<Duration> {
        Some(KEEPALIVE)
    }

    fn before_sleep(&mut self) {
        self.channel().send_now();
    }

    fn may_pause(&self) -> bool {
        false
    }

    fn peer_lost(&mut self, failure: &Failure) -> Result<Alone, ProtectionError> {
        let outputs =
            backup_lost(&self.arbiter, &self.me, failure, &self.events, &self.recorder.sink().fence(), || {
                self.gate.release_all()
            })?;
        Ok(Alone { outputs, inputs: Vec::new() })
    }

    fn hand_over(&mut self, _m: &mut E) -> Result<Vec<Request>, ProtectionError> {
        Ok(self.hand_over_outputs())
    }

    fn hand_over_end(&mut self, m: &mut E) -> Result<HandOver, ProtectionError> {
        self.hand_over_log_end(m)
    }

    fn status(&mut self) -> Option<PairStatus> {
        Some(self.pair_status(PrimaryMode::Lockstep))
    }

    fn summary(&self) -> Option<String> {
        Some(self.lag_summary())
    }

    fn stream_failed(&self) -> bool {
        self.channel().failure().is_some()
    }

    fn control(&mut self, _m: &mut E, entry: ControlEntry) -> Result<(), ProtectionError> {
        self.send_control(entry);
        Ok(())
    }

    fn unprotect(self: Box<Self>, m: &mut E) -> Result<Alone, ProtectionError> {
        let outputs = self.stop_protection(m)?;
        Ok(Alone { outputs, inputs: Vec::new() })
    }

    fn finish(self: Box<Self>, m: &mut E, status: Option<u32>) -> Result<(), ProtectionError> {
        let acknowledged = |channel: LogSender| {
            // The end must reach the backup, or it would take the
            // primary's exit for a failure and go live.
            let end = channel.written();
            if !channel.wait_acked(end, END_ACK_WAIT) {
                eprintln!("ftvm: the backup did not acknowledge the end of the log");
            }
            Ok(end)
        };
        Ok(self.recorder.finish(m, status, acknowledged)?)
    }
}
