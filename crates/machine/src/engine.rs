//! The seam between a VM's engine and what drives it, in two parts.
//!
//! [`Engine`] is what running a VM and checkpointing it need: run a
//! slice, inject an input, take the I/O requests, the RAM and the pages
//! written, save the state. Any engine can provide it: this crate's
//! interpreter and translator ([`Machine`]), or one that runs guest code
//! on hardware (KVM), whose instruction count is only an estimate.
//! Checkpoint mode (Remus) needs no more: its backup never executes.
//!
//! [`DeterministicEngine`] is what the replay modes need on top: an exact
//! instruction count, a run that stops exactly at instruction N, and a
//! digest of the whole state to compare two replicas by. Recording and
//! replaying a log, lockstep and epochs are written against it; an engine
//! without exact counts cannot implement it, and so can run plain VMs and
//! checkpoint mode only.

use crate::machine::{Machine, MachineError, RunExit};
use crate::{Event, GuestRam, IoRequest, StateDigest};

/// What running and checkpointing a VM need of its engine.
pub trait Engine {
    /// Runs toward instruction count `target`; stops sooner when every
    /// hart idles, when I/O requests wait to be handed out, or when the
    /// guest powers off.
    fn run_until(&mut self, target: u64) -> RunExit;
    /// Instructions executed so far.
    fn icount(&self) -> u64;
    /// Applies an input at the current instruction boundary.
    fn inject(&mut self, ev: Event) -> bool;
    /// The requests the devices made since the last call, in order.
    fn take_io_requests(&mut self) -> Vec<(usize, IoRequest)>;
    /// Guest RAM.
    fn ram(&self) -> &GuestRam;
    /// The guest-physical frame numbers written since the last call.
    fn take_dirty_pages(&mut self) -> Vec<u64>;
    /// Turns the tracking of pages written on or off (off, a store costs
    /// nothing extra).
    fn set_dirty_tracking(&mut self, on: bool);
    /// Starts a second reader of the pages written (a transfer beside the
    /// pair in force, which takes the first set), with tracking on.
    fn start_dirty_view(&mut self);
    /// The second reader's pages written since it started or last took.
    fn take_dirty_view(&mut self) -> Vec<u64>;
    /// The second reader is done.
    fn end_dirty_view(&mut self);
    /// The whole machine but its RAM, to restore beside a copy of RAM.
    fn checkpoint_state(&self) -> Result<Vec<u8>, MachineError>;
    /// The whole machine, RAM included (a snapshot file's machine part).
    fn snapshot(&self) -> Result<Vec<u8>, MachineError>;
    /// Guest time, in timebase ticks.
    fn time(&self) -> u64;
    /// The rate at which guest time advances per instruction (32.32 fixed
    /// point), where the host steers it with `Event::ClockRate` to keep
    /// guest time near the wall clock; None for an engine whose guest time
    /// follows the host's clock by itself.
    fn steered_clock_rate(&self) -> Option<u64>;
    /// The date the guest's RTC shows now (ns since the Unix epoch), where
    /// the host steers guest time; None where it follows the host's clock.
    fn rtc_now_ns(&self) -> Option<u64>;
    /// The requests the devices still wait for (issued again after a
    /// restore, or when a backup goes live).
    fn io_in_flight(&self) -> Vec<(usize, IoRequest)>;
    /// Whether any device waits for the host to complete a request.
    fn io_pending(&self) -> bool;
    /// Runs the harts in parallel on host threads of their own (`on`), or
    /// all on the caller's thread (the default), where runs are exact: see
    /// [`Machine::set_parallel`]. A host asks for parallel only while
    /// nothing needs the run to be repeated.
    fn set_parallel(&mut self, on: bool);
    /// The host CPU time the last run took on the busiest of the harts'
    /// own threads (None: the caller's thread ran it all).
    fn run_cpu_time(&self) -> Option<std::time::Duration>;
    /// Whether the device in `slot` would take input (a frame) now.
    fn input_ready(&self, slot: usize) -> bool;
    /// How many console input bytes the guest can take now.
    fn console_room(&self) -> usize;
    /// The guest's console output since the last call.
    fn take_console_output(&mut self) -> Vec<u8>;
}

/// What the replay modes need on top: exactness and a state to compare.
///
/// Its guest time ([`Engine::time`]) is a function of the instruction
/// count and the logged clock events.
pub trait DeterministicEngine: Engine {
    /// A digest of the whole state, chained from the last one.
    fn state_digest(&mut self) -> StateDigest;
    /// The names of the digest's parts, for a divergence's message.
    fn digest_part_names(&self) -> Vec<String>;
    /// Whether every hart waits for an interrupt.
    fn all_harts_idle(&self) -> bool;
    /// Makes the machine what one restored from its checkpoint state is:
    /// where a replica begins from a transferred state rather than from
    /// the same start, the other carries on as though restored too (see
    /// [`Machine::begin_as_restored`]).
    fn begin_as_restored(&mut self);
}

impl Engine for Machine {
    fn run_until(&mut self, target: u64) -> RunExit {
        Machine::run_until(self, target)
    }
    fn icount(&self) -> u64 {
        Machine::icount(self)
    }
    fn inject(&mut self, ev: Event) -> bool {
        Machine::inject(self, ev)
    }
    fn take_io_requests(&mut self) -> Vec<(usize, IoRequest)> {
        Machine::take_io_requests(self)
    }
    fn ram(&self) -> &GuestRam {
        Machine::ram(self)
    }
    fn take_dirty_pages(&mut self) -> Vec<u64> {
        Machine::take_dirty_pages(self)
    }
    fn set_dirty_tracking(&mut self, on: bool) {
        Machine::set_dirty_tracking(self, on)
    }
    fn start_dirty_view(&mut self) {
        Machine::start_dirty_view(self)
    }
    fn take_dirty_view(&mut self) -> Vec<u64> {
        Machine::take_dirty_view(self)
    }
    fn end_dirty_view(&mut self) {
        Machine::end_dirty_view(self)
    }
    fn checkpoint_state(&self) -> Result<Vec<u8>, MachineError> {
        Machine::checkpoint_state(self)
    }
    fn snapshot(&self) -> Result<Vec<u8>, MachineError> {
        Machine::snapshot(self)
    }
    fn time(&self) -> u64 {
        Machine::time(self)
    }
    fn steered_clock_rate(&self) -> Option<u64> {
        Some(self.clock().rate())
    }
    fn rtc_now_ns(&self) -> Option<u64> {
        Some(Machine::rtc_now_ns(self))
    }
    fn io_in_flight(&self) -> Vec<(usize, IoRequest)> {
        Machine::io_in_flight(self)
    }
    fn io_pending(&self) -> bool {
        Machine::io_pending(self)
    }
    fn set_parallel(&mut self, on: bool) {
        Machine::set_parallel(self, on)
    }
    fn run_cpu_time(&self) -> Option<std::time::Duration> {
        Machine::run_cpu_time(self)
    }
    fn input_ready(&self, slot: usize) -> bool {
        Machine::input_ready(self, slot)
    }
    fn console_room(&self) -> usize {
        Machine::console_room(self)
    }
    fn take_console_output(&mut self) -> Vec<u8> {
        Machine::take_console_output(self)
    }
}

impl DeterministicEngine for Machine {
    fn state_digest(&mut self) -> StateDigest {
        Machine::state_digest(self)
    }
    fn digest_part_names(&self) -> Vec<String> {
        Machine::digest_part_names(self)
    }
    fn all_harts_idle(&self) -> bool {
        self.harts().iter().all(|h| h.is_idle())
    }
    fn begin_as_restored(&mut self) {
        Machine::begin_as_restored(self)
    }
}
