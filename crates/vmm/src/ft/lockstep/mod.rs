//! Lockstep (VMware FT): the primary logs every input at the instruction
//! where it took effect and streams the log to the backup, which replays
//! it (`primary`; the backup's replay is `ft::backup` with
//! `crate::replay`); with separate disks or backup reads, the backup
//! performs disk I/O of its own (`backup_disks`).

pub mod backup_disks;
pub mod primary;
