//! The state digest replay checks against a recording: a hash per hart,
//! per device, of the clock and scheduler, a chained hash of RAM, and the
//! list of RAM pages written since the previous digest with a short hash
//! of each. Its cost follows the pages written, not the size of RAM, and a
//! mismatch names the hart, the device or the RAM pages that differ.

/// The pages written between two digests, as page numbers with the first
/// 16 bits of each page's hash: enough to say which pages differ (the
/// chained 64-bit RAM hash catches what 16 bits could miss) at about
/// 3-4 bytes a page in the log.
pub type PageHashes = Vec<(u64, u16)>;

/// What [`crate::Machine::state_digest`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDigest {
    /// Each hart's registers and CSRs.
    pub harts: Vec<[u8; 8]>,
    /// Each device, then the clock and scheduler, in the order of
    /// [`crate::Machine::digest_part_names`].
    pub parts: Vec<[u8; 8]>,
    /// The pages written since the previous digest, chained to the
    /// previous RAM hash.
    pub ram: [u8; 8],
    /// The pages written since the previous digest, ascending.
    pub pages: PageHashes,
}

/// How many differing pages a report lists before it says "and N more".
const PAGES_SHOWN: usize = 8;

impl StateDigest {
    /// Where `self` (this run) and `recorded` differ, in words: each hart,
    /// each part by its name in `part_names`, then the RAM pages.
    pub fn differences(&self, recorded: &StateDigest, part_names: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        if self.harts.len() != recorded.harts.len() {
            out.push(format!("the number of harts ({} here, {} recorded)", self.harts.len(), recorded.harts.len()));
        }
        for (i, (a, b)) in self.harts.iter().zip(&recorded.harts).enumerate() {
            if a != b {
                out.push(format!("hart {i} registers"));
            }
        }
        if self.parts.len() != recorded.parts.len() {
            out.push(format!("the number of devices ({} here, {} recorded)", self.parts.len(), recorded.parts.len()));
        }
        for (i, (a, b)) in self.parts.iter().zip(&recorded.parts).enumerate() {
            if a != b {
                out.push(part_names.get(i).cloned().unwrap_or_else(|| format!("device {i}")));
            }
        }
        if let Some(pages) = self.page_differences(recorded) {
            out.push(pages);
        } else if self.ram != recorded.ram {
            out.push("RAM (the pages written agree by their short hashes; the full hash differs)".into());
        }
        out
    }

    /// The RAM pages written here and not when recorded, the other way
    /// round, and written in both with different contents.
    fn page_differences(&self, recorded: &StateDigest) -> Option<String> {
        use std::collections::BTreeMap;
        let mine: BTreeMap<u64, u16> = self.pages.iter().copied().collect();
        let theirs: BTreeMap<u64, u16> = recorded.pages.iter().copied().collect();
        let only_here: Vec<u64> = mine.keys().filter(|p| !theirs.contains_key(p)).copied().collect();
        let only_recorded: Vec<u64> = theirs.keys().filter(|p| !mine.contains_key(p)).copied().collect();
        let changed: Vec<u64> =
            mine.iter().filter(|(p, h)| theirs.get(p).is_some_and(|t| t != *h)).map(|(p, _)| *p).collect();
        let list = |pages: &[u64]| {
            let mut s: Vec<String> =
                pages.iter().take(PAGES_SHOWN).map(|p| format!("{:#x}", p << ftvm_memory::PAGE_SHIFT)).collect();
            if pages.len() > PAGES_SHOWN {
                s.push(format!("and {} more", pages.len() - PAGES_SHOWN));
            }
            s.join(", ")
        };
        let mut out = Vec::new();
        if !changed.is_empty() {
            out.push(format!("the contents of RAM pages {}", list(&changed)));
        }
        if !only_here.is_empty() {
            out.push(format!("RAM pages written only in this run: {}", list(&only_here)));
        }
        if !only_recorded.is_empty() {
            out.push(format!("RAM pages written only in the recording: {}", list(&only_recorded)));
        }
        (!out.is_empty()).then(|| out.join("; "))
    }
}

/// The digest's hash of `bytes`: XXH3-64. The digest compares two runs of
/// the same machine, fed the same inputs, to find ftvm's own divergences;
/// no one picks the bytes to make two runs collide, so a cryptographic
/// hash buys nothing here and costs: BLAKE3 took about 1.7 us a page on
/// this host against 0.2 us for XXH3, and the digests every 100 ms of a
/// boot and a CPU job took ~1-2 % of a lockstep primary's samples with
/// BLAKE3, ~0.3 % with XXH3 (perf). 64 bits: collisions between two such
/// runs are not a concern.
pub(crate) fn hash8(bytes: &[u8]) -> [u8; 8] {
    xxhash_rust::xxh3::xxh3_64(bytes).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> StateDigest {
        StateDigest {
            harts: vec![[1; 8], [2; 8]],
            parts: vec![[3; 8], [4; 8]],
            ram: [5; 8],
            pages: vec![(0x80000, 7), (0x80001, 8), (0x80005, 9)],
        }
    }

    #[test]
    fn names_each_part_that_differs() {
        let names = vec!["UART".to_string(), "virtio-blk (slot 0)".to_string()];
        let a = digest();
        assert!(a.differences(&a.clone(), &names).is_empty());
        let mut b = a.clone();
        b.harts[1] = [0; 8];
        b.parts[1] = [0; 8];
        b.ram = [0; 8];
        b.pages = vec![(0x80000, 7), (0x80001, 1), (0x80009, 9)];
        let d = a.differences(&b, &names);
        assert_eq!(d[0], "hart 1 registers");
        assert_eq!(d[1], "virtio-blk (slot 0)");
        assert_eq!(
            d[2],
            "the contents of RAM pages 0x80001000; RAM pages written only in this run: 0x80005000; \
             RAM pages written only in the recording: 0x80009000"
        );
    }

    #[test]
    fn a_full_hash_difference_alone_is_still_reported() {
        let a = digest();
        let mut b = a.clone();
        b.ram = [0; 8];
        assert_eq!(a.differences(&b, &[]).len(), 1);
    }
}
