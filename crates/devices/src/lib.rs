//! Device models of the ftvm board. Devices know nothing of the CPU or of
//! replication: they see MMIO reads and writes at an offset inside their
//! window, guest RAM for DMA, and interrupt lines they raise or lower.
//! Everything here is deterministic: no host time, no threads, no hashing.

pub mod clint;
pub mod io;
pub mod layout;
pub mod plic;
pub mod rtc;
pub mod snapshot;
pub mod syscon;
pub mod uart;
pub mod virtio;

pub use clint::Clint;
pub use io::{IoCompletion, IoRequest};
pub use plic::Plic;
pub use rtc::Rtc;
pub use snapshot::SnapshotError;
pub use syscon::{PowerRequest, Syscon};
pub use uart::Uart;
pub use virtio::blk::BlkDevice;
pub use virtio::{VirtioDevice, VirtioMmio};

use ftvm_memory::GuestRam;

/// Level of every PLIC interrupt source (bit n = source n), as driven by
/// the devices. The PLIC samples these lines; it owns the gateway logic.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IrqLines(pub u64);

impl IrqLines {
    pub fn set(&mut self, source: u32, level: bool) {
        if level {
            self.0 |= 1 << source;
        } else {
            self.0 &= !(1 << source);
        }
    }

    pub fn get(&self, source: u32) -> bool {
        self.0 & (1 << source) != 0
    }
}

/// What a device may touch beyond its own registers during an access.
pub struct DeviceCtx<'a> {
    pub ram: &'a GuestRam,
    pub irq: &'a mut IrqLines,
}

/// A device behind a window of guest-physical addresses.
///
/// `size` is 1, 2, 4 or 8 bytes; `offset` is relative to the window base.
/// An access the device does not implement reads as zero and ignores writes,
/// as on real buses; it must never panic on guest input.
pub trait MmioDevice {
    fn read(&mut self, offset: u64, size: u8, ctx: &mut DeviceCtx) -> u64;
    fn write(&mut self, offset: u64, size: u8, value: u64, ctx: &mut DeviceCtx);
}
