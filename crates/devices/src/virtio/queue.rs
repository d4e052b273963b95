//! Split virtqueues (virtio 1.2 §2.7), device side: taking descriptor
//! chains the driver made available, returning them through the used ring,
//! and deciding whether the driver wants an interrupt (VIRTIO_F_EVENT_IDX
//! or the NO_INTERRUPT flag).
//!
//! Our own code rather than rust-vmm's virtio-queue because that crate is
//! written against vm-memory's `GuestMemory` trait, which [`GuestRam`] does
//! not implement (it keeps a single region with a non-atomic dirty bitmap,
//! see ftvm-memory). Every ring access goes through `GuestRam`'s checked
//! accessors so device DMA marks pages dirty.
//!
//! Guest mistakes never panic: a ring that cannot be read or written marks
//! the queue broken (the transport then reports DEVICE_NEEDS_RESET), and a
//! malformed chain (bad index, loop, bad indirect table) comes back as a
//! [`ChainError`] carrying its head so the device can still return it.

use ftvm_memory::{GuestRam, OutOfRange};

use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};

pub const VIRTQ_DESC_F_NEXT: u16 = 1;
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
pub const VIRTQ_DESC_F_INDIRECT: u16 = 4;
pub const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Largest queue size of a split virtqueue.
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Largest indirect table we walk. The spec sets no limit; this bounds the
/// host memory a guest can make us allocate for one chain.
pub const MAX_INDIRECT: u32 = 1024;

/// One buffer of a chain, after indirect tables have been flattened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    /// Device-writable (VIRTQ_DESC_F_WRITE).
    pub writable: bool,
}

/// A descriptor chain taken from the available ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescChain {
    pub head: u16,
    pub descs: Vec<Desc>,
}

/// A chain that cannot be walked; `head` is valid and must still be
/// returned through the used ring (normally with length 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainError {
    pub head: u16,
    pub reason: &'static str,
}

impl DescChain {
    pub fn readable(&self) -> impl Iterator<Item = &Desc> {
        self.descs.iter().filter(|d| !d.writable)
    }

    pub fn writable(&self) -> impl Iterator<Item = &Desc> {
        self.descs.iter().filter(|d| d.writable)
    }

    pub fn readable_len(&self) -> u64 {
        self.readable().map(|d| d.len as u64).sum()
    }

    pub fn writable_len(&self) -> u64 {
        self.writable().map(|d| d.len as u64).sum()
    }

    /// Copies `len` bytes of the device-readable buffers, starting `offset`
    /// bytes into them (the buffers taken as one byte stream).
    pub fn read_readable(&self, ram: &GuestRam, offset: u64, len: usize) -> Result<Vec<u8>, OutOfRange> {
        let mut out = Vec::with_capacity(len);
        gather(self.readable(), offset, len, |addr, n| {
            out.extend_from_slice(ram.slice(addr, n as u64)?);
            Ok(())
        })?;
        if out.len() != len {
            return Err(OutOfRange { addr: 0, len: len as u64 });
        }
        Ok(out)
    }
}

/// Writes `data` into a sequence of device-writable buffers, starting
/// `offset` bytes into them. Fails without partial effects beyond what was
/// already written if a buffer lies outside RAM or the buffers are too short.
pub fn write_buffers(descs: &[Desc], ram: &GuestRam, offset: u64, data: &[u8]) -> Result<(), OutOfRange> {
    let mut done = 0usize;
    gather(descs.iter(), offset, data.len(), |addr, n| {
        ram.write(addr, &data[done..done + n])?;
        done += n;
        Ok(())
    })?;
    if done != data.len() {
        return Err(OutOfRange { addr: 0, len: data.len() as u64 });
    }
    Ok(())
}

/// Visits the pieces `(guest address, length)` covering `len` bytes that
/// start `offset` bytes into the concatenation of `descs`.
fn gather<'a>(
    descs: impl Iterator<Item = &'a Desc>,
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(u64, usize) -> Result<(), OutOfRange>,
) -> Result<(), OutOfRange> {
    let mut left = len as u64;
    for d in descs {
        if left == 0 {
            break;
        }
        let dlen = d.len as u64;
        if offset >= dlen {
            offset -= dlen;
            continue;
        }
        let n = (dlen - offset).min(left);
        let addr = d.addr.checked_add(offset).ok_or(OutOfRange { addr: d.addr, len: dlen })?;
        f(addr, n as usize)?;
        left -= n;
        offset = 0;
    }
    Ok(())
}

/// Device-side state of one split virtqueue, as configured through the
/// transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    pub max_size: u16,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    /// VIRTIO_F_EVENT_IDX was negotiated.
    pub event_idx: bool,
    next_avail: u16,
    next_used: u16,
    /// `next_used` when we last decided whether to interrupt.
    signalled_used: u16,
    broken: bool,
}

impl Queue {
    pub fn new(max_size: u16) -> Self {
        let max_size = max_size.clamp(1, MAX_QUEUE_SIZE);
        Queue {
            max_size,
            size: max_size,
            ready: false,
            desc_table: 0,
            avail_ring: 0,
            used_ring: 0,
            event_idx: false,
            next_avail: 0,
            next_used: 0,
            signalled_used: 0,
            broken: false,
        }
    }

    /// Back to the state after device reset.
    pub fn reset(&mut self) {
        *self = Queue::new(self.max_size);
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    pub fn next_avail(&self) -> u16 {
        self.next_avail
    }

    pub fn next_used(&self) -> u16 {
        self.next_used
    }

    /// Whether size and ring addresses describe rings that lie in RAM with
    /// the alignment the spec requires.
    pub fn is_valid(&self, ram: &GuestRam) -> bool {
        let n = self.size as u64;
        self.size != 0
            && self.size <= self.max_size
            && self.size.is_power_of_two()
            && self.desc_table.is_multiple_of(16)
            && self.avail_ring.is_multiple_of(2)
            && self.used_ring.is_multiple_of(4)
            && ram.offset_of(self.desc_table, 16 * n).is_some()
            && ram.offset_of(self.avail_ring, 6 + 2 * n).is_some()
            && ram.offset_of(self.used_ring, 6 + 8 * n).is_some()
    }

    /// Starts using the rings; an invalid layout leaves the queue broken.
    pub fn enable(&mut self, ram: &GuestRam, event_idx: bool) {
        self.ready = true;
        self.event_idx = event_idx;
        self.next_avail = 0;
        self.next_used = 0;
        self.signalled_used = 0;
        self.broken = !self.is_valid(ram);
    }

    fn break_queue<T>(&mut self) -> Option<T> {
        self.broken = true;
        None
    }

    /// Tells an EVENT_IDX driver how far we have consumed, so it kicks us
    /// again when it adds beyond that.
    fn publish_avail_event(&mut self, ram: &GuestRam) {
        if self.event_idx {
            let at = self.used_ring.wrapping_add(4 + 8 * self.size as u64);
            if ram.write_u16(at, self.next_avail).is_err() {
                self.broken = true;
            }
        }
    }

    /// Whether the driver has made chains available that we have not taken.
    pub fn has_available(&self, ram: &GuestRam) -> bool {
        self.ready && !self.broken && ram.read_u16(self.avail_ring.wrapping_add(2)).is_ok_and(|i| i != self.next_avail)
    }

    /// Takes the next available chain. `None` when there is none, or when
    /// the queue is not ready or broken.
    pub fn pop(&mut self, ram: &GuestRam) -> Option<Result<DescChain, ChainError>> {
        if !self.ready || self.broken {
            return None;
        }
        let Ok(avail_idx) = ram.read_u16(self.avail_ring.wrapping_add(2)) else {
            return self.break_queue();
        };
        let outstanding = avail_idx.wrapping_sub(self.next_avail);
        if outstanding == 0 {
            self.publish_avail_event(ram);
            return None;
        }
        if outstanding > self.size {
            // The driver claims more chains than the ring holds.
            return self.break_queue();
        }
        let slot = (self.next_avail % self.size) as u64;
        let Ok(head) = ram.read_u16(self.avail_ring.wrapping_add(4 + 2 * slot)) else {
            return self.break_queue();
        };
        if head >= self.size {
            // Not even a head we could return: the ring is garbage.
            return self.break_queue();
        }
        self.next_avail = self.next_avail.wrapping_add(1);
        self.publish_avail_event(ram);
        Some(self.walk(ram, head))
    }

    fn walk(&self, ram: &GuestRam, head: u16) -> Result<DescChain, ChainError> {
        let fail = |reason| Err(ChainError { head, reason });
        let mut descs = Vec::new();
        let mut table = self.desc_table;
        let mut table_len = self.size as u32;
        let mut idx = head as u32;
        let mut in_indirect = false;
        // Descriptors visited in the current table; more than the table
        // holds means the `next` links form a loop.
        let mut visited = 0u32;
        loop {
            if idx >= table_len {
                return fail("descriptor index out of range");
            }
            let mut raw = [0u8; 16];
            let at = table.checked_add(16 * idx as u64);
            if at.is_none_or(|at| ram.read(at, &mut raw).is_err()) {
                return fail("descriptor table outside RAM");
            }
            let addr = u64::from_le_bytes(raw[0..8].try_into().unwrap());
            let len = u32::from_le_bytes(raw[8..12].try_into().unwrap());
            let flags = u16::from_le_bytes(raw[12..14].try_into().unwrap());
            let next = u16::from_le_bytes(raw[14..16].try_into().unwrap());
            visited += 1;
            if visited > table_len {
                return fail("descriptor chain loops");
            }
            if flags & VIRTQ_DESC_F_INDIRECT != 0 {
                if in_indirect {
                    return fail("nested indirect table");
                }
                if flags & VIRTQ_DESC_F_NEXT != 0 {
                    return fail("indirect descriptor with NEXT");
                }
                if len == 0 || len % 16 != 0 || len / 16 > MAX_INDIRECT {
                    return fail("bad indirect table length");
                }
                in_indirect = true;
                table = addr;
                table_len = len / 16;
                idx = 0;
                visited = 0;
                continue;
            }
            descs.push(Desc { addr, len, writable: flags & VIRTQ_DESC_F_WRITE != 0 });
            if flags & VIRTQ_DESC_F_NEXT == 0 {
                return Ok(DescChain { head, descs });
            }
            idx = next as u32;
        }
    }

    /// Returns a chain to the driver with `len` bytes written into it.
    pub fn add_used(&mut self, ram: &GuestRam, head: u16, len: u32) {
        if !self.ready || self.broken {
            return;
        }
        let slot = (self.next_used % self.size) as u64;
        let elem = self.used_ring.wrapping_add(4 + 8 * slot);
        let mut e = [0u8; 8];
        e[0..4].copy_from_slice(&(head as u32).to_le_bytes());
        e[4..8].copy_from_slice(&len.to_le_bytes());
        let new = self.next_used.wrapping_add(1);
        if ram.write(elem, &e).is_err() || ram.write_u16(self.used_ring.wrapping_add(2), new).is_err() {
            self.broken = true;
            return;
        }
        self.next_used = new;
    }

    /// Whether chains returned since the last call deserve an interrupt.
    /// Call once after a batch of [`Queue::add_used`].
    pub fn needs_interrupt(&mut self, ram: &GuestRam) -> bool {
        if !self.ready || self.next_used == self.signalled_used {
            return false;
        }
        let old = self.signalled_used;
        let new = self.next_used;
        self.signalled_used = new;
        if self.event_idx {
            let at = self.avail_ring.wrapping_add(4 + 2 * self.size as u64);
            match ram.read_u16(at) {
                // vring_need_event: did `used_event` fall in (old, new]?
                Ok(used_event) => new.wrapping_sub(used_event).wrapping_sub(1) < new.wrapping_sub(old),
                Err(_) => true,
            }
        } else {
            ram.read_u16(self.avail_ring).map_or(true, |f| f & VIRTQ_AVAIL_F_NO_INTERRUPT == 0)
        }
    }

    pub fn save(&self, w: &mut SnapWriter) {
        w.u16(self.max_size);
        w.u16(self.size);
        w.bool(self.ready);
        w.u64(self.desc_table);
        w.u64(self.avail_ring);
        w.u64(self.used_ring);
        w.bool(self.event_idx);
        w.u16(self.next_avail);
        w.u16(self.next_used);
        w.u16(self.signalled_used);
        w.bool(self.broken);
    }

    pub fn load(&mut self, r: &mut SnapReader) -> SnapResult<()> {
        let max_size = r.u16()?;
        if max_size != self.max_size {
            return Err(SnapshotError::QueueMaxSize { saved: max_size, actual: self.max_size });
        }
        let q = Queue {
            max_size,
            size: r.u16()?,
            ready: r.bool()?,
            desc_table: r.u64()?,
            avail_ring: r.u64()?,
            used_ring: r.u64()?,
            event_idx: r.bool()?,
            next_avail: r.u16()?,
            next_used: r.u16()?,
            signalled_used: r.u16()?,
            broken: r.bool()?,
        };
        // A ready queue with a zero size would make the ring arithmetic
        // divide by zero; only a corrupt snapshot can say so.
        if q.ready && !q.broken && (q.size == 0 || q.size > q.max_size) {
            return Err(SnapshotError::QueueSize);
        }
        *self = q;
        Ok(())
    }
}
