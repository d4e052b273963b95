//! What each side of a pair reports of itself: the pair's part of a VM's
//! status, as serde types with a readable form (`Display`: the
//! `key=value` fields of the status line).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A VM's part in a fault-tolerant pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum PairStatus {
    Primary(PrimaryStatus),
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
    pub generation: u64,
    pub mode: PrimaryMode,
}

/// The primary's figures of its mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum PrimaryMode {
    Lockstep(LogStatus),
    Epoch { epochs: EpochStatus, log: LogStatus },
    Checkpoint(CheckpointStatus),
}

/// A primary whose log streams to its backup (lockstep, epoch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogStatus {
    /// shared or separate.
    pub disks: String,
    /// The backup performs the guest's disk reads itself.
    pub backup_reads: bool,
    pub lag_ms: u64,
    pub lag_max_ms: u64,
    pub log_mbit_s: f64,
    pub log_bytes: u64,
    pub acked: u64,
    /// Outputs held now, and in all, by the Output Rule.
    pub held: u64,
    pub outputs_held_total: u64,
    pub cpu_share_percent: f64,
    pub lag_control: LagControl,
    pub lag_control_engaged: u64,
    pub paused_total_ms: u64,
    pub mips_primary: Option<f64>,
    pub mips_backup: Option<f64>,
}

/// What the execution-lag control does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LagControl {
    Off,
    /// Under the threshold: the primary's share trimmed by a few percent.
    Trim,
    /// Past the threshold: the primary slowed until the backup follows.
    Engaged,
}

/// A Bressoud & Schneider epoch mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochSetting {
    pub length: u64,
    /// original or revised.
    pub protocol: String,
}

/// The primary's epochs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochStatus {
    pub setting: EpochSetting,
    pub ends: u64,
    pub idle_ends: u64,
    pub inputs_delivered: u64,
    pub inputs_buffered: u64,
    pub inputs_waiting: u64,
    /// Under the original protocol: the time waited for acknowledgements
    /// at epoch ends, in all and per end.
    pub ack_wait_total_ms: Option<u64>,
    pub ack_wait_mean_us: Option<u64>,
}

/// A checkpoint-mode primary (Remus).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointStatus {
    pub interval_ms: u64,
    pub checkpoints: u64,
    /// Checkpoints taken early because the guest idled (None: off).
    pub idle_checkpoints: Option<u64>,
    /// Checkpoints a second on the beat, lately and over the whole run.
    pub rate: f64,
    pub rate_overall: f64,
    pub committed: u64,
    pub pause_median_us: u64,
    pub pause_p99_us: u64,
    pub dirty_median: u64,
    /// Pause against pages dirtied (Remus's Fig. 5), per decade of pages.
    pub pause_by_dirty: Vec<PauseBucket>,
    pub bytes_per_checkpoint: u64,
    pub compression: f64,
    pub log_bytes: u64,
    pub acked: u64,
    pub held: u64,
    pub outputs_held_total: u64,
}

/// The pauses of the checkpoints that dirtied `lo..=hi` pages (`hi`
/// None: no bound).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PauseBucket {
    pub lo: u64,
    pub hi: Option<u64>,
    pub median_us: u64,
    pub p99_us: u64,
    pub checkpoints: u64,
}

/// The backup's side of a pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackupStatus {
    /// The primary's logging-channel address.
    pub primary: String,
    pub generation: u64,
    pub mode: BackupMode,
    pub log_mbit_s: f64,
    /// Bytes received, and received but not yet taken by the replay.
    pub received: u64,
    pub buffered: u64,
}

/// The backup's figures of its mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum BackupMode {
    /// `last_end`: the last go-live point received.
    Lockstep {
        last_end: u64,
    },
    Epoch {
        setting: EpochSetting,
        last_end: u64,
    },
    Checkpoint {
        interval_ms: u64,
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
            PrimaryMode::Lockstep(log) => write!(f, "mode=lockstep {log}"),
            PrimaryMode::Epoch { epochs, log } => write!(f, "{epochs} {log}"),
            PrimaryMode::Checkpoint(c) => write!(f, "{c}"),
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
        write!(f, " log={:.3}Mbit/s received={} buffered={}", self.log_mbit_s, self.received, self.buffered)
    }
}
