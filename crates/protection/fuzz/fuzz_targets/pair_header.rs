//! Arbitrary bytes as what a backup reads of the primary's handshake: the
//! `ft-pair` field of the stream's header (`pair::PairHeader::read`,
//! versioned JSON), and as the whole header's text read from a stream
//! (`LogReader::open`, its checksum made right so that the text is
//! parsed) followed by the backup's other checks of it (`PairHeader::read`,
//! `replayer::header_ram`). Refused or read, never a panic; a pair header
//! read writes back as one that reads the same.
//! Run: `cd crates/protection/fuzz && cargo +nightly fuzz run pair_header`.
#![no_main]

use ftvm_protection::pair::PairHeader;
use ftvm_replay::{Header, LogReader, LogWriter};
use libfuzzer_sys::fuzz_target;

fn check(h: &Header) {
    if let Ok(pair) = PairHeader::read(h) {
        let mut again = Header::default();
        pair.write(&mut again);
        assert_eq!(PairHeader::read(&again), Ok(pair), "a pair header did not read back as written");
    }
    let _ = ftvm_replay::replayer::header_ram(h);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let mut h = Header::default();
        // The field `PairHeader::write` fills.
        h.set("ft-pair", text);
        check(&h);
    }
    // magic | format | header length | header text | crc32 of the text.
    let mut log = Vec::new();
    drop(LogWriter::new(&mut log, &Header::default()).unwrap());
    log.truncate(12);
    log.extend_from_slice(&(data.len() as u32).to_le_bytes());
    log.extend_from_slice(data);
    log.extend_from_slice(&crc32(data).to_le_bytes());
    if let Ok((_, h)) = LogReader::open(&log[..]) {
        check(&h);
    }
});

/// CRC-32 (IEEE), as the log's header carries.
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
