//! What each side of a pair reports of itself: the pair's part of a VM's
//! status, as serde types with a readable form (`Display`: the
//! `key=value` fields of the status line).

use crate::mode::Mode;
use ftvm_replication::channel::SenderWatch;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A VM's part in a fault-tolerant pair.
// Made once per status request and serialized at once: a box would only
// add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum PairStatus {
    /// It is a protected primary.
    Primary(PrimaryStatus),
    /// It is a backup following its primary.
    Backup(BackupStatus),
    /// A primary whose backup was lost, or a backup that went live: it
    /// runs alone.
    Unprotected,
}

/// The primary's side of a pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrimaryStatus {
    /// The backup's logging-channel address.
    pub backup: String,
    /// The pair's generation at the arbiter.
    pub generation: u64,
    /// The mode, with its figures.
    pub mode: PrimaryMode,
    /// This side's failure timeout, in milliseconds.
    pub timeout_ms: u64,
    /// The backup's, as its last acknowledgement said (None before the
    /// first): the same but for a moment after a change.
    pub backup_timeout_ms: Option<u64>,
    /// The heartbeat silence after which this side declares the backup
    /// failed now, learned from its beats (at most `timeout_ms`).
    #[serde(default)]
    pub heartbeat_timeout_ms: u64,
    /// The backup's, as its last acknowledgement said: how soon it
    /// declares this side failed when its beats stop (None before the
    /// first).
    #[serde(default)]
    pub backup_heartbeat_timeout_ms: Option<u64>,
}

impl PrimaryStatus {
    /// The status of a primary whose channel is `channel`.
    pub fn of(channel: &SenderWatch, generation: u64, mode: PrimaryMode) -> PrimaryStatus {
        PrimaryStatus {
            backup: channel.peer().to_string(),
            generation,
            mode,
            timeout_ms: channel.timeout().as_millis() as u64,
            backup_timeout_ms: channel.backup_timeout().map(|t| t.as_millis() as u64),
            heartbeat_timeout_ms: channel.heartbeat_timeout().as_millis() as u64,
            backup_heartbeat_timeout_ms: channel.backup_heartbeat_timeout().map(|t| t.as_millis() as u64),
        }
    }
}

/// The primary's figures of its mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum PrimaryMode {
    /// Lockstep: its log.
    Lockstep(LogStatus),
    /// Epoch mode: lockstep's log, with inputs held to epoch ends.
    Epoch {
        /// The epochs.
        epochs: EpochStatus,
        /// The log.
        log: LogStatus,
    },
    /// Checkpoint mode.
    Checkpoint(CheckpointStatus),
    /// A running VM on its way to protection: its machine goes to the
    /// backup while the guest runs.
    Transfer(TransferStatus),
}

impl PrimaryMode {
    /// The mode's name (a transfer: the mode the pair will run in).
    pub fn name(&self) -> &str {
        match self {
            PrimaryMode::Lockstep(_) => "lockstep",
            PrimaryMode::Epoch { .. } => "epoch",
            PrimaryMode::Checkpoint(_) => "checkpoint",
            PrimaryMode::Transfer(t) => t.then.name(),
        }
    }
}

/// A running VM's transfer to its new backup (pre-copy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferStatus {
    /// The mode the pair will run in.
    pub then: Mode,
    /// The pre-copy round in progress (1: all of RAM in use).
    pub round: u32,
    /// Pages of this round still to send.
    pub round_left: u64,
    /// Pages sent so far.
    pub pages: u64,
    /// Bytes of stream written so far, and acknowledged.
    pub bytes: u64,
    /// Bytes the backup acknowledged.
    pub acked: u64,
}

impl fmt::Display for TransferStatus {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "mode={} protecting round={} round_left={} pages_sent={} bytes_sent={} acked={}",
            self.then, self.round, self.round_left, self.pages, self.bytes, self.acked
        )
    }
}

/// A primary whose log streams to its backup (lockstep, epoch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogStatus {
    /// shared or separate.
    pub disks: String,
    /// The backup performs the guest's disk reads itself.
    pub backup_reads: bool,
    /// The backup's execution lag, in ms: how long ago the primary was
    /// where the backup is now.
    pub lag_ms: u64,
    /// The largest lag measured so far, in ms.
    pub lag_max_ms: u64,
    /// Log bandwidth lately, in Mbit/s.
    pub log_mbit_s: f64,
    /// Bytes of log sent so far.
    pub log_bytes: u64,
    /// Bytes of log the backup has acknowledged.
    pub acked: u64,
    /// Outputs the Output Rule holds now.
    pub held: u64,
    /// Outputs it has held in all.
    pub outputs_held_total: u64,
    /// The primary's CPU share under the lag control, in percent.
    pub cpu_share_percent: f64,
    /// What the lag control does now.
    pub lag_control: LagControl,
    /// How many times the lag control has engaged.
    pub lag_control_engaged: u64,
    /// Time the primary has paused for its CPU share, in all, in ms.
    pub paused_total_ms: u64,
    /// The primary's speed while it runs, in millions of instructions a
    /// second; None until measured.
    pub mips_primary: Option<f64>,
    /// The backup's speed, in millions of instructions a second; None
    /// until measured.
    pub mips_backup: Option<f64>,
}

/// What the execution-lag control does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LagControl {
    /// Nothing: the primary runs at its full share.
    Off,
    /// Under the threshold: the primary's share trimmed by a few percent.
    Trim,
    /// Past the threshold: the primary slowed until the backup follows.
    Engaged,
}

/// A Bressoud & Schneider epoch mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochSetting {
    /// Instructions per epoch.
    pub length: u64,
    /// original or revised.
    pub protocol: String,
}

/// The primary's epochs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochStatus {
    /// The epoch mode.
    pub setting: EpochSetting,
    /// Epoch ends passed, run through or stopped at.
    pub ends: u64,
    /// Of them, the ends where every hart waited for an interrupt.
    pub idle_ends: u64,
    /// Inputs delivered at epoch ends.
    pub inputs_delivered: u64,
    /// Of them, those that arrived inside an epoch and waited for its end.
    pub inputs_buffered: u64,
    /// Inputs waiting now for the end of the current epoch.
    pub inputs_waiting: u64,
    /// Under the original protocol: the time waited for acknowledgements
    /// at epoch ends, in all, in ms.
    pub ack_wait_total_ms: Option<u64>,
    /// Under the original protocol: the mean wait per epoch end, in µs.
    pub ack_wait_mean_us: Option<u64>,
}

/// A checkpoint-mode primary (Remus).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointStatus {
    /// The configured time between checkpoints, in ms.
    pub interval_ms: u64,
    /// Checkpoints taken so far, early ones included.
    pub checkpoints: u64,
    /// Checkpoints taken early because the guest idled (None: off).
    pub idle_checkpoints: Option<u64>,
    /// Checkpoints a second on the beat (early ones not counted), lately.
    pub rate: f64,
    /// Checkpoints a second on the beat, over the whole run.
    pub rate_overall: f64,
    /// Checkpoints the backup has acknowledged.
    pub committed: u64,
    /// Median pause of the guest for a checkpoint, in µs, over the last
    /// few thousand checkpoints.
    pub pause_median_us: u64,
    /// 99th-percentile pause, in µs, over the same checkpoints.
    pub pause_p99_us: u64,
    /// Median pages dirtied per checkpoint, over the same checkpoints.
    pub dirty_median: u64,
    /// Pause against pages dirtied (Remus's Fig. 5), per decade of pages.
    pub pause_by_dirty: Vec<PauseBucket>,
    /// Mean bytes of stream per checkpoint (its pages and state).
    pub bytes_per_checkpoint: u64,
    /// Page bytes before encoding over bytes after (1.0: none saved).
    pub compression: f64,
    /// Bytes of stream sent so far.
    pub log_bytes: u64,
    /// Bytes of stream the backup has acknowledged.
    pub acked: u64,
    /// Frames held now, until their interval's checkpoint is acknowledged.
    pub held: u64,
    /// Frames held in all.
    pub outputs_held_total: u64,
}

/// The pauses of the checkpoints that dirtied `lo..=hi` pages (`hi`
/// None: no bound).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PauseBucket {
    /// Fewest pages dirtied.
    pub lo: u64,
    /// Most pages dirtied; None for the last bucket, which has no bound.
    pub hi: Option<u64>,
    /// Median pause, in µs.
    pub median_us: u64,
    /// 99th-percentile pause, in µs.
    pub p99_us: u64,
    /// Checkpoints in the bucket.
    pub checkpoints: u64,
}

/// The backup's side of a pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackupStatus {
    /// The primary's logging-channel address.
    pub primary: String,
    /// The pair's generation at the arbiter.
    pub generation: u64,
    /// The mode, with its figures.
    pub mode: BackupMode,
    /// Stream bandwidth lately, in Mbit/s.
    pub log_mbit_s: f64,
    /// Bytes received.
    pub received: u64,
    /// Bytes received but not yet taken by the replay.
    pub buffered: u64,
    /// The failure timeout, in milliseconds (the primary's, once its
    /// change has reached this side).
    pub timeout_ms: u64,
    /// The heartbeat silence after which the primary is declared failed
    /// now, learned from its beats (at most `timeout_ms`).
    #[serde(default)]
    pub heartbeat_timeout_ms: u64,
}

/// The backup's figures of its mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum BackupMode {
    /// Lockstep: it replays the log.
    Lockstep {
        /// Instruction count of the last go-live point received.
        last_end: u64,
    },
    /// Epoch mode: it replays the log, checking the epoch rule.
    Epoch {
        /// The epoch mode.
        setting: EpochSetting,
        /// Instruction count of the last go-live point received.
        last_end: u64,
    },
    /// Checkpoint mode: it commits checkpoints.
    Checkpoint {
        /// The primary's time between checkpoints, in ms.
        interval_ms: u64,
        /// Checkpoints committed.
        committed: u64,
    },
}

impl fmt::Display for EpochSetting {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "mode=epoch epoch_length={} protocol={}", self.length, self.protocol)
    }
}

impl fmt::Display for PrimaryStatus {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "role=primary backup={} generation={} ", self.backup, self.generation)?;
        match &self.mode {
            PrimaryMode::Lockstep(log) => write!(f, "mode=lockstep {log}")?,
            PrimaryMode::Epoch { epochs, log } => write!(f, "{epochs} {log}")?,
            PrimaryMode::Checkpoint(c) => write!(f, "{c}")?,
            PrimaryMode::Transfer(t) => write!(f, "{t}")?,
        }
        write!(f, " timeout={}ms heartbeat_timeout={}ms", self.timeout_ms, self.heartbeat_timeout_ms)?;
        if let Some(theirs) = self.backup_timeout_ms.filter(|&t| t != self.timeout_ms) {
            write!(f, " backup_timeout={theirs}ms")?;
        }
        match self.backup_heartbeat_timeout_ms {
            Some(theirs) => write!(f, " backup_heartbeat_timeout={theirs}ms"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for EpochStatus {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{} epochs={} idle_ends={} inputs_delivered={} inputs_buffered={} inputs_waiting={}",
            self.setting, self.ends, self.idle_ends, self.inputs_delivered, self.inputs_buffered, self.inputs_waiting
        )?;
        if let (Some(total), Some(mean)) = (self.ack_wait_total_ms, self.ack_wait_mean_us) {
            write!(f, " ack_wait_total={total}ms ack_wait_mean={mean}us")?;
        }
        Ok(())
    }
}

impl fmt::Display for LogStatus {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mips = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.1}"));
        let lag_control = match self.lag_control {
            LagControl::Off => "off",
            LagControl::Trim => "trim",
            LagControl::Engaged => "engaged",
        };
        write!(
            f,
            "disks={}{} lag={}ms lag_max={}ms log={:.3}Mbit/s log_bytes={} acked={} held={} outputs_held_total={} \
             cpu_share={:.0}% lag_control={lag_control} lag_control_engaged={} paused_total={}ms mips_primary={} \
             mips_backup={}",
            self.disks,
            if self.backup_reads { ",backup-reads" } else { "" },
            self.lag_ms,
            self.lag_max_ms,
            self.log_mbit_s,
            self.log_bytes,
            self.acked,
            self.held,
            self.outputs_held_total,
            self.cpu_share_percent,
            self.lag_control_engaged,
            self.paused_total_ms,
            mips(self.mips_primary),
            mips(self.mips_backup)
        )
    }
}

impl fmt::Display for CheckpointStatus {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let by_dirty: Vec<String> = self
            .pause_by_dirty
            .iter()
            .map(|b| {
                let hi = b.hi.map_or(String::new(), |h| h.to_string());
                format!("{}-{hi}:{}/{}us/{}", b.lo, b.median_us, b.p99_us, b.checkpoints)
            })
            .collect();
        write!(
            f,
            "mode=checkpoint interval={}ms checkpoints={} idle_checkpoints={} rate={:.2}/s rate_overall={:.2}/s \
             committed={} pause_median={}us pause_p99={}us dirty_median={} pause_by_dirty={} \
             bytes_per_checkpoint={} compression={:.2} log_bytes={} acked={} held={} outputs_held_total={}",
            self.interval_ms,
            self.checkpoints,
            self.idle_checkpoints.map_or("off".to_string(), |n| n.to_string()),
            self.rate,
            self.rate_overall,
            self.committed,
            self.pause_median_us,
            self.pause_p99_us,
            self.dirty_median,
            if by_dirty.is_empty() { "none".to_string() } else { by_dirty.join(",") },
            self.bytes_per_checkpoint,
            self.compression,
            self.log_bytes,
            self.acked,
            self.held,
            self.outputs_held_total
        )
    }
}

impl fmt::Display for BackupStatus {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "role=backup primary={} generation={} ", self.primary, self.generation)?;
        match &self.mode {
            BackupMode::Lockstep { .. } => write!(f, "mode=lockstep")?,
            BackupMode::Epoch { setting, .. } => write!(f, "{setting}")?,
            BackupMode::Checkpoint { interval_ms, .. } => write!(f, "mode=checkpoint interval={interval_ms}ms")?,
        }
        write!(
            f,
            " log={:.3}Mbit/s received={} buffered={} timeout={}ms heartbeat_timeout={}ms",
            self.log_mbit_s, self.received, self.buffered, self.timeout_ms, self.heartbeat_timeout_ms
        )
    }
}
