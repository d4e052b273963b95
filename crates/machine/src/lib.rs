//! The ftvm board: a QEMU-`virt`-shaped RISC-V machine assembled from the
//! CPU and the device models, with virtual time and a loader.
//!
//! [`Machine`] is the only way in: replication protocols and the command
//! line drive it by running to an instruction count, injecting events at
//! instruction boundaries, and taking snapshots and dirty pages. What of
//! that an engine must offer, and what only a deterministic one can, is
//! [`engine`]'s two traits, which `Machine` implements.

mod board;
pub mod clock;
pub mod digest;
pub mod engine;
pub mod fdt;
pub mod layout;
pub mod loader;
pub mod mac;
mod machine;
pub mod parallel;
pub mod snapshot;
pub mod snapshot_file;

pub use board::BoardError;
pub use digest::StateDigest;
pub use engine::{DeterministicEngine, Engine};
pub use fdt::FdtError;
/// The optional extensions a machine's harts implement.
pub use ftvm_cpu::Extensions;
/// How much console input the guest's UART holds: `Engine::console_room`
/// when nothing waits to be read (when a console break may be offered).
pub use ftvm_devices::uart::RX_CAPACITY as CONSOLE_CAPACITY;
pub use ftvm_devices::virtio::blk::{execute as execute_blk, BlkOp, BlockBackend};
pub use ftvm_devices::{IoCompletion, IoRequest};
pub use ftvm_memory::GuestRam;
pub use loader::LoadError;
pub use machine::{DeviceSpec, Event, Machine, MachineConfig, MachineError, RunExit, DEFAULT_GUEST_IPS, QUANTUM};
pub use snapshot::StateError;
pub use snapshot_file::{SnapshotFileError, SnapshotFormatError};
