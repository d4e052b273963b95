//! Arbitrary bytes as a saved machine state: as the whole machine a
//! snapshot file holds once unpacked (`Machine::restore`, what
//! `ftvm run --restore` does with it: harts, devices with their queues and
//! I/O in flight, clock, RAM map and pages), and as the state a
//! checkpoint carries beside its pages (`Machine::from_checkpoint`, what a
//! checkpoint backup goes live with), given 16 MiB of RAM. Refused with
//! an error or restored, never a panic, and never RAM the input does not
//! declare in its page map (the map bounds it: a byte per 32 KiB); a
//! restored machine's state saves again as state that restores the same.
//! Run: `cd crates/machine/fuzz && cargo +nightly fuzz run machine_state`.
#![no_main]

use ftvm_machine::layout::RAM_BASE;
use ftvm_machine::{GuestRam, Machine};
use libfuzzer_sys::fuzz_target;

/// The machine's state without RAM saves, restores and saves again the same.
fn state_round_trips(m: &Machine) {
    let Ok(state) = m.checkpoint_state() else { return };
    let ram = GuestRam::new(m.ram().base(), m.ram().size()).expect("as much RAM as restored");
    let again = Machine::from_checkpoint(&state, ram).expect("a restored machine's state restores");
    assert_eq!(again.checkpoint_state().expect("saved once"), state, "restored state saves differently");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Machine::restore(data) {
        let _ = m.io_in_flight();
        state_round_trips(&m);
    }
    let ram = GuestRam::new(RAM_BASE, 16 << 20).expect("16 MiB of RAM");
    if let Ok(m) = Machine::from_checkpoint(data, ram) {
        let _ = m.io_in_flight();
        state_round_trips(&m);
    }
});
