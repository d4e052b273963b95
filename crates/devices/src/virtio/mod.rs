//! Virtio devices: the virtio-mmio transport (version 2 only), split
//! virtqueues, and the device models behind the [`VirtioDevice`] trait.
//!
//! The transport owns everything the spec puts in the transport (feature
//! negotiation, status, queue configuration, interrupt status); a device
//! owns its config space and what its queues carry. Work a device does on
//! its queues — in a notify handler, or when the machine applies an I/O
//! completion — is followed by the transport deciding which interrupts
//! that raised. Host work leaves through the transport's outbox as
//! [`IoRequest`]s (see [`crate::io`]).

pub mod blk;
pub mod net;
pub mod rng;

pub mod mmio;
pub mod queue;

use std::any::Any;

use ftvm_memory::GuestRam;

use crate::io::{IoCompletion, IoRequest};
use crate::snapshot::SnapResult;

pub use mmio::VirtioMmio;
pub use queue::{ChainError, Desc, DescChain, Queue};

/// Feature bits the transport itself implements and always offers.
pub const VIRTIO_F_RING_INDIRECT_DESC: u64 = 1 << 28;
pub const VIRTIO_F_RING_EVENT_IDX: u64 = 1 << 29;
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
pub const TRANSPORT_FEATURES: u64 = VIRTIO_F_VERSION_1 | VIRTIO_F_RING_INDIRECT_DESC | VIRTIO_F_RING_EVENT_IDX;

pub const VIRTIO_ID_NET: u32 = 1;
pub const VIRTIO_ID_BLOCK: u32 = 2;
pub const VIRTIO_ID_CONSOLE: u32 = 3;
pub const VIRTIO_ID_RNG: u32 = 4;

/// A virtio device model, independent of the transport.
///
/// `Send` so a machine holding devices can move between host threads.
pub trait VirtioDevice: Send {
    /// Virtio device type (2 = block, ...).
    fn device_type(&self) -> u32;
    /// Device-specific feature bits (0..=23 and any others the device
    /// implements); the transport adds [`TRANSPORT_FEATURES`].
    fn features(&self) -> u64;
    fn num_queues(&self) -> usize;
    fn queue_max_size(&self, queue: usize) -> u16;
    /// Reads device config space; bytes past its end stay as given (zero).
    fn read_config(&self, offset: u64, data: &mut [u8]);
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The driver set DRIVER_OK with these negotiated features.
    fn activate(&mut self, features: u64);
    /// The driver kicked `queue` (which is ready). The device takes chains
    /// from it; chains it can finish at once go back to the used ring, work
    /// for the host goes to `out` (the transport raises the interrupt).
    fn queue_notify(&mut self, queue: usize, queues: &mut [Queue], ram: &GuestRam, out: &mut Vec<IoRequest>);
    /// The host answered a request or delivered input. Returns false when
    /// the device has no use for it (an unknown tag, a device reset since
    /// the request, a frame with no receive buffer), in which case nothing
    /// changed.
    fn complete(&mut self, c: IoCompletion, queues: &mut [Queue], ram: &GuestRam, out: &mut Vec<IoRequest>) -> bool;
    /// Whether input (a received frame) would find a buffer now. Hosts hold
    /// input back until it does, so an injected input is never dropped.
    fn input_ready(&self, _queues: &[Queue], _ram: &GuestRam) -> bool {
        false
    }
    /// Requests handed to the host and not yet completed, in the order
    /// they were issued: after a restore or a failover they are issued
    /// again (every request is safe to repeat).
    fn in_flight(&self) -> Vec<IoRequest> {
        Vec::new()
    }
    /// How many requests [`VirtioDevice::in_flight`] would list (cheap).
    fn in_flight_count(&self) -> usize {
        0
    }
    /// Device reset by the driver (status 0): forget negotiated state and
    /// anything in flight.
    fn reset(&mut self);
    /// Device-specific state (not the transport's, not backing storage).
    fn snapshot(&self) -> Vec<u8>;
    fn restore(&mut self, blob: &[u8]) -> SnapResult<()>;
    /// For tests and tools to reach a concrete device through the
    /// transport's trait object.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Copies `src` (a device config structure) into a config read at `offset`.
pub fn config_read_bytes(src: &[u8], offset: u64, data: &mut [u8]) {
    if offset >= src.len() as u64 {
        return;
    }
    let start = offset as usize;
    let n = data.len().min(src.len() - start);
    data[..n].copy_from_slice(&src[start..start + n]);
}

#[cfg(test)]
pub(crate) mod testdriver;
