//! Checkpoint mode (Remus): the primary runs the VM speculatively and
//! sends whole-VM checkpoints every interval (`primary`); the backup never
//! executes, it commits each checkpoint as it arrives whole and goes live
//! from the last one (`backup`). Nothing here needs determinism.

pub mod backup;
pub mod primary;
