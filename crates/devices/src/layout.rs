//! The board's physical memory map and interrupt numbers, shared by the
//! machine's bus and the device-tree generator so the two cannot disagree.
//! Addresses follow QEMU's `virt` board, so guest software built for it
//! (OpenSBI, Debian's kernel) finds devices where it expects them.

/// SiFive test / finisher device (poweroff, reboot, fail with code).
pub const SYSCON_BASE: u64 = 0x0010_0000;
pub const SYSCON_SIZE: u64 = 0x1000;

/// Goldfish real-time clock, where QEMU virt puts it.
pub const RTC_BASE: u64 = 0x0010_1000;
pub const RTC_SIZE: u64 = 0x1000;
/// QEMU virt's RTC line; free here too (virtio uses 1..=8, the UART 10).
pub const RTC_IRQ: u32 = 11;

pub const CLINT_BASE: u64 = 0x0200_0000;
pub const CLINT_SIZE: u64 = 0x1_0000;

pub const PLIC_BASE: u64 = 0x0c00_0000;
pub const PLIC_SIZE: u64 = 0x60_0000;

pub const UART_BASE: u64 = 0x1000_0000;
pub const UART_SIZE: u64 = 0x100;
pub const UART_IRQ: u32 = 10;
/// Input clock advertised to the 8250 driver; only the divisor math uses it.
pub const UART_CLOCK_HZ: u32 = 3_686_400;

pub const VIRTIO_BASE: u64 = 0x1000_1000;
pub const VIRTIO_STRIDE: u64 = 0x1000;
pub const VIRTIO_SLOTS: usize = 8;
/// Slot `i` (0-based) raises PLIC source `VIRTIO_IRQ_BASE + i`.
pub const VIRTIO_IRQ_BASE: u32 = 1;

pub const RAM_BASE: u64 = 0x8000_0000;

/// Base address and PLIC source of virtio slot `i`.
pub const fn virtio_slot(i: usize) -> (u64, u32) {
    (VIRTIO_BASE + i as u64 * VIRTIO_STRIDE, VIRTIO_IRQ_BASE + i as u32)
}
