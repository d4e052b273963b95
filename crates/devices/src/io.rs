//! The boundary between the device models and the host.
//!
//! A device never performs host I/O. What the guest asks of the outside
//! world leaves the machine as an [`IoRequest`]; what the outside world
//! hands the guest comes back as an [`IoCompletion`], which the machine
//! applies at an instruction boundary. This is the one place where inputs
//! enter (so a recorder can log them and a replayer can supply them) and
//! where outputs leave (so a replication protocol can hold them back until
//! the backup has what produced them).
//!
//! DMA happens only when a request is taken (data to write is copied out
//! of guest memory) and when its completion is applied (data read is copied
//! in): never while the host works on it (the bounce-buffer rule of VMware
//! FT §3.4).

use crate::virtio::blk::{BlkOp, BlkResult};

/// Work for the host. Requests with a `tag` expect a completion with the
/// same tag; the tag is unique among the device's requests in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoRequest {
    /// A disk operation on the device's backing image.
    Disk { tag: u32, op: BlkOp },
    /// An Ethernet frame the guest transmitted (no virtio header). Needs no
    /// answer: the guest already has its buffer back.
    NetTx { frame: Vec<u8> },
    /// The guest wants up to `len` bytes of entropy.
    Entropy { tag: u32, len: u32 },
}

/// An answer from the host, or input that arrived on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoCompletion {
    Disk {
        tag: u32,
        result: BlkResult,
    },
    /// An Ethernet frame received for the guest (no virtio header).
    NetRx {
        frame: Vec<u8>,
    },
    Entropy {
        tag: u32,
        data: Vec<u8>,
    },
}

impl IoRequest {
    /// Whether the host must answer this request with a completion.
    pub fn expects_completion(&self) -> bool {
        !matches!(self, IoRequest::NetTx { .. })
    }
}
