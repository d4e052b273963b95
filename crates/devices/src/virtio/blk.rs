//! virtio-blk over a raw image (virtio 1.2 §5.2): one request queue, IN,
//! OUT, FLUSH and GET_ID.
//!
//! The device never touches the image. A request goes through three steps:
//!   1. [`BlkDevice::parse`] (at the guest's kick): take a chain from the
//!      ring and turn it into a self-contained [`BlkRequest`]; data to write
//!      is copied out of guest memory here. Its [`BlkOp`] leaves the machine
//!      as an [`IoRequest::Disk`] and the request waits, tagged, in flight.
//!   2. [`execute`] (on the host, any thread): run the op against a
//!      [`BlockBackend`]; touches no guest state.
//!   3. [`complete`] (when the machine applies the host's
//!      [`IoCompletion::Disk`] at an instruction boundary): copy read data
//!      and the status byte into the chain's writable buffers and return it
//!      through the used ring.
//!
//! Several requests can be in flight and complete in any order.
//!
//! Malformed requests (short header, no status byte, buffers outside RAM,
//! sectors past the end, oversize) fail with VIRTIO_BLK_S_IOERR, unknown
//! types with VIRTIO_BLK_S_UNSUPP; a chain with nowhere to put a status
//! byte is returned with used length 0. These, and GET_ID, complete at the
//! kick without the host.

use std::any::Any;
use std::collections::BTreeMap;
use std::io;

use ftvm_memory::GuestRam;

use super::queue::{write_buffers, ChainError, Desc, DescChain, Queue};
use super::{config_read_bytes, VirtioDevice, VIRTIO_ID_BLOCK};
use crate::io::{IoCompletion, IoRequest};
use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};

pub const VIRTIO_BLK_F_SIZE_MAX: u64 = 1 << 1;
pub const VIRTIO_BLK_F_SEG_MAX: u64 = 1 << 2;
pub const VIRTIO_BLK_F_RO: u64 = 1 << 5;
pub const VIRTIO_BLK_F_BLK_SIZE: u64 = 1 << 6;
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;

pub const VIRTIO_BLK_T_IN: u32 = 0;
pub const VIRTIO_BLK_T_OUT: u32 = 1;
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;

pub const VIRTIO_BLK_S_OK: u8 = 0;
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

pub const SECTOR_SIZE: u64 = 512;
pub const QUEUE_SIZE: u16 = 256;
/// Segments per request we advertise: the queue less header and status.
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Largest segment we advertise.
pub const SIZE_MAX: u32 = 256 * 1024;
/// Largest data transfer we accept in one request: what SEG_MAX × SIZE_MAX
/// permits, rounded up. Bounds the host memory one request can pin.
pub const MAX_REQUEST_BYTES: u64 = 64 << 20;
/// GET_ID answers with at most this many bytes (no terminator when full).
pub const ID_BYTES: usize = 20;
const HEADER_BYTES: u64 = 16;

/// Storage a host executes disk requests against. `Send` so it can live
/// on an I/O thread.
pub trait BlockBackend: Send {
    /// Size in bytes; the device exposes whole 512-byte sectors of it.
    fn size(&self) -> u64;
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes completed writes durable.
    fn flush(&mut self) -> io::Result<()>;
}

/// An in-memory disk, for tests and scratch disks.
pub struct MemBackend {
    pub data: Vec<u8>,
    pub flushes: u64,
}

impl MemBackend {
    pub fn new(data: Vec<u8>) -> Self {
        MemBackend { data, flushes: 0 }
    }
}

impl BlockBackend for MemBackend {
    fn size(&self) -> u64 {
        self.data.len() as u64
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset.checked_add(buf.len() as u64).filter(|&e| e <= self.size());
        let Some(end) = end else {
            return Err(io::ErrorKind::UnexpectedEof.into());
        };
        buf.copy_from_slice(&self.data[offset as usize..end as usize]);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset.checked_add(data.len() as u64).filter(|&e| e <= self.size());
        let Some(end) = end else {
            return Err(io::ErrorKind::WriteZero.into());
        };
        self.data[offset as usize..end as usize].copy_from_slice(data);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flushes += 1;
        Ok(())
    }
}

/// What a request asks of the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlkOp {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    Flush,
    /// Decided while parsing, without the backend (GET_ID, bad requests).
    Done {
        status: u8,
        data: Vec<u8>,
    },
}

/// A request taken from the ring, self-contained: it holds everything
/// needed to execute and complete it, so it can wait for an I/O thread, be
/// saved in a snapshot, or be re-issued after failover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlkRequest {
    /// Chain head to return through the used ring.
    pub head: u16,
    pub op: BlkOp,
    /// The chain's device-writable buffers in order; the last byte of them
    /// is the status byte. Empty when there is nowhere to write a status.
    pub writable: Vec<Desc>,
}

/// The outcome of executing a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlkResult {
    pub status: u8,
    /// Bytes for the guest (read data, device id); empty on error.
    pub data: Vec<u8>,
}

/// Step 2: performs the operation. Touches only the backend.
pub fn execute(op: &BlkOp, backend: &mut dyn BlockBackend) -> BlkResult {
    let fail = |status| BlkResult { status, data: Vec::new() };
    match op {
        BlkOp::Read { offset, len } => {
            let mut buf = vec![0u8; *len as usize];
            match backend.read_at(*offset, &mut buf) {
                Ok(()) => BlkResult { status: VIRTIO_BLK_S_OK, data: buf },
                Err(_) => fail(VIRTIO_BLK_S_IOERR),
            }
        }
        BlkOp::Write { offset, data } => match backend.write_at(*offset, data) {
            Ok(()) => fail(VIRTIO_BLK_S_OK),
            Err(_) => fail(VIRTIO_BLK_S_IOERR),
        },
        BlkOp::Flush => match backend.flush() {
            Ok(()) => fail(VIRTIO_BLK_S_OK),
            Err(_) => fail(VIRTIO_BLK_S_IOERR),
        },
        BlkOp::Done { status, data } => BlkResult { status: *status, data: data.clone() },
    }
}

/// Step 3: writes the result into the guest's buffers and returns the chain.
/// The caller decides about interrupts (the transport does, after device
/// work). Buffers that turn out to lie outside RAM lose the data or status
/// but the chain is still returned, so the driver never waits forever.
pub fn complete(req: &BlkRequest, result: &BlkResult, queue: &mut Queue, ram: &GuestRam) {
    let wlen: u64 = req.writable.iter().map(|d| d.len as u64).sum();
    let mut used = 0u32;
    if wlen > 0 {
        let room = wlen - 1;
        let mut status = result.status;
        let n = (result.data.len() as u64).min(room) as usize;
        if n > 0 {
            if write_buffers(&req.writable, ram, 0, &result.data[..n]).is_ok() {
                used = n as u32;
            } else {
                status = VIRTIO_BLK_S_IOERR;
            }
        }
        if write_buffers(&req.writable, ram, room, &[status]).is_ok() {
            used += 1;
        }
    }
    queue.add_used(ram, req.head, used);
}

pub struct BlkDevice {
    /// Capacity in 512-byte sectors.
    capacity: u64,
    read_only: bool,
    id: [u8; ID_BYTES],
    /// Negotiated at DRIVER_OK; only kept for the snapshot.
    features: u64,
    /// Tag of the next request handed to the host.
    next_tag: u32,
    /// Requests handed to the host, by tag.
    in_flight: BTreeMap<u32, BlkRequest>,
}

impl BlkDevice {
    /// A disk of `size_bytes` (whole sectors of it are exposed); `id` is
    /// the serial GET_ID returns (truncated to 20 bytes).
    pub fn new(size_bytes: u64, read_only: bool, id: &str) -> Self {
        let mut idb = [0u8; ID_BYTES];
        let n = id.len().min(ID_BYTES);
        idb[..n].copy_from_slice(&id.as_bytes()[..n]);
        BlkDevice {
            capacity: size_bytes / SECTOR_SIZE,
            read_only,
            id: idb,
            features: 0,
            next_tag: 0,
            in_flight: BTreeMap::new(),
        }
    }

    pub fn capacity_sectors(&self) -> u64 {
        self.capacity
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn config(&self) -> [u8; 24] {
        let mut c = [0u8; 24];
        c[0..8].copy_from_slice(&self.capacity.to_le_bytes());
        c[8..12].copy_from_slice(&SIZE_MAX.to_le_bytes());
        c[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        // 16..20: geometry, not offered.
        c[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        c
    }

    /// Step 1: turns a chain (or a chain the queue could not walk) into a
    /// request. Reads guest memory, never writes it.
    pub fn parse(&self, chain: Result<DescChain, ChainError>, ram: &GuestRam) -> BlkRequest {
        let chain = match chain {
            Ok(c) => c,
            Err(e) => return BlkRequest { head: e.head, op: done(VIRTIO_BLK_S_IOERR), writable: Vec::new() },
        };
        let writable: Vec<Desc> = chain.writable().copied().collect();
        let wlen: u64 = writable.iter().map(|d| d.len as u64).sum();
        let op = if wlen == 0 {
            // No status byte: nothing can be reported; the request is dropped.
            done(VIRTIO_BLK_S_IOERR)
        } else {
            self.parse_op(&chain, wlen - 1, ram)
        };
        BlkRequest { head: chain.head, op, writable }
    }

    /// `room`: writable bytes before the status byte.
    fn parse_op(&self, chain: &DescChain, room: u64, ram: &GuestRam) -> BlkOp {
        let rlen = chain.readable_len();
        let Ok(hdr) = chain.read_readable(ram, 0, HEADER_BYTES as usize) else {
            return done(VIRTIO_BLK_S_IOERR);
        };
        let ty = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
        let sector = u64::from_le_bytes(hdr[8..16].try_into().unwrap());
        match ty {
            VIRTIO_BLK_T_IN => match self.range(sector, room) {
                Some(offset) if writable_in_ram(chain, ram) => BlkOp::Read { offset, len: room as u32 },
                _ => done(VIRTIO_BLK_S_IOERR),
            },
            VIRTIO_BLK_T_OUT => {
                let len = rlen - HEADER_BYTES;
                if self.read_only {
                    return done(VIRTIO_BLK_S_IOERR);
                }
                match self.range(sector, len) {
                    Some(offset) => match chain.read_readable(ram, HEADER_BYTES, len as usize) {
                        Ok(data) => BlkOp::Write { offset, data },
                        Err(_) => done(VIRTIO_BLK_S_IOERR),
                    },
                    None => done(VIRTIO_BLK_S_IOERR),
                }
            }
            VIRTIO_BLK_T_FLUSH => BlkOp::Flush,
            VIRTIO_BLK_T_GET_ID => {
                let n = (room as usize).min(ID_BYTES);
                BlkOp::Done { status: VIRTIO_BLK_S_OK, data: self.id[..n].to_vec() }
            }
            _ => done(VIRTIO_BLK_S_UNSUPP),
        }
    }

    /// Byte offset of a `len`-byte transfer at `sector`, if it is whole
    /// sectors, not oversize, and inside the disk.
    fn range(&self, sector: u64, len: u64) -> Option<u64> {
        if !len.is_multiple_of(SECTOR_SIZE) || len > MAX_REQUEST_BYTES {
            return None;
        }
        let end = sector.checked_add(len / SECTOR_SIZE)?;
        if end > self.capacity {
            return None;
        }
        Some(sector * SECTOR_SIZE)
    }

    /// Takes every available chain from `queue` as parsed requests.
    pub fn take_requests(&self, queue: &mut Queue, ram: &GuestRam) -> Vec<BlkRequest> {
        let mut out = Vec::new();
        // At most one ring's worth per call, so a driver that keeps adding
        // cannot keep us here; it will kick again.
        for _ in 0..queue.size.max(1) {
            match queue.pop(ram) {
                Some(chain) => out.push(self.parse(chain, ram)),
                None => break,
            }
        }
        out
    }

    /// Step 1 for every available chain: requests that need the host go to
    /// `out` and wait in flight; the others complete now.
    fn submit(&mut self, queue: &mut Queue, ram: &GuestRam, out: &mut Vec<IoRequest>) {
        for req in self.take_requests(queue, ram) {
            if let BlkOp::Done { status, data } = &req.op {
                let result = BlkResult { status: *status, data: data.clone() };
                complete(&req, &result, queue, ram);
                continue;
            }
            let tag = self.next_tag;
            self.next_tag = self.next_tag.wrapping_add(1);
            out.push(IoRequest::Disk { tag, op: req.op.clone() });
            self.in_flight.insert(tag, req);
        }
    }
}

fn done(status: u8) -> BlkOp {
    BlkOp::Done { status, data: Vec::new() }
}

/// Checked before reading the disk so a bad buffer fails the request
/// instead of half-completing it.
fn writable_in_ram(chain: &DescChain, ram: &GuestRam) -> bool {
    chain.writable().all(|d| ram.offset_of(d.addr, d.len as u64).is_some())
}

impl VirtioDevice for BlkDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let mut f = VIRTIO_BLK_F_SIZE_MAX | VIRTIO_BLK_F_SEG_MAX | VIRTIO_BLK_F_BLK_SIZE | VIRTIO_BLK_F_FLUSH;
        if self.read_only {
            f |= VIRTIO_BLK_F_RO;
        }
        f
    }

    fn num_queues(&self) -> usize {
        1
    }

    fn queue_max_size(&self, _queue: usize) -> u16 {
        QUEUE_SIZE
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        config_read_bytes(&self.config(), offset, data);
    }

    /// Nothing in our config space is writable (no CONFIG_WCE).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, features: u64) {
        self.features = features;
    }

    fn queue_notify(&mut self, queue: usize, queues: &mut [Queue], ram: &GuestRam, out: &mut Vec<IoRequest>) {
        if let Some(q) = queues.get_mut(queue) {
            self.submit(q, ram, out);
        }
    }

    fn complete(&mut self, c: IoCompletion, queues: &mut [Queue], ram: &GuestRam, _out: &mut Vec<IoRequest>) -> bool {
        let IoCompletion::Disk { tag, result } = c else {
            return false;
        };
        let Some(req) = self.in_flight.remove(&tag) else {
            return false;
        };
        // A read's data must be the length asked for; anything else from a
        // host (or a log) is an I/O error, not a short read.
        let result = match &req.op {
            BlkOp::Read { len, .. } if result.status == VIRTIO_BLK_S_OK && result.data.len() != *len as usize => {
                BlkResult { status: VIRTIO_BLK_S_IOERR, data: Vec::new() }
            }
            _ => result,
        };
        if let Some(q) = queues.get_mut(0) {
            complete(&req, &result, q, ram);
        }
        true
    }

    fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    fn in_flight(&self) -> Vec<IoRequest> {
        self.in_flight.iter().map(|(&tag, r)| IoRequest::Disk { tag, op: r.op.clone() }).collect()
    }

    fn reset(&mut self) {
        self.features = 0;
        self.in_flight.clear();
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut w = SnapWriter::new(b"VBLK", 2);
        w.u64(self.capacity);
        w.bool(self.read_only);
        w.u64(self.features);
        w.u32(self.next_tag);
        w.u32(self.in_flight.len() as u32);
        for (&tag, req) in &self.in_flight {
            w.u32(tag);
            save_request(&mut w, req);
        }
        w.finish()
    }

    fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"VBLK")?;
        if version != 2 {
            return Err(SnapshotError::Version { device: "virtio-blk", version });
        }
        let capacity = r.u64()?;
        let read_only = r.bool()?;
        let features = r.u64()?;
        let next_tag = r.u32()?;
        let n = r.u32()?;
        let mut in_flight = BTreeMap::new();
        for _ in 0..n {
            let tag = r.u32()?;
            in_flight.insert(tag, load_request(&mut r)?);
        }
        r.end()?;
        if capacity != self.capacity || read_only != self.read_only {
            return Err(SnapshotError::OtherDisk);
        }
        self.features = features;
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

fn save_request(w: &mut SnapWriter, req: &BlkRequest) {
    w.u16(req.head);
    w.u32(req.writable.len() as u32);
    for d in &req.writable {
        w.u64(d.addr);
        w.u32(d.len);
    }
    save_op(w, &req.op);
}

fn load_request(r: &mut SnapReader) -> SnapResult<BlkRequest> {
    let head = r.u16()?;
    let n = r.u32()?;
    if n > u16::MAX as u32 {
        return Err(SnapshotError::TooManyBuffers { device: "virtio-blk" });
    }
    let mut writable = Vec::with_capacity(n as usize);
    for _ in 0..n {
        writable.push(Desc { addr: r.u64()?, len: r.u32()?, writable: true });
    }
    Ok(BlkRequest { head, op: load_op(r)?, writable })
}

/// A disk operation in a snapshot or a log.
pub fn save_op(w: &mut SnapWriter, op: &BlkOp) {
    match op {
        BlkOp::Read { offset, len } => {
            w.u8(0);
            w.u64(*offset);
            w.u32(*len);
        }
        BlkOp::Write { offset, data } => {
            w.u8(1);
            w.u64(*offset);
            w.bytes(data);
        }
        BlkOp::Flush => w.u8(2),
        BlkOp::Done { status, data } => {
            w.u8(3);
            w.u8(*status);
            w.bytes(data);
        }
    }
}

pub fn load_op(r: &mut SnapReader) -> SnapResult<BlkOp> {
    Ok(match r.u8()? {
        0 => BlkOp::Read { offset: r.u64()?, len: r.u32()? },
        1 => BlkOp::Write { offset: r.u64()?, data: r.bytes()?.to_vec() },
        2 => BlkOp::Flush,
        3 => BlkOp::Done { status: r.u8()?, data: r.bytes()?.to_vec() },
        k => return Err(SnapshotError::DiskOperation(k)),
    })
}
