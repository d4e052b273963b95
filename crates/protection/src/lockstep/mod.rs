//! Lockstep (VMware FT): the primary logs every input at the instruction
//! where it took effect and streams the log to the backup, which replays
//! it (`primary`; the backup replays it with `ftvm_replay::replayer`);
//! with separate disks or backup reads, the backup performs disk I/O of
//! its own (`backup_disks`).

use std::time::Duration;

pub mod backup;
pub mod backup_disks;
pub mod primary;

/// How often a protected VM whose guest sleeps wakes to log a go-live
/// point, showing the backup it is alive.
pub const KEEPALIVE: Duration = Duration::from_millis(50);
/// How often a protected VM's log carries a go-live point while its guest
/// runs. A CPU-bound guest logs next to nothing else (its timer is
/// deterministic), and the backup stops at the last go-live point it has:
/// at 50 ms a backup as fast as its primary trails it by 55-65 ms. 10 ms
/// brought that to 14-16 ms, but the sender's and acknowledgement
/// reader's wake-ups then preempted the VM thread 430 times a second
/// (185 at 50 ms) and the CPU job ran 3-4 % slower; the VM thread sending
/// them itself, without those wake-ups, cost the CPU job and redis more
/// (docs/PERFORMANCE.md).
pub const BUSY_GO_LIVE: Duration = Duration::from_millis(50);
