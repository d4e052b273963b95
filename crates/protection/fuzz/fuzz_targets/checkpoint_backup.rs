//! Arbitrary records as the checkpoint stream a checkpoint-mode backup
//! follows (`checkpoint::backup::follow`: disk writes and disk blocks
//! checked against this host's disk, page records and checkpoints decoded
//! against the committed copy of RAM, checkpoint states unpacked, commits),
//! and then the machine it would go live with (`Committed::into_machine`).
//! The input is a list of records, each `kind u8 | length u16 LE |
//! payload`, sent with the stream's real heads (length and checksum), so
//! that the fuzzer reaches what is inside them. The backup has 16 MiB of
//! RAM and one disk of 1 MiB in slot 0. Refused, cut or followed to its
//! end, never a panic, and nothing written outside the copy of RAM or the
//! disk.
//! Run: `cd crates/protection/fuzz && cargo +nightly fuzz run checkpoint_backup`.
#![no_main]

use ftvm_protection::checkpoint::backup::{follow, Committed, Disks};
use ftvm_protection::events::Events;
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;

thread_local! {
    /// This host's copy of the disk: a file of 1 MiB, unlinked once open.
    static DISKS: RefCell<Disks> = RefCell::new({
        let path = std::env::temp_dir().join(format!("ftvm-fuzz-disk-{}.img", std::process::id()));
        std::fs::File::create(&path).and_then(|f| f.set_len(1 << 20)).expect("a disk file");
        let disks = Disks::open(&[(0, &path)], Events::default()).expect("the disk opens");
        let _ = std::fs::remove_file(&path);
        disks
    });
}

fuzz_target!(|data: &[u8]| {
    let mut stream = Vec::new();
    let mut rest = data;
    while let [kind, a, b, more @ ..] = rest {
        let len = (u16::from_le_bytes([*a, *b]) as usize).min(more.len());
        let (payload, more) = more.split_at(len);
        stream.push(*kind);
        stream.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        stream.extend_from_slice(&crc32(payload).to_le_bytes());
        stream.extend_from_slice(payload);
        rest = more;
    }
    let mut held = Committed::new(16 << 20).expect("16 MiB of RAM");
    let followed = DISKS.with(|d| follow(&stream[..], &mut held, &mut d.borrow_mut(), |_| {}));
    if followed.is_ok() && held.state.is_some() {
        let _ = held.into_machine();
    }
});

/// CRC-32 (IEEE), as the stream's heads carry.
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
