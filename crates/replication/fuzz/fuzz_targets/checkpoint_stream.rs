//! Arbitrary bytes as the checkpoint stream of checkpoint mode
//! (`checkpoint_stream::Reader::next_record`: kind | length | crc32 |
//! payload), arriving in pieces of arbitrary sizes as from the channel:
//! every record read back encodes to exactly the bytes it was read from
//! (an end record: to bytes of the same length that read as the same),
//! and anything else is `Cut` or `Corrupt`, never a panic, a hang or an
//! allocation the input does not pay for. The bytes are also read as one
//! record's payload behind a head with the right length and checksum, so
//! that the fuzzer reaches the payload's parser.
//! Run: `cd crates/replication/fuzz && cargo +nightly fuzz run checkpoint_stream`.
#![no_main]

use ftvm_replication::checkpoint_stream::{encode, ReadError, Reader, Record};
use libfuzzer_sys::fuzz_target;
use std::io::Read;

/// Hands out its bytes at most `piece` at a time.
struct Trickle<'a> {
    bytes: &'a [u8],
    piece: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

fn read_all(stream: &[u8], piece: usize) {
    let mut r = Reader::new(Trickle { bytes: stream, piece });
    loop {
        let at = r.offset() as usize;
        match r.next_record() {
            Ok(record) => {
                let mut again = Vec::new();
                encode(&mut again, &record);
                let read = &stream[at..r.offset() as usize];
                if let Record::End { .. } = record {
                    // Any nonzero flag byte reads as "has a status", and
                    // the status of none is not looked at: the same record
                    // has other spellings.
                    assert_eq!(read.len(), again.len());
                    assert_eq!(Reader::new(&again[..]).next_record().as_ref(), Ok(&record));
                } else {
                    assert_eq!(read, &again[..], "{record:?} was not read as written");
                }
            }
            Err(ReadError::Cut) => break,
            Err(ReadError::Corrupt { offset, .. }) => {
                assert_eq!(offset as usize, at);
                break;
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else { return };
    let piece = cut as usize % 16 + 1;
    read_all(bytes, piece);
    // One record of kind bytes[0] and payload the rest, its head right,
    // followed by the bytes again.
    if let Some((&kind, payload)) = bytes.split_first() {
        let mut stream = vec![kind];
        stream.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        stream.extend_from_slice(&crc32(payload).to_le_bytes());
        stream.extend_from_slice(payload);
        stream.extend_from_slice(bytes);
        read_all(&stream, piece);
    }
});

/// CRC-32 (IEEE), as the stream's heads carry (crc32fast computes the same).
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xedb8_8320 } else { c >> 1 };
        }
    }
    !c
}
