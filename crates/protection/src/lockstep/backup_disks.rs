//! The backup's own disk I/O, when it does any (VMware FT §4). By default
//! it does none: the shared disk is the primary's to write, and read data
//! comes in the log. With separate disks (§4.1) the backup performs the
//! guest's writes and flushes on its own copy, so the copy stays what the
//! primary's is. With `--backup-reads` (§4.2) it performs the guest's reads
//! itself, when its replay issues them, and fills their data into the
//! completions the primary logged without it.
//!
//! The retry rules of §4.2: a read or write that fails here while it
//! succeeded on the primary is tried again until it succeeds (the guest
//! must see the same bytes); after [`GIVE_UP_AFTER`] the backup stops
//! following rather than stall the pair forever. A read that failed on the
//! primary needs nothing from here: our virtio-blk writes no data into
//! the guest's buffers on an error, so the guest memory the primary left
//! is already the backup's.

use crate::error::{file, ProtectionError};
use ftvm_host::{DiskImage, FileBackend};
use ftvm_machine::{BlkOp, IoCompletion, IoRequest};
use ftvm_replay::replayer::{HookError, ReplayIo};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a failing disk operation is retried before the backup gives up.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(10);

/// virtio-blk's "done" status.
const OK: u8 = 0;

/// The backup's own disk I/O: its writes to its copy of each disk (with
/// separate disks) and its reads (with `--backup-reads`).
pub struct BackupDisks {
    /// Per virtio slot of a disk: its image (holding the lock, if any)
    /// and the backend on it.
    disks: HashMap<usize, (DiskImage, FileBackend)>,
    writes: bool,
    reads: bool,
    /// Reads performed ahead of their logged completion, by (slot, tag).
    done_early: HashMap<(usize, u32), (BlkOp, u8, Vec<u8>)>,
    /// For status: disk operations performed.
    pub performed: u64,
    /// For status: retries they needed.
    pub retries: u64,
}

impl BackupDisks {
    /// `disks`: (slot, path) of each disk. With `writes` the backup owns
    /// these copies (separate disks) and locks them; otherwise it only
    /// reads beside the primary, which holds the lock.
    pub fn open(disks: &[(usize, &Path)], writes: bool, reads: bool) -> Result<BackupDisks, ProtectionError> {
        let mut open = HashMap::new();
        for &(slot, path) in disks {
            let image = if writes { DiskImage::open(path, false) } else { DiskImage::open_beside_writer(path) };
            let image = image?;
            let backend = image.backend().map_err(file("disk", path))?;
            open.insert(slot, (image, backend));
        }
        Ok(BackupDisks { disks: open, writes, reads, done_early: HashMap::new(), performed: 0, retries: 0 })
    }

    /// Performs `op` on the disk of `slot` until it succeeds, or gives up.
    fn perform_until_ok(&mut self, slot: usize, op: &BlkOp) -> Result<Vec<u8>, ProtectionError> {
        let started = Instant::now();
        let (image, backend) = self.disks.get_mut(&slot).expect("a disk slot");
        loop {
            let r = ftvm_machine::execute_blk(op, backend);
            if r.status == OK {
                self.performed += 1;
                return Ok(r.data);
            }
            if started.elapsed() >= GIVE_UP_AFTER {
                return Err(ProtectionError::DiskKeepsFailing { path: image.path().to_path_buf(), op: op_name(op) });
            }
            self.retries += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn op_name(op: &BlkOp) -> String {
    match op {
        BlkOp::Read { offset, len } => format!("a read of {len} bytes at {offset}"),
        BlkOp::Write { offset, data } => format!("a write of {} bytes at {offset}", data.len()),
        BlkOp::Flush => "a flush".into(),
        BlkOp::Done { .. } => "a request".into(),
    }
}

impl ReplayIo for BackupDisks {
    fn requests(&mut self, _icount: u64, requests: Vec<(usize, IoRequest)>) -> Result<(), HookError> {
        for (slot, req) in requests {
            let IoRequest::Disk { tag, op } = req else { continue };
            if !self.disks.contains_key(&slot) {
                continue;
            }
            match &op {
                BlkOp::Write { .. } | BlkOp::Flush if self.writes => {
                    self.perform_until_ok(slot, &op)?;
                }
                BlkOp::Read { .. } | BlkOp::Done { .. } if self.reads => {
                    // Performed now, in the guest's order against the
                    // writes; a failure is retried only if the primary's
                    // read turns out to have succeeded.
                    let (_, backend) = self.disks.get_mut(&slot).expect("a disk slot");
                    let r = ftvm_machine::execute_blk(&op, backend);
                    self.performed += 1;
                    self.done_early.insert((slot, tag), (op, r.status, r.data));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn completion(&mut self, slot: usize, completion: &mut IoCompletion) -> Result<(), HookError> {
        let IoCompletion::Disk { tag, result } = completion else { return Ok(()) };
        let Some((op, status, data)) = self.done_early.remove(&(slot, *tag)) else { return Ok(()) };
        // The primary logged the outcome; the data is ours to supply.
        if result.status == OK && result.data.is_empty() {
            result.data = if status == OK { data } else { self.perform_until_ok(slot, &op)? };
        }
        Ok(())
    }
}
