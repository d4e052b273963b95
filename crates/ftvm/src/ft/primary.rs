//! The primary's side of lockstep protection, as the live loop sees it:
//! which requests are outputs held by the Output Rule (VMware FT §2.2),
//! releasing them as the backup acknowledges, the execution-lag feedback
//! loop (§3.2), and what to do when the backup is declared failed (§2.3).

use ftvm_machine::{BlkOp, IoRequest};
use ftvm_replication::arbiter::{Arbiter, Verdict};
use ftvm_replication::channel::{Failure, LogSender};
use ftvm_replication::lag::{LagMeter, Throttle};
use ftvm_replication::output_rule::OutputGate;
use std::time::{Duration, Instant};

pub struct Protection {
    gate: OutputGate<(usize, IoRequest)>,
    lag: LagMeter,
    throttle: Throttle,
    arbiter: Arbiter,
    /// This host's name in the arbiter's record.
    me: String,
    last_lag: Duration,
    /// For the log bandwidth in status: (when, bytes sent) at the last look.
    rate_mark: (Instant, u64),
    rate: f64,
}

/// Whether a request changes the world outside the VM: a sent frame, or a
/// write to the shared disk (a flush orders writes, so it waits with them).
fn is_output(req: &IoRequest) -> bool {
    match req {
        IoRequest::NetTx { .. } => true,
        IoRequest::Disk { op, .. } => matches!(op, BlkOp::Write { .. } | BlkOp::Flush),
        IoRequest::Entropy { .. } => false,
    }
}

impl Protection {
    pub fn new(arbiter: Arbiter, me: String, lag_threshold: Duration) -> Protection {
        Protection {
            gate: OutputGate::default(),
            lag: LagMeter::default(),
            throttle: Throttle::new(lag_threshold),
            arbiter,
            me,
            last_lag: Duration::ZERO,
            rate_mark: (Instant::now(), 0),
            rate: 0.0,
        }
    }

    /// The machine's new requests: outputs are held until the log written
    /// so far (`logged` bytes) is acknowledged; the rest are returned, to
    /// go out now with whatever the acknowledgements have let go.
    pub fn gate(
        &mut self,
        requests: Vec<(usize, IoRequest)>,
        logged: u64,
        channel: &LogSender,
    ) -> Vec<(usize, IoRequest)> {
        let mut now = Vec::new();
        for (slot, req) in requests {
            if is_output(&req) {
                self.gate.hold(logged, (slot, req));
            } else {
                now.push((slot, req));
            }
        }
        let mut out = self.gate.release(channel.acked());
        out.extend(now);
        out
    }

    /// After the machine ran for `busy` to `icount`: updates the lag and
    /// returns how long to pause to keep to the CPU share.
    pub fn after_chunk(&mut self, icount: u64, busy: Duration, channel: &LogSender) -> Duration {
        let now = Instant::now();
        self.lag.note(icount, now);
        self.last_lag = self.lag.lag(channel.backup_icount(), now);
        self.throttle.update(self.last_lag, now);
        self.throttle.pause_after(busy)
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
        format!(
            "role=primary backup={} generation={} lag={}ms log={:.3}Mbit/s log_bytes={} acked={} held={} outputs_held_total={} cpu_share={:.0}%",
            channel.peer(),
            self.arbiter.generation(),
            self.last_lag.as_millis(),
            self.rate,
            channel.sent(),
            channel.acked(),
            self.gate.len(),
            self.gate.total_held(),
            self.throttle.share() * 100.0
        )
    }
}
