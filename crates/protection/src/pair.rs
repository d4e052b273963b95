//! What the two sides of a pair agree on, and the handshake that says it:
//! the primary writes a [`PairHeader`] into the header of the stream it
//! sends (one versioned JSON field of the replay log's header, beside the
//! machine's description), and the backup reads it before it follows.

use crate::error::{file as file_error, ProtectionError};
use ftvm_replay::Header;
use ftvm_replication::disk_sync;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The header field that carries the pair's part of the handshake.
const FIELD: &str = "ft-pair";
/// The version of [`PairHeader`] this build writes and reads.
pub const PAIR_HEADER_VERSION: u32 = 3;

pub use ftvm_api::mode::{DiskSharing, Mode};

/// What the pair does about disks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskPolicy {
    /// Whether the hosts share the disks or each has its own copy.
    pub sharing: DiskSharing,
    /// The backup performs the guest's disk reads itself (§4.2).
    pub backup_reads: bool,
}

impl DiskPolicy {
    /// Whether a disk write or flush is an output the Output Rule holds:
    /// only when it changes the shared disk.
    pub fn writes_are_outputs(self) -> bool {
        self.sharing == DiskSharing::Shared
    }

    /// Whether a write must also wait for the backup to have performed
    /// earlier reads of the same blocks (§4.2 on a shared disk).
    pub fn writes_wait_for_backup_reads(self) -> bool {
        self.sharing == DiskSharing::Shared && self.backup_reads
    }
}

/// The mode and its settings, as the backup must know them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum ModeSetting {
    /// Lockstep, which has no settings.
    Lockstep,
    /// Epochs of the given length and protocol.
    Epoch(crate::epoch::EpochMode),
    /// Checkpoints at an interval.
    Checkpoint {
        /// Time between checkpoints, in ms.
        interval_ms: u64,
    },
}

impl ModeSetting {
    /// The mode, without its settings.
    pub fn mode(&self) -> Mode {
        match self {
            ModeSetting::Lockstep => Mode::Lockstep,
            ModeSetting::Epoch(_) => Mode::Epoch,
            ModeSetting::Checkpoint { .. } => Mode::Checkpoint,
        }
    }

    /// The mode's name: lockstep, epoch or checkpoint.
    pub fn name(&self) -> &'static str {
        self.mode().name()
    }
}

/// One of the VM's disks: its virtio slot, the primary's path, and with
/// separate disks the digest of the primary's copy ([`DiskDigest::whole`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairDisk {
    /// The virtio slot the disk is attached at.
    pub slot: usize,
    /// The disk's path on the primary's host.
    pub path: PathBuf,
    /// With separate disks, the digest of the primary's copy; else None.
    pub digest: Option<String>,
}

/// The pair's part of the handshake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairHeader {
    /// [`PAIR_HEADER_VERSION`] of the primary that wrote it.
    pub version: u32,
    /// The pair's generation at the arbiter.
    pub generation: u64,
    /// The mode, with its settings.
    pub mode: ModeSetting,
    /// What the pair does about disks.
    pub disk_policy: DiskPolicy,
    /// The VM's disks, in slot order.
    pub disks: Vec<PairDisk>,
    /// The random token the primary wrote into its generation's record on
    /// the shared storage: a backup that reads another there (or none)
    /// does not see the same storage, and the arbiter could not stop a
    /// split brain.
    pub storage_token: String,
    /// The identity of the primary's host ([`host_identity`]): a backup
    /// on the same host is refused.
    pub host: String,
}

/// This host's identity, which a pair's two sides compare: `given`, else
/// the environment's `FTVM_HOST_ID` (hosts simulated on one machine, as
/// the test site's network namespaces), else `/etc/machine-id`, else the
/// host name. Addresses would not do: one host may have many.
pub fn host_identity(given: Option<&str>) -> String {
    if let Some(id) = given.filter(|id| !id.is_empty()) {
        return id.to_string();
    }
    if let Some(id) = std::env::var("FTVM_HOST_ID").ok().filter(|id| !id.is_empty()) {
        return id;
    }
    let read = |path: &str| std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    read("/etc/machine-id").or_else(|| read("/proc/sys/kernel/hostname")).unwrap_or_else(|| "unknown".into())
}

/// Why a header is no pair's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairHeaderError {
    /// The header has no pair field: the peer is not an FT primary.
    #[error("the primary named no generation (is it `ftvm ft primary`?)")]
    Missing,
    /// The pair field is not valid JSON of a pair header (the parser's
    /// message).
    #[error("the primary's pair header is unreadable: {0}")]
    Unreadable(String),
    /// The pair field is of another version (the primary's).
    #[error("the primary speaks pair header version {0}; this backup speaks {PAIR_HEADER_VERSION}")]
    Version(u32),
    /// The epoch length is outside what this side accepts.
    #[error("the primary's epoch mode is out of range: {0}")]
    Epoch(crate::epoch::EpochLengthError),
}

impl PairHeader {
    /// Writes it into `h`.
    pub fn write(&self, h: &mut Header) {
        h.set(FIELD, serde_json::to_string(self).expect("a pair header serializes"));
    }

    /// Reads it from `h`, checking what a peer could have got wrong.
    pub fn read(h: &Header) -> Result<PairHeader, PairHeaderError> {
        let text = h.get(FIELD).ok_or(PairHeaderError::Missing)?;
        // The version first: a newer primary's header may not parse here.
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let v: Versioned = serde_json::from_str(text).map_err(|e| PairHeaderError::Unreadable(e.to_string()))?;
        if v.version != PAIR_HEADER_VERSION {
            return Err(PairHeaderError::Version(v.version));
        }
        let pair: PairHeader = serde_json::from_str(text).map_err(|e| PairHeaderError::Unreadable(e.to_string()))?;
        if let ModeSetting::Epoch(e) = pair.mode {
            crate::epoch::EpochMode::new(e.length, e.protocol).map_err(PairHeaderError::Epoch)?;
        }
        Ok(pair)
    }

    /// The disks as (slot, path), in slot order.
    pub fn slot_disks(&self) -> SlotDisks {
        self.disks.iter().map(|d| (d.slot, d.path.clone())).collect()
    }

    /// The epoch mode, if the pair runs in one.
    pub fn epoch_mode(&self) -> Option<crate::epoch::EpochMode> {
        match self.mode {
            ModeSetting::Epoch(e) => Some(e),
            _ => None,
        }
    }
}

/// The digest part of [`DiskDigest::streamed`].
const STREAMED: &str = "streamed";

/// A VM's disks: (virtio slot, image path), in slot order.
pub type SlotDisks = Vec<(usize, PathBuf)>;

/// A disk image's content, hashed in blocks ([`disk_sync`]): two copies
/// are identical when their digests are; where they are not, the blocks
/// tell what to send to make them so.
pub struct DiskDigest {
    /// Bytes hashed: the disk's size.
    pub size: u64,
    /// BLAKE3 digest of each block, in order; the block size is
    /// [`disk_sync::block_size`] of `size`.
    pub blocks: Vec<[u8; 32]>,
}

impl DiskDigest {
    /// Hashes the first `size` bytes of the disk at `path` (its whole
    /// length when None).
    pub fn of(path: &Path, size: Option<u64>) -> Result<DiskDigest, ProtectionError> {
        let e = |e: std::io::Error| file_error("cannot read disk", path)(e);
        let file = std::fs::File::open(path).map_err(e)?;
        let size = match size {
            Some(s) => s,
            None => file.metadata().map_err(e)?.len(),
        };
        let blocks = disk_sync::digests(&file, size, disk_sync::block_size(size)).map_err(e)?;
        Ok(DiskDigest { size, blocks })
    }

    /// The digest of the whole disk, with its size: what the header names.
    pub fn whole(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(&self.size.to_le_bytes());
        for b in &self.blocks {
            h.update(b);
        }
        format!("{}:{}", self.size, h.finalize().to_hex())
    }

    /// What a header names for a running VM's disk in checkpoint mode:
    /// its size, and no digest, since the disk changes while it is copied
    /// (the backup asks for the blocks whatever it holds).
    pub fn streamed(size: u64) -> String {
        format!("{size}:{STREAMED}")
    }

    /// Whether a header's whole digest is [`DiskDigest::streamed`]'s.
    pub fn is_streamed(whole: &str) -> bool {
        whole.split_once(':').is_some_and(|(_, d)| d == STREAMED)
    }

    /// The size a header's whole digest names.
    pub fn size_in(whole: &str) -> Option<u64> {
        whole.split_once(':')?.0.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epoch::{EpochMode, EpochProtocol};

    fn sample() -> PairHeader {
        PairHeader {
            version: PAIR_HEADER_VERSION,
            generation: 7,
            mode: ModeSetting::Epoch(EpochMode::new(4096, EpochProtocol::Original).unwrap()),
            disk_policy: DiskPolicy { sharing: DiskSharing::Separate, backup_reads: true },
            disks: vec![PairDisk { slot: 0, path: "/srv/a.img".into(), digest: Some("1024:ab".into()) }],
            storage_token: "00ff".into(),
            host: "host-a".into(),
        }
    }

    #[test]
    fn the_pair_header_round_trips_and_refuses_what_a_peer_got_wrong() {
        let mut h = Header::default();
        sample().write(&mut h);
        assert_eq!(PairHeader::read(&h).unwrap(), sample());
        assert_eq!(PairHeader::read(&Header::default()), Err(PairHeaderError::Missing));
        let mut newer = Header::default();
        let next = PAIR_HEADER_VERSION + 1;
        newer.set(FIELD, format!(r#"{{"version":{next},"something":"new"}}"#));
        assert_eq!(PairHeader::read(&newer), Err(PairHeaderError::Version(next)));
        // A primary from before the storage token: refused, not half-read.
        let mut older = Header::default();
        older.set(FIELD, r#"{"version":1,"generation":1}"#);
        assert_eq!(PairHeader::read(&older), Err(PairHeaderError::Version(1)));
        let mut garbage = Header::default();
        garbage.set(FIELD, "{not json");
        assert!(matches!(PairHeader::read(&garbage), Err(PairHeaderError::Unreadable(_))));
        let mut short = Header::default();
        let text = serde_json::to_string(&sample()).unwrap().replace("4096", "7");
        short.set(FIELD, text);
        assert!(matches!(PairHeader::read(&short), Err(PairHeaderError::Epoch(_))));
    }
}
