//! Page compression of checkpoints (Remus §3.4,
//! ../../../shared/seeds/remus.txt, "Page compression"): the primary keeps
//! the last content it sent of recently sent pages, and the next version of
//! such a page goes out as its XOR against that copy, run-length encoded,
//! since a write usually changes a small part of a page. Pages that XOR
//! poorly or were not cached are gathered and compressed with zstd.
//! Remus reports about 10:1 on its replication stream this way.
//!
//! This module owns the encoding of one checkpoint's dirty pages into a
//! blob ([`PageEncoder`]) and its decoding back into pages ([`decode`]);
//! moving blobs and applying pages is the caller's.
//!
//! Blob layout (integers little-endian):
//!
//! ```text
//! header:  magic "FTPD" | version u8 (1) | section kind u8 (0 raw, 1 zstd)
//!          | pages u32 | section pages u32 | section length u64
//! section: the full contents of the section pages, in entry order, either
//!          raw (section pages * 4096 bytes) or as one zstd frame
//! entries: one per page, in the order encoded:
//!          tag u8 | pfn u64 | body
//!          tag 0 ZERO:    no body, the page is all zeros
//!          tag 1 XOR:     delta length u16 | delta; the page is the
//!                         backup's current copy XOR the decoded delta
//!          tag 2 SECTION: no body, the page is the next page of the section
//! delta:   runs of (skip u16 | len u16 | len bytes): skip bytes of the
//!          page stay as they are, the next len bytes are XORed with the
//!          given bytes; whatever follows the last run stays as it is
//! ```
//!
//! Per page the encoder picks ZERO if the page is all zeros, else XOR if
//! the page is cached and its delta is at most a fifth of a page (Remus's
//! 5:1 threshold), else the section. The section is one zstd frame if that
//! is smaller than sending its pages without zstd (a poor delta where it
//! is still shorter than the page, the page in full otherwise); if not,
//! those pages go that way, with the full ones in a raw section.
//!
//! The section goes before the entries so the decoder holds every page's
//! content by the time it walks them, and one frame for all the section
//! pages lets zstd find what they have in common.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub const PAGE_SIZE: usize = 4096;

const WORDS: usize = PAGE_SIZE / 8;
const MAGIC: [u8; 4] = *b"FTPD";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 4 + 1 + 1 + 4 + 4 + 8;
/// Tag and pfn: what every entry costs at least.
const ENTRY_LEN: usize = 1 + 8;
const RUN_HEADER: usize = 4;

const TAG_ZERO: u8 = 0;
const TAG_XOR: u8 = 1;
const TAG_SECTION: u8 = 2;
const SECTION_RAW: u8 = 0;
const SECTION_ZSTD: u8 = 1;

/// A delta at most this long is sent as is, without offering the page to
/// zstd: it already saves 5:1, the ratio below which Remus falls back to
/// its general compressor.
const XOR_GOOD: usize = PAGE_SIZE / 5;
/// Beyond this a delta (with its u16 length) is no smaller than the page.
const XOR_MAX: usize = PAGE_SIZE - 3;
/// Checkpoints sit on the guest's pause path: favour speed.
const ZSTD_LEVEL: i32 = 1;
/// The cache grows by chunks of this many pages, so filling it costs few
/// allocations and never copies what is already cached.
const CHUNK_PAGES: usize = 256;

/// What the encoder did, summed over all it encoded (for status and benches).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct DeltaStats {
    pub pages: u64,
    /// `pages * PAGE_SIZE`.
    pub raw_bytes: u64,
    /// Total length of the blobs, headers included.
    pub encoded_bytes: u64,
    pub zero_pages: u64,
    pub xor_pages: u64,
    /// Pages sent in a zstd section.
    pub compressed_pages: u64,
    /// Pages sent in full, in a raw section.
    pub plain_pages: u64,
}

impl DeltaStats {
    /// `raw_bytes / encoded_bytes`, 1.0 when nothing was encoded.
    pub fn ratio(&self) -> f64 {
        if self.raw_bytes == 0 || self.encoded_bytes == 0 {
            1.0
        } else {
            self.raw_bytes as f64 / self.encoded_bytes as f64
        }
    }
}

/// How one page of the checkpoint being encoded will go out. Deltas are
/// kept in the encoder's scratch buffer at `at..at + len`.
#[derive(Clone, Copy)]
enum Plan {
    Zero,
    Xor {
        at: usize,
        len: usize,
    },
    /// Cached, but the delta is long: XOR or section, whichever the
    /// checkpoint as a whole favours.
    Poor {
        at: usize,
        len: usize,
    },
    /// Not cached, or the delta is no smaller than the page.
    Full,
}

/// The primary's side. Remembers the last content it sent of up to
/// `cache_pages` pages, so the next version of a page can be sent as an
/// XOR delta against what the backup already holds.
///
/// Every page sent is cached, zero pages included (their next version is
/// then a delta against zeros). Eviction is clock (second chance): a page
/// found in the cache when it is sent again gets its reference bit set,
/// and a new page, its bit clear, takes the first slot past the clock hand
/// whose bit is clear, clearing bits on the way. It approximates the LRU of Remus at O(1) amortized cost with
/// no list to maintain, and a page sent once and never again (a burst of
/// fresh pages) is evicted before pages that keep changing.
pub struct PageEncoder {
    cache_pages: usize,
    /// pfn -> slot.
    index: HashMap<u64, usize, BuildHasherDefault<PfnHasher>>,
    /// Slot `s` is page `s % CHUNK_PAGES` of chunk `s / CHUNK_PAGES`.
    /// Kept over `clear()` to be refilled without allocating.
    chunks: Vec<Box<[u8]>>,
    slot_pfn: Vec<u64>,
    referenced: Vec<bool>,
    hand: usize,
    // Scratch reused from one checkpoint to the next, so that encoding
    // allocates nothing per page.
    plan: Vec<Plan>,
    deltas: Vec<u8>,
    section: Vec<u8>,
    frame: Vec<u8>,
    sorted: Vec<u64>,
    /// Made on first use; if zstd cannot get its context, pages go raw.
    zstd: Option<zstd::bulk::Compressor<'static>>,
    stats: DeltaStats,
}

impl PageEncoder {
    pub fn new(cache_pages: usize) -> PageEncoder {
        PageEncoder {
            cache_pages,
            index: HashMap::default(),
            chunks: Vec::new(),
            slot_pfn: Vec::new(),
            referenced: Vec::new(),
            hand: 0,
            plan: Vec::new(),
            deltas: Vec::new(),
            section: Vec::new(),
            frame: Vec::new(),
            sorted: Vec::new(),
            zstd: None,
            stats: DeltaStats::default(),
        }
    }

    /// Encodes one checkpoint's dirty pages into one self-delimiting blob.
    /// `pfns[i]` is the page number of `data[i*4096..(i+1)*4096]`; pfns
    /// are distinct. Updates the cache and the stats.
    pub fn encode(&mut self, pfns: &[u64], data: &[u8]) -> Vec<u8> {
        assert_eq!(data.len(), pfns.len() * PAGE_SIZE, "page_delta: data is not one page per pfn");
        assert!(pfns.len() <= u32::MAX as usize, "page_delta: too many pages for one blob");
        // A repeated pfn would be encoded against its own first version
        // here but against the older one on the backup.
        self.sorted.clear();
        self.sorted.extend_from_slice(pfns);
        self.sorted.sort_unstable();
        assert!(self.sorted.windows(2).all(|w| w[0] != w[1]), "page_delta: repeated pfn in one checkpoint");

        self.plan.clear();
        self.deltas.clear();
        self.section.clear();
        // What the section candidates would cost without zstd: XOR where
        // it beats the full page.
        let mut without_zstd = 0usize;
        for (&pfn, page) in pfns.iter().zip(data.chunks_exact(PAGE_SIZE)) {
            let page: &[u8; PAGE_SIZE] = page.try_into().expect("chunks_exact gives whole pages");
            let plan = if is_zero(page) {
                Plan::Zero
            } else if let Some(&slot) = self.index.get(&pfn) {
                let at = self.deltas.len();
                if xor_rle(slot_page(&self.chunks, slot), page, &mut self.deltas, XOR_MAX) {
                    let len = self.deltas.len() - at;
                    if len <= XOR_GOOD {
                        Plan::Xor { at, len }
                    } else {
                        without_zstd += len + 2;
                        Plan::Poor { at, len }
                    }
                } else {
                    without_zstd += PAGE_SIZE;
                    Plan::Full
                }
            } else {
                without_zstd += PAGE_SIZE;
                Plan::Full
            };
            if matches!(plan, Plan::Poor { .. } | Plan::Full) {
                self.section.extend_from_slice(page);
            }
            self.plan.push(plan);
            // The delta is taken: the cache may move on to this version.
            self.remember(pfn, page);
        }

        let use_zstd = !self.section.is_empty() && self.compress() && self.frame.len() < without_zstd;
        let (kind, section_pages, section_len) = if use_zstd {
            (SECTION_ZSTD, self.section.len() / PAGE_SIZE, self.frame.len())
        } else {
            let n = self.plan.iter().filter(|p| matches!(p, Plan::Full)).count();
            (SECTION_RAW, n, n * PAGE_SIZE)
        };
        let entries_len: usize = self
            .plan
            .iter()
            .map(|p| match *p {
                Plan::Xor { len, .. } => ENTRY_LEN + 2 + len,
                Plan::Poor { len, .. } if !use_zstd => ENTRY_LEN + 2 + len,
                _ => ENTRY_LEN,
            })
            .sum();

        let mut out = Vec::with_capacity(HEADER_LEN + section_len + entries_len);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&(pfns.len() as u32).to_le_bytes());
        out.extend_from_slice(&(section_pages as u32).to_le_bytes());
        out.extend_from_slice(&(section_len as u64).to_le_bytes());
        if use_zstd {
            out.extend_from_slice(&self.frame);
        } else {
            for (plan, page) in self.plan.iter().zip(data.chunks_exact(PAGE_SIZE)) {
                if matches!(plan, Plan::Full) {
                    out.extend_from_slice(page);
                }
            }
        }
        let st = &mut self.stats;
        for (plan, &pfn) in self.plan.iter().zip(pfns) {
            let tag = match *plan {
                Plan::Zero => TAG_ZERO,
                Plan::Xor { .. } => TAG_XOR,
                Plan::Poor { .. } if !use_zstd => TAG_XOR,
                _ => TAG_SECTION,
            };
            out.push(tag);
            out.extend_from_slice(&pfn.to_le_bytes());
            match (tag, *plan) {
                (TAG_XOR, Plan::Xor { at, len } | Plan::Poor { at, len }) => {
                    out.extend_from_slice(&(len as u16).to_le_bytes());
                    out.extend_from_slice(&self.deltas[at..at + len]);
                    st.xor_pages += 1;
                }
                (TAG_ZERO, _) => st.zero_pages += 1,
                _ if use_zstd => st.compressed_pages += 1,
                _ => st.plain_pages += 1,
            }
        }
        debug_assert_eq!(out.len(), HEADER_LEN + section_len + entries_len);
        st.pages += pfns.len() as u64;
        st.raw_bytes += (pfns.len() * PAGE_SIZE) as u64;
        st.encoded_bytes += out.len() as u64;
        out
    }

    pub fn stats(&self) -> DeltaStats {
        self.stats
    }

    /// Forget every cached page (after this, nothing is sent as a delta
    /// until sent again in full). The cache's memory is kept for reuse.
    pub fn clear(&mut self) {
        self.index.clear();
        self.slot_pfn.clear();
        self.referenced.clear();
        self.hand = 0;
    }

    /// Compresses the section into `frame`; false if zstd failed.
    fn compress(&mut self) -> bool {
        if self.zstd.is_none() {
            self.zstd = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
        }
        let Some(z) = self.zstd.as_mut() else { return false };
        self.frame.clear();
        self.frame.reserve(zstd::zstd_safe::compress_bound(self.section.len()));
        z.compress_to_buffer(&self.section, &mut self.frame).is_ok()
    }

    /// Makes `page` the cached content of `pfn`, which it has just been
    /// sent as.
    fn remember(&mut self, pfn: u64, page: &[u8; PAGE_SIZE]) {
        if self.cache_pages == 0 {
            return;
        }
        let slot = match self.index.get(&pfn) {
            Some(&slot) => {
                self.referenced[slot] = true;
                slot
            }
            None => {
                let slot = self.free_slot();
                self.index.insert(pfn, slot);
                self.slot_pfn[slot] = pfn;
                self.referenced[slot] = false;
                slot
            }
        };
        let chunk = &mut self.chunks[slot / CHUNK_PAGES];
        chunk[(slot % CHUNK_PAGES) * PAGE_SIZE..][..PAGE_SIZE].copy_from_slice(page);
    }

    fn free_slot(&mut self) -> usize {
        let used = self.slot_pfn.len();
        if used < self.cache_pages {
            if used / CHUNK_PAGES == self.chunks.len() {
                let n = CHUNK_PAGES.min(self.cache_pages - used);
                self.chunks.push(vec![0u8; n * PAGE_SIZE].into_boxed_slice());
            }
            self.slot_pfn.push(u64::MAX);
            self.referenced.push(false);
            return used;
        }
        // At most two turns: the first clears every bit it passes.
        loop {
            let slot = self.hand;
            self.hand = (slot + 1) % self.cache_pages;
            if self.referenced[slot] {
                self.referenced[slot] = false;
            } else {
                self.index.remove(&self.slot_pfn[slot]);
                return slot;
            }
        }
    }
}

fn slot_page(chunks: &[Box<[u8]>], slot: usize) -> &[u8; PAGE_SIZE] {
    chunks[slot / CHUNK_PAGES][(slot % CHUNK_PAGES) * PAGE_SIZE..][..PAGE_SIZE].try_into().expect("slot is a page")
}

fn word(page: &[u8; PAGE_SIZE], i: usize) -> u64 {
    u64::from_le_bytes(page[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

fn is_zero(page: &[u8; PAGE_SIZE]) -> bool {
    // OR whole lines before testing: vectorizes, and a nonzero page
    // usually shows it in its first line.
    page.chunks_exact(64).all(|line| {
        line.chunks_exact(8).fold(0, |acc, w| acc | u64::from_le_bytes(w.try_into().expect("8 bytes"))) == 0
    })
}

/// Appends the run-length encoded `old ^ new` to `out`. Runs are found a
/// word at a time and trimmed to the bytes that differ at their ends.
/// Returns false, with `out` as it was, if the delta would exceed `limit`.
fn xor_rle(old: &[u8; PAGE_SIZE], new: &[u8; PAGE_SIZE], out: &mut Vec<u8>, limit: usize) -> bool {
    const LINE_WORDS: usize = 8;
    let start = out.len();
    let mut done = 0; // bytes of the page covered by the runs so far
                      // The run being gathered: its first byte, and its last nonzero word
                      // with that word's index.
    let mut run: Option<(usize, usize, u64)> = None;
    let mut emit = |from: usize, w: usize, last: u64, out: &mut Vec<u8>| {
        // Little-endian: a word's last bytes are its high bits.
        let to = w * 8 + 8 - (last.leading_zeros() / 8) as usize;
        if out.len() - start + RUN_HEADER + (to - from) > limit {
            return false;
        }
        out.extend_from_slice(&((from - done) as u16).to_le_bytes());
        out.extend_from_slice(&((to - from) as u16).to_le_bytes());
        out.extend(old[from..to].iter().zip(&new[from..to]).map(|(a, b)| a ^ b));
        done = to;
        true
    };
    for line in 0..WORDS / LINE_WORDS {
        let words = line * LINE_WORDS..(line + 1) * LINE_WORDS;
        // Most of a lightly written page is equal lines: test a whole line
        // with one branch (this vectorizes) before looking at its words.
        if run.is_none() && words.clone().fold(0, |acc, w| acc | (word(old, w) ^ word(new, w))) == 0 {
            continue;
        }
        for w in words {
            let x = word(old, w) ^ word(new, w);
            match (x, run) {
                (0, None) => {}
                (0, Some((from, last_w, last))) => {
                    if !emit(from, last_w, last, out) {
                        out.truncate(start);
                        return false;
                    }
                    run = None;
                }
                (_, None) => run = Some((w * 8 + (x.trailing_zeros() / 8) as usize, w, x)),
                (_, Some((from, _, _))) => run = Some((from, w, x)),
            }
        }
    }
    if let Some((from, last_w, last)) = run {
        if !emit(from, last_w, last, out) {
            out.truncate(start);
            return false;
        }
    }
    true
}

/// Why a delta does not apply to a page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    /// Fewer bytes than a run's header are left.
    #[error("truncated run header in delta")]
    RunHeader { left: usize },
    /// A run says it has more bytes than the delta has left.
    #[error("run longer than its delta")]
    RunPastDelta { len: usize, left: usize },
    /// A run would change bytes past the page's end.
    #[error("delta runs past the end of the page")]
    RunPastPage { at: usize, len: usize },
}

/// Why a blob was refused, before any of its pages was applied.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The blob ends inside its `part` (header, section, entry or delta).
    #[error("blob truncated in {part}")]
    Truncated { part: &'static str },
    #[error("not a page delta blob (bad magic)")]
    Magic { found: [u8; 4] },
    #[error("unsupported page delta version {version}")]
    Version { version: u8 },
    /// The header counts more pages in the section than in all.
    #[error("{section_pages} section pages but {pages} pages")]
    SectionPages { section_pages: usize, pages: usize },
    #[error("section length {section_len} exceeds the blob")]
    SectionLength { section_len: u64 },
    /// More pages than the blob has room for entries of.
    #[error("{pages} pages cannot fit in the blob")]
    Pages { pages: usize },
    /// The zstd section is not a frame that inflates to its pages.
    #[error("section does not decompress: {0}")]
    Decompress(#[source] std::io::Error),
    #[error("unknown section kind {kind}")]
    SectionKind { kind: u8 },
    /// The section's content is not the header's count of pages.
    #[error("section holds {len} bytes, not {section_pages} pages")]
    SectionSize { len: usize, section_pages: usize },
    /// `base` has no page of this number.
    #[error("pfn {pfn:#x} out of range")]
    PfnOutOfRange { pfn: u64 },
    /// `base` gave a copy of the page that is not a page long.
    #[error("backup copy of pfn {pfn:#x} is {len} bytes")]
    BaseLength { pfn: u64, len: usize },
    /// The page's delta does not apply.
    #[error("pfn {pfn:#x}: {source}")]
    Delta {
        pfn: u64,
        #[source]
        source: DeltaError,
    },
    /// More entries take their page from the section than it holds.
    #[error("more section entries than section pages")]
    SectionShort,
    #[error("unknown page tag {tag} for pfn {pfn:#x}")]
    Tag { tag: u8, pfn: u64 },
    #[error("{len} bytes after the last page")]
    Trailing { len: usize },
    /// The section holds pages no entry takes.
    #[error("section pages without an entry")]
    SectionUnused,
    /// The encoder never repeats a pfn: a repeat would be decoded
    /// against a base the encoder did not use.
    #[error("pfn {pfn:#x} appears twice")]
    Repeated { pfn: u64 },
}

/// Applies a delta made by [`xor_rle`] to `page`.
fn apply_rle(page: &mut [u8; PAGE_SIZE], mut delta: &[u8]) -> Result<(), DeltaError> {
    let mut pos = 0usize;
    while !delta.is_empty() {
        if delta.len() < RUN_HEADER {
            return Err(DeltaError::RunHeader { left: delta.len() });
        }
        let skip = u16::from_le_bytes([delta[0], delta[1]]) as usize;
        let len = u16::from_le_bytes([delta[2], delta[3]]) as usize;
        delta = &delta[RUN_HEADER..];
        if len > delta.len() {
            return Err(DeltaError::RunPastDelta { len, left: delta.len() });
        }
        pos += skip;
        if pos + len > PAGE_SIZE {
            return Err(DeltaError::RunPastPage { at: pos, len });
        }
        for (d, s) in page[pos..pos + len].iter_mut().zip(&delta[..len]) {
            *d ^= s;
        }
        pos += len;
        delta = &delta[len..];
    }
    Ok(())
}

/// A cursor that refuses to read past the end of the blob.
struct Cursor<'b> {
    rest: &'b [u8],
}

impl<'b> Cursor<'b> {
    fn take(&mut self, n: usize, part: &'static str) -> Result<&'b [u8], DecodeError> {
        if n > self.rest.len() {
            return Err(DecodeError::Truncated { part });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, part: &'static str) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N, part)?.try_into().expect("took N bytes"))
    }
}

/// The backup's side: decodes a blob into full page contents without
/// changing anything, so that a corrupt blob is found before any page is
/// applied. `base(pfn)` is the backup's current copy of that page (what
/// was last sent of it, i.e. the XOR base), or None if the page number is
/// out of range; it is asked for every page, so a pfn out of range is an
/// error whatever its encoding. Returns (pfn, page) pairs in the order
/// encoded. Never panics on any input: returns the problem as an Err.
#[allow(clippy::type_complexity)] // spelled out: an alias would hide what callers get
pub fn decode<'a>(
    blob: &[u8],
    base: impl Fn(u64) -> Option<&'a [u8]>,
) -> Result<Vec<(u64, Box<[u8; PAGE_SIZE]>)>, DecodeError> {
    let mut r = Cursor { rest: blob };
    let magic = r.array::<4>("header")?;
    if magic != MAGIC {
        return Err(DecodeError::Magic { found: magic });
    }
    let [version] = r.array::<1>("header")?;
    if version != VERSION {
        return Err(DecodeError::Version { version });
    }
    let [kind] = r.array::<1>("header")?;
    let pages = u32::from_le_bytes(r.array("header")?) as usize;
    let section_pages = u32::from_le_bytes(r.array("header")?) as usize;
    let section_len = u64::from_le_bytes(r.array("header")?);
    if section_pages > pages {
        return Err(DecodeError::SectionPages { section_pages, pages });
    }
    let section_len = usize::try_from(section_len)
        .ok()
        .filter(|&n| n <= r.rest.len())
        .ok_or(DecodeError::SectionLength { section_len })?;
    let stored = r.take(section_len, "section")?;
    // Bounds what the counts below can make us allocate by the blob's
    // own size.
    if pages > r.rest.len() / ENTRY_LEN {
        return Err(DecodeError::Pages { pages });
    }
    let want = section_pages * PAGE_SIZE;
    let inflated;
    let section: &[u8] = match kind {
        SECTION_RAW => stored,
        SECTION_ZSTD => {
            inflated = zstd::bulk::decompress(stored, want).map_err(DecodeError::Decompress)?;
            &inflated
        }
        kind => return Err(DecodeError::SectionKind { kind }),
    };
    if section.len() != want {
        return Err(DecodeError::SectionSize { len: section.len(), section_pages });
    }

    let mut out = Vec::with_capacity(pages);
    let mut section = section.chunks_exact(PAGE_SIZE);
    for _ in 0..pages {
        let [tag] = r.array::<1>("entry")?;
        let pfn = u64::from_le_bytes(r.array("entry")?);
        let current = base(pfn).ok_or(DecodeError::PfnOutOfRange { pfn })?;
        let current: &[u8; PAGE_SIZE] =
            current.try_into().map_err(|_| DecodeError::BaseLength { pfn, len: current.len() })?;
        let page: Box<[u8; PAGE_SIZE]> = match tag {
            TAG_ZERO => vec![0u8; PAGE_SIZE].into_boxed_slice().try_into().expect("one page"),
            TAG_XOR => {
                let len = u16::from_le_bytes(r.array("entry")?) as usize;
                let delta = r.take(len, "delta")?;
                let mut page: Box<[u8; PAGE_SIZE]> = Box::<[u8]>::from(&current[..]).try_into().expect("one page");
                apply_rle(&mut page, delta).map_err(|source| DecodeError::Delta { pfn, source })?;
                page
            }
            TAG_SECTION => {
                let content = section.next().ok_or(DecodeError::SectionShort)?;
                Box::<[u8]>::from(content).try_into().expect("one page")
            }
            tag => return Err(DecodeError::Tag { tag, pfn }),
        };
        out.push((pfn, page));
    }
    if !r.rest.is_empty() {
        return Err(DecodeError::Trailing { len: r.rest.len() });
    }
    if section.next().is_some() {
        return Err(DecodeError::SectionUnused);
    }
    // The encoder never repeats a pfn: a repeat would be decoded against
    // a base the encoder did not use.
    let mut pfns: Vec<u64> = out.iter().map(|(pfn, _)| *pfn).collect();
    pfns.sort_unstable();
    if let Some(w) = pfns.windows(2).find(|w| w[0] == w[1]) {
        return Err(DecodeError::Repeated { pfn: w[0] });
    }
    Ok(out)
}

/// Pfns are neither secret nor chosen by an adversary: a multiply and a
/// fold beat SipHash here, and spread strided pfns over the low bits.
#[derive(Default)]
struct PfnHasher(u64);

impl Hasher for PfnHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, x: u64) {
        let h = (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64: deterministic, and no dev-dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn fill(&mut self, buf: &mut [u8]) {
            for b in buf {
                *b = self.next() as u8;
            }
        }

        /// `k` distinct pfns below `n`, in random order.
        fn dirty(&mut self, n: usize, k: usize) -> Vec<u64> {
            let mut all: Vec<u64> = (0..n as u64).collect();
            for i in (1..n).rev() {
                all.swap(i, self.below(i + 1));
            }
            all.truncate(k);
            all
        }
    }

    type Page = [u8; PAGE_SIZE];

    /// The ways a guest may have changed a page since it was last sent.
    fn mutate(rng: &mut Rng, page: &mut Page) {
        match rng.below(8) {
            0 => {
                for _ in 0..1 + rng.below(8) {
                    page[rng.below(PAGE_SIZE)] = rng.next() as u8;
                }
            }
            1 => {
                for _ in 0..1 + rng.below(16) {
                    let w = rng.below(WORDS) * 8;
                    page[w..w + 8].copy_from_slice(&rng.next().to_le_bytes());
                }
            }
            2 => rng.fill(page),
            3 => page.fill(0),
            4 => {
                // Text-like: compresses well, XORs badly.
                let alphabet = b"the quick brown fox ";
                let shift = rng.below(alphabet.len());
                for (i, b) in page.iter_mut().enumerate() {
                    *b = alphabet[(i + shift) % alphabet.len()] ^ (rng.below(64) == 0) as u8;
                }
            }
            5 => {
                let len = 1 + rng.below(2500);
                let at = rng.below(PAGE_SIZE - len);
                rng.fill(&mut page[at..at + len]);
            }
            6 => {} // dirtied, rewritten with the same bytes
            _ => {
                page.fill(0);
                page[rng.below(PAGE_SIZE)] = 1;
            }
        }
    }

    /// A primary's memory and a backup's, kept in step through blobs.
    struct Pair {
        primary: Vec<Page>,
        backup: Vec<Page>,
        enc: PageEncoder,
        blob_bytes: u64,
    }

    impl Pair {
        fn new(pages: usize, cache_pages: usize) -> Pair {
            Pair {
                primary: vec![[0; PAGE_SIZE]; pages],
                backup: vec![[0; PAGE_SIZE]; pages],
                enc: PageEncoder::new(cache_pages),
                blob_bytes: 0,
            }
        }

        /// Sends the pages `dirty` and applies them on the backup.
        fn checkpoint(&mut self, dirty: &[u64]) -> Vec<u8> {
            let mut data = Vec::new();
            for &pfn in dirty {
                data.extend_from_slice(&self.primary[pfn as usize]);
            }
            let blob = self.enc.encode(dirty, &data);
            self.blob_bytes += blob.len() as u64;
            let decoded = decode(&blob, |pfn| self.backup.get(pfn as usize).map(|p| &p[..])).unwrap();
            assert_eq!(decoded.len(), dirty.len());
            for ((pfn, page), &want) in decoded.into_iter().zip(dirty) {
                assert_eq!(pfn, want);
                self.backup[pfn as usize] = *page;
            }
            blob
        }

        fn random_checkpoint(&mut self, rng: &mut Rng) {
            let n = self.primary.len();
            let k = 1 + rng.below(n);
            let dirty = rng.dirty(n, k);
            for &pfn in &dirty {
                mutate(rng, &mut self.primary[pfn as usize]);
            }
            self.checkpoint(&dirty);
            self.assert_in_step();
        }

        fn assert_in_step(&self) {
            for (pfn, (p, b)) in self.primary.iter().zip(&self.backup).enumerate() {
                assert!(p == b, "page {pfn} differs between primary and backup");
            }
        }
    }

    #[test]
    fn round_trip_through_checkpoints() {
        let mut rng = Rng(1);
        let mut pair = Pair::new(64, 64);
        for _ in 0..80 {
            pair.random_checkpoint(&mut rng);
        }
        let st = pair.enc.stats();
        // Every kind of entry went through the round trip.
        assert!(st.zero_pages > 0 && st.xor_pages > 0 && st.compressed_pages > 0, "{st:?}");
        assert!(st.ratio() > 1.0, "{st:?}");
    }

    #[test]
    fn eviction_keeps_round_trip_correct() {
        let mut rng = Rng(2);
        let mut pair = Pair::new(64, 8);
        for _ in 0..80 {
            pair.random_checkpoint(&mut rng);
            assert!(pair.enc.index.len() <= 8 && pair.enc.slot_pfn.len() <= 8);
            for (slot, &pfn) in pair.enc.slot_pfn.iter().enumerate() {
                // Whatever the cache holds is what the backup holds.
                if pair.enc.index.get(&pfn) == Some(&slot) {
                    assert!(slot_page(&pair.enc.chunks, slot) == &pair.backup[pfn as usize]);
                }
            }
        }
        assert!(pair.enc.stats().xor_pages > 0);
        // A working set that fits is all hits again once it has been
        // sent twice (the first sends may still evict one another).
        for round in 0..6u8 {
            let before = pair.enc.stats().xor_pages;
            for pfn in 0..4 {
                pair.primary[pfn][8 * round as usize + pfn] = round + 1;
            }
            pair.checkpoint(&[0, 1, 2, 3]);
            if round >= 3 {
                assert_eq!(pair.enc.stats().xor_pages, before + 4, "round {round}");
            }
        }
        pair.assert_in_step();
    }

    #[test]
    fn cache_of_more_chunks_than_one() {
        let mut rng = Rng(3);
        let n = CHUNK_PAGES * 2 + 10;
        let mut pair = Pair::new(n, CHUNK_PAGES + 7);
        for _ in 0..6 {
            pair.random_checkpoint(&mut rng);
        }
        assert_eq!(pair.enc.chunks.len(), 2);
        assert_eq!(pair.enc.chunks[1].len(), 7 * PAGE_SIZE);
    }

    #[test]
    fn no_cache_still_round_trips() {
        let mut rng = Rng(4);
        let mut pair = Pair::new(16, 0);
        for _ in 0..20 {
            pair.random_checkpoint(&mut rng);
        }
        assert_eq!(pair.enc.stats().xor_pages, 0);
    }

    #[test]
    fn clear_forgets_and_still_round_trips() {
        let mut rng = Rng(5);
        let mut pair = Pair::new(32, 32);
        for _ in 0..10 {
            pair.random_checkpoint(&mut rng);
        }
        rng.fill(&mut pair.primary[7]);
        pair.checkpoint(&[7]);
        pair.enc.clear();
        let xor = pair.enc.stats().xor_pages;
        pair.primary[7][100] ^= 1;
        let blob = pair.checkpoint(&[7]);
        assert_eq!(pair.enc.stats().xor_pages, xor, "a delta against a forgotten page");
        assert!(blob.len() > PAGE_SIZE);
        pair.primary[7][200] ^= 1;
        pair.checkpoint(&[7]);
        assert_eq!(pair.enc.stats().xor_pages, xor + 1, "sent in full, so cached again");
        for _ in 0..10 {
            pair.random_checkpoint(&mut rng);
        }
        pair.assert_in_step();
    }

    #[test]
    fn few_changed_bytes_encode_small() {
        let mut rng = Rng(6);
        let mut pair = Pair::new(4, 4);
        rng.fill(&mut pair.primary[2]);
        let first = pair.checkpoint(&[2]);
        assert!(first.len() > PAGE_SIZE, "random content does not compress");
        for at in [0, 1000, 4095] {
            pair.primary[2][at] ^= 0xFF;
        }
        let blob = pair.checkpoint(&[2]);
        assert_eq!(blob.len(), HEADER_LEN + ENTRY_LEN + 2 + 3 * (RUN_HEADER + 1));
        pair.assert_in_step();
        assert_eq!(pair.enc.stats().xor_pages, 1);
        // Unchanged but dirty: an empty delta.
        assert_eq!(pair.checkpoint(&[2]).len(), HEADER_LEN + ENTRY_LEN + 2);
    }

    #[test]
    fn xor_rle_matches_apply_rle() {
        let mut rng = Rng(7);
        for round in 0..500 {
            let mut old = [0u8; PAGE_SIZE];
            rng.fill(&mut old);
            let mut new = old;
            for _ in 0..round % 40 {
                let len = 1 + rng.below(1 + round % 64);
                let at = rng.below(PAGE_SIZE - len);
                rng.fill(&mut new[at..at + len]);
            }
            let mut delta = vec![9, 9];
            assert!(xor_rle(&old, &new, &mut delta, usize::MAX));
            let mut page = old;
            apply_rle(&mut page, &delta[2..]).unwrap();
            assert!(page == new);
            let differ = old.iter().zip(&new).filter(|(a, b)| a != b).count();
            assert!(delta.len() - 2 <= differ + (RUN_HEADER + 14) * (round % 40));
        }
        // Over the limit: refused, and what was there is left alone.
        let old = [0u8; PAGE_SIZE];
        let new = [1u8; PAGE_SIZE];
        let mut delta = vec![7];
        assert!(!xor_rle(&old, &new, &mut delta, XOR_MAX));
        assert_eq!(delta, [7]);
    }

    #[test]
    fn zero_pages_are_a_tag() {
        let mut rng = Rng(8);
        let mut pair = Pair::new(4, 4);
        rng.fill(&mut pair.primary[1]);
        pair.checkpoint(&[1, 3]);
        pair.primary[1].fill(0);
        let blob = pair.checkpoint(&[1]);
        assert_eq!(blob.len(), HEADER_LEN + ENTRY_LEN);
        pair.assert_in_step();
        assert_eq!(pair.enc.stats().zero_pages, 2);
        // Decoded to zeros whatever the backup held.
        let ones = [1u8; PAGE_SIZE];
        let pages = decode(&blob, |_| Some(&ones[..])).unwrap();
        assert!(pages[0].1.iter().all(|&b| b == 0));
    }

    #[test]
    fn section_is_zstd_when_it_pays_else_plain() {
        let mut rng = Rng(9);
        let mut pair = Pair::new(8, 8);
        for pfn in 0..4 {
            rng.fill(&mut pair.primary[pfn]);
        }
        let blob = pair.checkpoint(&[0, 1, 2, 3]);
        assert_eq!(blob[5], SECTION_RAW);
        assert_eq!(pair.enc.stats().plain_pages, 4);
        assert_eq!(blob.len(), HEADER_LEN + 4 * (ENTRY_LEN + PAGE_SIZE));

        for pfn in 4..8 {
            for (i, b) in pair.primary[pfn].iter_mut().enumerate() {
                *b = (i % 7) as u8 + pfn as u8;
            }
        }
        let blob = pair.checkpoint(&[4, 5, 6, 7]);
        assert_eq!(blob[5], SECTION_ZSTD);
        assert_eq!(pair.enc.stats().compressed_pages, 4);
        assert!(blob.len() < PAGE_SIZE / 4);

        // Cached, rewritten in full with noise: no delta beats the page.
        rng.fill(&mut pair.primary[0]);
        pair.checkpoint(&[0]);
        assert_eq!(pair.enc.stats().plain_pages, 5);
        assert_eq!(pair.enc.stats().xor_pages, 0);

        // Cached, a third rewritten with noise: a poor delta, but better
        // than anything zstd makes of noise, so XOR after all.
        rng.fill(&mut pair.primary[1][..1500]);
        let blob = pair.checkpoint(&[1]);
        assert_eq!(pair.enc.stats().xor_pages, 1);
        assert!(blob.len() < 1600);
        pair.assert_in_step();
    }

    #[test]
    fn stats_add_up() {
        let mut rng = Rng(10);
        assert_eq!(DeltaStats::default().ratio(), 1.0);
        let mut pair = Pair::new(32, 16);
        let mut pages = 0;
        for _ in 0..30 {
            let k = 1 + rng.below(32);
            let dirty = rng.dirty(32, k);
            pages += dirty.len() as u64;
            for &pfn in &dirty {
                mutate(&mut rng, &mut pair.primary[pfn as usize]);
            }
            pair.checkpoint(&dirty);
        }
        pair.checkpoint(&[]);
        let st = pair.enc.stats();
        assert_eq!(st.pages, pages);
        assert_eq!(st.raw_bytes, pages * PAGE_SIZE as u64);
        assert_eq!(st.zero_pages + st.xor_pages + st.compressed_pages + st.plain_pages, pages);
        assert_eq!(st.encoded_bytes, pair.blob_bytes);
        assert_eq!(st.ratio(), st.raw_bytes as f64 / st.encoded_bytes as f64);
    }

    /// Blobs with every kind of entry and both kinds of section.
    fn sample_blobs() -> Vec<(Vec<u8>, Vec<Page>)> {
        let mut rng = Rng(11);
        let mut pair = Pair::new(8, 8);
        for pfn in 0..6 {
            rng.fill(&mut pair.primary[pfn]);
        }
        pair.checkpoint(&[0, 1, 2, 3, 4, 5]);
        let mut blobs = Vec::new();
        let backup = pair.backup.clone();
        pair.primary[0][10] ^= 1; // xor
        pair.primary[1].fill(0); // zero
        pair.primary[2].fill(3); // zstd
        rng.fill(&mut pair.primary[3][..2000]); // poor, into the zstd section
        blobs.push((pair.checkpoint(&[0, 1, 2, 3]), backup));
        assert_eq!(blobs[0].0[5], SECTION_ZSTD);
        let backup = pair.backup.clone();
        rng.fill(&mut pair.primary[6]); // plain
        pair.primary[4][4000] ^= 1; // xor
        blobs.push((pair.checkpoint(&[6, 4, 7]), backup));
        assert_eq!(blobs[1].0[5], SECTION_RAW);
        blobs
    }

    #[test]
    fn truncated_or_extended_blobs_are_refused() {
        for (blob, backup) in sample_blobs() {
            let base = |pfn: u64| backup.get(pfn as usize).map(|p| &p[..]);
            assert!(decode(&blob, base).is_ok());
            for len in 0..blob.len() {
                assert!(decode(&blob[..len], base).is_err(), "truncated to {len} of {}", blob.len());
            }
            let mut longer = blob.clone();
            longer.push(0);
            assert!(decode(&longer, base).is_err());
        }
    }

    #[test]
    fn garbage_is_refused_without_panic() {
        let mut rng = Rng(12);
        let page = [0u8; PAGE_SIZE];
        let base = |_| Some(&page[..]);
        for _ in 0..2000 {
            let mut junk = vec![0; rng.below(300)];
            rng.fill(&mut junk);
            assert!(decode(&junk, base).is_err());
            // Past the magic, into the counts and entries.
            if junk.len() >= 5 {
                junk[..4].copy_from_slice(&MAGIC);
                junk[4] = VERSION;
                junk[5..].iter_mut().take(1).for_each(|k| *k &= 1);
                let _ = decode(&junk, base);
            }
        }
        // Valid blobs with bytes flipped: anything but a panic.
        for (blob, backup) in sample_blobs() {
            let base = |pfn: u64| backup.get(pfn as usize).map(|p| &p[..]);
            for _ in 0..3000 {
                let mut bad = blob.clone();
                for _ in 0..1 + rng.below(3) {
                    // Half the flips in the header and first entries.
                    let span = HEADER_LEN + 64 + rng.below(2) * bad.len();
                    let at = rng.below(bad.len().min(span));
                    bad[at] ^= 1 << rng.below(8);
                }
                let _ = decode(&bad, base);
            }
        }
        // Huge counts and lengths.
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[VERSION, SECTION_ZSTD]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 64]);
        let refused = decode(&huge, base).unwrap_err();
        assert!(matches!(refused, DecodeError::SectionLength { .. }), "{refused:?}");
        assert!(refused.to_string().contains("section length"), "{refused}");
        huge[14..22].copy_from_slice(&0u64.to_le_bytes());
        let refused = decode(&huge, base).unwrap_err();
        assert!(matches!(refused, DecodeError::Pages { pages } if pages == u32::MAX as usize), "{refused:?}");
        assert!(refused.to_string().contains("pages"), "{refused}");
        // An entry claiming a delta longer than the blob.
        let mut long = MAGIC.to_vec();
        long.extend_from_slice(&[VERSION, SECTION_RAW, 1, 0, 0, 0, 0, 0, 0, 0]);
        long.extend_from_slice(&0u64.to_le_bytes());
        long.push(TAG_XOR);
        long.extend_from_slice(&0u64.to_le_bytes());
        long.extend_from_slice(&u16::MAX.to_le_bytes());
        let refused = decode(&long, base).unwrap_err();
        assert!(matches!(refused, DecodeError::Truncated { part: "delta" }), "{refused:?}");
        assert!(refused.to_string().contains("truncated"), "{refused}");
    }

    #[test]
    fn pfn_out_of_range_is_refused() {
        for (blob, backup) in sample_blobs() {
            // Every sample has a pfn past 2, of whatever kind.
            let err = decode(&blob, |pfn| backup[..3].get(pfn as usize).map(|p| &p[..])).unwrap_err();
            assert!(matches!(err, DecodeError::PfnOutOfRange { .. }), "{err:?}");
            assert!(err.to_string().contains("out of range"), "{err}");
            let short = [0u8; 100];
            assert!(decode(&blob, |_| Some(&short[..])).is_err());
        }
        let mut pair = Pair::new(8, 8);
        pair.primary[5].fill(0xAB);
        for _ in 0..2 {
            let mut data = Vec::new();
            data.extend_from_slice(&pair.primary[5]);
            let blob = pair.enc.encode(&[5], &data);
            assert!(decode(&blob, |pfn| pair.backup[..5].get(pfn as usize).map(|p| &p[..])).is_err());
        }
    }

    #[test]
    fn repeated_pfn_is_refused() {
        let mut enc = PageEncoder::new(4);
        let mut blob = enc.encode(&[1, 2], &[0; 2 * PAGE_SIZE]);
        let page = [0u8; PAGE_SIZE];
        assert!(decode(&blob, |_| Some(&page[..])).is_ok());
        let second = HEADER_LEN + ENTRY_LEN + 1;
        blob[second..second + 8].copy_from_slice(&1u64.to_le_bytes());
        let refused = decode(&blob, |_| Some(&page[..])).unwrap_err();
        assert!(matches!(refused, DecodeError::Repeated { pfn: 1 }), "{refused:?}");
        assert!(refused.to_string().contains("twice"), "{refused}");
    }

    #[test]
    fn errors_read_as_they_always_have() {
        assert_eq!(decode(b"FTP", |_| None).unwrap_err().to_string(), "blob truncated in header");
        assert_eq!(decode(b"XXXX", |_| None).unwrap_err().to_string(), "not a page delta blob (bad magic)");
        assert_eq!(DecodeError::PfnOutOfRange { pfn: 0x10 }.to_string(), "pfn 0x10 out of range");
        let delta = DecodeError::Delta { pfn: 3, source: DeltaError::RunPastDelta { len: 9, left: 2 } };
        assert_eq!(delta.to_string(), "pfn 0x3: run longer than its delta");
        assert_eq!(
            DecodeError::SectionSize { len: 5, section_pages: 1 }.to_string(),
            "section holds 5 bytes, not 1 pages"
        );
    }

    #[test]
    #[should_panic(expected = "repeated pfn")]
    fn encoder_refuses_repeated_pfn() {
        PageEncoder::new(4).encode(&[3, 3], &[0; 2 * PAGE_SIZE]);
    }
}
