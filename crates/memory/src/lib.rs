#![deny(missing_docs)]

//! Guest physical RAM: one contiguous region at a fixed guest-physical base,
//! plus a dirty-page bitmap that records every page written since the last
//! [`GuestRam::take_dirty`], whether by a CPU store or by device DMA, and
//! each page's code state: whether instructions were decoded from it since
//! it was last written (see [`GuestRam::begin_code`]).
//!
//! We keep our own type instead of vm-memory's `GuestMemoryMmap` because the
//! CPU's hot path wants a raw host pointer into a single region, and a
//! dirty bitmap and code states that translated code reads in place.
//!
//! RAM is shared: harts on several host threads (a machine that runs its
//! harts in parallel) and the devices they reach all write it through
//! `&GuestRam`. The bytes are reached through a raw pointer, never through
//! a reference that would claim them for one writer; the bitmaps and code
//! states are atomics, used with relaxed ordering (each is a fact about
//! one page, and whoever takes the bitmaps does so with every hart stopped).
//! As in every VMM, guest code on two harts may race on the same bytes:
//! what such a guest sees is its own business, never a fault of ours.
//! The interpreter's aligned loads and stores are volatile, as vm-memory
//! makes guest accesses; translated code's are the host's instructions.
//! What is left to do: with harts in parallel, a misaligned access of the
//! interpreter (`read_unaligned`), the decoder's and DMA's reads through a
//! shared slice (`as_slice`, `slice`) and another hart's store to the same
//! bytes are races that Rust's model leaves undefined.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
    /// RAM's bytes: `len` of them, allocated zeroed by [`zeroed`] and
    /// owned here (freed on drop). A raw pointer rather than a `Vec`, so
    /// that writers holding `&GuestRam` write through the allocation's
    /// own pointer.
    bytes: *mut u8,
    len: usize,
    /// One bit per page; set when the page is written.
    dirty: Box<[AtomicU64]>,
    /// Whether stores mark pages dirty. Off costs nothing on the CPU's
    /// store path beyond one predictable branch.
    tracking: bool,
    /// A second reader's bitmap of the pages written ([`GuestRam::start_view`]),
    /// marked beside the first and taken apart from it.
    view: Option<Box<[AtomicU64]>>,
    /// Each page's code state (see [`GuestRam::begin_code`]).
    code: Box<[AtomicU64]>,
    /// How many times a page that a store TLB may cache became code.
    code_purges: AtomicU64,
    /// See [`CodeStats`]: became_code, code_written.
    code_stats: [AtomicU64; 2],
    /// Each parallel hart's store TLB: the [`GuestRam::code_purges`] it
    /// caught up with, or `u64::MAX` while it runs no slice (it catches up
    /// before it stores again). See [`GuestRam::publish_store_tlb`].
    store_tlbs: [AtomicU64; MAX_STORE_TLBS],
}

/// How many store TLBs (harts) [`GuestRam::publish_store_tlb`] keeps.
pub const MAX_STORE_TLBS: usize = 8;

// SAFETY: the bytes behind `bytes` are owned by this value alone (nothing
// else frees or moves them), every access to them goes through the raw
// pointer (see the module's comment), and the rest is atomics or fields
// written only through `&mut self`.
unsafe impl Send for GuestRam {}
// SAFETY: as for Send; shared access writes only atomics and the bytes.
unsafe impl Sync for GuestRam {}

impl Drop for GuestRam {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: `bytes` came from `zeroed(len)`'s vector, taken apart
            // in `GuestRam::new`, with length and capacity `len`.
            drop(unsafe { Vec::from_raw_parts(self.bytes, self.len, self.len) });
        }
    }
}

/// `n` zeroed atomic words.
fn atomic_words(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
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
        let mut bytes = std::mem::ManuallyDrop::new(zeroed(len).ok_or(refused)?);
        Ok(GuestRam {
            base,
            bytes: if len == 0 { std::ptr::NonNull::dangling().as_ptr() } else { bytes.as_mut_ptr() },
            len,
            dirty: atomic_words(pages.div_ceil(64)),
            tracking: true,
            view: None,
            code: atomic_words(pages),
            code_purges: AtomicU64::new(0),
            code_stats: [AtomicU64::new(0), AtomicU64::new(0)],
            store_tlbs: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
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
        self.len as u64
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

    /// All of RAM, from [`GuestRam::base`] on, for reading by a reader
    /// that no hart runs beside (a snapshot, a digest), or that reads what
    /// the guest handed it (a device's DMA out).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `bytes` holds `len` initialised bytes for as long as self.
        unsafe { std::slice::from_raw_parts(self.bytes, self.len) }
    }

    /// All of RAM for a writer that holds it alone (filling a new
    /// machine's RAM, restoring one). Writers through this slice must call
    /// [`GuestRam::mark_dirty_offset`] themselves, and write no page that
    /// is code unless nothing was decoded from this RAM yet.
    pub fn as_mut_slice_untracked(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` excludes every other access.
        unsafe { std::slice::from_raw_parts_mut(self.bytes, self.len) }
    }

    /// RAM's first byte, for the CPU's fast paths and translated code:
    /// they check their offsets against [`GuestRam::size`] themselves and
    /// keep the rules of [`GuestRam::as_mut_slice_untracked`] for what they
    /// write (a page in a store TLB is not code: see
    /// [`GuestRam::begin_code`]).
    #[inline(always)]
    pub fn host_ptr(&self) -> *mut u8 {
        self.bytes
    }

    /// The `size`-byte little-endian value at RAM offset `off` (1, 2, 4
    /// or 8 bytes, any alignment), for the CPU's fast path.
    ///
    /// # Panics
    /// If the bytes are not all inside RAM.
    #[inline(always)]
    pub fn load_le(&self, off: usize, size: u8) -> u64 {
        assert!(off.checked_add(size as usize).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked above). Volatile where aligned, as
        // vm-memory reads guest memory: another hart may write these
        // bytes meanwhile (see the module's comment).
        unsafe {
            let p = self.bytes.add(off);
            let aligned = off.is_multiple_of(size as usize);
            match size {
                1 => std::ptr::read_volatile(p) as u64,
                2 if aligned => u16::from_le(std::ptr::read_volatile(p as *const u16)) as u64,
                4 if aligned => u32::from_le(std::ptr::read_volatile(p as *const u32)) as u64,
                8 if aligned => u64::from_le(std::ptr::read_volatile(p as *const u64)),
                2 => u16::from_le(std::ptr::read_unaligned(p as *const u16)) as u64,
                4 => u32::from_le(std::ptr::read_unaligned(p as *const u32)) as u64,
                _ => u64::from_le(std::ptr::read_unaligned(p as *const u64)),
            }
        }
    }

    /// Writes the low `size` bytes of `v` little-endian at RAM offset
    /// `off`, without marking anything: the CPU's fast path, under the
    /// rules of [`GuestRam::host_ptr`].
    ///
    /// # Panics
    /// If the bytes are not all inside RAM.
    #[inline(always)]
    pub fn store_le_untracked(&self, off: usize, size: u8, v: u64) {
        assert!(off.checked_add(size as usize).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked above), through the allocation's own
        // pointer; volatile where aligned, as in `load_le`.
        unsafe {
            let p = self.bytes.add(off);
            let aligned = off.is_multiple_of(size as usize);
            match size {
                1 => std::ptr::write_volatile(p, v as u8),
                2 if aligned => std::ptr::write_volatile(p as *mut u16, (v as u16).to_le()),
                4 if aligned => std::ptr::write_volatile(p as *mut u32, (v as u32).to_le()),
                8 if aligned => std::ptr::write_volatile(p as *mut u64, v.to_le()),
                2 => std::ptr::write_unaligned(p as *mut u16, (v as u16).to_le()),
                4 => std::ptr::write_unaligned(p as *mut u32, (v as u32).to_le()),
                _ => std::ptr::write_unaligned(p as *mut u64, v.to_le()),
            }
        }
    }

    /// Fills `len` bytes at RAM offset `off` with zeros, without marking
    /// anything (the rules of [`GuestRam::host_ptr`]).
    ///
    /// # Panics
    /// If the bytes are not all inside RAM.
    pub fn zero_untracked(&self, off: usize, len: usize) {
        assert!(off.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked above).
        unsafe { std::ptr::write_bytes(self.bytes.add(off), 0, len) }
    }

    /// The aligned `size`-byte word (4 or 8) at RAM offset `off` as an
    /// atomic, for atomic memory operations that other harts' accesses
    /// must not split.
    ///
    /// # Panics
    /// If the word is not inside RAM or not aligned to its size.
    pub fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off.checked_add(8).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds and aligned (checked above); AtomicU64 has the
        // layout of u64, and every byte of RAM may be shared.
        unsafe { AtomicU64::from_ptr(self.bytes.add(off) as *mut u64) }
    }

    /// As [`GuestRam::atomic_u64`] for a 4-byte word.
    ///
    /// # Panics
    /// If the word is not inside RAM or not aligned to its size.
    pub fn atomic_u32(&self, off: usize) -> &std::sync::atomic::AtomicU32 {
        assert!(off.is_multiple_of(4) && off.checked_add(4).is_some_and(|end| end <= self.len));
        // SAFETY: as in `atomic_u64`.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.bytes.add(off) as *mut u32) }
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
    pub fn mark_dirty_offset(&self, off: usize, len: usize) {
        if !self.tracking || len == 0 {
            return;
        }
        let first = off >> PAGE_SHIFT;
        let last = (off + len - 1) >> PAGE_SHIFT;
        for p in first..=last {
            set_bit(&self.dirty, p);
        }
        if let Some(view) = &self.view {
            for p in first..=last {
                set_bit(view, p);
            }
        }
    }

    /// What a write into `[off, off+len)` changes besides the bytes: the
    /// pages are dirty, and code no longer.
    #[inline]
    fn written(&self, off: usize, len: usize) {
        self.mark_dirty_offset(off, len);
        self.code_written(off, len);
    }

    /// Ends the time as code of every page in `[off, off+len)` that is
    /// code: what was decoded from it may be stale now.
    #[inline]
    fn code_written(&self, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        for p in off >> PAGE_SHIFT..=(off + len - 1) >> PAGE_SHIFT {
            let state = &self.code[p];
            // Checked first: most writes are to pages that are not code,
            // and a plain load costs less than an update.
            if state.load(Relaxed) & CODE != 0
                && state
                    .fetch_update(Relaxed, Relaxed, |s| {
                        (s & CODE != 0).then(|| (s & !(CODE | STORE_CACHED)) + CODE_WRITTEN)
                    })
                    .is_ok()
            {
                self.code_stats[1].fetch_add(1, Relaxed);
            }
        }
    }

    /// The code state of the page at RAM offset `off`: a block decoded
    /// from the page when it had this state is still what RAM holds while
    /// the state is unchanged. Code states are odd (they have [`CODE`]).
    #[inline(always)]
    pub fn code_state(&self, off: usize) -> u64 {
        self.code[off >> PAGE_SHIFT].load(Relaxed)
    }

    /// The code states, one `u64` per page, for translated code that
    /// compares a block's state as [`GuestRam::code_state`] does.
    pub fn code_states(&self) -> *const u64 {
        // AtomicU64 has the layout of u64; translated code's plain loads
        // are what a relaxed load compiles to.
        self.code.as_ptr() as *const u64
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
    pub fn begin_code(&self, off: usize) -> bool {
        let state = &self.code[off >> PAGE_SHIFT];
        let Ok(was) = state.fetch_update(Relaxed, Relaxed, |s| (s & CODE == 0).then_some((s & !STORE_CACHED) | CODE))
        else {
            return false;
        };
        let purge = was & STORE_CACHED != 0;
        self.code_stats[0].fetch_add(1, Relaxed);
        if purge {
            self.code_purges.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        purge
    }

    /// The page at RAM offset `off` enters a CPU's store TLB (a store to
    /// it, which is about to be written): it is code no longer, and it
    /// is marked dirty.
    #[inline]
    pub fn store_cached(&self, off: usize) {
        let page = off & !(PAGE_SIZE as usize - 1);
        self.written(page, PAGE_SIZE as usize);
        self.code[page >> PAGE_SHIFT].fetch_or(STORE_CACHED, Relaxed);
    }

    /// How many times a page that a store TLB may hold became code: a
    /// hart that saw this change since it last looked drops its store
    /// TLB before it stores again.
    #[inline(always)]
    pub fn code_purges(&self) -> u64 {
        self.code_purges.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Hart `index`, one of several running on their own host threads,
    /// says its store TLB holds no page that became code before purge
    /// count `seen` (it dropped its store side when it saw that count), or
    /// with `u64::MAX` that it runs no slice now and will catch up before
    /// it stores again. A hart on one thread with the others has no need:
    /// they catch up when their turn begins, before any of them stores.
    pub fn publish_store_tlb(&self, index: usize, seen: u64) {
        self.store_tlbs[index].store(seen, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether every parallel hart but `index` caught up with purge count
    /// `purges` (or runs no slice): from then on, a page that became code
    /// before that count is written only through paths that change its
    /// code state, so what is decoded from it now stays exact.
    pub fn store_tlbs_caught_up(&self, index: usize, purges: u64) -> bool {
        self.store_tlbs
            .iter()
            .enumerate()
            .all(|(i, seen)| i == index || seen.load(std::sync::atomic::Ordering::SeqCst) >= purges)
    }

    /// What the code states saw so far.
    pub fn code_stats(&self) -> CodeStats {
        CodeStats { became_code: self.code_stats[0].load(Relaxed), code_written: self.code_stats[1].load(Relaxed) }
    }

    /// A second reader of the pages written from now on (a running VM's
    /// transfer to a new backup, beside the pair in force, which takes the
    /// first set for its checkpoints or state digests): its own set, taken
    /// with [`GuestRam::take_view`] whatever [`GuestRam::take_dirty`] took.
    pub fn start_view(&mut self) {
        self.view = Some(atomic_words(self.dirty.len()));
    }

    /// The pages written since the view started or was last taken (empty
    /// without a view). As with [`GuestRam::take_dirty`], whoever caches
    /// "this page is marked" (a store TLB) must forget it.
    pub fn take_view(&mut self) -> Vec<u64> {
        let base_pfn = self.base >> PAGE_SHIFT;
        let Some(view) = &self.view else { return Vec::new() };
        take_bits(view, base_pfn)
    }

    /// The second reader is done.
    pub fn end_view(&mut self) {
        self.view = None;
    }

    /// Copies `buf.len()` bytes at guest address `addr` into `buf`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        let off = self.offset_of(addr, buf.len() as u64).ok_or(OutOfRange { addr, len: buf.len() as u64 })?;
        // SAFETY: `offset_of` checked the range; `buf` is not guest RAM.
        unsafe { std::ptr::copy_nonoverlapping(self.bytes.add(off), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copies `buf` to guest address `addr` and marks the pages it
    /// touches dirty.
    pub fn write(&self, addr: u64, buf: &[u8]) -> Result<(), OutOfRange> {
        let off = self.offset_of(addr, buf.len() as u64).ok_or(OutOfRange { addr, len: buf.len() as u64 })?;
        // SAFETY: `offset_of` checked the range. `buf` may be a slice of
        // this RAM itself (`slice` lends one while `&self` is shared):
        // `copy` allows the overlap.
        unsafe { std::ptr::copy(buf.as_ptr(), self.bytes.add(off), buf.len()) };
        self.written(off, buf.len());
        Ok(())
    }

    /// Borrow a guest range for reading without copying (device DMA out).
    pub fn slice(&self, addr: u64, len: u64) -> Result<&[u8], OutOfRange> {
        let off = self.offset_of(addr, len).ok_or(OutOfRange { addr, len })?;
        Ok(&self.as_slice()[off..off + len as usize])
    }

    /// Borrow a guest range for writing (device DMA in); marks it dirty.
    pub fn slice_mut(&mut self, addr: u64, len: u64) -> Result<&mut [u8], OutOfRange> {
        let off = self.offset_of(addr, len).ok_or(OutOfRange { addr, len })?;
        self.written(off, len as usize);
        Ok(&mut self.as_mut_slice_untracked()[off..off + len as usize])
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
    pub fn write_u16(&self, addr: u64, v: u16) -> Result<(), OutOfRange> {
        self.write(addr, &v.to_le_bytes())
    }

    /// Writes `v` little-endian at guest address `addr`, any alignment,
    /// and marks its pages dirty.
    pub fn write_u32(&self, addr: u64, v: u32) -> Result<(), OutOfRange> {
        self.write(addr, &v.to_le_bytes())
    }

    /// Writes `v` little-endian at guest address `addr`, any alignment,
    /// and marks its pages dirty.
    pub fn write_u64(&self, addr: u64, v: u64) -> Result<(), OutOfRange> {
        self.write(addr, &v.to_le_bytes())
    }

    /// Replaces the aligned little-endian u64 at guest address `addr` with
    /// `new` if it still holds `old`, atomically with respect to other
    /// harts (a page-table walk setting accessed and dirty bits), marking
    /// its page dirty when it does. `Ok(false)`: it held something else.
    pub fn compare_exchange_u64(&self, addr: u64, old: u64, new: u64) -> Result<bool, OutOfRange> {
        let off = self.offset_of(addr, 8).filter(|o| o % 8 == 0).ok_or(OutOfRange { addr, len: 8 })?;
        let swapped = self
            .atomic_u64(off)
            .compare_exchange(old.to_le(), new.to_le(), std::sync::atomic::Ordering::SeqCst, Relaxed)
            .is_ok();
        if swapped {
            self.written(off, 8);
        }
        Ok(swapped)
    }

    /// Guest-physical page numbers (address >> 12) written since the last
    /// call, in ascending order; resets the set.
    pub fn take_dirty(&mut self) -> Vec<u64> {
        take_bits(&self.dirty, self.base >> PAGE_SHIFT)
    }

    /// Number of pages written since the last [`GuestRam::take_dirty`],
    /// without resetting the set.
    pub fn dirty_count(&self) -> usize {
        self.dirty.iter().map(|w| w.load(Relaxed).count_ones() as usize).sum()
    }
}

/// Sets page `p`'s bit in `bitmap`, with a read first: a page written
/// once is written again many times, and a load costs less than a locked
/// update.
#[inline]
fn set_bit(bitmap: &[AtomicU64], p: usize) {
    let (word, bit) = (&bitmap[p >> 6], 1u64 << (p & 63));
    if word.load(Relaxed) & bit == 0 {
        word.fetch_or(bit, Relaxed);
    }
}

/// The page numbers of the bits set in `bitmap` (page 0 is `base_pfn`),
/// which is cleared.
fn take_bits(bitmap: &[AtomicU64], base_pfn: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for (i, word) in bitmap.iter().enumerate() {
        if word.load(Relaxed) == 0 {
            continue;
        }
        let mut w = word.swap(0, Relaxed);
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
        let ram = GuestRam::new(0x8000_0000, 4 * PAGE_SIZE).unwrap();
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
