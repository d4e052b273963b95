//! Arbitrary bytes as the handshake messages of the logging channel
//! (`channel::secure`, Noise NNpsk0 under the pair key): as the first
//! message a waiting backup reads from whoever connects (`answer`, what
//! `respond` does with it, and as its confirmation), and as the reply a primary reads (`Initiator::finish`).
//! Neither may panic; a reply not made for this primary's fresh handshake
//! must be refused (it takes the key and our ephemeral secret to make one).
//! Run: `cd crates/replication/fuzz && cargo +nightly fuzz run channel_handshake`.
#![no_main]

use ftvm_replication::channel::secure::{answer, Initiator};
use ftvm_replication::pair_key::PairKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = PairKey::from_bytes([7; 32]);
    // What `respond` reads is at most 65535 bytes (a u16 length first).
    let msg = &data[..data.len().min(u16::MAX as usize)];
    // A replayed first message of a real primary is answered (it cannot
    // confirm the session without that primary's ephemeral secret): the
    // same bytes as its confirmation give no session.
    if let Ok((_, answered)) = answer(&key, msg) {
        assert!(answered.confirm(msg).is_err(), "a session confirmed by bytes of the attacker's choosing");
    }
    let (initiator, _first) = Initiator::start(&key);
    assert!(initiator.finish(msg).is_err(), "a reply not made for this handshake was taken");
});
