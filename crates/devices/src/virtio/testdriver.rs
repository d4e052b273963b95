//! A fake virtio driver for unit tests: it lays out split rings in a
//! `GuestRam`, talks to a transport through MMIO exactly as a guest would,
//! and can also write garbage where a buggy guest would.

use ftvm_memory::GuestRam;

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
    pub qsize: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    next_desc: u16,
    avail_idx: u16,
    last_used: u16,
    heap: u64,
}

/// A buffer of a chain: guest address, length, device-writable.
pub type Buf = (u64, u32, bool);

impl TestDriver {
    pub fn new(dev: VirtioMmio) -> Self {
        TestDriver {
            ram: GuestRam::new(RAM_BASE, RAM_SIZE),
            irq: IrqLines::default(),
            dev,
            qsize: 0,
            desc: RAM_BASE,
            avail: RAM_BASE + 0x10000,
            used: RAM_BASE + 0x20000,
            next_desc: 0,
            avail_idx: 0,
            last_used: 0,
            heap: RAM_BASE + 0x40000,
        }
    }

    pub fn r32(&mut self, off: u64) -> u32 {
        let mut ctx = DeviceCtx {
            ram: &mut self.ram,
            irq: &mut self.irq,
        };
        self.dev.read(off, 4, &mut ctx) as u32
    }

    pub fn w32(&mut self, off: u64, v: u32) {
        let mut ctx = DeviceCtx {
            ram: &mut self.ram,
            irq: &mut self.irq,
        };
        self.dev.write(off, 4, v as u64, &mut ctx)
    }

    pub fn read_config(&mut self, off: u64, size: u8) -> u64 {
        let mut ctx = DeviceCtx {
            ram: &mut self.ram,
            irq: &mut self.irq,
        };
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

    /// The Linux probe sequence, accepting `want` & offered; returns the
    /// status read back after DRIVER_OK.
    pub fn init(&mut self, want: u64, qsize: u16) -> u32 {
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
        self.w32(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        if self.r32(REG_STATUS) & STATUS_FEATURES_OK == 0 {
            return self.r32(REG_STATUS);
        }
        self.setup_queue(0, qsize);
        self.w32(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
        self.r32(REG_STATUS)
    }

    pub fn all_features() -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_F_RING_INDIRECT_DESC | VIRTIO_F_RING_EVENT_IDX | 0xffffff
    }

    pub fn setup_queue(&mut self, q: u32, qsize: u16) {
        self.w32(REG_QUEUE_SEL, q);
        assert!(self.r32(REG_QUEUE_NUM_MAX) >= qsize as u32);
        assert_eq!(self.r32(REG_QUEUE_READY), 0);
        self.qsize = qsize;
        self.w32(REG_QUEUE_NUM, qsize as u32);
        for (lo, hi, a) in [
            (REG_QUEUE_DESC_LOW, REG_QUEUE_DESC_HIGH, self.desc),
            (REG_QUEUE_DRIVER_LOW, REG_QUEUE_DRIVER_HIGH, self.avail),
            (REG_QUEUE_DEVICE_LOW, REG_QUEUE_DEVICE_HIGH, self.used),
        ] {
            self.w32(lo, a as u32);
            self.w32(hi, (a >> 32) as u32);
        }
        self.w32(REG_QUEUE_READY, 1);
        assert_eq!(self.r32(REG_QUEUE_READY), 1);
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

    /// Makes a chain available (directly or through one indirect table)
    /// and returns its head; does not kick.
    pub fn post(&mut self, bufs: &[Buf], indirect: bool) -> u16 {
        let head = self.next_desc;
        if indirect {
            let table = self.alloc(16 * bufs.len() as u64);
            for (i, &(a, l, w)) in bufs.iter().enumerate() {
                let mut flags = if w { VIRTQ_DESC_F_WRITE } else { 0 };
                if i + 1 < bufs.len() {
                    flags |= VIRTQ_DESC_F_NEXT;
                }
                self.write_desc(table, i as u16, a, l, flags, i as u16 + 1);
            }
            self.write_desc(
                self.desc,
                head,
                table,
                16 * bufs.len() as u32,
                VIRTQ_DESC_F_INDIRECT,
                0,
            );
            self.next_desc = (self.next_desc + 1) % self.qsize;
        } else {
            for (i, &(a, l, w)) in bufs.iter().enumerate() {
                let idx = self.next_desc;
                let next = (idx + 1) % self.qsize;
                let mut flags = if w { VIRTQ_DESC_F_WRITE } else { 0 };
                if i + 1 < bufs.len() {
                    flags |= VIRTQ_DESC_F_NEXT;
                }
                self.write_desc(self.desc, idx, a, l, flags, next);
                self.next_desc = next;
            }
        }
        self.push_avail(head);
        head
    }

    pub fn push_avail(&mut self, head: u16) {
        let slot = (self.avail_idx % self.qsize) as u64;
        self.ram.write_u16(self.avail + 4 + 2 * slot, head).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.ram.write_u16(self.avail + 2, self.avail_idx).unwrap();
    }

    /// Sets the avail idx to anything, as a buggy driver might.
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.ram.write_u16(self.avail + 2, idx).unwrap();
    }

    pub fn kick(&mut self, q: u32) {
        self.w32(REG_QUEUE_NOTIFY, q);
    }

    /// Next entry of the used ring: (id, len).
    pub fn pop_used(&mut self) -> Option<(u32, u32)> {
        let idx = self.ram.read_u16(self.used + 2).unwrap();
        if idx == self.last_used {
            return None;
        }
        let slot = (self.last_used % self.qsize) as u64;
        let id = self.ram.read_u32(self.used + 4 + 8 * slot).unwrap();
        let len = self.ram.read_u32(self.used + 8 + 8 * slot).unwrap();
        self.last_used = self.last_used.wrapping_add(1);
        Some((id, len))
    }

    /// Acknowledges every pending interrupt.
    pub fn ack(&mut self) -> u32 {
        let s = self.r32(REG_INTERRUPT_STATUS);
        self.w32(REG_INTERRUPT_ACK, s);
        s
    }

    /// `avail_event` as published by the device (EVENT_IDX).
    pub fn avail_event(&self) -> u16 {
        self.ram
            .read_u16(self.used + 4 + 8 * self.qsize as u64)
            .unwrap()
    }

    /// `used_event` (EVENT_IDX): interrupt me when used idx passes this.
    pub fn set_used_event(&mut self, v: u16) {
        self.ram
            .write_u16(self.avail + 4 + 2 * self.qsize as u64, v)
            .unwrap();
    }

    pub fn set_avail_flags(&mut self, v: u16) {
        self.ram.write_u16(self.avail, v).unwrap();
    }
}
