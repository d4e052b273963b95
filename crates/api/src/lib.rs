//! ftvm's typed API, the seam between a VM's process and what drives it
//! (the command line, the cluster's agent, a script), as crosvm's
//! `vm_control`: serde types and a client, with no command-line parser and
//! no emulator in them, so that a client links this and not the VMM.
//!
//! - [`request`]: what a VM's control socket takes and answers (one JSON
//!   line each way), and its status; [`status`]: a pair's part of it;
//!   [`events`]: what happens to a side of a pair.
//! - [`client`]: the client side of the control socket.
//! - [`vm_config`]: a VM's configuration (what `ftvm run` takes, and the
//!   file `ftvm run --config` reads); [`pair_config`]: a pair's sides'.
//! - [`mode`]: the choices a pair is made with (its mode, where its disks
//!   live), one type each everywhere; [`limits`]: the numbers a setting
//!   may take.
//! - [`words`]: the control socket's requests as a person writes them
//!   (`status`, `snapshot FILE`, `protect --backup ...`).

pub mod client;
pub mod events;
pub mod limits;
pub mod mode;
pub mod pair_config;
pub mod request;
pub mod status;
pub mod vm_config;
pub mod words;

pub use mode::{DiskSharing, EpochProtocol, Mode};
pub use pair_config::{BackupConfig, PairConfig, ProtectConfig};
pub use request::*;
pub use status::*;
pub use vm_config::VmConfig;
