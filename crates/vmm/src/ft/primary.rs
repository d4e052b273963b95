//! The primary's side of lockstep protection, as the live loop sees it:
//! which requests are outputs held by the Output Rule (VMware FT §2.2),
//! releasing them as the backup acknowledges, the execution-lag feedback
//! loop (§3.2), and what to do when the backup is declared failed (§2.3).
//! Which requests are outputs depends on the disks (§4.1): a write to a
//! shared disk is one, a write to this host's own copy is not. In epoch
//! mode it also owns the epochs (see `epochs`); under the original epoch
//! protocol nothing is held, since every input was acknowledged before
//! the primary delivered it.

use super::epochs::{EpochMode, EpochProtocol, Epochs};
use super::DiskPolicy;
use ftvm_machine::{BlkOp, IoRequest};
use ftvm_replication::arbiter::{Arbiter, Verdict};
use ftvm_replication::channel::{Failure, LogSender};
use ftvm_replication::lag::{LagMeter, Throttle};
use ftvm_replication::output_rule::OutputGate;
use std::time::{Duration, Instant};

/// How old the backup's last report may be before its age counts in the
/// lag: a report follows every frame, and frames go at least every
/// [`crate::live::BUSY_GO_LIVE`] (or [`crate::live::KEEPALIVE`] when idle),
/// so one twice that old means the backup (or the way to it) is slow.
const REPORT_GRACE: Duration = crate::live::BUSY_GO_LIVE.saturating_mul(2);

pub struct Protection {
    gate: OutputGate<(usize, IoRequest)>,
    lag: LagMeter,
    throttle: Throttle,
    arbiter: Arbiter,
    /// This host's name in the arbiter's record.
    me: String,
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
    /// In epoch mode: the current epoch's buffered inputs and counts.
    pub epochs: Option<Epochs>,
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

impl Protection {
    pub fn new(
        arbiter: Arbiter,
        me: String,
        lag_threshold: Duration,
        disks: DiskPolicy,
        mode: Option<EpochMode>,
    ) -> Protection {
        Protection {
            gate: OutputGate::default(),
            lag: LagMeter::default(),
            throttle: Throttle::new(lag_threshold),
            arbiter,
            me,
            last_lag: Duration::ZERO,
            lag_max: Duration::ZERO,
            rate_mark: (Instant::now(), 0),
            rate: 0.0,
            disks,
            backup_reads: Vec::new(),
            epochs: mode.map(Epochs::new),
        }
    }

    /// Whether the primary waits at each epoch end for the backup to
    /// acknowledge everything sent (the original epoch protocol's P2).
    pub fn waits_at_epoch_ends(&self) -> bool {
        self.epochs.as_ref().is_some_and(|e| e.mode.protocol == EpochProtocol::Original)
    }

    /// The machine's new requests, made by instruction `icount`: outputs
    /// are held until the log written so far (`logged` bytes) is
    /// acknowledged; the rest are returned, to go out now with whatever
    /// the acknowledgements have let go.
    pub fn gate(
        &mut self,
        requests: Vec<(usize, IoRequest)>,
        logged: u64,
        icount: u64,
        channel: &LogSender,
    ) -> Vec<(usize, IoRequest)> {
        let mut now = Vec::new();
        let executed = channel.backup_icount();
        self.backup_reads.retain(|(at, _, _)| *at > executed);
        for (slot, req) in requests {
            if let (true, IoRequest::Disk { op: op @ BlkOp::Read { .. }, .. }) =
                (self.disks.writes_wait_for_backup_reads(), &req)
            {
                self.backup_reads.push((icount, slot, byte_range(op).expect("a read")));
            }
            if is_output(&req, self.disks) && !self.waits_at_epoch_ends() {
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
    /// returns how long to pause to keep to the CPU share (tell
    /// [`Protection::paused`] how long it was).
    pub fn after_chunk(&mut self, icount: u64, busy: Duration, channel: &LogSender) -> Duration {
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

    /// The primary paused for `slept` as [`Protection::after_chunk`] asked.
    pub fn paused(&mut self, slept: Duration) {
        self.throttle.paused(slept);
    }

    /// What the lag control did over the whole run, for the primary's
    /// last words: a slow protected run says whether the backup held it
    /// back.
    pub fn summary(&self) -> String {
        let epochs = self.epochs.as_ref().map_or(String::new(), |e| format!("; {}", e.summary()));
        format!(
            "the backup's lag reached {} ms at most; the lag control engaged {} times and paused the VM {} ms in all{epochs}",
            self.lag_max.as_millis(),
            self.throttle.engagements(),
            self.throttle.paused_total().as_millis()
        )
    }

    /// The backup is declared failed: win the test-and-set and go on alone
    /// with every held output, or halt (an error) because the backup went
    /// live first.
    pub fn backup_lost(&mut self, failure: &Failure) -> Result<Vec<(usize, IoRequest)>, String> {
        eprintln!("ftvm: the backup is declared failed: {failure}");
        match self.arbiter.go_live(&self.me, |m| eprintln!("ftvm: {m}")) {
            Verdict::Won => {
                eprintln!(
                    "ftvm: won generation {} at the arbiter; running unprotected, {} held outputs released",
                    self.arbiter.generation(),
                    self.gate.len()
                );
                Ok(self.gate.release_all())
            }
            Verdict::Lost(who) => Err(format!(
                "halting: {who} went live for generation {} (the backup took over)",
                self.arbiter.generation()
            )),
        }
    }

    /// Status fields for the control socket.
    pub fn status(&mut self, channel: &LogSender) -> String {
        let now = Instant::now();
        let dt = now.duration_since(self.rate_mark.0).as_secs_f64();
        if dt >= 0.5 {
            self.rate = (channel.sent() - self.rate_mark.1) as f64 * 8.0 / dt / 1e6;
            self.rate_mark = (now, channel.sent());
        }
        let (primary_rate, backup_rate) = self.throttle.rates();
        let mips = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{:.1}", r / 1e6));
        let mode = match &self.epochs {
            Some(e) => e.status(),
            None => EpochMode::describe(None),
        };
        format!(
            "role=primary backup={} generation={} {mode} disks={}{} lag={}ms lag_max={}ms log={:.3}Mbit/s log_bytes={} acked={} held={} outputs_held_total={} cpu_share={:.0}% lag_control={} lag_control_engaged={} paused_total={}ms mips_primary={} mips_backup={}",
            channel.peer(),
            self.arbiter.generation(),
            self.disks.sharing.name(),
            if self.disks.backup_reads { ",backup-reads" } else { "" },
            self.last_lag.as_millis(),
            self.lag_max.as_millis(),
            self.rate,
            channel.sent(),
            channel.acked(),
            self.gate.len(),
            self.gate.total_held(),
            self.throttle.share() * 100.0,
            if self.throttle.engaged() {
                "engaged"
            } else if self.throttle.trimming() {
                "trim"
            } else {
                "off"
            },
            self.throttle.engagements(),
            self.throttle.paused_total().as_millis(),
            mips(primary_rate),
            mips(backup_rate)
        )
    }
}
