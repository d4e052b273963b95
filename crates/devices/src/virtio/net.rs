//! virtio-net (virtio 1.2 §5.1): one receive queue and one transmit queue,
//! a fixed MAC and a link that is always up.
//!
//! Frames leave and enter the machine bare (no virtio header): a transmitted
//! chain becomes an [`IoRequest::NetTx`] at the guest's kick and goes back
//! to the guest at once (the frame was copied out, nothing waits for the
//! host); a received frame arrives as an [`IoCompletion::NetRx`] applied at
//! an instruction boundary and is written into the next posted buffer.
//!
//! Design choices:
//! - No offloads (checksum, GSO), no mergeable buffers, no control queue,
//!   no multiqueue. Every frame is then one whole Ethernet frame in one
//!   chain each way, and the header the guest sends carries nothing we
//!   must honour. Offloads would put checksumming and segmentation into
//!   the device, where it must stay deterministic and be replayed; that is
//!   worth doing only once a workload shows the need.
//! - A received frame is delivered only when a receive buffer exists:
//!   [`VirtioDevice::input_ready`] tells the host, which holds frames back
//!   until then. So a frame injected into the machine is never dropped for
//!   lack of a buffer, and the recorded input stream is exactly what the
//!   guest received (record/replay and the backup see the same thing).
//! - Guest mistakes cost the guest its frame, never the host: a malformed
//!   transmit chain is returned unsent, a receive buffer too small or
//!   outside RAM is returned empty (the frame is lost, as on a NIC whose
//!   buffer is too small; Linux posts at least 1526 bytes per buffer, so
//!   this does not happen to a sane driver).

use std::any::Any;

use ftvm_memory::GuestRam;

use super::queue::{write_buffers, ChainError, Desc, DescChain, Queue};
use super::{config_read_bytes, VirtioDevice, VIRTIO_ID_NET};
use crate::io::{IoCompletion, IoRequest};
use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};

pub const VIRTIO_NET_F_MAC: u64 = 1 << 5;
pub const VIRTIO_NET_F_STATUS: u64 = 1 << 16;
pub const VIRTIO_NET_S_LINK_UP: u16 = 1;

pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;
pub const QUEUE_SIZE: u16 = 256;

/// `struct virtio_net_hdr_v1`: with VERSION_1 (which the transport
/// requires) the header always has `num_buffers`, 12 bytes in all.
pub const NET_HDR_LEN: usize = 12;
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_AT: usize = 10;
/// Largest frame either way: the spec's 65562-byte receive buffer for
/// unmerged GSO less the header. Bounds the host memory one chain costs.
pub const MAX_FRAME: usize = 65550;
/// An Ethernet header; anything shorter is no frame at all.
pub const MIN_FRAME: usize = 14;

pub struct NetDevice {
    mac: [u8; 6],
    /// Negotiated at DRIVER_OK; only kept for the snapshot.
    features: u64,
}

impl NetDevice {
    pub fn new(mac: [u8; 6]) -> Self {
        NetDevice { mac, features: 0 }
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// `struct virtio_net_config` up to `status`; the fields after it
    /// (max_virtqueue_pairs, mtu, ...) belong to features we do not offer
    /// and read as zero.
    fn config(&self) -> [u8; 8] {
        let mut c = [0u8; 8];
        c[0..6].copy_from_slice(&self.mac);
        c[6..8].copy_from_slice(&VIRTIO_NET_S_LINK_UP.to_le_bytes());
        c
    }

    /// Sends every chain the driver made available on the transmit queue
    /// and returns each at once with used length 0 (we write nothing back).
    fn transmit(&mut self, q: &mut Queue, ram: &GuestRam, out: &mut Vec<IoRequest>) {
        // At most one ring's worth per call, so a driver that keeps adding
        // cannot keep us here; it will kick again.
        for _ in 0..q.size.max(1) {
            let Some(chain) = q.pop(ram) else { break };
            let head = match &chain {
                Ok(c) => c.head,
                Err(e) => e.head,
            };
            if let Some(frame) = tx_frame(chain, ram) {
                out.push(IoRequest::NetTx { frame });
            }
            q.add_used(ram, head, 0);
        }
    }

    /// Writes `frame` behind a header into the next receive buffer.
    /// Returns false when there is no buffer (nothing changed).
    fn receive(&mut self, frame: &[u8], q: &mut Queue, ram: &GuestRam) -> bool {
        let Some(chain) = q.pop(ram) else { return false };
        let (head, used) = match chain {
            Ok(c) => (c.head, rx_write(&c, frame, ram)),
            // The buffer is consumed and the frame lost, as with any other
            // unusable buffer.
            Err(e) => (e.head, 0),
        };
        q.add_used(ram, head, used);
        true
    }
}

/// The frame a transmit chain carries, or `None` if the chain is malformed,
/// unreadable, or holds no plausible Ethernet frame. Device-writable
/// buffers in a transmit chain are ignored.
fn tx_frame(chain: Result<DescChain, ChainError>, ram: &GuestRam) -> Option<Vec<u8>> {
    let chain = chain.ok()?;
    // The header says nothing we act on: we offered no checksum or GSO
    // offload, so a conforming driver leaves flags and gso_type zero.
    let len = chain.readable_len().checked_sub(NET_HDR_LEN as u64)?;
    if len < MIN_FRAME as u64 || len > MAX_FRAME as u64 {
        return None;
    }
    chain.read_readable(ram, NET_HDR_LEN as u64, len as usize).ok()
}

/// Writes header and frame into a receive chain; returns the used length
/// (0 when the buffers are too small or not all in RAM: the frame is lost).
fn rx_write(chain: &DescChain, frame: &[u8], ram: &GuestRam) -> u32 {
    let total = NET_HDR_LEN + frame.len();
    if chain.writable_len() < total as u64 {
        return 0;
    }
    let writable: Vec<Desc> = chain.writable().copied().collect();
    let mut buf = Vec::with_capacity(total);
    buf.extend_from_slice(&[0u8; NET_HDR_LEN]);
    buf[NUM_BUFFERS_AT..NUM_BUFFERS_AT + 2].copy_from_slice(&1u16.to_le_bytes());
    buf.extend_from_slice(frame);
    // A buffer outside RAM may leave part of the frame written; used
    // length 0 tells the driver to ignore it.
    match write_buffers(&writable, ram, 0, &buf) {
        Ok(()) => total as u32,
        Err(_) => 0,
    }
}

pub(crate) fn format_mac(mac: &[u8]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

impl VirtioDevice for NetDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS
    }

    fn num_queues(&self) -> usize {
        2
    }

    fn queue_max_size(&self, _queue: usize) -> u16 {
        QUEUE_SIZE
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        config_read_bytes(&self.config(), offset, data);
    }

    /// The MAC is writable only for legacy drivers, which we do not serve.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, features: u64) {
        self.features = features;
    }

    /// A kick on the receive queue (new buffers) needs no work here: the
    /// host asks [`VirtioDevice::input_ready`] after the guest ran.
    fn queue_notify(&mut self, queue: usize, queues: &mut [Queue], ram: &GuestRam, out: &mut Vec<IoRequest>) {
        if queue == TX_QUEUE {
            if let Some(q) = queues.get_mut(TX_QUEUE) {
                self.transmit(q, ram, out);
            }
        }
    }

    /// A frame outside [`MIN_FRAME`]..=[`MAX_FRAME`] is refused (false,
    /// nothing consumed): no NIC could have received it, and refusing it
    /// keeps a receive buffer for the next real frame.
    fn complete(&mut self, c: IoCompletion, queues: &mut [Queue], ram: &GuestRam, _out: &mut Vec<IoRequest>) -> bool {
        let IoCompletion::NetRx { frame } = c else {
            return false;
        };
        if !(MIN_FRAME..=MAX_FRAME).contains(&frame.len()) {
            return false;
        }
        let Some(q) = queues.get_mut(RX_QUEUE) else {
            return false;
        };
        self.receive(&frame, q, ram)
    }

    fn input_ready(&self, queues: &[Queue], ram: &GuestRam) -> bool {
        queues.get(RX_QUEUE).is_some_and(|q| q.has_available(ram))
    }

    fn reset(&mut self) {
        self.features = 0;
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut w = SnapWriter::new(b"VNET", 1);
        w.bytes(&self.mac);
        w.u64(self.features);
        w.finish()
    }

    fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"VNET")?;
        if version != 1 {
            return Err(SnapshotError::Version { device: "virtio-net", version });
        }
        let mac = r.bytes()?;
        let features = r.u64()?;
        r.end()?;
        if mac != self.mac {
            return Err(SnapshotError::OtherMac { saved: mac.to_vec(), actual: self.mac });
        }
        self.features = features;
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[cfg(test)]
mod tests;
