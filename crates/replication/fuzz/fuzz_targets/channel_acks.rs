//! Arbitrary bytes as what the backup sends the primary on the logging
//! channel, once opened (`channel::wire`: acknowledgements, requests,
//! refusals), arriving in pieces of arbitrary sizes as the primary's
//! reader takes them (`sender.rs`, `AckStream::apply`): every message
//! parses or is refused, never a panic, and where the message boundaries
//! fall does not depend on how the bytes were cut.
//! Run: `cd crates/replication/fuzz && cargo +nightly fuzz run channel_acks`.
#![no_main]

use ftvm_replication::channel::wire::{self, Message};
use libfuzzer_sys::fuzz_target;

/// The messages parsed from `bytes` fed `piece` bytes at a time, and how
/// it ended (an error, or what the end of the stream means then).
fn read(bytes: &[u8], piece: usize) -> (Vec<String>, String) {
    let mut got = Vec::new();
    let mut partial = Vec::new();
    for chunk in bytes.chunks(piece) {
        partial.extend_from_slice(chunk);
        let mut at = 0;
        loop {
            match wire::parse(&partial[at..]) {
                Ok(Some((msg, len))) => {
                    assert!(len > 0 && len <= partial.len() - at, "message of {len} bytes in {}", partial.len() - at);
                    got.push(match msg {
                        Message::Ack { received, icount, heartbeat } => format!("ack {received} {icount} {heartbeat}"),
                        Message::Request(r) => format!("request {r:?}"),
                        Message::Refuse(why) => format!("refuse {why:?}"),
                    });
                    at += len;
                }
                Ok(None) => break,
                Err(failure) => return (got, format!("failed: {failure:?}")),
            }
        }
        partial.drain(..at);
    }
    (got, format!("end: {:?}", wire::at_end(&partial)))
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else { return };
    let whole = read(bytes, bytes.len().max(1));
    let pieces = read(bytes, cut as usize % 64 + 1);
    assert_eq!(whole, pieces, "the messages depend on how the bytes were cut");
});
