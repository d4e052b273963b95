//! Address translation (Sv39, Sv48, hardware-managed A/D bits) and the
//! software TLB that gives loads, stores and fetches to RAM a fast path.
//!
//! TLB entries are tagged with the virtual page *and* the effective
//! privilege level, so switching between U and S (every system call) needs
//! no flush; S with mstatus.SUM set is a level of its own in the tag, so
//! neither does setting SUM and clearing it again, which Linux does around
//! every copy to or from user memory. The tag also names the address space
//! (a context standing for satp's ASID, see [`Tlb::enter`]) of every access
//! that translates: a satp write that keeps the mode switches the context
//! and flushes nothing, so a process switched back to finds its
//! translations. `sfence.vma` drops what its address and ASID name, no
//! more. (Global mappings are not shared between address spaces: each
//! refills them, which the spec allows, and which keeps a page Linux maps
//! without the G bit, or a guest that does, cached like any other.) Only RAM pages are cached; device
//! pages always take the slow path to the bus. A page enters the store TLB
//! only after its PTE's D bit is set, and is marked dirty in guest RAM when
//! it enters: stores that hit the TLB then need no dirty bookkeeping of
//! their own. For the same reason a page is never in the store TLB while
//! instructions decoded from it are in use (its code state, see
//! `GuestRam::begin_code`): entering ends its time as code, and a page
//! becoming code leaves it.

use crate::csr::{MSTATUS_MPP, MSTATUS_MPP_SHIFT, MSTATUS_MPRV, MSTATUS_MXR, MSTATUS_SUM};
use crate::hart::{Hart, PrivilegeMode};
use crate::trap::{Access, Trap};
use crate::Bus;
use ftvm_memory::GuestRam;

/// Entries of each kind (load, store, fetch), direct-mapped by virtual
/// page. Python's code spans megabytes: with 256 its test_math refilled
/// the fetch side 19.9M times in 26.2M block decodes, with 1024 4.8M;
/// 4096 entries are 64 KiB a kind (a full flush, at each satp write and
/// sfence.vma without an address, clears 192 KiB).
pub(crate) const TLB_SIZE: usize = 4096;
/// A tag no lookup can produce (page addresses have zero low bits and the
/// privilege part is 0, 1, 2 or 3).
pub(crate) const NO_TAG: u64 = 4;
/// The privilege part of the tag of a data access made in S with SUM set
/// (2: no privilege level has it). Such an access may reach U pages, so
/// its translations must not serve S without SUM, nor the other way.
const S_WITH_SUM: u64 = 2;
/// Where a tag's context is: bits 3 to 11, below the page and above the
/// privilege part and [`NO_TAG`]'s bit 2.
const CTX_SHIFT: u32 = 3;
const CTX_MASK: u64 = 0x1ff << CTX_SHIFT;
/// Contexts 1 to 511 stand for ASIDs (0 is the global one). When all are
/// taken, a new ASID flushes the whole TLB and numbering starts again: one
/// full flush per 511 address spaces, instead of one per satp write.
const CONTEXTS: u16 = 512;
/// satp.ASID: 16 bits, kept whole by the register (WARL, all implemented).
const ASIDS: usize = 1 << 16;

/// `repr(C)`: translated code reads the fields at fixed offsets (see `jit`).
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct TlbEntry {
    pub tag: u64,
    /// What, added to a virtual address in the page (wrapping), gives its
    /// offset in guest RAM: the page's RAM offset less the page's virtual
    /// address. Added whole, so that a lookup needs no masking of the
    /// address (QEMU's TLB entries keep such an addend for the same
    /// reason).
    pub addend: usize,
}

impl TlbEntry {
    /// The entry mapping the page of `vaddr` (tagged `tag`) to RAM offset
    /// `off`.
    pub(crate) fn new(tag: u64, vaddr: u64, off: usize) -> TlbEntry {
        TlbEntry { tag, addend: off.wrapping_sub((vaddr & !0xfff) as usize) }
    }

    /// The RAM offset of `vaddr`, an address in the entry's page.
    #[inline(always)]
    pub(crate) fn offset(&self, vaddr: u64) -> usize {
        self.addend.wrapping_add(vaddr as usize)
    }
}

pub(crate) struct Tlb {
    pub load: [TlbEntry; TLB_SIZE],
    pub store: [TlbEntry; TLB_SIZE],
    pub fetch: [TlbEntry; TLB_SIZE],
    /// For each entry of `load`, `store`, `fetch`: log2 of the size of the
    /// page its leaf PTE maps (12, or 21, 30, 39 for a superpage, of which
    /// an entry caches one 4 KiB piece), for `flush_page`. Translated code
    /// never reads them.
    leaf_bits: [[u8; TLB_SIZE]; 3],
    /// The lowest and highest address of the superpages entries were
    /// made from since the last full flush (`lo > hi`: none), so that a
    /// `flush_page` elsewhere looks at `vaddr`'s own slots only.
    superpages: (u64, u64),
    /// The RAM's [`GuestRam::code_purges`] when the store side last caught
    /// up with it.
    code_purges_seen: u64,
    /// This hart's index among harts that run on their own host threads
    /// (see [`Tlb::purge_and_wait`]); None on a machine's one thread.
    pub(crate) parallel: Option<usize>,
    /// The current address space's context, in place in a tag
    /// (`ctx << CTX_SHIFT`): what a U or S-with-SUM tag carries.
    pub(crate) ctx: u64,
    /// The context of each ASID (0: none yet), and the ASID of each
    /// context, so that a flush clears only the ASIDs given one.
    ctx_of_asid: Box<[u16]>,
    asid_of_ctx: [u16; CONTEXTS as usize],
    /// The next context to give (1 to `CONTEXTS`; `CONTEXTS`: none left).
    next_ctx: u16,
}

const NO_SUPERPAGES: (u64, u64) = (u64::MAX, 0);

const EMPTY: TlbEntry = TlbEntry { tag: NO_TAG, addend: 0 };

impl Tlb {
    pub fn new() -> Tlb {
        let mut tlb = Tlb {
            load: [EMPTY; TLB_SIZE],
            store: [EMPTY; TLB_SIZE],
            fetch: [EMPTY; TLB_SIZE],
            leaf_bits: [[12; TLB_SIZE]; 3],
            superpages: NO_SUPERPAGES,
            code_purges_seen: 0,
            parallel: None,
            ctx: 0,
            ctx_of_asid: vec![0; ASIDS].into_boxed_slice(),
            asid_of_ctx: [0; CONTEXTS as usize],
            next_ctx: 1,
        };
        // satp is 0 at reset: ASID 0.
        tlb.enter(0);
        tlb
    }

    /// Makes `asid` the current address space: its context if it has one,
    /// else the next free one (after a full flush if none is). Entries of
    /// other address spaces stay; a lookup cannot take them, as their tags
    /// name other contexts. Deterministic: the contexts are numbered in the
    /// order the guest's satp writes name ASIDs, so a replay fills and
    /// finds the same entries (which is guest-visible: a hit sets no
    /// accessed bit).
    pub fn enter(&mut self, asid: u16) {
        let mut c = self.ctx_of_asid[asid as usize];
        if c == 0 {
            if self.next_ctx == CONTEXTS {
                self.flush(asid);
                return;
            }
            c = self.next_ctx;
            self.next_ctx += 1;
            self.ctx_of_asid[asid as usize] = c;
            self.asid_of_ctx[c as usize] = asid;
        }
        self.ctx = u64::from(c) << CTX_SHIFT;
    }

    /// The context bits of a tag whose privilege part is `prv`: the current
    /// address space's for U (0), S (1) and S with SUM (2), none for M (3),
    /// which does not translate (so M's entries outlive switches).
    #[inline(always)]
    pub(crate) fn ctx_for(&self, prv: u64) -> u64 {
        self.ctx & ((prv + 1) >> 2).wrapping_sub(1)
    }

    /// Drops the entries of `asid`'s address space: `sfence.vma x0, asid`
    /// (global mappings included, as they are cached per address space).
    pub fn flush_asid(&mut self, asid: u16) {
        let c = self.ctx_of_asid[asid as usize];
        if c == 0 {
            return;
        }
        let bits = u64::from(c) << CTX_SHIFT;
        for entries in [&mut self.load, &mut self.store, &mut self.fetch] {
            for e in entries.iter_mut() {
                if e.tag & CTX_MASK == bits {
                    *e = EMPTY;
                }
            }
        }
    }

    /// Drops the store side's entries for the RAM page at offset `off`,
    /// which just became code, `purges` being the RAM's count of such
    /// pages with this one (so this TLB is up to date with it).
    pub fn purge_store_page(&mut self, off: usize, purges: u64) {
        let page = off & !0xfff;
        for e in self.store.iter_mut() {
            if e.tag != NO_TAG && e.offset(e.tag & !0xfff) == page {
                *e = EMPTY;
            }
        }
        self.code_purges_seen = purges;
    }

    /// Drops the whole store side if pages became code since it last
    /// caught up (`purges`, the RAM's count): another hart's decoding, for
    /// which a page must leave every store TLB.
    #[inline(always)]
    pub fn catch_up(&mut self, purges: u64) {
        if purges != self.code_purges_seen {
            self.flush_stores();
            self.code_purges_seen = purges;
        }
    }

    /// A page became code while some store TLB could hold it (`purges`,
    /// the RAM's count with it), and this hart runs beside others on their
    /// own threads (`parallel`), which catch up only when their next slice
    /// begins: until every one has, one of them could still write the page
    /// without changing its code state. So this hart drops its whole store
    /// side (purges of other harts may have come between), says so, and
    /// waits until all the others have caught up (or run no slice) before
    /// it decodes. Two harts waiting so each publish as they wait, so
    /// neither waits for the other. The wait lasts at most another hart's
    /// slice, and only for a page written through a store TLB and then run.
    pub fn purge_and_wait(&mut self, ram: &GuestRam, index: usize, purges: u64) {
        loop {
            let now = ram.code_purges();
            if now != self.code_purges_seen {
                self.flush_stores();
                self.code_purges_seen = now;
            }
            ram.publish_store_tlb(index, now);
            if ram.store_tlbs_caught_up(index, purges) {
                return;
            }
            std::thread::yield_now();
        }
    }

    #[cfg(test)]
    pub(crate) fn code_purges_seen(&self) -> u64 {
        self.code_purges_seen
    }

    /// Drops every entry, global ones too, and every ASID's context, then
    /// enters `asid`'s address space (satp's).
    pub fn flush(&mut self, asid: u16) {
        self.load = [EMPTY; TLB_SIZE];
        self.store = [EMPTY; TLB_SIZE];
        self.fetch = [EMPTY; TLB_SIZE];
        self.superpages = NO_SUPERPAGES;
        for c in 1..self.next_ctx {
            self.ctx_of_asid[self.asid_of_ctx[c as usize] as usize] = 0;
        }
        self.next_ctx = 1;
        self.enter(asid);
    }

    pub fn flush_stores(&mut self) {
        self.store = [EMPTY; TLB_SIZE];
    }

    /// Drops every entry the leaf PTE mapping `vaddr` may have made, at
    /// any privilege level: `sfence.vma` with an address. Linux issues
    /// one after each page fault it handles (riscv may cache a missing
    /// translation); flushing everything there made a program that grows
    /// its heap walk its page tables again for all it touched. An entry
    /// from a superpage is dropped if `vaddr` is anywhere in that
    /// superpage, so every slot is looked at, not only `vaddr`'s, when
    /// `vaddr` is within the superpages cached (Linux maps the kernel's
    /// memory with them; the faults it handles are in user pages).
    pub fn flush_page(&mut self, vaddr: u64) {
        self.flush_page_where(vaddr, |_| true);
    }

    /// Drops the entries of `asid`'s address space that the leaf PTE
    /// mapping `vaddr` may have made: `sfence.vma vaddr, asid`. Linux's
    /// fault handler issues one for its process's ASID.
    pub fn flush_page_asid(&mut self, vaddr: u64, asid: u16) {
        let c = self.ctx_of_asid[asid as usize];
        if c == 0 {
            return;
        }
        let bits = u64::from(c) << CTX_SHIFT;
        self.flush_page_where(vaddr, |tag| tag & CTX_MASK == bits);
    }

    fn flush_page_where(&mut self, vaddr: u64, also: impl Fn(u64) -> bool) {
        let (lo, hi) = self.superpages;
        if vaddr < lo || vaddr > hi {
            let i = index(vaddr);
            for entries in [&mut self.load, &mut self.store, &mut self.fetch] {
                if (entries[i].tag ^ vaddr) >> 12 == 0 && also(entries[i].tag) {
                    entries[i] = EMPTY;
                }
            }
            return;
        }
        for (entries, bits) in [&mut self.load, &mut self.store, &mut self.fetch].into_iter().zip(&self.leaf_bits) {
            for (e, &b) in entries.iter_mut().zip(bits) {
                if (e.tag ^ vaddr) >> b == 0 && also(e.tag) {
                    *e = EMPTY;
                }
            }
        }
    }

    pub(crate) fn fill(&mut self, access: Access, i: usize, e: TlbEntry, leaf_bits: u8) {
        let kind = match access {
            Access::Load => 0,
            Access::Store => 1,
            Access::Fetch => 2,
        };
        [&mut self.load, &mut self.store, &mut self.fetch][kind][i] = e;
        self.leaf_bits[kind][i] = leaf_bits;
        if leaf_bits > 12 {
            let size_mask = (1u64 << leaf_bits) - 1;
            let (lo, hi) = &mut self.superpages;
            *lo = (*lo).min(e.tag & !size_mask);
            *hi = (*hi).max(e.tag | size_mask);
        }
    }
}

#[inline(always)]
pub(crate) fn tag(vaddr: u64, prv: u64) -> u64 {
    (vaddr & !0xfff) | prv
}

#[inline(always)]
pub(crate) fn index(vaddr: u64) -> usize {
    ((vaddr >> 12) as usize) & (TLB_SIZE - 1)
}

const PTE_V: u64 = 1 << 0;
const PTE_R: u64 = 1 << 1;
const PTE_W: u64 = 1 << 2;
const PTE_X: u64 = 1 << 3;
const PTE_U: u64 = 1 << 4;
const PTE_A: u64 = 1 << 6;
const PTE_D: u64 = 1 << 7;
/// Bits 54..63: reserved, PBMT and N. We implement neither Svpbmt nor
/// Svnapot, so any of them set makes the PTE invalid.
const PTE_RESERVED: u64 = 0x3ff << 54;

impl Hart {
    /// The privilege level loads and stores are checked against (MPRV).
    #[inline(always)]
    pub(crate) fn data_prv(&self) -> PrivilegeMode {
        if self.s.mstatus & MSTATUS_MPRV != 0 && self.s.prv == PrivilegeMode::Machine {
            PrivilegeMode::from_bits((self.s.mstatus & MSTATUS_MPP) >> MSTATUS_MPP_SHIFT)
        } else {
            self.s.prv
        }
    }

    /// The low bits of a data access's TLB tag: the level loads and
    /// stores are checked against, or [`S_WITH_SUM`], and its context.
    #[inline(always)]
    pub(crate) fn data_tag_prv(&self) -> u64 {
        let prv = match self.data_prv() {
            PrivilegeMode::Supervisor if self.s.mstatus & MSTATUS_SUM != 0 => S_WITH_SUM,
            prv => prv as u64,
        };
        prv | self.tlb.ctx_for(prv)
    }

    /// The low bits of a fetch's TLB tag: the privilege level and its
    /// context.
    #[inline(always)]
    pub(crate) fn fetch_tag_prv(&self) -> u64 {
        let prv = self.s.prv as u64;
        prv | self.tlb.ctx_for(prv)
    }

    /// Translate a virtual address for an access at privilege `prv`: the
    /// physical address, and log2 of the size of the page that maps it
    /// (12 without translation: nothing a PTE says).
    pub(crate) fn translate(
        &mut self,
        ram: &GuestRam,
        vaddr: u64,
        access: Access,
        prv: PrivilegeMode,
    ) -> Result<(u64, u8), Trap> {
        let mode = self.s.satp >> 60;
        if prv == PrivilegeMode::Machine || mode == 0 {
            return Ok((vaddr, 12));
        }
        let levels = if mode == 9 { 4 } else { 3 };
        let va_bits = 12 + 9 * levels;
        // The address must be sign-extended from its top valid bit.
        let sext = ((vaddr << (64 - va_bits)) as i64 >> (64 - va_bits)) as u64;
        if sext != vaddr {
            return Err(access.page_fault(vaddr));
        }
        let mut table = (self.s.satp & ((1u64 << 44) - 1)) << 12;
        let mut level = levels - 1;
        loop {
            let vpn = (vaddr >> (12 + 9 * level)) & 0x1ff;
            let pte_addr = table + vpn * 8;
            let pte = ram.read_u64(pte_addr).map_err(|_| access.access_fault(vaddr))?;
            if pte & PTE_V == 0 || (pte & PTE_R == 0 && pte & PTE_W != 0) || pte & PTE_RESERVED != 0 {
                return Err(access.page_fault(vaddr));
            }
            let ppn = (pte >> 10) & ((1u64 << 44) - 1);
            if pte & (PTE_R | PTE_X) == 0 {
                // Pointer to the next level.
                if level == 0 || pte & (PTE_A | PTE_D | PTE_U) != 0 {
                    return Err(access.page_fault(vaddr));
                }
                table = ppn << 12;
                level -= 1;
                continue;
            }
            self.check_leaf(pte, access, prv).map_err(|_| access.page_fault(vaddr))?;
            // A superpage's low PPN fields must be zero.
            let low_mask = (1u64 << (9 * level)) - 1;
            if ppn & low_mask != 0 {
                return Err(access.page_fault(vaddr));
            }
            let mut new_pte = pte | PTE_A;
            if access == Access::Store {
                new_pte |= PTE_D;
            }
            // Atomically, as the privileged spec asks of a hart that sets
            // A and D itself: a PTE another hart changed since it was read
            // is walked again.
            if new_pte != pte
                && !ram.compare_exchange_u64(pte_addr, pte, new_pte).map_err(|_| access.access_fault(vaddr))?
            {
                table = (self.s.satp & ((1u64 << 44) - 1)) << 12;
                level = levels - 1;
                continue;
            }
            let page_bits = 12 + 9 * level as u8;
            let page_off_mask = (1u64 << page_bits) - 1;
            return Ok(((ppn << 12) & !page_off_mask | (vaddr & page_off_mask), page_bits));
        }
    }

    fn check_leaf(&self, pte: u64, access: Access, prv: PrivilegeMode) -> Result<(), ()> {
        let user_page = pte & PTE_U != 0;
        match prv {
            PrivilegeMode::User if !user_page => return Err(()),
            PrivilegeMode::Supervisor
                if user_page && (access == Access::Fetch || self.s.mstatus & MSTATUS_SUM == 0) =>
            {
                return Err(());
            }
            _ => {}
        }
        let ok = match access {
            Access::Fetch => pte & PTE_X != 0,
            Access::Load => pte & PTE_R != 0 || (self.s.mstatus & MSTATUS_MXR != 0 && pte & PTE_X != 0),
            Access::Store => pte & PTE_W != 0,
        };
        if ok {
            Ok(())
        } else {
            Err(())
        }
    }

    /// Translate and, for RAM pages, fill the TLB. Returns the physical
    /// address.
    #[inline(never)]
    pub(crate) fn translate_fill(&mut self, ram: &GuestRam, vaddr: u64, access: Access) -> Result<u64, Trap> {
        let prv = if access == Access::Fetch { self.s.prv } else { self.data_prv() };
        let (paddr, leaf_bits) = self.translate(ram, vaddr, access, prv)?;
        let page = paddr & !0xfff;
        if let Some(off) = ram.offset_of(page, 0x1000) {
            if access == Access::Store {
                // Dirty, and code no longer: stores through the entry
                // will write RAM directly.
                ram.store_cached(off);
            }
            let tag_prv = if access == Access::Fetch { self.fetch_tag_prv() } else { self.data_tag_prv() };
            self.tlb.fill(access, index(vaddr), TlbEntry::new(tag(vaddr, tag_prv), vaddr, off), leaf_bits);
        }
        Ok(paddr)
    }

    /// A load that missed the TLB, crosses a page, or goes to a device.
    #[inline(never)]
    pub(crate) fn load_slow(
        &mut self,
        ram: &GuestRam,
        bus: &mut dyn Bus,
        vaddr: u64,
        size: u8,
        touched_device: &mut bool,
    ) -> Result<u64, Trap> {
        let size64 = size as u64;
        if (vaddr & 0xfff) + size64 > 0x1000 {
            // Page-crossing misaligned access: byte by byte, RAM only.
            let mut v = 0u64;
            for i in 0..size64 {
                let a = vaddr.wrapping_add(i);
                let p = self.translate_fill(ram, a, Access::Load)?;
                let mut b = [0u8];
                ram.read(p, &mut b).map_err(|_| Access::Load.access_fault(a))?;
                v |= (b[0] as u64) << (8 * i);
            }
            return Ok(v);
        }
        let paddr = self.translate_fill(ram, vaddr, Access::Load)?;
        if let Some(off) = ram.offset_of(paddr, size64) {
            return Ok(ram.load_le(off, size));
        }
        if vaddr & (size64 - 1) != 0 {
            return Err(Access::Load.misaligned(vaddr));
        }
        *touched_device = true;
        bus.read(ram, paddr, size, self.progress).ok_or(Access::Load.access_fault(vaddr))
    }

    #[inline(never)]
    pub(crate) fn store_slow(
        &mut self,
        ram: &GuestRam,
        bus: &mut dyn Bus,
        vaddr: u64,
        size: u8,
        value: u64,
        touched_device: &mut bool,
    ) -> Result<(), Trap> {
        let size64 = size as u64;
        if (vaddr & 0xfff) + size64 > 0x1000 {
            // Translate every byte first so a fault leaves memory untouched.
            let mut paddrs = [0u64; 8];
            for i in 0..size64 {
                let a = vaddr.wrapping_add(i);
                let p = self.translate_fill(ram, a, Access::Store)?;
                if ram.offset_of(p, 1).is_none() {
                    return Err(Access::Store.access_fault(a));
                }
                paddrs[i as usize] = p;
            }
            for (i, &p) in paddrs.iter().take(size64 as usize).enumerate() {
                let _ = ram.write(p, &[(value >> (8 * i)) as u8]);
            }
            return Ok(());
        }
        let paddr = self.translate_fill(ram, vaddr, Access::Store)?;
        if let Some(off) = ram.offset_of(paddr, size64) {
            // translate_fill marked the page dirty as it entered the store TLB.
            ram.store_le_untracked(off, size, value);
            return Ok(());
        }
        if vaddr & (size64 - 1) != 0 {
            return Err(Access::Store.misaligned(vaddr));
        }
        *touched_device = true;
        if bus.write(ram, paddr, size, value, self.progress) {
            Ok(())
        } else {
            Err(Access::Store.access_fault(vaddr))
        }
    }

    /// Translate `vaddr` for an atomic memory operation; AMOs must be
    /// naturally aligned and target RAM. Returns the RAM offset.
    pub(crate) fn amo_offset(&mut self, ram: &GuestRam, vaddr: u64, size: u8) -> Result<usize, Trap> {
        if vaddr & (size as u64 - 1) != 0 {
            return Err(Access::Store.misaligned(vaddr));
        }
        let i = index(vaddr);
        let e = self.tlb.store[i];
        if e.tag == tag(vaddr, self.data_tag_prv()) {
            return Ok(e.offset(vaddr));
        }
        let paddr = self.translate_fill(ram, vaddr, Access::Store)?;
        // translate_fill marked a RAM page dirty as it entered the store TLB.
        ram.offset_of(paddr, size as u64).ok_or(Access::Store.access_fault(vaddr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(vaddr: u64) -> TlbEntry {
        TlbEntry::new(tag(vaddr, PrivilegeMode::Supervisor as u64), vaddr, 0x1000)
    }

    fn cached(tlb: &Tlb, vaddr: u64) -> bool {
        tlb.load[index(vaddr)].tag == entry(vaddr).tag
    }

    /// A page's own slot is enough while no superpage holds the address;
    /// an address anywhere in a cached superpage drops all its pieces.
    #[test]
    fn an_address_flush_drops_its_page_and_the_superpage_it_is_in() {
        let mut tlb = Tlb::new();
        let user = 0x4000_1000;
        let other_with_the_same_slot = user + (TLB_SIZE as u64) * 0x1000;
        let kernel = 0xffff_ffd8_0020_0000u64; // a 2 MiB page
        let piece = kernel + 0x3000;
        tlb.fill(Access::Load, index(user), entry(user), 12);
        tlb.fill(Access::Load, index(piece), entry(piece), 21);
        tlb.flush_page(other_with_the_same_slot);
        assert!(cached(&tlb, user) && cached(&tlb, piece), "another page's flush dropped an entry");
        tlb.flush_page(user);
        assert!(!cached(&tlb, user) && cached(&tlb, piece));
        // Another address of the same 2 MiB page, in another slot.
        tlb.flush_page(kernel + 0x1f_f000);
        assert!(!cached(&tlb, piece), "the superpage's piece survived a flush of its page");
        // After a full flush no superpage is cached: the scan is skipped.
        tlb.fill(Access::Load, index(piece), entry(piece), 21);
        tlb.flush(0);
        assert_eq!(tlb.superpages, NO_SUPERPAGES);
    }

    /// A U or S entry of one address space serves it alone, and serves it
    /// again after a switch away and back; an M entry serves every one; an
    /// `sfence.vma` with an ASID drops that space's entries, not another
    /// space's nor M's; running out of contexts starts over from an empty
    /// TLB.
    #[test]
    fn entries_belong_to_their_address_space() {
        let mut tlb = Tlb::new();
        let (va, kva) = (0x4000_1000u64, 0xffff_ffd8_0000_3000u64);
        let user = |tlb: &Tlb| tag(va, PrivilegeMode::User as u64 | tlb.ctx_for(PrivilegeMode::User as u64));
        let machine = |tlb: &Tlb| tag(kva, PrivilegeMode::Machine as u64 | tlb.ctx_for(3));
        tlb.enter(7);
        let in_7 = user(&tlb);
        tlb.fill(Access::Load, index(va), TlbEntry::new(in_7, va, 0x1000), 12);
        tlb.fill(Access::Load, index(kva), TlbEntry::new(machine(&tlb), kva, 0x2000), 12);
        tlb.enter(9);
        assert_ne!(user(&tlb), in_7, "ASID 9 finds ASID 7's entry");
        assert_eq!(tlb.load[index(kva)].tag, machine(&tlb), "the M entry does not serve ASID 9");
        tlb.enter(7);
        assert_eq!(tlb.load[index(va)].tag, user(&tlb), "ASID 7's entry is gone after a switch and back");
        tlb.flush_page_asid(va, 9);
        tlb.flush_asid(9);
        assert_eq!(tlb.load[index(va)].tag, in_7, "a flush of ASID 9 dropped ASID 7's entry");
        tlb.flush_page_asid(kva, 7);
        tlb.flush_asid(7);
        assert_eq!(tlb.load[index(va)].tag, NO_TAG, "sfence.vma x0, 7 kept ASID 7's entry");
        assert_eq!(tlb.load[index(kva)].tag, machine(&tlb), "a flush by ASID dropped an M entry");
        tlb.flush_page(kva);
        assert_eq!(tlb.load[index(kva)].tag, NO_TAG, "sfence.vma kva, x0 kept the entry");
        // 511 contexts, 3 taken (ASIDs 0, 7, 9); the 512th ASID flushes
        // and starts again at 1.
        tlb.fill(Access::Load, index(va), TlbEntry::new(user(&tlb), va, 0x1000), 12);
        for asid in 100..100 + CONTEXTS - 1 - 3 {
            tlb.enter(asid);
        }
        assert_eq!(tlb.load[index(va)].tag, in_7, "contexts left: nothing flushed");
        tlb.enter(5000);
        assert_eq!(tlb.load[index(va)].tag, NO_TAG, "no context left: the TLB starts over");
        assert_eq!(tlb.ctx, 1 << CTX_SHIFT);
        tlb.enter(9);
        assert_eq!(tlb.ctx, 2 << CTX_SHIFT, "ASID 9 kept its old context across the flush");
    }
}
