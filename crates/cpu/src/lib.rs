//! A deterministic RV64GC hart (IMAFDC, Zicsr, Zifencei, Zicntr) with M/S/U
//! privilege levels and Sv39/Sv48 paging.
//!
//! The CPU knows nothing of devices. It reads and writes guest RAM directly
//! (the fast path) and sends every other physical access to a [`Bus`]; the
//! board decides what lives there. Interrupt lines reach it as bits the
//! board sets in `mip` between slices. Execution is a pure function of the
//! hart state, RAM, and what the bus returns: no host time, no host floating
//! point environment, no randomness.

mod block;
mod compressed;
pub mod csr;
mod decode;
mod exec;
mod ext;
pub mod fpu;
mod hart;
// dynasm's macros convert every register operand with `.into()`, u8 to u8.
#[allow(clippy::useless_conversion)]
mod jit;
mod mmu;
mod peek;
mod trap;

pub use block::prepare_tables as prepare_block_tables;
pub use ext::{Extensions, CBO_BLOCK_BYTES};
use ftvm_memory::GuestRam;
pub use hart::{Exit, Hart, HartState, JitStats, PrivilegeMode, WakeCondition};
pub use peek::{peek_instruction, Flow, Peek};
pub use trap::Trap;

/// Everything outside RAM, as seen from one hart. RAM is passed along so a
/// device can perform DMA while handling the access.
pub trait Bus {
    /// A load from a physical address outside RAM. `None` raises an access
    /// fault. `progress` is the number of steps this hart has executed so
    /// far in the current slice, which places the access exactly in time.
    fn read(&mut self, ram: &GuestRam, paddr: u64, size: u8, progress: u64) -> Option<u64>;
    /// A store to a physical address outside RAM. `false` raises an access fault.
    fn write(&mut self, ram: &GuestRam, paddr: u64, size: u8, value: u64, progress: u64) -> bool;
    /// The platform timer (`mtime`) at step `progress` of the current slice.
    fn time(&mut self, progress: u64) -> u64;
}
