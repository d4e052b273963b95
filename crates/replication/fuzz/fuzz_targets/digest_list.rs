//! Arbitrary bytes as the list of disk digests a backup sends the primary
//! when protection starts (`disk_sync::DigestList::decode`): a list is
//! refused or describes a disk of its size in blocks of its block size,
//! encodes back to the same bytes, and the primary's comparison with its
//! own digests (`differing`) names only blocks inside the disk; never a
//! panic.
//! Run: `cd crates/replication/fuzz && cargo +nightly fuzz run digest_list`.
#![no_main]

use ftvm_replication::disk_sync::{block_size, DigestList};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(list) = DigestList::decode(data) else { return };
    assert_eq!(list.encode(), data, "not read as written");
    assert_eq!(list.block, block_size(list.size));
    assert_eq!(list.digests.len() as u64, list.size.div_ceil(list.block));
    // The primary's own digests: all different, and one more than sent.
    let mut mine: Vec<[u8; 32]> = list.digests.iter().map(|d| d.map(|b| !b)).collect();
    mine.push([0; 32]);
    let differ = list.differing(&mine);
    assert_eq!(differ.len(), list.digests.len());
    for (at, len) in differ {
        assert!(len > 0 && at + len as u64 <= list.size, "block {at}+{len} outside a disk of {}", list.size);
    }
});
