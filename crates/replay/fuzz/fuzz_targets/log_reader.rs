//! Arbitrary bytes as a replay log: the reader must report an error or
//! hand out entries, never panic, hang or allocate without bound.
//! Run: `cd crates/replay/fuzz && cargo +nightly fuzz run log_reader`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // As a whole stream, header included.
    if let Ok((mut r, _)) = ftvm_replay::LogReader::open(data) {
        while let Ok(Some(_)) = r.next_record() {}
    }
    // As the entries of one frame, behind a valid header.
    let mut log = Vec::new();
    {
        let w = ftvm_replay::LogWriter::new(&mut log, &ftvm_replay::Header::default()).unwrap();
        drop(w);
    }
    log.extend_from_slice(&(data.len() as u32).to_le_bytes());
    log.extend_from_slice(&crc32(data).to_le_bytes());
    log.extend_from_slice(data);
    if let Ok((mut r, _)) = ftvm_replay::LogReader::open(&log[..]) {
        while let Ok(Some(_)) = r.next_record() {}
    }
});

/// CRC-32 (IEEE), so frames built here pass the checksum and the fuzzer
/// reaches the entry decoder.
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
