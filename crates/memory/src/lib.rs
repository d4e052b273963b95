#![deny(missing_docs)]

//! Guest physical RAM: one contiguous region at a fixed guest-physical base,
//! plus a dirty-page bitmap that records every page written since the last
//! [`GuestRam::take_dirty`], whether by a CPU store or by device DMA, and
//! each page's code state: whether instructions were decoded from it since
//! it was last written (see [`GuestRam::begin_code`]).
//!
//! We keep our own type instead of vm-memory's `GuestMemoryMmap` because the
//! CPU's hot path wants a raw host pointer into a single region and a dirty
//! bitmap that is updated with plain (non-atomic) stores: everything that
//! touches guest memory runs on the machine's one thread, so no atomics are
//! needed and the bitmap stays exact at instruction boundaries.

use std::fmt;

/// log2 of [`PAGE_SIZE`]: a guest-physical address shifted right by this
/// is its page number.
pub const PAGE_SHIFT: u32 = 12;
/// Bytes in a page, the unit of dirty tracking.
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;

/// An access that falls outside guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfRange {
    /// Guest-physical address of the access's first byte.
    pub addr: u64,
    /// Length of the access in bytes.
    pub len: u64,
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "guest physical range {:#x}+{:#x} is outside RAM", self.addr, self.len)
    }
}

impl std::error::Error for OutOfRange {}

/// Guest RAM the host would not give: too large for the host's memory or
/// address space. A VMM asked for more than the host has says so and
/// exits, rather than aborting in the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamAllocError {
    /// Size of RAM asked for, in bytes.
    pub size: u64,
}

impl fmt::Display for RamAllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot allocate {} MiB of guest RAM: the host refused the memory", self.size >> 20)
    }
}

impl std::error::Error for RamAllocError {}

/// `len` zero bytes, or None if the allocator refuses. `vec![0; len]`
/// would abort the process on refusal, and `try_reserve` + `resize` would
/// write every byte (committing all of RAM at once); `alloc_zeroed` gets
/// lazily zeroed pages from the kernel and reports refusal as null.
fn zeroed(len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: `layout` has a non-zero size (len > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout
    // of `[u8; len]` (align 1, size len == capacity), and all `len` bytes
    // are initialised (zeroed).
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// The guest's RAM and its dirty-page bitmap. Dirty tracking is on when
/// created.
pub struct GuestRam {
    base: u64,
    bytes: Vec<u8>,
    /// One bit per page; set when the page is written.
    dirty: Vec<u64>,
    /// Whether stores mark pages dirty. Off costs nothing on the CPU's
    /// store path beyond one predictable branch.
    tracking: bool,
    /// A second reader's bitmap of the pages written ([`GuestRam::start_view`]),
    /// marked beside the first and taken apart from it.
    view: Option<Vec<u64>>,
    /// Each page's code state (see [`GuestRam::begin_code`]).
    code: Vec<u64>,
    /// How many times a page that a store TLB may cache became code.
    code_purges: u64,
    /// See [`CodeStats`].
    code_stats: CodeStats,
}

/// A page's code state: instructions were decoded from it since it was
/// last written.
pub const CODE: u64 = 1;
/// A page's code state: a CPU's store TLB may hold it (it entered one
/// since it last became code).
const STORE_CACHED: u64 = 2;
/// A page's code state: the count of times it stopped being code, in the
/// bits above [`CODE`] and `STORE_CACHED`.
const CODE_WRITTEN: u64 = 4;

/// What the code states saw, for measurements: nothing the guest sees
/// depends on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeStats {
    /// Pages that became code (of which those a store TLB may have held
    /// are counted by [`GuestRam::code_purges`]).
    pub became_code: u64,
    /// Writes into code, each ending a page's time as code.
    pub code_written: u64,
}

impl GuestRam {
    /// `size` is rounded up to whole pages. Large zeroed allocations are
    /// backed lazily by the host kernel, so an idle guest costs little.
    /// A size the host will not give (a `--mem` beyond the host, or one a
    /// log header or snapshot declares) is an error, not an abort.
    pub fn new(base: u64, size: u64) -> Result<Self, RamAllocError> {
        let refused = RamAllocError { size };
        let size = size.checked_add(PAGE_SIZE - 1).ok_or(refused)? & !(PAGE_SIZE - 1);
        let len = usize::try_from(size).map_err(|_| refused)?;
        let pages = (size >> PAGE_SHIFT) as usize;
        let dirty = vec![0u64; pages.div_ceil(64)];
        Ok(GuestRam {
            base,
            bytes: zeroed(len).ok_or(refused)?,
            dirty,
            tracking: true,
            view: None,
            code: vec![0; pages],
            code_purges: 0,
            code_stats: CodeStats::default(),
        })
    }

    /// Guest-physical address of RAM's first byte.
    #[inline]
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size of RAM in bytes: a whole number of pages.
    #[inline]
    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Guest-physical address one past RAM's last byte.
    #[inline]
    pub fn end(&self) -> u64 {
        self.base + self.size()
    }

    /// Offset of `[addr, addr+len)` into RAM, if it lies entirely inside.
    #[inline]
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<usize> {
        let off = addr.wrapping_sub(self.base);
        if off < self.size() && len <= self.size() - off {
            Some(off as usize)
        } else {
            None
        }
    }

    /// All of RAM, from [`GuestRam::base`] on, for reading.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    /// Raw access for the CPU's fast path. Writers through this slice must
    /// call [`GuestRam::mark_dirty_offset`] themselves, and write no page
    /// that is code (a page in a store TLB is not: see
    /// [`GuestRam::begin_code`]) unless nothing was decoded from this RAM
    /// yet (filling a new machine's RAM).
    pub fn as_mut_slice_untracked(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// Whether writes mark pages dirty.
    #[inline]
    pub fn tracking(&self) -> bool {
        self.tracking
    }

    /// Turns dirty tracking on or off. Pages already marked stay marked.
    pub fn set_tracking(&mut self, on: bool) {
        self.tracking = on;
    }

    /// Marks dirty every page that `[off, off+len)` touches, `off` being a
    /// byte offset into RAM (not a guest address). Does nothing while
    /// tracking is off.
    #[inline]
    pub fn mark_dirty_offset(&mut self, off: usize, len: usize) {
        if !self.tracking || len == 0 {
            return;
        }
        let first = off >> PAGE_SHIFT;
        let last = (off + len - 1) >> PAGE_SHIFT;
        for p in first..=last {
            self.dirty[p >> 6] |= 1u64 << (p & 63);
        }
        if let Some(view) = &mut self.view {
            for p in first..=last {
                view[p >> 6] |= 1u64 << (p & 63);
            }
        }
    }

    /// What a write into `[off, off+len)` changes besides the bytes: the
    /// pages are dirty, and code no longer.
    #[inline]
    fn written(&mut self, off: usize, len: usize) {
        self.mark_dirty_offset(off, len);
        self.code_written(off, len);
    }

    /// Ends the time as code of every page in `[off, off+len)` that is
    /// code: what was decoded from it may be stale now.
    #[inline]
    fn code_written(&mut self, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        for p in off >> PAGE_SHIFT..=(off + len - 1) >> PAGE_SHIFT {
            let state = &mut self.code[p];
            if *state & CODE != 0 {
                *state = (*state & !(CODE | STORE_CACHED)) + CODE_WRITTEN;
                self.code_stats.code_written += 1;
            }
        }
    }

    /// The code state of the page at RAM offset `off`: a block decoded
    /// from the page when it had this state is still what RAM holds while
    /// the state is unchanged. Code states are odd (they have [`CODE`]).
    #[inline(always)]
    pub fn code_state(&self, off: usize) -> u64 {
        self.code[off >> PAGE_SHIFT]
    }

    /// The code states, one `u64` per page, for translated code that
    /// compares a block's state as [`GuestRam::code_state`] does.
    pub fn code_states(&self) -> *const u64 {
        self.code.as_ptr()
    }

    /// Instructions are being decoded from the page at RAM offset `off`:
    /// from now on every write to it ends its time as code, changing its
    /// state, so a decoder can trust what it decoded while the state is
    /// unchanged instead of comparing the bytes again.
    ///
    /// Writes through this type's methods do that themselves. A CPU's
    /// store TLB lets stores write RAM directly, so a page must never be
    /// in a store TLB while it is code: a store that fills a store TLB
    /// calls [`GuestRam::store_cached`] first, which ends the page's time
    /// as code, and when a page that a store TLB may hold becomes code,
    /// this returns true: the caller drops the page from its own store
    /// TLB, and [`GuestRam::code_purges`] tells the other harts to drop
    /// theirs before they store again.
    ///
    /// (QEMU write-protects the host pages that hold translated code
    /// instead; here every store already goes through a TLB of our own,
    /// and one `u64` a page keeps the check to a compare: 64 bits, so
    /// that no count of writes a guest could make brings a state back.)
    #[inline]
    pub fn begin_code(&mut self, off: usize) -> bool {
        let state = &mut self.code[off >> PAGE_SHIFT];
        if *state & CODE != 0 {
            return false;
        }
        let purge = *state & STORE_CACHED != 0;
        *state = (*state & !STORE_CACHED) | CODE;
        self.code_stats.became_code += 1;
        if purge {
            self.code_purges += 1;
        }
        purge
    }

    /// The page at RAM offset `off` enters a CPU's store TLB (a store to
    /// it, which is about to be written): it is code no longer, and it
    /// is marked dirty.
    #[inline]
    pub fn store_cached(&mut self, off: usize) {
        let page = off & !(PAGE_SIZE as usize - 1);
        self.written(page, PAGE_SIZE as usize);
        self.code[page >> PAGE_SHIFT] |= STORE_CACHED;
    }

    /// How many times a page that a store TLB may hold became code: a
    /// hart that saw this change since it last looked drops its store
    /// TLB before it stores again.
    #[inline(always)]
    pub fn code_purges(&self) -> u64 {
        self.code_purges
    }

    /// What the code states saw so far.
    pub fn code_stats(&self) -> CodeStats {
        self.code_stats
    }

    /// A second reader of the pages written from now on (a running VM's
    /// transfer to a new backup, beside the pair in force, which takes the
    /// first set for its checkpoints or state digests): its own set, taken
    /// with [`GuestRam::take_view`] whatever [`GuestRam::take_dirty`] took.
    pub fn start_view(&mut self) {
        self.view = Some(vec![0u64; self.dirty.len()]);
    }

    /// The pages written since the view started or was last taken (empty
    /// without a view). As with [`GuestRam::take_dirty`], whoever caches
    /// "this page is marked" (a store TLB) must forget it.
    pub fn take_view(&mut self) -> Vec<u64> {
        let base_pfn = self.base >> PAGE_SHIFT;
        let Some(view) = &mut self.view else { return Vec::new() };
        take_bits(view, base_pfn)
    }

    /// The second reader is done.
    pub fn end_view(&mut self) {
        self.view = None;
    }

    /// Copies `buf.len()` bytes at guest address `addr` into `buf`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        let off = self.offset_of(addr, buf.len() as u64).ok_or(OutOfRange { addr, len: buf.len() as u64 })?;
        buf.copy_from_slice(&self.bytes[off..off + buf.len()]);
        Ok(())
    }

    /// Copies `buf` to guest address `addr` and marks the pages it
    /// touches dirty.
    pub fn write(&mut self, addr: u64, buf: &[u8]) -> Result<(), OutOfRange> {
        let off = self.offset_of(addr, buf.len() as u64).ok_or(OutOfRange { addr, len: buf.len() as u64 })?;
        self.bytes[off..off + buf.len()].copy_from_slice(buf);
        self.written(off, buf.len());
        Ok(())
    }

    /// Borrow a guest range for reading without copying (device DMA out).
    pub fn slice(&self, addr: u64, len: u64) -> Result<&[u8], OutOfRange> {
        let off = self.offset_of(addr, len).ok_or(OutOfRange { addr, len })?;
        Ok(&self.bytes[off..off + len as usize])
    }

    /// Borrow a guest range for writing (device DMA in); marks it dirty.
    pub fn slice_mut(&mut self, addr: u64, len: u64) -> Result<&mut [u8], OutOfRange> {
        let off = self.offset_of(addr, len).ok_or(OutOfRange { addr, len })?;
        self.written(off, len as usize);
        Ok(&mut self.bytes[off..off + len as usize])
    }

    /// The little-endian u16 at guest address `addr`; any alignment.
    pub fn read_u16(&self, addr: u64) -> Result<u16, OutOfRange> {
        let mut b = [0u8; 2];
        self.read(addr, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    /// The little-endian u32 at guest address `addr`; any alignment.
    pub fn read_u32(&self, addr: u64) -> Result<u32, OutOfRange> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// The little-endian u64 at guest address `addr`; any alignment.
    pub fn read_u64(&self, addr: u64) -> Result<u64, OutOfRange> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes `v` little-endian at guest address `addr`, any alignment,
    /// and marks its pages dirty.
    pub fn write_u16(&mut self, addr: u64, v: u16) -> Result<(), OutOfRange> {
        self.write(addr, &v.to_le_bytes())
    }

    /// Writes `v` little-endian at guest address `addr`, any alignment,
    /// and marks its pages dirty.
    pub fn write_u32(&mut self, addr: u64, v: u32) -> Result<(), OutOfRange> {
        self.write(addr, &v.to_le_bytes())
    }

    /// Writes `v` little-endian at guest address `addr`, any alignment,
    /// and marks its pages dirty.
    pub fn write_u64(&mut self, addr: u64, v: u64) -> Result<(), OutOfRange> {
        self.write(addr, &v.to_le_bytes())
    }

    /// Guest-physical page numbers (address >> 12) written since the last
    /// call, in ascending order; resets the set.
    pub fn take_dirty(&mut self) -> Vec<u64> {
        take_bits(&mut self.dirty, self.base >> PAGE_SHIFT)
    }

    /// Number of pages written since the last [`GuestRam::take_dirty`],
    /// without resetting the set.
    pub fn dirty_count(&self) -> usize {
        self.dirty.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// The page numbers of the bits set in `bitmap` (page 0 is `base_pfn`),
/// which is cleared.
fn take_bits(bitmap: &mut [u64], base_pfn: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for (i, word) in bitmap.iter_mut().enumerate() {
        let mut w = std::mem::take(word);
        while w != 0 {
            let bit = w.trailing_zeros() as u64;
            out.push(base_pfn + (i as u64) * 64 + bit);
            w &= w - 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second reader sees every page written since its last take,
    /// whatever the first took meanwhile, and the first likewise.
    #[test]
    fn a_view_is_taken_apart_from_the_dirty_set() {
        let mut ram = GuestRam::new(0x8000_0000, 64 * PAGE_SIZE).unwrap();
        let base = 0x8000_0000 >> PAGE_SHIFT;
        ram.write_u32(0x8000_0000 + PAGE_SIZE, 1).unwrap();
        ram.start_view();
        ram.write_u32(0x8000_0000 + 3 * PAGE_SIZE, 1).unwrap();
        assert_eq!(ram.take_dirty(), vec![base + 1, base + 3]);
        ram.write_u32(0x8000_0000 + 7 * PAGE_SIZE, 1).unwrap();
        assert_eq!(ram.take_view(), vec![base + 3, base + 7]);
        assert_eq!(ram.take_dirty(), vec![base + 7]);
        assert!(ram.take_view().is_empty());
        ram.end_view();
        ram.write_u32(0x8000_0000 + 9 * PAGE_SIZE, 1).unwrap();
        assert!(ram.take_view().is_empty());
        assert_eq!(ram.take_dirty(), vec![base + 9]);
    }

    /// A page's code state changes with every write while it is code,
    /// and only then; a page a store TLB took asks for a purge when it
    /// becomes code again.
    #[test]
    fn code_states_change_when_code_is_written() {
        let mut ram = GuestRam::new(0x8000_0000, 4 * PAGE_SIZE).unwrap();
        let page = PAGE_SIZE as usize;
        assert!(!ram.begin_code(page), "a fresh page is in no store TLB");
        let decoded = ram.code_state(page);
        assert_eq!(decoded & CODE, CODE);
        ram.write_u32(0x8000_0000 + 2 * PAGE_SIZE, 1).unwrap();
        assert_eq!(ram.code_state(page), decoded, "another page's write changed it");
        // DMA into the page (a straddling write reaches it too).
        ram.write(0x8000_0000 + PAGE_SIZE - 2, &[1, 2, 3, 4]).unwrap();
        let written = ram.code_state(page);
        assert_ne!(written, decoded);
        assert_eq!(written & CODE, 0);
        ram.write_u32(0x8000_0000 + PAGE_SIZE, 1).unwrap();
        assert_eq!(ram.code_state(page), written, "a page that is not code changes no more");
        assert!(!ram.begin_code(page));
        let again = ram.code_state(page);
        assert!(again != decoded && again & CODE == CODE);
        // A store TLB takes it: no longer code; it becomes code again only
        // with a purge.
        ram.store_cached(page + 8);
        assert_eq!(ram.code_state(page) & CODE, 0);
        assert_ne!(ram.code_state(page) & !STORE_CACHED, again);
        let purges = ram.code_purges();
        assert!(ram.begin_code(page));
        assert_eq!(ram.code_purges(), purges + 1);
        assert!(!ram.begin_code(page), "already code");
        let s = ram.code_stats();
        assert_eq!((s.became_code, ram.code_purges(), s.code_written), (3, 1, 2));
    }

    #[test]
    fn dirty_pages_are_exact_and_reset() {
        let mut ram = GuestRam::new(0x8000_0000, 64 * PAGE_SIZE).unwrap();
        ram.write_u32(0x8000_0000 + 5 * PAGE_SIZE + 12, 7).unwrap();
        // Straddles pages 9 and 10.
        ram.write(0x8000_0000 + 10 * PAGE_SIZE - 2, &[1, 2, 3, 4]).unwrap();
        assert_eq!(ram.dirty_count(), 3);
        let base = 0x8000_0000 >> PAGE_SHIFT;
        assert_eq!(ram.take_dirty(), vec![base + 5, base + 9, base + 10]);
        assert!(ram.take_dirty().is_empty());
    }

    #[test]
    fn out_of_range_is_an_error_not_a_panic() {
        let mut ram = GuestRam::new(0x1000, PAGE_SIZE).unwrap();
        assert!(ram.read_u64(0x1000 + PAGE_SIZE - 4).is_err());
        assert!(ram.write_u8_range_check());
        assert!(ram.slice(u64::MAX - 2, 8).is_err());
        assert!(ram.read_u32(0).is_err());
    }

    impl GuestRam {
        fn write_u8_range_check(&mut self) -> bool {
            self.write(self.end(), &[0]).is_err()
        }
    }

    /// RAM the host will not give is an error, not an abort.
    #[test]
    fn ram_the_host_refuses_is_an_error() {
        let e = GuestRam::new(0x8000_0000, 1 << 46).err().expect("64 TiB refused");
        assert_eq!(e, RamAllocError { size: 1 << 46 });
        assert!(e.to_string().starts_with("cannot allocate 67108864 MiB of guest RAM"), "{e}");
        assert!(GuestRam::new(0, u64::MAX).is_err());
    }
}
