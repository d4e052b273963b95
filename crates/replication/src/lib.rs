//! The parts of fault tolerance that know nothing of the machine they
//! protect (VMware FT, ../../../shared/seeds/vmware-ft-techreport.txt §2-§3):
//!
//! - [`channel`]: the logging channel, a byte stream from primary to backup
//!   with acknowledgements back, bounded buffers on both ends and failure
//!   detection on its traffic;
//! - [`checkpoint_stream`]: what checkpoint mode (Remus) sends instead of
//!   a log: disk writes and whole checkpoints, in checkpoint order;
//! - [`disk_sync`]: the blocks that make the backup's copy of a disk the
//!   same as the primary's when protection starts;
//! - [`heartbeat`]: UDP heartbeats between the two hosts, each with a MAC;
//! - [`pair_key`]: the secret the two hosts share, which keys the
//!   channel's handshake and the heartbeats;
//! - [`arbiter`]: the atomic test-and-set on shared storage that lets only
//!   one side go live;
//! - [`isolation`]: whether this host still reaches the outside, checked
//!   before contending at the arbiter so that the side that can serve wins;
//! - [`fence`]: whether this side may let outputs leave now: a lease the
//!   backup's acknowledgements renew, and the arbiter's verdict;
//! - [`output_rule`]: outputs held until the log that produced them is
//!   acknowledged;
//! - [`lag`]: the backup's execution lag, measured on the primary, and the
//!   CPU-share feedback loop that bounds it;
//! - [`page_delta`]: checkpoint pages sent as XOR deltas or zstd (Remus §3.4);
//! - [`priority`]: the threads the peer's failure detector listens to,
//!   raised where the VM's threads cannot starve them;
//! - [`poll`]: reading a socket by polling while a round trip is awaited.
//!
//! The program drives a machine with these; nothing here runs guest code.

pub mod arbiter;
pub mod channel;
pub mod checkpoint_stream;
pub mod disk_sync;
pub mod fence;
pub mod heartbeat;
pub mod isolation;
pub mod lag;
pub mod output_rule;
pub mod page_delta;
pub mod pair_key;
pub mod poll;
pub mod priority;

use std::time::Duration;

/// Failure detection settings shared by both ends.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Silence after which the peer is declared failed.
    pub timeout: Duration,
    /// How often each side shows it is alive (heartbeats, acknowledgements,
    /// keep-alive frames when the log is quiet).
    pub interval: Duration,
}

impl Timing {
    /// Heartbeats every 50 ms, failure after 500 ms of silence: ten missed
    /// beats. VMware FT waits "a few seconds" over a datacenter network; our
    /// beats come from threads that never wait for the guest, so only a
    /// stalled host or a broken link silences them, and a failover of a
    /// second or less needs detection well under that.
    pub const DEFAULT: Timing = Timing { timeout: Duration::from_millis(500), interval: Duration::from_millis(50) };

    pub fn with_timeout(timeout: Duration) -> Timing {
        // Ten beats per timeout, within bounds that keep a beat cheap and
        // detection responsive.
        let interval = (timeout / 10).clamp(Duration::from_millis(5), Duration::from_millis(1000));
        Timing { timeout, interval }
    }
}
