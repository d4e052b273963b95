//! Arbitrary bytes as a snapshot file (`snapshot_file::decode`: magic,
//! format, writer, host section, zstd machine state, BLAKE3 of it all),
//! then what `ftvm run --restore` does with a file that decodes: the host
//! section as text, the machine state restored (`Machine::restore`). The
//! bytes are tried as they are and with their checksum made right (so
//! that the fuzzer reaches the fields behind it). Refused or read, never
//! a panic, and a declared machine state length is never allocated ahead
//! of what its data inflates to.
//! Run: `cd crates/machine/fuzz && cargo +nightly fuzz run snapshot_file`.
#![no_main]

use ftvm_machine::snapshot_file::decode;
use ftvm_machine::Machine;
use libfuzzer_sys::fuzz_target;

fn restore(bytes: &[u8]) {
    if let Ok(snap) = decode(bytes) {
        let _ = String::from_utf8(snap.host);
        let _ = Machine::restore(&snap.machine);
    }
}

fuzz_target!(|data: &[u8]| {
    restore(data);
    let mut sealed = data.to_vec();
    sealed.extend_from_slice(blake3::hash(data).as_bytes());
    restore(&sealed);
});
