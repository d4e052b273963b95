//! The block cache: straight-line runs of guest instructions, decoded once
//! into compact operations and kept in a direct-mapped table indexed by
//! the run's offset in guest RAM.
//!
//! A block ends after a jump, a branch, or an instruction without a fast
//! path (system, fence, atomic), at the end of its page, or after
//! `MAX_INSTS`. Floating point does not end it: it changes nothing a block
//! depends on (privilege, translation, interrupts), and FP code is dense. So the interpreter looks a block up once per
//! taken branch instead of fetching and checking every instruction, and
//! executes the block's operations one after the other from the table.
//!
//! Blocks are keyed by RAM offset, not by virtual address: the same code
//! mapped at two addresses (or reached from U and S mode) shares its
//! decoding, and pc-relative operands are computed when executed.
//!
//! Nothing ever invalidates a block. Each records its page's code state
//! as it was decoded ([`GuestRam::code_state`]) and is reused only while
//! the state is unchanged: the state changes with every write into a page
//! instructions were decoded from, whether by a store, DMA or another
//! hart, so no decoding is ever stale, and the check is one compare
//! instead of a compare of every RAM word the block covers. Stores reach
//! RAM directly only through a store TLB, which never holds a page while
//! it is code (see [`GuestRam::begin_code`]): a page becoming code leaves
//! this hart's store TLB here, and the other harts' as they start their
//! next slice. The block also keeps the words it was decoded from, to
//! find its translation again after it was pushed out of its slot, and
//! for `FTVM_VERIFY_CODE=1`, which compares them too at every use and
//! stops the process if a block whose state is unchanged no longer
//! matches RAM (for tests). Within one run through a block, the executor
//! ends the block early when the guest stores into its own bytes (the
//! store went the slow way, making the page no longer code).
//!
//! A block entered often enough is translated to host code (see `jit`);
//! the translation lives in the block's slot, so it is dropped with the
//! decoding whenever the slot's check against RAM fails.

use crate::decode::{decode, Decoded, Op};
use crate::ext::Extensions;
use crate::jit::{self, Arena, JitFn};
use crate::mmu::Tlb;
use ftvm_memory::GuestRam;
use std::collections::HashMap;
use std::sync::Mutex;

/// The longest block, in instructions. A block is also the unit of
/// translation, and each costs its entry's checks and its registers'
/// loads and stores: 32 against 16 took bare-metal SHA-256 (whose rounds
/// run 60 instructions without a branch) from 1.27-1.30 s to 1.13-1.15 s
/// and a boot from 3.05-3.46 s to 2.73-2.76 s, for twice the table's
/// memory (docs/PERFORMANCE.md).
pub(crate) const MAX_INSTS: usize = 32;
/// Blocks in the table (a power of two), 736 bytes each: 96 MB a
/// hart, which the kernel maps only as slots are used (a backup about to
/// go live touches it all ahead, see [`prepare_tables`]). A boot runs so
/// much code once or a few times that with 8192 slots 97% of its 6M
/// decodes were of blocks decoded before and pushed out; with 32768 it
/// decodes 3.5M (65536: 3M). Real userland spans more code than a boot:
/// python3's test_math decoded 26M blocks with 32768 slots, 5M with
/// 131072.
pub(crate) const SLOTS: usize = 1 << 17;
/// RAM words a block's bytes can span: 4 bytes per instruction, plus the
/// alignment of its start.
const WORDS: usize = MAX_INSTS * 4 / 8 + 2;

/// One decoded instruction of a block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inst {
    pub op: Op,
    pub rd: u8,
    pub rs1: u8,
    pub rs2: u8,
    /// The immediate (every fast-path immediate fits 32 bits). For `Other`,
    /// `Illegal`, floating point and `cbo.zero`: the instruction's own bits
    /// as a trap reports them (the 16 bits of a compressed one).
    pub imm: i32,
    /// Offsets, from the start of the block, of this instruction and of
    /// the one after it.
    pub at: u16,
    pub next: u16,
    /// For `Other` and floating point: the instruction expanded to 32 bits.
    pub insn: u32,
}

impl Inst {
    fn new(d: &Decoded, at: usize) -> Inst {
        use Op::*;
        // Loads keep rd = 0: they still access memory, and may fault
        // (cbo.zero, a store, always has rd = 0).
        // Floating point's rd is an f register, or an x register written
        // by `fp_compute` itself.
        let only_writes_x0 = d.rd == 0
            && !matches!(d.op, Other | Illegal | Jal | Jalr | Beq | Bne | Blt | Bge | Bltu | Bgeu)
            && !matches!(d.op, Lb | Lh | Lw | Ld | Lbu | Lhu | Lwu | Sb | Sh | Sw | Sd)
            && !matches!(d.op, Fp | Fload | Fstore | CboZero);
        let op = if only_writes_x0 { Nop } else { d.op };
        let imm = match d.op {
            Other | Illegal | Fp | Fload | Fstore | CboZero => {
                (if d.len == 2 { d.raw & 0xffff } else { d.insn }) as i32
            }
            _ => d.imm as i32,
        };
        Inst {
            op,
            rd: d.rd,
            rs1: d.rs1,
            rs2: d.rs2,
            imm,
            at: at as u16,
            next: (at + d.len as usize) as u16,
            insn: d.insn,
        }
    }

    /// The instruction's length in bytes.
    pub fn len(&self) -> u64 {
        (self.next - self.at) as u64
    }

    /// Whether the block ends after this instruction: control flow leaves
    /// the straight line, and the general executor's instructions may
    /// change privilege, translation or memory behind the block's back.
    pub(crate) fn ends_block(&self) -> bool {
        use Op::*;
        matches!(self.op, Jal | Jalr | Beq | Bne | Blt | Bge | Bltu | Bgeu | Other | Illegal)
    }
}

#[derive(Clone)]
pub(crate) struct Block {
    /// RAM offset of the first instruction.
    pub off: usize,
    /// Length of the block's code in bytes.
    pub bytes: usize,
    /// The RAM words covering the code, from `off` rounded down to 8, as
    /// they were when decoded.
    pub base: usize,
    pub nwords: usize,
    pub words: [u64; WORDS],
    /// Its instructions; 0 in an empty slot, whose other fields are all
    /// zero too (so `off` 0 says nothing, and its `chain` 0 stops a jump).
    pub n: usize,
    pub insts: [Inst; MAX_INSTS],
    /// Entries so far, up to the cache's `hot`, when it is translated (or
    /// found not translatable, and entries stop counting).
    hits: u32,
    /// The block's host code, once translated: where Rust calls it...
    pub jit: Option<JitFn>,
    /// ... and where other blocks' code jumps to it (0 if none).
    pub chain: usize,
    /// The instructions it translated (from the first, on into the blocks
    /// after it if it runs on: see `jit::translate`); the interpreter
    /// executes the rest.
    pub jit_n: usize,
    /// The instructions of the block and of those its translation runs on
    /// into: what the budget must hold to call it (32 bits: the table's
    /// slots stay 736 bytes, `hits` leaving 4 for it).
    pub jit_len: u32,
    /// Its page's code state when it was decoded (0 in an empty slot:
    /// never a code state).
    pub code: u64,
}

const NOP: Inst = Inst { op: Op::Illegal, rd: 0, rs1: 0, rs2: 0, imm: 0, at: 0, next: 0, insn: 0 };

impl Block {
    const EMPTY: Block = Block {
        off: 0,
        bytes: 0,
        base: 0,
        nwords: 0,
        words: [0; WORDS],
        n: 0,
        insts: [NOP; MAX_INSTS],
        hits: 0,
        jit: None,
        chain: 0,
        jit_n: 0,
        jit_len: 0,
        code: 0,
    };

    /// A block of one instruction that is not in RAM's cache (it crosses a
    /// page, or its page is not in the fetch TLB). Its empty byte range
    /// never matches a store.
    pub fn single(d: &Decoded) -> Block {
        let mut b = Block::EMPTY;
        b.insts[0] = Inst::new(d, 0);
        b.n = 1;
        b
    }

    /// Whether RAM still holds the bits this block was decoded from.
    #[inline(always)]
    fn still_in(&self, ram: &[u8]) -> bool {
        holds(ram, self.base, &self.words[..self.nwords])
    }

    /// Decodes the block at RAM offset `off`. `None` if not even its first
    /// instruction lies wholly within its page.
    pub(crate) fn decode_at(ram: &[u8], off: usize, ext: Extensions) -> Option<Block> {
        let page_end = (off | 0xfff) + 1;
        let mut b = Block { off, ..Block::EMPTY };
        let mut at = 0;
        while b.n < MAX_INSTS {
            let pos = off + at;
            let left = page_end - pos;
            let half = |p: usize| u16::from_le_bytes([ram[p], ram[p + 1]]) as u32;
            let lo = half(pos);
            let raw = match (lo & 3 == 3, left >= 4) {
                (_, true) => lo | half(pos + 2) << 16,
                (false, false) => lo,
                (true, false) => break,
            };
            let inst = Inst::new(&decode(raw, ext), at);
            b.insts[b.n] = inst;
            b.n += 1;
            at = inst.next as usize;
            if inst.ends_block() || at + 2 > page_end - off {
                break;
            }
        }
        if b.n == 0 {
            return None;
        }
        b.bytes = at;
        b.base = off & !7;
        b.nwords = (off + at - b.base).div_ceil(8);
        for (w, read) in b.words.iter_mut().zip(words(&ram[b.base..b.base + 8 * b.nwords])) {
            *w = read;
        }
        Some(b)
    }
}

/// `code`'s little-endian 64-bit words (its length a multiple of 8): how
/// a block's code is kept to be compared with RAM later.
fn words(code: &[u8]) -> impl Iterator<Item = u64> + '_ {
    code.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
}

/// Whether `ram` holds `kept`, words read by `words`, from offset `base`.
#[inline(always)]
fn holds(ram: &[u8], base: usize, kept: &[u64]) -> bool {
    ram.get(base..base + 8 * kept.len()).is_some_and(|now| words(now).eq(kept.iter().copied()))
}

/// The slot of the block at RAM offset `off`.
#[inline(always)]
pub(crate) fn slot_of(off: usize) -> usize {
    // Code is laid out densely: neighbouring blocks take neighbouring
    // slots, and the high bits spread distant code over the table.
    ((off >> 1) ^ (off >> 14)) & (SLOTS - 1)
}

/// Tables made ahead of time by [`prepare_tables`], taken first by the
/// caches made after.
static PREPARED: Mutex<Vec<Box<[Block]>>> = Mutex::new(Vec::new());

/// A table of empty slots: one prepared ahead if there is one, else
/// zeroed memory the allocator gets fresh from the kernel, which nothing
/// touches until a slot is used (a boot uses a fraction of it).
fn empty_slots() -> Box<[Block]> {
    PREPARED.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_else(empty_slots_fresh)
}

/// Makes `harts` tables of empty slots now, every page of them touched,
/// for the next harts made in this process. The first touch of a page
/// costs about 5 µs on a host without hardware virtualization (12,800
/// pages a table): a backup building its machine as it goes live paid
/// 10 ms of them in its guest's first 60,000 instructions (4.5 instead of
/// some 40 million a second, measured in a handover), or as many building
/// the tables filled. It makes them while it waits instead.
pub fn prepare_tables(harts: usize) {
    let mut made = Vec::new();
    for _ in 0..harts {
        let mut slots = empty_slots_fresh();
        let bytes = std::mem::size_of_val(&*slots);
        let base = slots.as_mut_ptr().cast::<u8>();
        for at in (0..bytes).step_by(4096) {
            // SAFETY: inside the table; a zero byte where one already is
            // (the volatile write is what makes the kernel map the page).
            unsafe { std::ptr::write_volatile(base.add(at), 0) };
        }
        made.push(slots);
    }
    PREPARED.lock().unwrap_or_else(|e| e.into_inner()).extend(made);
}

fn empty_slots_fresh() -> Box<[Block]> {
    let slots = Box::<[Block]>::new_zeroed_slice(SLOTS);
    // SAFETY: all-zero bytes are a valid `Block`, `Block::EMPTY` itself:
    // its fields are integers, arrays of them and of `Inst` (integers and
    // an `Op`, a `repr(u8)` enum whose `Other` is 0), and an
    // `Option<JitFn>`, whose `None` is the null function pointer.
    unsafe { slots.assume_init() }
}
const _: () = assert!(Op::Other as u8 == 0, "a zeroed Inst must hold a valid Op");

/// The table of blocks of one hart.
pub(crate) struct BlockCache {
    slots: Box<[Block]>,
    /// The translations' memory; `None` when translation is off.
    arena: Option<Arena>,
    /// Entries into a block before it is translated.
    hot: u32,
    /// Every translation in the arena by RAM offset, with the words it
    /// was made from: a block pushed out of its slot by another (or
    /// decoded again after its words changed and changed back) gets its
    /// code back at once instead of being translated again.
    known: HashMap<usize, Known>,
    /// The host instructions translations may use.
    host: jit::Host,
    /// The links of every translation in the arena by the RAM offset of
    /// the block they go to (see `jit::Arena::link`): pointed at its
    /// translation whenever one is made.
    links: HashMap<usize, Vec<usize>>,
    /// Blocks pushed out of their slot by another block while still
    /// current, by RAM offset, up to `VICTIMS` (then they all go): one
    /// wanted again comes back whole if its page's code state has not
    /// changed, with its entry count and its translation, instead of
    /// being decoded again (and counted from zero, so that a block pushed
    /// out often was never translated).
    victims: HashMap<usize, Block>,
}

/// The most blocks `BlockCache::victims` keeps: about 26 MB. Real userland
/// runs more hot code than the table has slots for: with 131072 slots,
/// python3's test_math and test_float pushed out and decoded again 5
/// million blocks (measured with a counter of the exits from translated
/// code, not kept).
const VICTIMS: usize = 1 << 16;

/// A translation and the code it was made from: the RAM words from its
/// first block's `base` to the end of the last block it runs on into.
struct Known {
    words: Box<[u64]>,
    entry: JitFn,
    chain: usize,
    n: usize,
    len: usize,
}

impl Default for BlockCache {
    /// An empty stand-in (no slots) for while the executor holds the cache.
    fn default() -> BlockCache {
        BlockCache {
            slots: Box::new([]),
            arena: None,
            hot: 0,
            known: HashMap::new(),
            host: jit::Host::PORTABLE,
            links: HashMap::new(),
            victims: HashMap::new(),
        }
    }
}

/// After how many entries new harts translate a block, 0 for never:
/// `jit::HOT` unless the environment says `FTVM_JIT=0` (off) or
/// `FTVM_JIT=hot=N` (after N entries, 1 to translate everything: for
/// testing the translator). The choice never changes what the guest sees,
/// only how fast; translation happens only on an x86-64 host.
fn jit_default() -> u32 {
    if !cfg!(target_arch = "x86_64") {
        return 0;
    }
    match std::env::var("FTVM_JIT") {
        Ok(v) if v == "0" => 0,
        Ok(v) => v.strip_prefix("hot=").and_then(|n| n.parse().ok()).unwrap_or(jit::HOT),
        Err(_) => jit::HOT,
    }
}

impl BlockCache {
    pub fn new() -> BlockCache {
        // Not `set_jit`: a new table has no translation to forget, and
        // forgetting would touch every slot of the lazily mapped table.
        let hot = jit_default();
        BlockCache {
            slots: empty_slots(),
            arena: (hot > 0).then(Arena::default),
            hot,
            known: HashMap::new(),
            host: jit::Host::detect(),
            links: HashMap::new(),
            victims: HashMap::new(),
        }
    }

    /// Translates blocks after `hot` entries, or never if 0. Forgets every
    /// translation made so far.
    pub fn set_jit(&mut self, hot: u32) {
        self.forget_translations();
        self.hot = hot;
        self.arena = (hot > 0).then(Arena::default);
    }

    /// Translates as for a host without LZCNT, TZCNT and POPCNT (with
    /// their portable sequences, to test those on a host that has them),
    /// or as this host allows. Forgets every translation made so far.
    pub fn set_jit_portable(&mut self, portable: bool) {
        self.forget_translations();
        self.host = if portable { jit::Host::PORTABLE } else { jit::Host::detect() };
    }

    /// How many slots hold a translation.
    pub fn translated(&self) -> usize {
        self.slots.iter().filter(|b| b.jit.is_some()).count()
    }

    fn forget_translations(&mut self) {
        for b in self.slots.iter_mut() {
            b.jit = None;
            b.chain = 0;
            b.jit_n = 0;
            b.jit_len = 0;
            b.hits = 0;
        }
        self.known.clear();
        self.links.clear();
        self.victims.clear();
        if let Some(a) = &mut self.arena {
            a.reset();
        }
    }

    /// Counts an entry into slot `i` and translates its block when hot.
    #[inline(always)]
    fn count(&mut self, i: usize, ram: &GuestRam, ext: Extensions) {
        let b = &mut self.slots[i];
        if b.jit.is_none() && b.hits < self.hot {
            b.hits += 1;
            if b.hits == self.hot {
                self.translate(i, ram, ext);
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn translate(&mut self, i: usize, ram: &GuestRam, ext: Extensions) {
        let Some(arena) = &mut self.arena else { return };
        // The blocks its translation runs on into, decoded from RAM (on
        // the block's page, whose code state is the block's: what their
        // slots hold may be older or another block).
        let mut after: Vec<Block> = Vec::new();
        while after.len() + 1 < jit::MAX_PARTS && jit::runs_on(after.last().unwrap_or(&self.slots[i])) {
            let last = after.last().unwrap_or(&self.slots[i]);
            match Block::decode_at(ram.as_slice(), last.off + last.bytes, ext) {
                Some(b) => after.push(b),
                None => break,
            }
        }
        // The unit borrows the table, which starting over changes: made twice.
        fn unit<'a>(first: &'a Block, after: &'a [Block]) -> Vec<&'a Block> {
            std::iter::once(first).chain(after).collect()
        }
        let mut code = jit::translate(arena, &unit(&self.slots[i], &after), i, &self.slots, self.host);
        if code.is_none() && arena.full() {
            // Start over: every translation goes, this one goes in first.
            self.forget_translations();
            let arena = self.arena.as_mut().expect("translation is on");
            code = jit::translate(arena, &unit(&self.slots[i], &after), i, &self.slots, self.host);
            self.slots[i].hits = self.hot;
        }
        if let Some(t) = code {
            let b = &mut self.slots[i];
            b.jit = Some(t.entry);
            b.chain = t.chain;
            b.jit_n = t.n;
            b.jit_len = t.len as u32;
            let off = b.off;
            let end = after.last().map_or(off + b.bytes, |l| l.off + l.bytes);
            let words = words(&ram.as_slice()[b.base..(end + 7) & !7]).collect();
            self.known.insert(off, Known { words, entry: t.entry, chain: t.chain, n: t.n, len: t.len });
            let arena = self.arena.as_mut().expect("translation is on");
            // Its links to blocks translated already, and the links to it.
            for (at, target) in t.links {
                let s = &self.slots[slot_of(target)];
                if s.off == target && s.chain != 0 {
                    arena.link(at, s.chain);
                }
                self.links.entry(target).or_default().push(at);
            }
            for &at in self.links.get(&off).into_iter().flatten() {
                arena.link(at, t.chain);
            }
        }
    }

    /// Gives the block just decoded into slot `i` the translation made
    /// earlier from the same words at the same place (its own and those of
    /// the blocks it runs on into), if there is one. The code depends on
    /// nothing else (the slots it refers to are those of fixed RAM
    /// offsets), so it is exactly the code translating the block again
    /// would make.
    #[cold]
    fn reuse(&mut self, i: usize, ram: &GuestRam) {
        let b = &mut self.slots[i];
        if let Some(k) = self.known.get(&b.off) {
            if holds(ram.as_slice(), b.base, &k.words) {
                b.jit = Some(k.entry);
                b.chain = k.chain;
                b.jit_n = k.n;
                b.jit_len = k.len as u32;
                b.hits = self.hot;
            }
        }
    }

    /// The block in slot `i`.
    pub fn slot(&self, i: usize) -> &Block {
        &self.slots[i]
    }

    /// The block at RAM offset `off`, decoded afresh if the table holds
    /// none there or its page was written since; `None` if no block can
    /// start there (its first instruction crosses the page). A page that
    /// becomes code here leaves `tlb`'s store side (the hart's own).
    #[inline(always)]
    pub fn get(&mut self, ram: &GuestRam, tlb: &mut Tlb, off: usize, ext: Extensions) -> Option<&Block> {
        let i = slot_of(off);
        let b = &self.slots[i];
        let hit = b.off == off && b.n != 0 && b.code == ram.code_state(off);
        if !hit {
            self.decode(ram, tlb, i, off, ext)?;
        } else if verify_code() {
            verify(b, ram);
        }
        self.count(i, ram, ext);
        Some(&self.slots[i])
    }

    /// Decodes the block at `off` into slot `i`, its page made code first.
    #[cold]
    #[inline(never)]
    fn decode(&mut self, ram: &GuestRam, tlb: &mut Tlb, i: usize, off: usize, ext: Extensions) -> Option<()> {
        if ram.begin_code(off) {
            match tlb.parallel {
                None => tlb.purge_store_page(off, ram.code_purges()),
                Some(index) => tlb.purge_and_wait(ram, index, ram.code_purges()),
            }
        }
        let old = &self.slots[i];
        if old.n != 0 && old.off != off && old.code == ram.code_state(old.off) {
            if self.victims.len() >= VICTIMS {
                self.victims.clear();
            }
            self.victims.insert(old.off, old.clone());
        }
        if let Some(v) = self.victims.remove(&off) {
            if v.code == ram.code_state(off) {
                self.slots[i] = v;
                return Some(());
            }
        }
        let mut b = Block::decode_at(ram.as_slice(), off, ext)?;
        b.code = ram.code_state(off);
        self.slots[i] = b;
        self.reuse(i, ram);
        Some(())
    }
}

/// Whether every use of a block compares its words with RAM too (see the
/// module's comment): `FTVM_VERIFY_CODE=1`, read once.
pub(crate) fn verify_code() -> bool {
    static VERIFY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VERIFY.get_or_init(|| std::env::var("FTVM_VERIFY_CODE").is_ok_and(|v| v == "1"))
}

/// Stops the process: the translation of `block` found RAM no longer
/// holding what it was made from, its page's code state unchanged: a
/// write into code that did not change its page's state.
#[cold]
pub(crate) fn stale(block: &Block) -> ! {
    panic!(
        "FTVM_VERIFY_CODE: the code translated from RAM offset {:#x} on changed in RAM but its page's code state ({:#x}) did not",
        block.off, block.code
    );
}

/// Stops the process if `block`, whose code state is unchanged, is not
/// what RAM holds: a write into code that did not change its page's state.
#[cold]
pub(crate) fn verify(block: &Block, ram: &GuestRam) {
    assert!(
        block.still_in(ram.as_slice()),
        "FTVM_VERIFY_CODE: the block at RAM offset {:#x} changed in RAM but its page's code state ({:#x}) did not",
        block.off,
        block.code
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmu::TlbEntry;
    use crate::trap::Access;

    fn ram_with(code: &[u8], at: usize) -> Vec<u8> {
        let mut ram = vec![0u8; 0x3000];
        ram[at..at + code.len()].copy_from_slice(code);
        ram
    }

    /// Guest RAM (at 0) holding `code` at offset `at`.
    fn guest_ram_with(code: &[u8], at: usize) -> GuestRam {
        let ram = GuestRam::new(0, 0x3000).unwrap();
        ram.write(at as u64, code).unwrap();
        ram
    }

    // addi a0, a0, 1 ; c.addi a1, 1 ; beq a0, a1, 0 ; addi a2, a2, 1
    const CODE: [u8; 14] = [0x13, 0x05, 0x15, 0x00, 0x85, 0x05, 0x63, 0x00, 0xb5, 0x00, 0x13, 0x06, 0x16, 0x00];

    /// A new table's slots are zeroed memory: the empty slot that RAM
    /// offset 0 maps to (`off` 0) is not taken for the block there.
    #[test]
    fn a_new_tables_empty_slot_is_no_block_at_offset_0() {
        let ram = guest_ram_with(&CODE, 0);
        let mut cache = BlockCache::new();
        let b = cache.get(&ram, &mut Tlb::new(), 0, Extensions::ALL).unwrap();
        assert_eq!((b.off, b.n, b.bytes), (0, 3, 10));
        assert!(cache.slots.iter().filter(|b| b.n != 0).count() == 1);
    }

    #[test]
    fn a_block_runs_to_its_branch_and_keeps_offsets() {
        let ram = ram_with(&CODE, 0x1006);
        let b = Block::decode_at(&ram, 0x1006, Extensions::ALL).unwrap();
        assert_eq!(b.n, 3);
        assert_eq!(b.bytes, 10);
        let ops: Vec<_> = b.insts[..3].iter().map(|i| (i.op, i.at, i.next)).collect();
        assert_eq!(ops, [(Op::Addi, 0, 4), (Op::Addi, 4, 6), (Op::Beq, 6, 10)]);
    }

    #[test]
    fn a_block_is_decoded_again_when_its_page_is_written() {
        let mut ram = guest_ram_with(&CODE, 0x1006);
        let mut tlb = Tlb::new();
        let mut cache = BlockCache::new();
        let mut get = |ram: &GuestRam| cache.get(ram, &mut tlb, 0x1006, Extensions::ALL).unwrap().clone();
        assert_eq!(get(&mut ram).insts[0].op, Op::Addi);
        // addi -> xori, one byte changed
        ram.write(0x1007, &[0x45]).unwrap();
        let b = get(&mut ram);
        assert_eq!(b.insts[0].op, Op::Xori);
        // A write anywhere in the page changes its state: a decode, the
        // same block.
        ram.write(0x1f00, &[1]).unwrap();
        let again = get(&mut ram);
        assert_ne!(again.code, b.code);
        assert_eq!((again.n, again.insts[0].op), (3, Op::Xori));
        // Another page's write does not.
        ram.write(0x2000, &[1]).unwrap();
        assert_eq!(get(&mut ram).code, again.code);
    }

    /// A block pushed out of its slot by another comes back whole (its
    /// entry count too) when it is wanted again, unless its page changed
    /// meanwhile.
    #[test]
    fn a_block_pushed_out_of_its_slot_comes_back_unless_its_page_changed() {
        const SIZE: usize = 4 << 20;
        let a = 0x1006;
        let b =
            (0x2000..SIZE - 0x100).step_by(2).find(|&o| slot_of(o) == slot_of(a)).expect("an offset sharing a's slot");
        let mut ram = GuestRam::new(0, SIZE as u64).unwrap();
        ram.write(a as u64, &CODE).unwrap();
        ram.write(b as u64, &CODE).unwrap();
        let mut tlb = Tlb::new();
        let mut cache = BlockCache::new();
        // Counted, never translated.
        cache.hot = u32::MAX;
        let mut get = |ram: &GuestRam, off: usize| {
            let b = cache.get(ram, &mut tlb, off, Extensions::ALL).unwrap();
            (b.off, b.hits)
        };
        for _ in 0..5 {
            get(&mut ram, a);
        }
        assert_eq!(get(&mut ram, b), (b, 1));
        assert_eq!(get(&mut ram, a), (a, 6), "a decoded again");
        // b's page written while b is out: decoded again, counted afresh.
        assert_eq!((b + 0x20) >> 12, b >> 12);
        ram.write(b as u64 + 0x20, &[1]).unwrap();
        assert_eq!(get(&mut ram, b), (b, 1));
        assert_eq!(get(&mut ram, b), (b, 2));
    }

    /// A store TLB holding a page that becomes code loses it (stores to
    /// code must go the slow way, which changes the page's state).
    #[test]
    fn a_page_that_becomes_code_leaves_the_store_tlb() {
        let ram = guest_ram_with(&CODE, 0x1006);
        let mut tlb = Tlb::new();
        let entry = TlbEntry::new(0x7000_1000, 0x7000_1000, 0x1000);
        let other = TlbEntry::new(0x7000_2000, 0x7000_2000, 0x2000);
        ram.store_cached(0x1000);
        tlb.fill(Access::Store, 1, entry, 12);
        tlb.fill(Access::Store, 2, other, 12);
        let mut cache = BlockCache::new();
        cache.get(&ram, &mut tlb, 0x1006, Extensions::ALL).unwrap();
        assert_eq!(tlb.store[1].tag, crate::mmu::NO_TAG, "the code page stayed in the store TLB");
        assert_eq!(tlb.store[2].tag, other.tag, "another page left the store TLB");
        assert_eq!(tlb.code_purges_seen(), ram.code_purges());
    }

    #[test]
    fn operations_that_only_write_x0_become_nops_but_loads_stay() {
        // addi x0, a0, 1 ; ld x0, 0(a0) ; jal x0, 0
        let code = [0x13, 0x00, 0x15, 0x00, 0x03, 0x30, 0x05, 0x00, 0x6f, 0x00, 0x00, 0x00];
        let ram = ram_with(&code, 0x1000);
        let b = Block::decode_at(&ram, 0x1000, Extensions::ALL).unwrap();
        let ops: Vec<_> = b.insts[..b.n].iter().map(|i| i.op).collect();
        assert_eq!(ops, [Op::Nop, Op::Ld, Op::Jal]);
    }

    #[test]
    fn blocks_stop_at_the_page_end() {
        // Four 32-bit addi, the last starting 2 bytes before the page end.
        let mut code = Vec::new();
        for _ in 0..4 {
            code.extend_from_slice(&[0x13, 0x05, 0x15, 0x00]);
        }
        let ram = ram_with(&code, 0x1ff2);
        let b = Block::decode_at(&ram, 0x1ff2, Extensions::ALL).unwrap();
        assert_eq!((b.n, b.bytes), (3, 12));
        // A 32-bit instruction that crosses the page starts no block.
        assert!(Block::decode_at(&ram, 0x1ffe, Extensions::ALL).is_none());
        // A compressed one in the last halfword does.
        let ram = ram_with(&[0x85, 0x05], 0x1ffe);
        assert_eq!(Block::decode_at(&ram, 0x1ffe, Extensions::ALL).unwrap().n, 1);
    }
}
