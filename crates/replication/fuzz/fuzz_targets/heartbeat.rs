//! Arbitrary bytes as a heartbeat datagram (`heartbeat`, "FTH2" |
//! generation | sequence | keyed-BLAKE3 MAC): `Beats::check` never panics,
//! and takes only a beat it made itself, of its own generation.
//! Run: `cd crates/replication/fuzz && cargo +nightly fuzz run heartbeat`.
#![no_main]

use ftvm_replication::heartbeat::Beats;
use ftvm_replication::pair_key::PairKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let beats = Beats::new(&PairKey::from_bytes([7; 32]), 5);
    if let Some(seq) = beats.check(data) {
        // Only what the same key and generation made (a seed, say).
        assert_eq!(&beats.make(seq)[..], data, "a beat it did not make was heard");
    }
    // The datagram behind a valid MAC: the generation and the sequence
    // number are read from it, never trusted blindly.
    if data.len() >= 20 {
        let seq = u64::from_le_bytes(data[12..20].try_into().unwrap());
        let generation = u64::from_le_bytes(data[4..12].try_into().unwrap());
        let made = Beats::new(&PairKey::from_bytes([7; 32]), generation).make(seq);
        assert_eq!(beats.check(&made), (generation == 5).then_some(seq));
    }
});
