//! The board's physical memory map, laid out like QEMU's `virt` machine so
//! that firmware and kernels built for it run unchanged. Device windows
//! are defined once, beside the devices; this adds what only the board
//! itself decides.

pub use ftvm_devices::layout::*;

/// Where a kernel goes when firmware runs first (the 2 MiB OpenSBI leaves
/// to itself, as QEMU does).
pub const KERNEL_OFFSET: u64 = 0x20_0000;

/// Platform timer frequency, as on QEMU virt.
pub const TIMEBASE_HZ: u64 = 10_000_000;
