//! A fake virtio driver for unit tests: it lays out split rings in a
//! `GuestRam`, talks to a transport through MMIO exactly as a guest would,
//! and can also write garbage where a buggy guest would.

use ftvm_memory::GuestRam;

use crate::io::{IoCompletion, IoRequest};
use crate::virtio::blk::{execute, BlockBackend};

use super::mmio::*;
use super::queue::{VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use super::{VirtioMmio, VIRTIO_F_RING_EVENT_IDX, VIRTIO_F_RING_INDIRECT_DESC, VIRTIO_F_VERSION_1};
use crate::{DeviceCtx, IrqLines, MmioDevice};

pub const RAM_BASE: u64 = 0x8000_0000;
pub const RAM_SIZE: u64 = 4 << 20;
pub const IRQ: u32 = 3;

pub struct TestDriver {
    pub ram: GuestRam,
    pub irq: IrqLines,
    pub dev: VirtioMmio,
    /// Layout of queue 0, the queue the helpers without a queue argument
    /// drive. Tests may move these before `init` (rings outside RAM...).
    pub qsize: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    /// Layouts of queues 1.. (index q - 1), carved from the heap when they
    /// are set up, so each queue has its own desc/avail/used areas.
    others: Vec<Ring>,
    /// The driver's own ring indices, per queue.
    cursors: Vec<Cursor>,
    heap: u64,
    /// When set, disk requests are executed against it as soon as the
    /// device issues them, as a host with instant I/O would.
    pub disk: Option<Box<dyn BlockBackend>>,
    /// Requests the driver's host did not serve, in order.
    pub unserved: Vec<IoRequest>,
}

/// Where one queue's rings live in guest memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ring {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// Driver-side indices of one queue.
#[derive(Debug, Clone, Copy, Default)]
struct Cursor {
    next_desc: u16,
    avail_idx: u16,
    last_used: u16,
}

/// A buffer of a chain: guest address, length, device-writable.
pub type Buf = (u64, u32, bool);

impl TestDriver {
    pub fn new(dev: VirtioMmio) -> Self {
        TestDriver {
            ram: GuestRam::new(RAM_BASE, RAM_SIZE).unwrap(),
            irq: IrqLines::default(),
            dev,
            qsize: 0,
            desc: RAM_BASE,
            avail: RAM_BASE + 0x10000,
            used: RAM_BASE + 0x20000,
            others: Vec::new(),
            cursors: vec![Cursor::default()],
            heap: RAM_BASE + 0x40000,
            disk: None,
            unserved: Vec::new(),
        }
    }

    pub fn r32(&mut self, off: u64) -> u32 {
        let mut ctx = DeviceCtx { ram: &mut self.ram, irq: &mut self.irq };
        self.dev.read(off, 4, &mut ctx) as u32
    }

    pub fn w32(&mut self, off: u64, v: u32) {
        let mut ctx = DeviceCtx { ram: &mut self.ram, irq: &mut self.irq };
        self.dev.write(off, 4, v as u64, &mut ctx);
        self.serve();
    }

    /// Executes the requests the device issued (disk ones against
    /// [`TestDriver::disk`], if set) and applies their completions.
    pub fn serve(&mut self) {
        for req in self.dev.take_requests() {
            match (req, self.disk.as_deref_mut()) {
                (IoRequest::Disk { tag, op }, Some(disk)) => {
                    let result = execute(&op, disk);
                    self.dev.complete(IoCompletion::Disk { tag, result }, &self.ram, &mut self.irq);
                }
                (req, _) => self.unserved.push(req),
            }
        }
    }

    /// Applies a completion as the machine would.
    pub fn inject(&mut self, c: IoCompletion) -> bool {
        self.dev.complete(c, &self.ram, &mut self.irq)
    }

    pub fn read_config(&mut self, off: u64, size: u8) -> u64 {
        let mut ctx = DeviceCtx { ram: &mut self.ram, irq: &mut self.irq };
        self.dev.read(CONFIG_SPACE + off, size, &mut ctx)
    }

    pub fn line(&self) -> bool {
        self.irq.get(IRQ)
    }

    pub fn device_features(&mut self) -> u64 {
        self.w32(REG_DEVICE_FEATURES_SEL, 0);
        let lo = self.r32(REG_DEVICE_FEATURES) as u64;
        self.w32(REG_DEVICE_FEATURES_SEL, 1);
        let hi = self.r32(REG_DEVICE_FEATURES) as u64;
        (hi << 32) | lo
    }

    /// The Linux probe sequence, accepting `want` & offered and setting up
    /// queue 0 with `qsize` entries; returns the status read back after
    /// DRIVER_OK.
    pub fn init(&mut self, want: u64, qsize: u16) -> u32 {
        self.init_queues(want, &[qsize])
    }

    /// As [`TestDriver::init`], setting up queues 0, 1, ... with the
    /// given sizes.
    pub fn init_queues(&mut self, want: u64, sizes: &[u16]) -> u32 {
        assert_eq!(self.r32(REG_MAGIC), MAGIC);
        assert_eq!(self.r32(REG_VERSION), 2);
        self.w32(REG_STATUS, 0);
        self.w32(REG_STATUS, STATUS_ACKNOWLEDGE);
        self.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        let feats = self.device_features() & want;
        self.w32(REG_DRIVER_FEATURES_SEL, 0);
        self.w32(REG_DRIVER_FEATURES, feats as u32);
        self.w32(REG_DRIVER_FEATURES_SEL, 1);
        self.w32(REG_DRIVER_FEATURES, (feats >> 32) as u32);
        self.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK);
        if self.r32(REG_STATUS) & STATUS_FEATURES_OK == 0 {
            return self.r32(REG_STATUS);
        }
        for (q, &size) in sizes.iter().enumerate() {
            self.setup_queue(q as u32, size);
        }
        self.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
        self.r32(REG_STATUS)
    }

    pub fn all_features() -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_F_RING_INDIRECT_DESC | VIRTIO_F_RING_EVENT_IDX | 0xffffff
    }

    /// Lays out queue `q` (queue 0 where [`TestDriver::desc`] etc. say,
    /// others in fresh heap memory), starts the driver's indices from zero
    /// with zeroed rings, and enables it.
    pub fn setup_queue(&mut self, q: u32, qsize: u16) {
        self.w32(REG_QUEUE_SEL, q);
        assert!(self.r32(REG_QUEUE_NUM_MAX) >= qsize as u32);
        assert_eq!(self.r32(REG_QUEUE_READY), 0);
        let ring = if q == 0 {
            self.qsize = qsize;
            self.ring(0)
        } else {
            let n = qsize as u64;
            let ring = Ring {
                size: qsize,
                desc: self.alloc(16 * n),
                avail: self.alloc(6 + 2 * n),
                used: self.alloc(6 + 8 * n),
            };
            let i = q as usize - 1;
            if self.others.len() <= i {
                self.others.resize(i + 1, Ring::default());
            }
            self.others[i] = ring;
            ring
        };
        *self.cursor(q as usize) = Cursor::default();
        // Fresh rings, as a driver's zeroed allocation would be; rings a
        // test put outside RAM stay as they are.
        let _ = self.ram.write(ring.avail, &[0; 4]);
        let _ = self.ram.write(ring.used, &[0; 4]);
        self.w32(REG_QUEUE_NUM, qsize as u32);
        for (lo, hi, a) in [
            (REG_QUEUE_DESC_LOW, REG_QUEUE_DESC_HIGH, ring.desc),
            (REG_QUEUE_DRIVER_LOW, REG_QUEUE_DRIVER_HIGH, ring.avail),
            (REG_QUEUE_DEVICE_LOW, REG_QUEUE_DEVICE_HIGH, ring.used),
        ] {
            self.w32(lo, a as u32);
            self.w32(hi, (a >> 32) as u32);
        }
        self.w32(REG_QUEUE_READY, 1);
        assert_eq!(self.r32(REG_QUEUE_READY), 1);
    }

    /// Where queue `q`'s rings are (size 0 for a queue never set up).
    pub fn ring(&self, q: usize) -> Ring {
        if q == 0 {
            return Ring { size: self.qsize, desc: self.desc, avail: self.avail, used: self.used };
        }
        self.others.get(q - 1).copied().unwrap_or_default()
    }

    fn cursor(&mut self, q: usize) -> &mut Cursor {
        if self.cursors.len() <= q {
            self.cursors.resize(q + 1, Cursor::default());
        }
        &mut self.cursors[q]
    }

    /// Bump allocation of guest buffers (16-byte aligned).
    pub fn alloc(&mut self, len: u64) -> u64 {
        let a = self.heap;
        self.heap = (self.heap + len + 15) & !15;
        assert!(self.heap <= RAM_BASE + RAM_SIZE, "test heap exhausted");
        a
    }

    pub fn alloc_with(&mut self, data: &[u8]) -> u64 {
        let a = self.alloc(data.len() as u64);
        self.ram.write(a, data).unwrap();
        a
    }

    pub fn write_desc(&mut self, table: u64, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = table + 16 * idx as u64;
        self.ram.write_u64(at, addr).unwrap();
        self.ram.write_u32(at + 8, len).unwrap();
        self.ram.write_u16(at + 12, flags).unwrap();
        self.ram.write_u16(at + 14, next).unwrap();
    }

    /// Makes a chain available on queue 0 (directly or through one
    /// indirect table) and returns its head; does not kick.
    pub fn post(&mut self, bufs: &[Buf], indirect: bool) -> u16 {
        self.post_on(0, bufs, indirect)
    }

    /// [`TestDriver::post`] on queue `q`.
    pub fn post_on(&mut self, q: usize, bufs: &[Buf], indirect: bool) -> u16 {
        let ring = self.ring(q);
        let head = self.cursor(q).next_desc;
        if indirect {
            let table = self.alloc(16 * bufs.len() as u64);
            for (i, &(a, l, w)) in bufs.iter().enumerate() {
                let mut flags = if w { VIRTQ_DESC_F_WRITE } else { 0 };
                if i + 1 < bufs.len() {
                    flags |= VIRTQ_DESC_F_NEXT;
                }
                self.write_desc(table, i as u16, a, l, flags, i as u16 + 1);
            }
            self.write_desc(ring.desc, head, table, 16 * bufs.len() as u32, VIRTQ_DESC_F_INDIRECT, 0);
            self.cursor(q).next_desc = (head + 1) % ring.size;
        } else {
            for (i, &(a, l, w)) in bufs.iter().enumerate() {
                let idx = self.cursor(q).next_desc;
                let next = (idx + 1) % ring.size;
                let mut flags = if w { VIRTQ_DESC_F_WRITE } else { 0 };
                if i + 1 < bufs.len() {
                    flags |= VIRTQ_DESC_F_NEXT;
                }
                self.write_desc(ring.desc, idx, a, l, flags, next);
                self.cursor(q).next_desc = next;
            }
        }
        self.push_avail_on(q, head);
        head
    }

    pub fn push_avail(&mut self, head: u16) {
        self.push_avail_on(0, head);
    }

    pub fn push_avail_on(&mut self, q: usize, head: u16) {
        let ring = self.ring(q);
        let c = self.cursor(q);
        let slot = (c.avail_idx % ring.size) as u64;
        c.avail_idx = c.avail_idx.wrapping_add(1);
        let idx = c.avail_idx;
        self.ram.write_u16(ring.avail + 4 + 2 * slot, head).unwrap();
        self.ram.write_u16(ring.avail + 2, idx).unwrap();
    }

    /// Sets queue 0's avail idx to anything, as a buggy driver might.
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.set_avail_idx_on(0, idx);
    }

    pub fn set_avail_idx_on(&mut self, q: usize, idx: u16) {
        self.cursor(q).avail_idx = idx;
        let avail = self.ring(q).avail;
        self.ram.write_u16(avail + 2, idx).unwrap();
    }

    pub fn kick(&mut self, q: u32) {
        self.w32(REG_QUEUE_NOTIFY, q);
    }

    /// Next entry of queue 0's used ring: (id, len).
    pub fn pop_used(&mut self) -> Option<(u32, u32)> {
        self.pop_used_on(0)
    }

    pub fn pop_used_on(&mut self, q: usize) -> Option<(u32, u32)> {
        let ring = self.ring(q);
        let last = self.cursor(q).last_used;
        let idx = self.ram.read_u16(ring.used + 2).unwrap();
        if idx == last {
            return None;
        }
        let slot = (last % ring.size) as u64;
        let id = self.ram.read_u32(ring.used + 4 + 8 * slot).unwrap();
        let len = self.ram.read_u32(ring.used + 8 + 8 * slot).unwrap();
        self.cursor(q).last_used = last.wrapping_add(1);
        Some((id, len))
    }

    /// Acknowledges every pending interrupt.
    pub fn ack(&mut self) -> u32 {
        let s = self.r32(REG_INTERRUPT_STATUS);
        self.w32(REG_INTERRUPT_ACK, s);
        s
    }

    /// `avail_event` of queue 0 as published by the device (EVENT_IDX).
    pub fn avail_event(&self) -> u16 {
        self.avail_event_on(0)
    }

    pub fn avail_event_on(&self, q: usize) -> u16 {
        let ring = self.ring(q);
        self.ram.read_u16(ring.used + 4 + 8 * ring.size as u64).unwrap()
    }

    /// `used_event` of queue 0 (EVENT_IDX): interrupt me when used idx
    /// passes this.
    pub fn set_used_event(&mut self, v: u16) {
        self.set_used_event_on(0, v);
    }

    pub fn set_used_event_on(&mut self, q: usize, v: u16) {
        let ring = self.ring(q);
        self.ram.write_u16(ring.avail + 4 + 2 * ring.size as u64, v).unwrap();
    }

    pub fn set_avail_flags(&mut self, v: u16) {
        self.set_avail_flags_on(0, v);
    }

    pub fn set_avail_flags_on(&mut self, q: usize, v: u16) {
        let avail = self.ring(q).avail;
        self.ram.write_u16(avail, v).unwrap();
    }
}
