//! Arbitrary bytes as a checkpoint's page blob (`page_delta::decode`:
//! header, raw or zstd section, ZERO/XOR/SECTION entries, run-length XOR
//! deltas), decoded against a backup's copy of 64 pages (pfns 0..64, the
//! rest out of range): an error or whole, distinct pages, never a panic
//! or an allocation the blob does not bound.
//! Run: `cd crates/replication/fuzz && cargo +nightly fuzz run page_delta`.
#![no_main]

use ftvm_replication::page_delta::{decode, PAGE_SIZE};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// The backup's copy: page i filled with i, its first bytes its number.
fn base() -> &'static [u8] {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let mut b = vec![0u8; 64 * PAGE_SIZE];
        for (i, page) in b.chunks_exact_mut(PAGE_SIZE).enumerate() {
            page.fill(i as u8);
            page[..8].copy_from_slice(&(i as u64).to_le_bytes());
        }
        b
    })
}

fuzz_target!(|data: &[u8]| {
    let copy = base();
    let pages = decode(data, |pfn| {
        let i = usize::try_from(pfn).ok().filter(|&i| i < 64)?;
        copy.get(i * PAGE_SIZE..(i + 1) * PAGE_SIZE)
    });
    if let Ok(pages) = pages {
        let mut pfns: Vec<u64> = pages.iter().map(|(pfn, _)| *pfn).collect();
        pfns.sort_unstable();
        pfns.dedup();
        assert_eq!(pfns.len(), pages.len(), "a page decoded twice");
        assert!(pfns.iter().all(|&p| p < 64), "a page outside the copy");
    }
});
