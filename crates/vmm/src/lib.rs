//! ftvm's host side as a library: everything that runs a VM on this host,
//! for the command line (`crates/ftvm`) and any other front end to drive
//! in-process. It takes typed configurations (`ftvm_api`'s `VmConfig`,
//! `ProtectConfig`, `BackupConfig`) and knows no command line.
//!
//! `api` is the typed API (`ftvm_api`: requests, replies, status, errors,
//! the configurations of a VM and a pair), re-exported under its old path;
//! `launch` turns a VM's configuration into a machine and starts it, `live` owns
//! the host loop of a running VM, `host_io` its backends (disks, TAPs,
//! entropy), `control` its control socket, `console` the terminal, `exec`
//! the `--exec` protocol with the guest, `watch` what the loop looks for
//! on the console (a kernel panic, the command's start), `registry` the
//! VMs of this host with a control socket (`ftvm list`), `record` and
//! `replay` the replay log's two ends, `slice` how long the loop lets the
//! guest run at a time, `overlay` a run's copy of an
//! image's root disk, and `ft` the fault-tolerant pair.

pub use ftvm_api as api;
pub mod attach;
pub mod console;
pub mod control;
pub mod error;
pub mod exec;
pub mod ft;
pub mod host_io;
pub mod launch;
pub mod live;
pub mod overlay;
pub mod pacing;
pub mod record;
pub mod registry;
pub mod replay;
pub mod signals;
pub mod slice;
pub mod watch;
