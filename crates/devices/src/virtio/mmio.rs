//! The virtio-mmio transport, version 2 ("modern", virtio 1.x, spec §4.2.2).
//! Legacy version 1 is not offered: Linux and the spec have used version 2
//! for years, and one register layout is less to get wrong. A slot with no
//! device still answers with the magic value and version and reads device
//! id 0, which is how drivers recognise an empty slot.

use std::any::Any;

use ftvm_memory::GuestRam;

use super::queue::Queue;
use super::{VirtioDevice, TRANSPORT_FEATURES, VIRTIO_F_RING_EVENT_IDX, VIRTIO_F_VERSION_1};
use crate::io::{IoCompletion, IoRequest};
use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};
use crate::{DeviceCtx, IrqLines, MmioDevice};

pub const MAGIC: u32 = 0x7472_6976; // "virt"
pub const VERSION: u32 = 2;
/// "FTVM" read little-endian; QEMU uses "QEMU".
pub const VENDOR_ID: u32 = 0x4d56_5446;

pub const REG_MAGIC: u64 = 0x000;
pub const REG_VERSION: u64 = 0x004;
pub const REG_DEVICE_ID: u64 = 0x008;
pub const REG_VENDOR_ID: u64 = 0x00c;
pub const REG_DEVICE_FEATURES: u64 = 0x010;
pub const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
pub const REG_DRIVER_FEATURES: u64 = 0x020;
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
pub const REG_QUEUE_SEL: u64 = 0x030;
pub const REG_QUEUE_NUM_MAX: u64 = 0x034;
pub const REG_QUEUE_NUM: u64 = 0x038;
pub const REG_QUEUE_READY: u64 = 0x044;
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
pub const REG_INTERRUPT_STATUS: u64 = 0x060;
pub const REG_INTERRUPT_ACK: u64 = 0x064;
pub const REG_STATUS: u64 = 0x070;
pub const REG_QUEUE_DESC_LOW: u64 = 0x080;
pub const REG_QUEUE_DESC_HIGH: u64 = 0x084;
pub const REG_QUEUE_DRIVER_LOW: u64 = 0x090;
pub const REG_QUEUE_DRIVER_HIGH: u64 = 0x094;
pub const REG_QUEUE_DEVICE_LOW: u64 = 0x0a0;
pub const REG_QUEUE_DEVICE_HIGH: u64 = 0x0a4;
pub const REG_SHM_SEL: u64 = 0x0ac;
pub const REG_SHM_LEN_LOW: u64 = 0x0b0;
pub const REG_SHM_LEN_HIGH: u64 = 0x0b4;
pub const REG_SHM_BASE_LOW: u64 = 0x0b8;
pub const REG_SHM_BASE_HIGH: u64 = 0x0bc;
pub const REG_CONFIG_GENERATION: u64 = 0x0fc;
pub const CONFIG_SPACE: u64 = 0x100;
/// End of the 4 KiB window; config space is what lies between.
pub const WINDOW_SIZE: u64 = 0x1000;

pub const STATUS_ACKNOWLEDGE: u32 = 1;
pub const STATUS_DRIVER: u32 = 2;
pub const STATUS_DRIVER_OK: u32 = 4;
pub const STATUS_FEATURES_OK: u32 = 8;
pub const STATUS_DEVICE_NEEDS_RESET: u32 = 0x40;
pub const STATUS_FAILED: u32 = 0x80;

pub const INT_USED_BUFFER: u32 = 1;
pub const INT_CONFIG_CHANGE: u32 = 2;

pub struct VirtioMmio {
    irq: u32,
    device: Option<Box<dyn VirtioDevice>>,
    queues: Vec<Queue>,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    interrupt_status: u32,
    status: u32,
    config_generation: u32,
    /// Requests for the host, in the order the device issued them.
    outbox: Vec<IoRequest>,
}

impl VirtioMmio {
    /// A slot holding `device`, raising PLIC source `irq`.
    pub fn new(device: Box<dyn VirtioDevice>, irq: u32) -> Self {
        let queues = (0..device.num_queues()).map(|i| Queue::new(device.queue_max_size(i))).collect();
        VirtioMmio {
            irq,
            device: Some(device),
            queues,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            interrupt_status: 0,
            status: 0,
            config_generation: 0,
            outbox: Vec::new(),
        }
    }

    /// An empty slot: device id 0, no queues, never interrupts.
    pub fn empty(irq: u32) -> Self {
        VirtioMmio {
            irq,
            device: None,
            queues: Vec::new(),
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            interrupt_status: 0,
            status: 0,
            config_generation: 0,
            outbox: Vec::new(),
        }
    }

    pub fn irq(&self) -> u32 {
        self.irq
    }

    pub fn irq_level(&self) -> bool {
        self.interrupt_status != 0
    }

    pub fn status(&self) -> u32 {
        self.status
    }

    pub fn interrupt_status(&self) -> u32 {
        self.interrupt_status
    }

    /// Features the driver accepted (meaningful once FEATURES_OK is set).
    pub fn driver_features(&self) -> u64 {
        self.driver_features
    }

    pub fn device_type(&self) -> u32 {
        self.device.as_ref().map_or(0, |d| d.device_type())
    }

    pub fn device_mut(&mut self) -> Option<&mut (dyn VirtioDevice + 'static)> {
        self.device.as_deref_mut()
    }

    /// The device as its concrete type, e.g. `device_as::<BlkDevice>()`.
    pub fn device_as<T: Any>(&mut self) -> Option<&mut T> {
        self.device.as_deref_mut()?.as_any_mut().downcast_mut::<T>()
    }

    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    fn device_features(&self) -> u64 {
        self.device.as_ref().map_or(0, |d| d.features() | TRANSPORT_FEATURES)
    }

    /// Runs device work outside an MMIO access (tests, tools), then raises
    /// whatever interrupts it caused. Returns `None` for an empty slot.
    pub fn with_device<R>(
        &mut self,
        ram: &GuestRam,
        irq: &mut IrqLines,
        f: impl FnOnce(&mut dyn VirtioDevice, &mut [Queue], &GuestRam) -> R,
    ) -> Option<R> {
        let dev = self.device.as_deref_mut()?;
        let r = f(dev, &mut self.queues, ram);
        self.after_device_work(ram, irq);
        Some(r)
    }

    /// Applies a completion or input from the host at an instruction
    /// boundary. Returns false when the device had no use for it.
    pub fn complete(&mut self, c: IoCompletion, ram: &GuestRam, irq: &mut IrqLines) -> bool {
        if !self.is_live() {
            return false;
        }
        let Some(dev) = self.device.as_deref_mut() else {
            return false;
        };
        let used = dev.complete(c, &mut self.queues, ram, &mut self.outbox);
        self.after_device_work(ram, irq);
        used
    }

    /// Whether input offered now would find a buffer.
    pub fn input_ready(&self, ram: &GuestRam) -> bool {
        self.is_live() && self.device.as_deref().is_some_and(|d| d.input_ready(&self.queues, ram))
    }

    /// Requests issued since the last call, in order.
    pub fn take_requests(&mut self) -> Vec<IoRequest> {
        std::mem::take(&mut self.outbox)
    }

    pub fn has_requests(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Requests the device is still waiting for (issued, not completed).
    pub fn in_flight_count(&self) -> usize {
        self.device.as_deref().map_or(0, |d| d.in_flight_count())
    }

    pub fn in_flight(&self) -> Vec<IoRequest> {
        self.device.as_deref().map_or_else(Vec::new, |d| d.in_flight())
    }

    fn is_live(&self) -> bool {
        self.status & STATUS_DRIVER_OK != 0 && self.status & STATUS_DEVICE_NEEDS_RESET == 0
    }

    /// The device's config space changed (e.g. a link came up).
    pub fn signal_config_change(&mut self, irq: &mut IrqLines) {
        if self.device.is_none() {
            return;
        }
        self.config_generation = self.config_generation.wrapping_add(1);
        if self.status & STATUS_DRIVER_OK != 0 {
            self.interrupt_status |= INT_CONFIG_CHANGE;
        }
        irq.set(self.irq, self.irq_level());
    }

    /// Collects used-buffer notifications and broken rings after the device
    /// touched its queues, and drives the line.
    fn after_device_work(&mut self, ram: &GuestRam, irq: &mut IrqLines) {
        for q in &mut self.queues {
            if q.needs_interrupt(ram) {
                self.interrupt_status |= INT_USED_BUFFER;
            }
            if q.is_broken() && self.status & STATUS_DEVICE_NEEDS_RESET == 0 && self.status & STATUS_DRIVER_OK != 0 {
                self.status |= STATUS_DEVICE_NEEDS_RESET;
                self.interrupt_status |= INT_CONFIG_CHANGE;
            }
        }
        irq.set(self.irq, self.irq_level());
    }

    fn reset(&mut self) {
        if let Some(d) = self.device.as_deref_mut() {
            d.reset();
        }
        for q in &mut self.queues {
            q.reset();
        }
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.queue_sel = 0;
        self.interrupt_status = 0;
        self.status = 0;
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue layout may only change while the queue is not live.
    fn config_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if let Some(q) = self.selected_queue() {
            if !q.ready {
                f(q);
            }
        }
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        let present = self.device.is_some();
        match offset {
            REG_MAGIC => MAGIC,
            REG_VERSION => VERSION,
            REG_DEVICE_ID => self.device_type(),
            REG_VENDOR_ID => VENDOR_ID,
            _ if !present => 0,
            REG_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device_features() as u32,
                1 => (self.device_features() >> 32) as u32,
                _ => 0,
            },
            REG_QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| q.max_size as u32),
            REG_QUEUE_NUM => self.selected_queue().map_or(0, |q| q.size as u32),
            REG_QUEUE_READY => self.selected_queue().map_or(0, |q| q.ready as u32),
            REG_QUEUE_DESC_LOW => self.selected_queue().map_or(0, |q| q.desc_table as u32),
            REG_QUEUE_DESC_HIGH => self.selected_queue().map_or(0, |q| (q.desc_table >> 32) as u32),
            REG_QUEUE_DRIVER_LOW => self.selected_queue().map_or(0, |q| q.avail_ring as u32),
            REG_QUEUE_DRIVER_HIGH => self.selected_queue().map_or(0, |q| (q.avail_ring >> 32) as u32),
            REG_QUEUE_DEVICE_LOW => self.selected_queue().map_or(0, |q| q.used_ring as u32),
            REG_QUEUE_DEVICE_HIGH => self.selected_queue().map_or(0, |q| (q.used_ring >> 32) as u32),
            REG_INTERRUPT_STATUS => self.interrupt_status,
            REG_STATUS => self.status,
            // No shared memory regions: length reads as all ones.
            REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH | REG_SHM_BASE_LOW | REG_SHM_BASE_HIGH => u32::MAX,
            REG_CONFIG_GENERATION => self.config_generation,
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32, ram: &GuestRam, irq: &mut IrqLines) {
        if self.device.is_none() {
            return;
        }
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = v,
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            REG_DRIVER_FEATURES
                // Frozen once FEATURES_OK was accepted.
                if self.status & STATUS_FEATURES_OK == 0 => {
                    match self.driver_features_sel {
                        0 => self.driver_features = (self.driver_features & !0xffff_ffff) | v as u64,
                        1 => self.driver_features = (self.driver_features & 0xffff_ffff) | ((v as u64) << 32),
                        _ => {}
                    }
                }
            REG_QUEUE_SEL => self.queue_sel = v,
            REG_QUEUE_NUM => self.config_queue(|q| q.size = v.min(u16::MAX as u32) as u16),
            REG_QUEUE_DESC_LOW => self.config_queue(|q| q.desc_table = set_low(q.desc_table, v)),
            REG_QUEUE_DESC_HIGH => self.config_queue(|q| q.desc_table = set_high(q.desc_table, v)),
            REG_QUEUE_DRIVER_LOW => self.config_queue(|q| q.avail_ring = set_low(q.avail_ring, v)),
            REG_QUEUE_DRIVER_HIGH => self.config_queue(|q| q.avail_ring = set_high(q.avail_ring, v)),
            REG_QUEUE_DEVICE_LOW => self.config_queue(|q| q.used_ring = set_low(q.used_ring, v)),
            REG_QUEUE_DEVICE_HIGH => self.config_queue(|q| q.used_ring = set_high(q.used_ring, v)),
            REG_QUEUE_READY => {
                let event_idx = self.driver_features & VIRTIO_F_RING_EVENT_IDX != 0;
                if let Some(q) = self.selected_queue() {
                    if v & 1 != 0 && !q.ready {
                        q.enable(ram, event_idx);
                    } else if v & 1 == 0 {
                        q.ready = false;
                    }
                }
            }
            REG_QUEUE_NOTIFY => {
                let idx = (v & 0xffff) as usize;
                if self.is_live() && self.queues.get(idx).is_some_and(|q| q.ready) {
                    if let Some(d) = self.device.as_deref_mut() {
                        d.queue_notify(idx, &mut self.queues, ram, &mut self.outbox);
                    }
                }
            }
            REG_INTERRUPT_ACK => self.interrupt_status &= !v,
            REG_STATUS => self.write_status(v),
            _ => {}
        }
        self.after_device_work(ram, irq);
    }

    fn write_status(&mut self, v: u32) {
        if v == 0 {
            self.reset();
            return;
        }
        let v = v & 0xff;
        let newly = v & !self.status;
        let mut next = v | (self.status & STATUS_DEVICE_NEEDS_RESET);
        if newly & STATUS_FEATURES_OK != 0 {
            let offered = self.device_features();
            let ok = self.driver_features & !offered == 0 && self.driver_features & VIRTIO_F_VERSION_1 != 0;
            if !ok {
                // Left clear so the driver reads back that we refused.
                next &= !STATUS_FEATURES_OK;
            }
        }
        if newly & STATUS_DRIVER_OK != 0 {
            if next & STATUS_FEATURES_OK == 0 {
                next &= !STATUS_DRIVER_OK;
            } else if let Some(d) = self.device.as_deref_mut() {
                d.activate(self.driver_features);
            }
        }
        self.status = next;
    }

    /// Transport state, the queues, and the device's own blob.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = SnapWriter::new(b"VMMI", 1);
        w.u32(self.irq);
        w.u32(self.device_type());
        w.u32(self.device_features_sel);
        w.u32(self.driver_features_sel);
        w.u64(self.driver_features);
        w.u32(self.queue_sel);
        w.u32(self.interrupt_status);
        w.u32(self.status);
        w.u32(self.config_generation);
        w.u32(self.queues.len() as u32);
        for q in &self.queues {
            q.save(&mut w);
        }
        w.bytes(&self.device.as_ref().map_or_else(Vec::new, |d| d.snapshot()));
        w.finish()
    }

    pub fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"VMMI")?;
        if version != 1 {
            return Err(SnapshotError::Version { device: "virtio-mmio", version });
        }
        let irq = r.u32()?;
        let ty = r.u32()?;
        if irq != self.irq || ty != self.device_type() {
            return Err(SnapshotError::MmioSlot {
                saved_type: ty,
                saved_irq: irq,
                slot_type: self.device_type(),
                slot_irq: self.irq,
            });
        }
        let device_features_sel = r.u32()?;
        let driver_features_sel = r.u32()?;
        let driver_features = r.u64()?;
        let queue_sel = r.u32()?;
        let interrupt_status = r.u32()?;
        let status = r.u32()?;
        let config_generation = r.u32()?;
        let nq = r.u32()? as usize;
        if nq != self.queues.len() {
            return Err(SnapshotError::MmioQueues { saved: nq, actual: self.queues.len() });
        }
        let mut queues = self.queues.clone();
        for q in &mut queues {
            q.load(&mut r)?;
        }
        let dev_blob = r.bytes()?;
        r.end()?;
        if let Some(d) = self.device.as_deref_mut() {
            d.restore(dev_blob)?;
        }
        self.device_features_sel = device_features_sel;
        self.driver_features_sel = driver_features_sel;
        self.driver_features = driver_features;
        self.queue_sel = queue_sel;
        self.interrupt_status = interrupt_status & (INT_USED_BUFFER | INT_CONFIG_CHANGE);
        self.status = status & 0xff;
        self.config_generation = config_generation;
        self.queues = queues;
        Ok(())
    }
}

fn set_low(r: u64, v: u32) -> u64 {
    (r & !0xffff_ffff) | v as u64
}

fn set_high(r: u64, v: u32) -> u64 {
    (r & 0xffff_ffff) | ((v as u64) << 32)
}

/// Transport registers are 32-bit only (other sizes read zero and are
/// ignored); config space takes any size the device's layout calls for.
impl MmioDevice for VirtioMmio {
    fn read(&mut self, offset: u64, size: u8, _ctx: &mut DeviceCtx) -> u64 {
        if offset < CONFIG_SPACE {
            if size != 4 || !offset.is_multiple_of(4) {
                return 0;
            }
            return self.read_reg(offset) as u64;
        }
        let Some(dev) = self.device.as_deref() else {
            return 0;
        };
        if !matches!(size, 1 | 2 | 4 | 8) || offset >= WINDOW_SIZE {
            return 0;
        }
        let mut buf = [0u8; 8];
        dev.read_config(offset - CONFIG_SPACE, &mut buf[..size as usize]);
        u64::from_le_bytes(buf)
    }

    fn write(&mut self, offset: u64, size: u8, value: u64, ctx: &mut DeviceCtx) {
        if offset < CONFIG_SPACE {
            if size == 4 && offset.is_multiple_of(4) {
                self.write_reg(offset, value as u32, ctx.ram, ctx.irq);
            }
            return;
        }
        let Some(dev) = self.device.as_deref_mut() else {
            return;
        };
        if !matches!(size, 1 | 2 | 4 | 8) || offset >= WINDOW_SIZE {
            return;
        }
        let buf = value.to_le_bytes();
        dev.write_config(offset - CONFIG_SPACE, &buf[..size as usize]);
    }
}
