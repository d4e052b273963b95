//! virtio-rng, the entropy device (virtio 1.2 §5.4): one request queue
//! whose device-writable buffers the device fills with random bytes. No
//! features, no config space.
//!
//! Randomness is input like any other: the device never makes any. A
//! buffer taken at the guest's kick becomes an [`IoRequest::Entropy`] and
//! waits, tagged, until the host's [`IoCompletion::Entropy`] is applied at
//! an instruction boundary; only then are the bytes copied into the guest.
//! So the bytes are in the input stream a recorder logs and a backup
//! replays, and both machines see the same ones.
//!
//! A request asks for at most [`MAX_REQUEST`] bytes whatever the buffer
//! size (Linux asks for small amounts anyway; the bound keeps each request
//! cheap to log). The host may answer with fewer bytes (even none, if its
//! entropy source failed): the used length says how many arrived. Requests
//! in flight are part of the snapshot, so a restored or promoted machine
//! completes them when the host answers the re-issued requests.

use std::any::Any;
use std::collections::BTreeMap;

use ftvm_memory::GuestRam;

use super::queue::{write_buffers, Desc, Queue};
use super::{VirtioDevice, VIRTIO_ID_RNG};
use crate::io::{IoCompletion, IoRequest};
use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};

pub const QUEUE_SIZE: u16 = 64;
/// Most bytes one request asks the host for.
pub const MAX_REQUEST: u32 = 4096;
/// Most requests waiting for the host. A driver that only reuses returned
/// descriptors never has more than a queue's worth out (64 at most), so
/// this only bounds a buggy driver that re-posts heads still in flight.
const MAX_IN_FLIGHT: usize = QUEUE_SIZE as usize;
/// Most buffers one saved request may have: what a chain can hold (a
/// direct ring plus an indirect table) is far less.
const MAX_SAVED_DESCS: u32 = u16::MAX as u32;

/// A buffer handed to the host to fill, waiting for its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    /// Chain head to return through the used ring.
    head: u16,
    /// The chain's device-writable buffers, in order.
    writable: Vec<Desc>,
    /// Bytes asked of the host.
    len: u32,
}

#[derive(Default)]
pub struct RngDevice {
    /// Tag of the next request handed to the host.
    next_tag: u32,
    in_flight: BTreeMap<u32, Pending>,
}

impl RngDevice {
    pub fn new() -> Self {
        RngDevice::default()
    }

    /// A tag no request in flight has. Only a wrap of the u32 counter with
    /// a request still out from 4 billion requests ago could collide, but
    /// the host must be able to tell answers apart, so skip taken ones.
    fn take_tag(&mut self) -> u32 {
        while self.in_flight.contains_key(&self.next_tag) {
            self.next_tag = self.next_tag.wrapping_add(1);
        }
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        tag
    }

    fn submit(&mut self, q: &mut Queue, ram: &GuestRam, out: &mut Vec<IoRequest>) {
        // At most one ring's worth per call, so a driver that keeps adding
        // cannot keep us here; it will kick again.
        for _ in 0..q.size.max(1) {
            if self.in_flight.len() >= MAX_IN_FLIGHT {
                break;
            }
            let chain = match q.pop(ram) {
                None => break,
                Some(Ok(c)) => c,
                Some(Err(e)) => {
                    q.add_used(ram, e.head, 0);
                    continue;
                }
            };
            let writable: Vec<Desc> = chain.writable().copied().collect();
            let room = chain.writable_len();
            if room == 0 {
                // Nowhere to put entropy: give it straight back.
                q.add_used(ram, chain.head, 0);
                continue;
            }
            let len = room.min(MAX_REQUEST as u64) as u32;
            let tag = self.take_tag();
            out.push(IoRequest::Entropy { tag, len });
            self.in_flight.insert(tag, Pending { head: chain.head, writable, len });
        }
    }
}

impl VirtioDevice for RngDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn features(&self) -> u64 {
        0
    }

    fn num_queues(&self) -> usize {
        1
    }

    fn queue_max_size(&self, _queue: usize) -> u16 {
        QUEUE_SIZE
    }

    fn read_config(&self, _offset: u64, _data: &mut [u8]) {}

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    /// Nothing to negotiate.
    fn activate(&mut self, _features: u64) {}

    fn queue_notify(&mut self, queue: usize, queues: &mut [Queue], ram: &GuestRam, out: &mut Vec<IoRequest>) {
        if let Some(q) = queues.get_mut(queue) {
            self.submit(q, ram, out);
        }
    }

    /// Bytes beyond what was asked are ignored; fewer are fine. A buffer
    /// that turns out to lie outside RAM gets nothing (used length 0) but
    /// is still returned, so the driver never waits forever.
    fn complete(&mut self, c: IoCompletion, queues: &mut [Queue], ram: &GuestRam, _out: &mut Vec<IoRequest>) -> bool {
        let IoCompletion::Entropy { tag, data } = c else {
            return false;
        };
        let Some(p) = self.in_flight.remove(&tag) else {
            return false;
        };
        let n = data.len().min(p.len as usize);
        let used = match write_buffers(&p.writable, ram, 0, &data[..n]) {
            Ok(()) => n as u32,
            Err(_) => 0,
        };
        if let Some(q) = queues.get_mut(0) {
            q.add_used(ram, p.head, used);
        }
        true
    }

    fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    fn in_flight(&self) -> Vec<IoRequest> {
        self.in_flight.iter().map(|(&tag, p)| IoRequest::Entropy { tag, len: p.len }).collect()
    }

    fn reset(&mut self) {
        self.in_flight.clear();
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut w = SnapWriter::new(b"VRNG", 1);
        w.u32(self.next_tag);
        w.u32(self.in_flight.len() as u32);
        for (&tag, p) in &self.in_flight {
            w.u32(tag);
            w.u16(p.head);
            w.u32(p.len);
            w.u32(p.writable.len() as u32);
            for d in &p.writable {
                w.u64(d.addr);
                w.u32(d.len);
            }
        }
        w.finish()
    }

    fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"VRNG")?;
        if version != 1 {
            return Err(SnapshotError::Version { device: "virtio-rng", version });
        }
        let next_tag = r.u32()?;
        let n = r.u32()?;
        let mut in_flight = BTreeMap::new();
        let mut last_tag = None;
        for _ in 0..n {
            let tag = r.u32()?;
            // Tags were saved in order; anything else would not survive
            // snapshot -> restore -> snapshot unchanged.
            if last_tag.is_some_and(|t| tag <= t) {
                return Err(SnapshotError::RngOrder);
            }
            last_tag = Some(tag);
            let head = r.u16()?;
            let len = r.u32()?;
            if len == 0 || len > MAX_REQUEST {
                return Err(SnapshotError::RngLength(len));
            }
            let nd = r.u32()?;
            if nd > MAX_SAVED_DESCS {
                return Err(SnapshotError::TooManyBuffers { device: "virtio-rng" });
            }
            let mut writable = Vec::new();
            for _ in 0..nd {
                writable.push(Desc { addr: r.u64()?, len: r.u32()?, writable: true });
            }
            in_flight.insert(tag, Pending { head, writable, len });
        }
        r.end()?;
        self.next_tag = next_tag;
        self.in_flight = in_flight;
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[cfg(test)]
mod tests;
