//! The logging channel's sealed frames (`channel::secure`: a u16 length
//! and a Noise transport message, its nonce its place in the stream) as
//! the receiving end opens them, arriving in pieces of arbitrary sizes.
//! The input is a little program: frames sealed by the real peer of a
//! session made for the run, mixed with arbitrary bytes. What the peer
//! sealed opens, in order; anything else is refused (`Unauthentic`) and
//! nothing forged, cut or misplaced is ever handed out; never a panic.
//! Run: `cd crates/replication/fuzz && cargo +nightly fuzz run channel_frames`.
#![no_main]

use ftvm_replication::channel::secure::{answer, Initiator};
use ftvm_replication::pair_key::PairKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, mut ops)) = data.split_first() else { return };
    let key = PairKey::from_bytes([7; 32]);
    let (initiator, first) = Initiator::start(&key);
    let (reply, answered) = answer(&key, &first).expect("our own handshake");
    let (primary, confirm) = initiator.finish(&reply).expect("our own handshake");
    let backup = answered.confirm(&confirm).expect("our own handshake");
    let (mut seal, _) = primary.split();
    let (_, mut open) = backup.split();

    // What goes on the wire, and the plaintext the peer sealed into it.
    let mut wire = Vec::new();
    let mut sealed = Vec::new();
    let mut garbage = false;
    while let [op, len, rest @ ..] = ops {
        let take = (*len as usize).min(rest.len());
        let (bytes, rest) = rest.split_at(take);
        match op % 3 {
            // A frame the peer sealed.
            0 => {
                seal.seal(bytes, &mut wire);
                sealed.extend_from_slice(bytes);
            }
            // Bytes of anyone's choosing.
            1 => {
                wire.extend_from_slice(bytes);
                garbage |= !bytes.is_empty();
            }
            // A large write: several frames of the largest size and a rest.
            _ => {
                let big: Vec<u8> = (0..*len as usize * 300).map(|i| i as u8 ^ op).collect();
                seal.seal(&big, &mut wire);
                sealed.extend_from_slice(&big);
            }
        }
        ops = rest;
    }

    let mut out = Vec::new();
    let mut refused = false;
    for piece in wire.chunks(cut as usize * 7 + 1) {
        let before = out.len();
        let opened = open.open(piece, &mut out);
        if out.len() != before {
            assert!(sealed.starts_with(&out), "opened what the peer did not seal");
        }
        if opened.is_err() {
            refused = true;
            break;
        }
    }
    if !garbage {
        assert!(!refused, "a sealed frame was refused");
        assert_eq!(out, sealed, "the peer's frames did not all open");
    }
});
