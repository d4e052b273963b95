//! The host side of ftvm: the backends that do real I/O for the guest.
//!
//! The machine runs in one thread and never touches the outside world: it
//! hands out [`ftvm_devices::IoRequest`]s tagged with a virtio slot, and
//! takes back `(slot, IoCompletion)` pairs that it applies at an
//! instruction boundary. This crate owns everything on the other side of
//! that boundary:
//!   * [`disk`]: raw disk images (locked so two VMs cannot share one), a
//!     positioned-I/O [`BlockBackend`](ftvm_devices::virtio::blk::BlockBackend),
//!     and a pool of threads executing disk requests;
//!   * [`tap`]: Linux TAP interfaces, a receive thread and frame transmit;
//!   * [`entropy`]: bytes from the host's entropy pool;
//!   * [`memory`]: how much memory the host can give a VM.
//!
//! Nothing here decides what the guest sees next: every result goes back
//! through a callback, and the caller (the live loop, a recorder, a
//! replication protocol) decides when the machine gets it.

pub mod disk;
pub mod entropy;
pub mod memory;
pub mod tap;

pub use disk::{DiskError, DiskImage, DiskWorkers, FileBackend, DEFAULT_DISK_THREADS};
pub use tap::{IfNameError, Tap, TapError, IFNAME_MAX, MAX_FRAME};

use std::io;

/// An OS error as a person reads it: `No such file or directory`, without
/// Rust's ` (os error 2)` suffix, so one-line messages stay short.
pub(crate) fn describe(e: &io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) if s.ends_with(')') => s[..i].to_string(),
        _ => s,
    }
}
