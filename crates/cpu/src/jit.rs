//! The translation tier: hot blocks of the block cache compiled to x86-64.
//!
//! This module owns the translator (a decoded [`Block`] into host code),
//! the executable memory the code lives in, and the layout of what the
//! code is given when called ([`JitCtx`]). The block cache owns *when*
//! to translate (a block entered often enough) and ties each translation
//! to its block slot, so the code is reused exactly as long as the
//! decoding it came from: the slot's revalidation against RAM covers both.
//! The executor owns *whether* to call it (only when the whole block fits
//! in the remaining budget) and what happens after.
//!
//! Translated code keeps the guest registers a block uses in nine host
//! registers, given out as the block goes: to the registers an
//! instruction accesses that a later one accesses again, the one held
//! whose next use is furthest away giving its place up (Belady's choice,
//! exact for straight-line code; a value the code overwrites before any
//! exit is not written back when it gives its place up); others are read
//! and written in place in the hart's register file, which x86 takes as
//! an operand. A word operation's result (`addw`, `slliw`, ...) is left
//! with its sign extension undone while only low words are read (by
//! other word operations, a word's store, bitwise operations and
//! comparisons of two sign-extended values): see `Emitter::narrow`. It
//! runs the block's operations with no dispatch, and writes the dirty
//! registers back at every exit. It does only what the interpreter's fast
//! paths do and returns to Rust for everything else (LR, the CSRs other
//! than floating point's, system instructions), with two exceptions. Of the
//! general executor's instructions, which end their block, it steps over
//! fences (all the general executor does with them), runs SCs and AMOs
//! (their address checks and the store TLB's hit test inline, the rest in
//! the interpreter's own `HartState::sc_or_amo` through a call: a
//! misaligned address or a TLB miss returns to Rust at the instruction,
//! which traps or walks the page tables as the interpreter does), and
//! runs the accesses to fflags, frm and fcsr inline (glibc's floor, ceil,
//! trunc and round save and restore fflags around their conversions, and
//! its rounding-mode changes read and write frm and fcsr: two returns to
//! Rust per call otherwise); FS off returns to Rust at the instruction,
//! which raises the illegal instruction. See `General`. The other
//! exception is floating point. Loads and stores of
//! f registers take the integer ones' TLB fast paths (after the FS check;
//! flw NaN-boxes, a load marks FS dirty). What compiled code computes
//! most (arithmetic, square roots, fused multiply-adds where the host has
//! FMA3, comparisons, sign injection, moves, conversions), in round to
//! nearest even, runs inline on the host's SSE when the result is one the
//! host computes exactly as the guest does (finite, normal and clear of
//! the subnormal range: only inexact can have been raised, and x86's
//! inexact flag gives it; see `Emitter::fp_inline`); everything else
//! (NaNs, infinities, zeros and tiny results, the other rounding modes,
//! fmin and fmax of equal numbers, fclass of anything but a normal
//! number, the unsigned conversions to an integer) calls the
//! interpreter's own `HartState::fp_compute` (the software FPU: exact
//! results, fflags, canonical NaNs, every rounding mode) from translated
//! code, which costs a call instead of a return to Rust and back. The f
//! registers stay in the register file. The bit-manipulation extensions (Zba, Zbb, Zbs, Zicond)
//! are translated inline; clz, ctz and cpop use the host's LZCNT, TZCNT
//! and POPCNT if it has them and equivalent sequences if not (see `Host`).
//! So is Zicboz's `cbo.zero`, which Linux's `clear_page` issues 64 times
//! a page: its enables and the store TLB checked inline, 64 bytes zeroed,
//! anything else (a miss, an enable off, M-mode's unconditional one) left
//! to the interpreter at that instruction.
//!
//! A block whose next pc is known (a branch either way, `jal`, the
//! straight line running on) and lies on the same page goes on to that
//! block's translation directly, without returning, doing what the
//! executor's loop would: the target's code first checks that the budget
//! holds the whole block, that its slot still holds this translation and
//! that its page's code state is the one it was decoded with (the block
//! cache's check, compiled in), and returns to Rust if not. The virtual
//! page maps to the same RAM page throughout (nothing in translated code
//! changes the privilege level or the TLB), so the target's RAM offset is
//! fixed at translation. The jump is a `jmp` the block cache points at
//! the target's translation once there is one (`Arena::link`); until
//! then it falls through to a lookup in the target's slot. Each block adds
//! what it retired to the count in the context, so the instructions
//! counted and the point the budget stops at are the interpreter's.
//! A block that ends only because it reached `MAX_INSTS` instructions
//! (straight-line code: a SHA-256 round is 62) is translated together
//! with the blocks after it, up to `MAX_PARTS` in all, as one piece of
//! code (see `translate`): the guest registers stay in host registers
//! from one to the next, with no chain entry between them.
//! A translation that goes back to its own start (a loop of one block or
//! of the blocks it runs on through: a fill, a copy, a byte loop, a hash's
//! rounds) jumps to the top of its own body instead: of the chain entry's
//! checks only the budget's can fail there. The guest registers its body
//! ends with in host registers stay there from one round to the next:
//! the body's start takes them to be there (every entry loads them), and
//! the way back moves only those not in place (see `Emitter::loop_back`).
//! A loop whose rounds sign-extend words is emitted twice, its first
//! round and the rounds after, which know more of what the registers hold
//! (see `assemble`).
//!
//! A jump through a register (`jalr`: returns, indirect calls) and a
//! direct jump, branch or fall-through to another page go on the same
//! way, to a target found at run time as the executor's loop finds it:
//! the RAM offset of the pc from the interpreter's one-entry fetch cache
//! or the fetch TLB (refilling the cache as `Hart::fetch_offset` does, so
//! that translated and interpreted execution always fetch a pc from the
//! same RAM), then the block cache's slot for that offset. A TLB miss, a
//! slot holding another block or none translated returns to Rust, which
//! walks the page tables, decodes or translates.
//!
//! What a call returns:
//! - `END`: every block it ran retired whole (the count is in
//!   `JitCtx::left`) and the next pc is `JitCtx::pc`;
//! - `RESUME | k << 8 | slot << 16 | part << 40`: the blocks before the
//!   one in `slot` retired; that one, at `JitCtx::pc`, and the `part`
//!   blocks after it its translation runs on through executed whole, the
//!   next one its instructions `0..k`, none of them counted, and the
//!   interpreter carries on from instruction `k` of that one: a load or store whose TLB fast path missed, an SC or AMO whose
//!   did or whose address is misaligned, a floating-point
//!   instruction that traps (FS off, a reserved rounding mode or
//!   encoding: `fp_compute` declines without changing anything), or an
//!   instruction the translator does not handle (the general executor's,
//!   always the last of its block). The interpreter then does exactly what it would
//!   have done had it run the block from the start, so slow paths, device
//!   accesses and traps (precise: pc, tval, registers, counts) need no
//!   second implementation here.
//!
//! Loads (or stores) through one base register with nothing between them
//! that writes it or calls out share one TLB check of the span they
//! cover, made by the first of them (see `Group`).
//!
//! A store (or `cbo.zero`) cannot reach the running block's own bytes,
//! nor any other code: translated code stores only through the store
//! TLB, which holds no page while it is code (see the block cache), so a
//! store into code leaves translated code for the interpreter, which cuts
//! its block after a store into its own bytes.
//!
//! The emitter is dynasm-rs (`dynasmrt`): the assembly is written inline
//! in Intel syntax, checked and encoded at compile time into plain byte
//! pushes (no run-time assembler to trust or to slow translation), it
//! supports registers chosen at run time (`Rq(n)`), and its runtime crate
//! is small and widely used (wasmer's single-pass compiler). iced-x86's
//! code assembler would do too, but encodes every instruction at run time
//! through a much larger crate.

use crate::block::{slot_of, Block, Inst, MAX_INSTS, SLOTS};
use crate::csr::{ENVCFG_CBZE, FCSR, FFLAGS, FRM, MSTATUS_FS, MSTATUS_FS_DIRTY, MSTATUS_SD};
use crate::decode::Op;
use crate::ext::CBO_BLOCK_BYTES;
use crate::hart::HartState;
use crate::mmu::{TlbEntry, TLB_SIZE};
use crate::trap::Trap;
use dynasmrt::x64::X64Relocation;
use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use std::mem::offset_of;

/// Entries into a block before it is translated.
pub(crate) const HOT: u32 = 32;

/// Exit codes of translated code (the low byte of what it returns).
pub(crate) const END: u64 = 0;
pub(crate) const RESUME: u64 = 1;
/// The bit a resume's part starts at (its instruction is at bit 8, the
/// slot at bit 16).
pub(crate) const RESUME_PART: u32 = 40;
/// `FTVM_VERIFY_CODE` only: the translation in slot `code >> 16` was
/// entered with its page's code state unchanged but the bits of its
/// blocks changed in RAM.
pub(crate) const STALE: u64 = 2;

/// What translated code reads and writes besides the guest registers
/// (which it gets as a pointer to `HartState::x`).
#[repr(C)]
pub(crate) struct JitCtx {
    /// The pc of the running block's first instruction; after `END`, the
    /// next pc.
    pub pc: u64,
    /// Steps left in the budget: each block subtracts what it retired.
    pub left: u64,
    /// Guest RAM's first byte.
    pub ram: *mut u8,
    pub load_tlb: *const TlbEntry,
    pub store_tlb: *const TlbEntry,
    /// The low bits of a load's or store's TLB tag: the privilege part and
    /// the address space's context (`Hart::data_tag_prv`).
    pub prv: u64,
    /// The fetch side, for jumps to a pc known only at run time: the fetch
    /// TLB, the low bits of a fetch's tag (privilege level and context), and the
    /// interpreter's one-entry fetch cache (`Hart::fetch_tag` and
    /// `fetch_addend`), which translated code reads and updates exactly as
    /// `Hart::fetch_offset` does, so that both find the same RAM for a pc.
    pub fetch_tlb: *const TlbEntry,
    pub fetch_prv: u64,
    pub fetch_tag: u64,
    pub fetch_addend: usize,
    /// The RAM's code states, one `u64` a page (`GuestRam::code_states`).
    pub code: *const u64,
    /// `MXCSR_DEFAULT`, for `ldmxcsr`, which takes only a memory operand.
    pub mxcsr_default: u32,
    /// Where translated code stores MXCSR to test its inexact flag.
    pub mxcsr: u32,
    /// Floating-point computations that called the software FPU.
    pub fp_calls: u64,
    /// The host address of the span the first load, and the first store,
    /// of a group checked (see `Group`).
    pub group: [usize; 2],
}

/// The host's SSE control and status register as every thread starts
/// with it and Rust code leaves it: every exception masked, round to
/// nearest even, subnormals neither flushed nor treated as zero, no flag
/// raised. Translated code computes floating point in this mode only, and
/// loads it to clear the flags before an operation whose inexact flag it
/// needs (see `Emitter::fp_inline`).
pub(crate) const MXCSR_DEFAULT: u32 = 0x1f80;

const CTX_PC: i32 = offset_of!(JitCtx, pc) as i32;
const CTX_LEFT: i32 = offset_of!(JitCtx, left) as i32;
const CTX_RAM: i32 = offset_of!(JitCtx, ram) as i32;
const CTX_LOAD_TLB: i32 = offset_of!(JitCtx, load_tlb) as i32;
const CTX_STORE_TLB: i32 = offset_of!(JitCtx, store_tlb) as i32;
const CTX_PRV: i32 = offset_of!(JitCtx, prv) as i32;
const CTX_FETCH_TLB: i32 = offset_of!(JitCtx, fetch_tlb) as i32;
const CTX_FETCH_PRV: i32 = offset_of!(JitCtx, fetch_prv) as i32;
const CTX_FETCH_TAG: i32 = offset_of!(JitCtx, fetch_tag) as i32;
const CTX_FETCH_ADDEND: i32 = offset_of!(JitCtx, fetch_addend) as i32;
const CTX_CODE: i32 = offset_of!(JitCtx, code) as i32;
const CTX_MXCSR_DEFAULT: i32 = offset_of!(JitCtx, mxcsr_default) as i32;
const CTX_MXCSR: i32 = offset_of!(JitCtx, mxcsr) as i32;
const CTX_FP_CALLS: i32 = offset_of!(JitCtx, fp_calls) as i32;
const CTX_GROUP: i32 = offset_of!(JitCtx, group) as i32;
const TLB_TAG: i32 = offset_of!(TlbEntry, tag) as i32;
const TLB_ADDEND: i32 = offset_of!(TlbEntry, addend) as i32;
const _: () = assert!(std::mem::size_of::<TlbEntry>() == 16 && TLB_SIZE.is_power_of_two());
const BLOCK_OFF: i32 = offset_of!(Block, off) as i32;
const BLOCK_CHAIN: i32 = offset_of!(Block, chain) as i32;
const BLOCK_CODE: i32 = offset_of!(Block, code) as i32;
const BLOCK_SIZE: i32 = std::mem::size_of::<Block>() as i32;
/// Where the f registers and mstatus are, from the x registers (the
/// pointer translated code gets): the offsets within `HartState`.
const X_OFF: i32 = offset_of!(HartState, x) as i32;
const F_REL: i32 = offset_of!(HartState, f) as i32 - X_OFF;
const MSTATUS_REL: i32 = offset_of!(HartState, mstatus) as i32 - X_OFF;
const MENVCFG_REL: i32 = offset_of!(HartState, menvcfg) as i32 - X_OFF;
const SENVCFG_REL: i32 = offset_of!(HartState, senvcfg) as i32 - X_OFF;
const FFLAGS_REL: i32 = offset_of!(HartState, fflags) as i32 - X_OFF;
const FRM_REL: i32 = offset_of!(HartState, frm) as i32 - X_OFF;

/// A translated block: the guest registers (`HartState::x`, a pointer
/// valid for the whole `HartState`), the context; returns an exit code.
pub(crate) type JitFn = unsafe extern "sysv64" fn(*mut u64, *mut JitCtx) -> u64;

/// A floating-point computation for translated code: the interpreter's own
/// (`HartState::fp_compute`), so results, fflags, NaN boxing, canonical
/// NaNs and rounding modes are the interpreter's by construction. 1 when
/// done; 0 when it would trap (illegal: FS off, a reserved rounding mode
/// or encoding), having changed nothing, and the interpreter runs it.
///
/// # Safety
/// `s` points to a live `HartState` that nothing else accesses for the
/// call.
unsafe extern "sysv64" fn fp_helper(s: *mut HartState, insn: u32, raw: u32) -> u64 {
    // SAFETY: as the caller promises; translated code passes the state
    // its own register pointer is in, and touches nothing during the call.
    let s = unsafe { &mut *s };
    let r: Result<(), Trap> = s.fp_compute(insn, raw);
    r.is_ok() as u64
}

/// An SC or AMO for translated code: the interpreter's own
/// (`HartState::sc_or_amo`), on the bytes at RAM offset `off`, which the
/// code found in the store TLB and checked aligned, as `Hart::amo_offset`
/// does before the general executor's. Returns what rd gets. The
/// translator only translates the funct5 values `sc_or_amo` does.
///
/// # Safety
/// `s` points to a live `HartState` that nothing else accesses for the
/// call; `ram + off` to the access's aligned word (4 bytes for .w, 8 for
/// .d) in guest RAM.
unsafe extern "sysv64" fn amo_helper(s: *mut HartState, ram: *mut u8, off: u64, insn: u32, src: u64) -> u64 {
    // SAFETY: as the caller promises: translated code passes the state its
    // register pointer is in and an aligned offset from a store TLB entry
    // (a RAM page), and touches nothing during the call.
    let s = unsafe { &mut *s };
    s.sc_or_amo(ram, off, insn, src).expect("only valid SCs and AMOs are translated")
}

/// Whether FENCE `insn` orders stores before loads (predecessor set has
/// W, successor set has R): the only order a host with x86's (TSO) does
/// not keep by itself. FENCE.I orders nothing in memory, and FENCE.TSO
/// (fm 1000) nothing beyond TSO.
pub(crate) fn fence_needs_barrier(insn: u32) -> bool {
    (insn >> 12) & 7 == 0 && insn >> 28 != 0b1000 && insn >> 24 & 1 != 0 && insn >> 21 & 1 != 0
}

/// Host registers (x86-64 encodings). rdi holds the guest register file,
/// rsi the context; rax, rcx, rdx and r11 are scratch.
const RAX: u8 = 0;
const RCX: u8 = 1;
const RDX: u8 = 2;
const R11: u8 = 11;
/// The host registers guest registers live in within a block, in the
/// order they are given out. rbx, rbp and r12-r15 are callee-saved (the
/// prologue saves them) and come first: r8-r10, caller-saved, are pushed
/// around a call into Rust while they hold guest registers.
const POOL: [u8; 9] = [3, 5, 12, 13, 14, 15, 8, 9, 10];

/// Where rsi and rdi are in the frame, from rsp in a block (see
/// `assemble`).
const FRAME_RSI: i32 = 0;
const FRAME_RDI: i32 = 8;

/// The registers `Emitter::save_for_call` pushed; it padded the stack if
/// they are an even number.
struct Saved {
    regs: Vec<u8>,
}

impl Saved {
    /// The frame leaves the stack 8 past a multiple of 16: an even number
    /// of pushes needs 8 more bytes for the call.
    fn pad(&self) -> bool {
        self.regs.len().is_multiple_of(2)
    }
}

/// The x registers (bit r: xr) an instruction reads and writes, and
/// whether translated code may leave at it (`may_exit`).
#[derive(Clone, Copy)]
struct Access {
    read: u32,
    written: u32,
    exits: bool,
}

impl Access {
    fn all(self) -> u32 {
        self.read | self.written
    }
}

/// The first instruction after `k` that reads or writes guest register
/// `r`, if any.
fn next_use(accesses: &[Access], k: usize, r: usize) -> Option<usize> {
    (k + 1..accesses.len()).find(|&j| accesses[j].all() & (1 << r) != 0)
}

/// Whether the value of guest register `r` before instruction `k` is
/// dead: an instruction at or after `k` overwrites it before anything
/// reads it, and none from `k` to that one may leave translated code (an
/// exit writes the registers back: the register file must then hold it).
fn dead(accesses: &[Access], k: usize, r: usize) -> bool {
    for a in &accesses[k..] {
        if a.exits || a.read & (1 << r) != 0 {
            return false;
        }
        if a.written & (1 << r) != 0 {
            return true;
        }
    }
    false
}

/// Whether translated code may leave at `d`: its emitter makes a side
/// exit (`Emitter::stub`: loads, stores, floating point, atomics, the
/// floating-point CSRs, `cbo.zero`), or it ends the unit.
fn may_exit(d: &Inst) -> bool {
    use Op::*;
    matches!(
        d.op,
        Other
            | Illegal
            | Jal
            | Jalr
            | Beq
            | Bne
            | Blt
            | Bge
            | Bltu
            | Bgeu
            | Lb
            | Lh
            | Lw
            | Ld
            | Lbu
            | Lhu
            | Lwu
            | Sb
            | Sh
            | Sw
            | Sd
            | Fp
            | Fload
            | Fstore
            | CboZero
    )
}

/// A load's or store's place in a group: loads (or stores) through the
/// same base register, none writing it in between, and nothing but other
/// loads and stores and integer operations among them (no call into Rust,
/// no other group of the same kind). The group's first access checks the
/// TLB once for the span of all of them (its entry from the span's first
/// byte, the tag from its last: the span within one page, which the entry
/// allows) and leaves its host address in `JitCtx::group`; the others
/// read it from there, and cannot miss. If the check fails, the
/// interpreter goes on at the first (which may fault, and then the others
/// did not run). A function's saves and restores (`sd ra, 24(sp)`, ...),
/// a structure's fields, a byte loop's four loads.
#[derive(Clone, Copy)]
struct Group {
    /// The span's offsets from the base register.
    lo: i32,
    hi: i32,
    first: bool,
}

/// The widest span a group checks at once.
const GROUP_SPAN: i32 = 512;

/// Whether `d` is a load (0) or a store (1) a group may hold, and its
/// size.
fn access_kind(d: &Inst) -> Option<(usize, i32)> {
    use Op::*;
    match d.op {
        Lb | Lbu | Sb => Some((usize::from(d.op == Sb), 1)),
        Lh | Lhu | Sh => Some((usize::from(d.op == Sh), 2)),
        Lw | Lwu | Sw => Some((usize::from(d.op == Sw), 4)),
        Ld | Sd => Some((usize::from(d.op == Sd), 8)),
        _ => None,
    }
}

/// Each instruction's place in a group (see `Group`), if it has one.
fn groups(insts: &[Inst]) -> Vec<Option<Group>> {
    let mut out: Vec<Option<Group>> = vec![None; insts.len()];
    // The group of each kind being gathered: its base register, span and
    // members.
    type Gathering = (u8, i32, i32, Vec<usize>);
    let mut open: [Option<Gathering>; 2] = [None, None];
    let close = |g: Option<Gathering>, out: &mut Vec<Option<Group>>| {
        if let Some((_, lo, hi, members)) = g {
            if members.len() > 1 {
                for (i, &m) in members.iter().enumerate() {
                    out[m] = Some(Group { lo, hi, first: i == 0 });
                }
            }
        }
    };
    for (k, d) in insts.iter().enumerate() {
        if let Some((kind, size)) = access_kind(d) {
            let (lo, hi) = (d.imm, d.imm + size);
            match &mut open[kind] {
                Some((base, glo, ghi, members)) if *base == d.rs1 && (*ghi).max(hi) - (*glo).min(lo) <= GROUP_SPAN => {
                    *glo = (*glo).min(lo);
                    *ghi = (*ghi).max(hi);
                    members.push(k);
                }
                g => {
                    close(g.take(), &mut out);
                    *g = Some((d.rs1, lo, hi, vec![k]));
                }
            }
        } else if may_exit(d) {
            // Integer operations leave the groups open; anything else
            // that may leave or call out closes them.
            for g in &mut open {
                close(g.take(), &mut out);
            }
        }
        // A write of the base register ends its groups (after a load into
        // its own base: `ld a0, 0(a0)` is a member).
        if writes(d) {
            for g in &mut open {
                if g.as_ref().is_some_and(|(base, ..)| *base == d.rd && d.rd != 0) {
                    close(g.take(), &mut out);
                }
            }
        }
    }
    for g in &mut open {
        close(g.take(), &mut out);
    }
    out
}

/// Whether `d` jumps or branches to its unit's start (it is the unit's
/// last instruction: only those leave the straight line).
fn back_to_start(d: &Inst) -> bool {
    use Op::*;
    matches!(d.op, Jal | Beq | Bne | Blt | Bge | Bltu | Bgeu) && d.at as i64 + d.imm as i64 == 0
}

/// Where the registers stand at the start of a loop's body, whose
/// instructions access `body` (the last goes back to the first), and
/// what the allocation then looks ahead at: the body, then the body again
/// (a register the next round uses soon keeps its host register at the
/// end of this one, as within straight-line code).
///
/// The start's places are those the end of a round leaves, the round run
/// from them (a few rounds of the allocation without code settle it); the
/// registers that may be dirty there are those the end of a round leaves
/// dirty, the round started with them dirty (from all of them down to
/// where that holds). Every entry loads the start's registers (then
/// clean: fewer dirty than assumed only costs stores); the way back
/// writes back and loads the ones out of place (see `Emitter::loop_back`).
fn round(body: &[Access]) -> ([Loc; 32], u32, Vec<Access>) {
    let ahead: Vec<Access> = body.iter().chain(body).copied().collect();
    let mut top = Loc::all_in_memory();
    // One round from `loc` with `dirty`: where it ends, and what is dirty.
    let run = |mut loc: [Loc; 32], mut dirty: u32| {
        for (k, here) in body.iter().enumerate() {
            allocation(&mut loc, &ahead, k, dirty, |m| {
                if let Move::GiveUp { guest, .. } = m {
                    dirty &= !(1 << guest);
                }
            });
            dirty |= here.written & held(&loc);
        }
        (loc, dirty)
    };
    for _ in 0..4 {
        let (end, _) = run(top, 0);
        if end == top {
            break;
        }
        top = end;
    }
    let (end, _) = run(top, 0);
    let in_place = held(&top) & !(1..32).filter(|&r| end[r] != top[r]).fold(0, |m, r| m | 1 << r);
    let mut dirty = held(&top);
    loop {
        let (_, after) = run(top, dirty);
        let next = after & in_place;
        if next == dirty {
            break;
        }
        dirty = next;
    }
    (top, dirty, ahead)
}

/// The guest registers in host registers in `loc`, as a mask.
fn held(loc: &[Loc; 32]) -> u32 {
    (1..32).filter(|&r| matches!(loc[r], Loc::Host(_))).fold(0, |m, r| m | 1 << r)
}

/// A change `allocation` makes to where guest registers are.
enum Move {
    /// `guest` leaves `host` for the register file, where it need not be
    /// written if `dead`.
    GiveUp { guest: usize, host: u8, dead: bool },
    /// `guest` goes into `host`.
    Take { guest: usize, host: u8 },
}

/// Before instruction `k`: a host register for each guest register it
/// accesses that an instruction after it accesses again (one used only
/// here is as cheap in the register file). With none free, the one held
/// whose next use is furthest away gives its host register up, unless
/// that use comes sooner than the newcomer's: the choice that reloads
/// least in straight-line code (Belady's). Of those equally far, one that
/// need not be written back goes first: clean (of the registers `dirty`),
/// or dead (see `dead`: not written back at all). Ranking by the next
/// read instead (a value overwritten first counting as never used) gave
/// up registers whose values the exits still needed: more stores. It
/// changes only where registers are between instructions (each exit
/// writes back what is dirty where it stands; a stub keeps the places of
/// its own), and tells `moved` of each change, in order.
fn allocation(loc: &mut [Loc; 32], accesses: &[Access], k: usize, mut dirty: u32, mut moved: impl FnMut(Move)) {
    let here = accesses[k];
    for r in (1..32).filter(|&r| here.all() & (1 << r) != 0) {
        if matches!(loc[r], Loc::Host(_)) {
            continue;
        }
        let Some(next) = next_use(accesses, k, r) else { continue };
        let host = match POOL.iter().copied().find(|&h| !loc.contains(&Loc::Host(h))) {
            Some(h) => h,
            None => {
                // Never used again counts as furthest away.
                let victim = (1..32)
                    .filter(|&v| here.all() & (1 << v) == 0 && matches!(loc[v], Loc::Host(_)))
                    .map(|v| {
                        let dead = dead(accesses, k, v);
                        (v, next_use(accesses, k, v).unwrap_or(usize::MAX), dead, dead || dirty & (1 << v) == 0)
                    })
                    .max_by_key(|&(_, used, _, free)| (used, free));
                let Some((v, used, dead, _)) = victim else { continue };
                if used <= next {
                    continue;
                }
                let Loc::Host(h) = loc[v] else { unreachable!() };
                dirty &= !(1 << v);
                moved(Move::GiveUp { guest: v, host: h, dead });
                loc[v] = Loc::Mem(8 * v as i32);
                h
            }
        };
        loc[r] = Loc::Host(host);
        moved(Move::Take { guest: r, host });
    }
}

/// Where a guest register is during a block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loc {
    /// x0.
    Zero,
    Host(u8),
    /// In the hart's register file, at this offset from rdi.
    Mem(i32),
}

impl Loc {
    /// Every register where a call finds it: x0, and the others in the
    /// hart's register file.
    fn all_in_memory() -> [Loc; 32] {
        let mut loc = [Loc::Zero; 32];
        for (r, l) in loc.iter_mut().enumerate().skip(1) {
            *l = Loc::Mem(8 * r as i32);
        }
        loc
    }
}

/// Whether the translator handles `d`: everything with a fast path in
/// the interpreter, and of the general executor's instructions the fences,
/// the SCs and AMOs and the accesses to floating point's CSRs (see
/// `General`); the others (other CSRs, LR, system instructions) and
/// illegal ones end translated code.
fn supported(d: &Inst) -> bool {
    match d.op {
        Op::Illegal => false,
        Op::Other => general(d.insn).is_some(),
        _ => true,
    }
}

/// The instructions of the general executor (`Op::Other`, always the last
/// of a block) that translated code runs itself: the ones the guest runs
/// most (a Linux boot: the kernel's atomics and fences around locks and
/// reference counts), and only where the general executor does nothing
/// more than the translation can do exactly.
#[derive(Clone, Copy, PartialEq, Eq)]
enum General {
    /// fence and fence.i, which the general executor only steps over: one
    /// thread runs every hart, so memory is always coherent, and blocks
    /// are used only while their page is unchanged, so no decoding is ever
    /// stale.
    Fence,
    /// An SC or AMO, .w or .d: the alignment check and the store TLB's hit
    /// test of `Hart::amo_offset` inline, then `HartState::sc_or_amo`
    /// through `amo_helper`; a misaligned address or a TLB miss returns to
    /// the interpreter at the instruction, which traps or walks the page
    /// tables exactly. Not LR, which the general executor translates with
    /// a page walk every time rather than through a TLB.
    ScAmo,
    /// csrrw, csrrs, csrrc and their immediate forms on fflags, frm and
    /// fcsr (frflags, fsflags, frrm, fsrm, frcsr, fscsr): inline, as the
    /// general executor's `system` makes them; FS off (illegal) returns to
    /// the interpreter at the instruction. They read and write nothing
    /// but rd, rs1, fflags, frm and mstatus.FS, can trap for nothing else
    /// (the three are read-write at every privilege level), and change
    /// nothing a block or translated code depends on.
    FpCsr,
}

/// What `insn`, an `Op::Other`, is for the translator; `None` if it returns
/// to Rust.
fn general(insn: u32) -> Option<General> {
    let funct3 = (insn >> 12) & 7;
    match insn & 0x7f {
        0x0f if funct3 <= 1 => Some(General::Fence),
        // SC, then amoswap, amoadd, amoxor, amoor, amoand, amomin, amomax,
        // amominu, amomaxu: every funct5 `sc_or_amo` does (others are
        // illegal, which the interpreter raises after the address checks).
        0x2f if matches!(funct3, 2 | 3)
            && matches!(
                insn >> 27,
                0b00011 | 0b00001 | 0 | 0b00100 | 0b01000 | 0b01100 | 0b10000 | 0b10100 | 0b11000 | 0b11100
            ) =>
        {
            Some(General::ScAmo)
        }
        // csrrw, csrrs, csrrc, csrrwi, csrrsi, csrrci (funct3 4 is
        // illegal) of fflags, frm and fcsr.
        0x73 if matches!(funct3, 1 | 2 | 3 | 5 | 6 | 7) && matches!((insn >> 20) as u16, FFLAGS | FRM | FCSR) => {
            Some(General::FpCsr)
        }
        _ => None,
    }
}

/// The optional instructions of the host that translations use, found out
/// once per process. clz, ctz and cpop map to single instructions (LZCNT,
/// TZCNT, POPCNT) only where the host has ABM, BMI1 and POPCNT: elsewhere
/// LZCNT and TZCNT execute as BSR and BSF (the index of the highest set
/// bit rather than the zeros above it; an undefined result for zero) and
/// POPCNT faults. So a translation made for a host without them uses
/// portable sequences that compute the same results: what the guest sees
/// does not depend on the host (a log recorded on one replays on another).
/// Fused multiply-adds are computed inline with FMA3 where the host has it
/// (a single rounding, as the guest's) and by the software FPU elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Host {
    pub lzcnt: bool,
    pub tzcnt: bool,
    pub popcnt: bool,
    pub fma: bool,
}

impl Host {
    /// None of the optional instructions: the portable sequences only.
    pub const PORTABLE: Host = Host { lzcnt: false, tzcnt: false, popcnt: false, fma: false };

    /// What this host has (CPUID, read once).
    pub fn detect() -> Host {
        static HOST: std::sync::OnceLock<Host> = std::sync::OnceLock::new();
        *HOST.get_or_init(Host::probe)
    }

    #[cfg(target_arch = "x86_64")]
    fn probe() -> Host {
        Host {
            lzcnt: std::is_x86_feature_detected!("lzcnt"),
            tzcnt: std::is_x86_feature_detected!("bmi1"),
            popcnt: std::is_x86_feature_detected!("popcnt"),
            fma: std::is_x86_feature_detected!("fma"),
        }
    }

    /// Nothing is translated on other hosts.
    #[cfg(not(target_arch = "x86_64"))]
    fn probe() -> Host {
        Host::PORTABLE
    }
}

/// Bytes of executable memory a hart's translations may take before
/// everything is thrown away and translation starts over. Mapped whole,
/// but the host gives a page only when a translation is written into it.
/// 8 MiB did not hold PostgreSQL's and the kernel's code under pgbench's
/// TPC-B-like load: the arena filled and started over about once a second,
/// 18,000 translations a second, every block interpreted again until hot
/// (uprobes on `BlockCache::translate`, 10 s at 4 clients); with 64 MiB
/// it never started over and made 380 translations a second, and TPC-B's
/// tps rose 1.7-2.3 times (docs/PERFORMANCE.md, 2026-12-08). QEMU's
/// translation buffer is 1 GiB.
const ARENA_BYTES: usize = 64 << 20;

/// The executable memory of one hart's translations, filled in order,
/// never freed piece by piece: a translation lives until the whole arena
/// is reset, when the block cache forgets every translation first.
///
/// Its own rather than dynasmrt's `ExecutableBuffer`, which makes its
/// memory writable and executable again around each copy: an mprotect of
/// the chunk each way, whose TLB shootdowns cost 7 µs a translation with
/// this process alone on the host's cores and 39 µs with another of its
/// threads running (measured on this 2-core VM), paid in the guest's time
/// by every block that turns hot, and in a backup's first request after
/// it goes live (a cold cache). Here the same pages are mapped twice, from
/// one memfd: writable at one address, executable at another. No address
/// is ever both, and nothing changes a mapping after it is made.
#[derive(Default)]
pub(crate) struct Arena {
    /// Mapped at the first translation; None before, or if the host
    /// refused (nothing is translated then).
    map: Option<DualMap>,
    /// Bytes used.
    used: usize,
    /// The last translation did not fit.
    full: bool,
}

/// `ARENA_BYTES` of a memfd mapped twice.
struct DualMap {
    writable: *mut u8,
    executable: *const u8,
}

// SAFETY: the mappings belong to the arena alone, which one hart owns.
unsafe impl Send for DualMap {}

impl DualMap {
    #[cfg(target_os = "linux")]
    fn new() -> Option<DualMap> {
        // SAFETY: plain system calls on a descriptor and mappings this
        // function owns; each result is checked before use.
        unsafe {
            let fd = libc::memfd_create(c"ftvm-translations".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return None;
            }
            let map = |prot| libc::mmap(std::ptr::null_mut(), ARENA_BYTES, prot, libc::MAP_SHARED, fd, 0);
            let mapped = if libc::ftruncate(fd, ARENA_BYTES as libc::off_t) == 0 {
                let w = map(libc::PROT_READ | libc::PROT_WRITE);
                let x = map(libc::PROT_READ | libc::PROT_EXEC);
                match (w, x) {
                    (w, x) if w != libc::MAP_FAILED && x != libc::MAP_FAILED => {
                        Some(DualMap { writable: w.cast(), executable: x.cast_const().cast() })
                    }
                    (w, x) => {
                        for m in [w, x].into_iter().filter(|&m| m != libc::MAP_FAILED) {
                            libc::munmap(m, ARENA_BYTES);
                        }
                        None
                    }
                }
            } else {
                None
            };
            // The mappings keep the memory.
            libc::close(fd);
            mapped
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn new() -> Option<DualMap> {
        None
    }
}

impl Drop for DualMap {
    fn drop(&mut self) {
        // SAFETY: both were mapped by `new` with this length, and no
        // translation outlives the arena (the block cache drops them first).
        unsafe {
            libc::munmap(self.writable.cast(), ARENA_BYTES);
            libc::munmap(self.executable.cast_mut().cast(), ARENA_BYTES);
        }
    }
}

impl Arena {
    /// Copies `code` into executable memory and returns its address, or
    /// `None` when the arena is full (the caller resets it) or the host
    /// refuses memory.
    fn place(&mut self, code: &[u8]) -> Option<*const u8> {
        if self.map.is_none() {
            self.map = Some(DualMap::new()?);
        }
        let map = self.map.as_ref()?;
        let at = self.used;
        if at + code.len() > ARENA_BYTES {
            self.full = true;
            return None;
        }
        // SAFETY: `at..at + len` lies inside the writable mapping, and no
        // translation in use is there (the arena only grows until reset).
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), map.writable.add(at), code.len()) };
        // Keep entries 16-byte aligned.
        self.used = (at + code.len() + 15) & !15;
        // SAFETY: the same offset of the executable mapping, which shows
        // the same pages (x86 keeps instruction fetch coherent with stores
        // through any mapping of them).
        Some(unsafe { map.executable.add(at) })
    }

    /// Points the link whose `jmp` displacement is at `at` (an address in
    /// a translation, from `Translation::links`) at `chain`, the chain
    /// entry of the translation of the block it goes to, so that it jumps
    /// there directly instead of looking the block up in its slot. The
    /// entry checks that its slot still holds it (see `assemble`), so a
    /// link to a translation since pushed out of its slot, or made for
    /// an older state of the page, returns to Rust instead of running it.
    pub fn link(&mut self, at: usize, chain: usize) {
        let Some(map) = &self.map else { return };
        let exec = map.executable as usize;
        assert!(at >= exec && at + 4 <= exec + self.used, "a link in a translation");
        let rel = i32::try_from(chain as i64 - (at as i64 + 4)).expect("within the arena");
        // SAFETY: `at..at + 4` is in the writable mapping's used part (the
        // same offset as in the executable one), the displacement of a
        // `jmp` that no code is executing now: translations run only on
        // this hart's thread, which is here.
        unsafe { std::ptr::write_unaligned(map.writable.add(at - exec).cast::<i32>(), rel) };
    }

    /// Whether the last translation did not fit (the cache starts over).
    pub fn full(&self) -> bool {
        self.full
    }

    /// Forget every translation (their blocks must forget them first); the
    /// memory is kept and written over.
    pub fn reset(&mut self) {
        self.used = 0;
        self.full = false;
    }
}

/// A block's host code: where Rust calls it, and where other translated
/// blocks jump to it.
pub(crate) struct Translation {
    pub entry: JitFn,
    pub chain: usize,
    /// The instructions translated: the longest prefix of the block and
    /// the blocks it runs on into (see `translate`) the translator
    /// handles.
    pub n: usize,
    /// The instructions of the block and of those it runs on into: what
    /// the budget must hold for a call (or a chained jump) to run it.
    pub len: usize,
    /// Its links to blocks on its own page: the address of each link's
    /// `jmp` displacement and the RAM offset of the block it goes to (see
    /// `Arena::link`).
    pub links: Vec<(usize, usize)>,
}

/// The most blocks one translation runs through (see `translate`).
pub(crate) const MAX_PARTS: usize = 4;

/// Whether the translation of `block` would run on into the block after
/// it, whose first instruction follows its last on the same page: it
/// translates every instruction of `block`, and the block ends only
/// because it reached its length (not at a jump, a branch or the
/// general executor's instruction, nor at the page's end).
pub(crate) fn runs_on(block: &Block) -> bool {
    let insts = &block.insts[..block.n];
    let next = block.off + block.bytes;
    block.n == MAX_INSTS
        && insts.iter().all(supported)
        && !insts[block.n - 1].ends_block()
        && next >> 12 == block.off >> 12
}

/// Translate `unit` into the arena, for a host with the instructions
/// `host`: its first block, which is in `slots[slot]`, and the blocks
/// that follow it straight on (each of the others the one right after
/// the one before, which `runs_on`), as one piece of code. Long
/// straight-line code (the 62 instructions of a SHA-256 round, a loop of
/// 34) is split into blocks of `MAX_INSTS`; crossing from one to the next
/// through a chain entry cost its checks and every register written back
/// and loaded again. Within one translation the registers stay in host
/// registers, and nothing is checked: the blocks are on the first one's
/// page, whose code state its entry checked. The first block's slot
/// keeps the translation (the others are decoded as the translation was
/// made, and keep their own slots and translations), so a resume in a
/// later block names the first's slot and the part (see `Emitter::resume`).
/// `None` if the first instruction is not handled or the arena is full.
pub(crate) fn translate(
    arena: &mut Arena,
    unit: &[&Block],
    slot: usize,
    slots: &[Block],
    host: Host,
) -> Option<Translation> {
    let (code, chain, n, links) = assemble(unit, slot, slots, host)?;
    let len = unit.iter().map(|b| b.n).sum();
    let ptr = arena.place(&code)?;
    perf_map(ptr, code.len(), unit[0].off);
    // SAFETY: `ptr` is the start of the code just assembled for exactly
    // this signature (System V: rdi = guest registers, rsi = context,
    // returns rax; it saves the callee-saved registers it uses), copied
    // into memory that stays mapped and executable until `Arena::reset`,
    // before which the block cache drops every `JitFn`.
    let entry = unsafe { std::mem::transmute::<*const u8, JitFn>(ptr) };
    let links = links.into_iter().map(|(at, target)| (ptr as usize + at, target)).collect();
    Some(Translation { entry, chain: ptr as usize + chain, n, len, links })
}

/// With `FTVM_PERF_MAP=1`, names each translation in `/tmp/perf-PID.map`
/// (the format `perf report` reads for code it has no file for) by its
/// block's RAM offset, so a profile shows which guest code the time in
/// translated code went to. A line per translation, written as made (a
/// write each: buffered, a short run's lines never reached the file, the
/// process exiting without flushing); the file is never trimmed, and a
/// later line for the same addresses (the arena started over) replaces the
/// earlier. `perf report` does not read it for the memfd the code lives
/// in: the addresses `perf script -F ip` samples are matched against it.
/// With `FTVM_JIT_DUMP=DIR` as well, each translation's code goes to
/// `DIR/OFF-ADDR.bin` (its block's RAM offset, its address), to
/// disassemble with `objdump -D -b binary -m i386:x86-64`. A profiling
/// aid, not for production runs.
fn perf_map(ptr: *const u8, len: usize, off: usize) {
    use std::io::Write;
    type MapFile = std::sync::Mutex<std::io::LineWriter<std::fs::File>>;
    static MAP: std::sync::OnceLock<Option<MapFile>> = std::sync::OnceLock::new();
    let map = MAP.get_or_init(|| {
        if std::env::var("FTVM_PERF_MAP").is_ok_and(|v| v == "1") {
            let path = format!("/tmp/perf-{}.map", std::process::id());
            let file = std::fs::OpenOptions::new().create(true).append(true).open(path).ok()?;
            Some(std::sync::Mutex::new(std::io::LineWriter::new(file)))
        } else {
            None
        }
    });
    if let Some(file) = map {
        if let Ok(mut f) = file.lock() {
            // A failed write loses a name in a profile, nothing else.
            let _ = writeln!(f, "{:x} {:x} ftvm-block-{:x}", ptr as usize, len, off);
            if let Some(dir) = std::env::var_os("FTVM_JIT_DUMP") {
                // SAFETY: `ptr` is the start of the `len` bytes of code
                // just placed in the arena, mapped and readable.
                let code = unsafe { std::slice::from_raw_parts(ptr, len) };
                let file = std::path::Path::new(&dir).join(format!("{:x}-{:x}.bin", off, ptr as usize));
                let _ = std::fs::write(file, code);
            }
        }
    }
}

/// The host code for `block`'s longest prefix of handled operations, the
/// offset in it of the entry for other blocks, and the length of the
/// prefix. `slots` is the block cache's table, whose address the code
/// keeps (the table does not move while the cache, and with it the arena,
/// lives).
/// The code and, as offsets in it, its chain entry and its links (see
/// `Translation`); the instructions translated.
type Assembled = (Vec<u8>, usize, usize, Vec<(usize, usize)>);

fn assemble(unit: &[&Block], slot: usize, slots: &[Block], host: Host) -> Option<Assembled> {
    let block = unit[0];
    // The unit's instructions as one block's, their offsets from its
    // start, and where each part begins among them.
    let mut insts = Vec::with_capacity(unit.len() * MAX_INSTS);
    let mut parts = Vec::with_capacity(unit.len());
    for b in unit {
        debug_assert_eq!(b.off, block.off + insts.last().map_or(0, |d: &Inst| d.next as usize));
        parts.push(insts.len());
        let at = (b.off - block.off) as u16;
        insts.extend(b.insts[..b.n].iter().map(|d| Inst { at: d.at + at, next: d.next + at, ..*d }));
    }
    let len: usize = insts.len();
    let m = insts.iter().position(|d| !supported(d)).unwrap_or(insts.len());
    if m == 0 {
        return None;
    }
    let insts = &insts[..m];

    // Which x registers each instruction reads and writes (x0 left out):
    // host registers go to them as the block runs (see `Emitter::allocate`).
    let mut accesses: Vec<Access> = insts
        .iter()
        .map(|d| {
            let (b1, b2) = read_masks(d);
            let read = b1 | b2;
            let written = (u32::from(writes(d)) << d.rd) & !1;
            Access { read, written, exits: may_exit(d) }
        })
        .collect();
    let loc = Loc::all_in_memory();

    let mut ops = VecAssembler::<X64Relocation>::new(0);
    let epilogue = ops.new_dynamic_label();
    let mut e = Emitter {
        ops,
        loc,
        dirty: 0,
        sext: 1,
        narrow: 0,
        written: Written::default(),
        stubs: Vec::new(),
        epilogue,
        lookup: None,
        slot,
        slots: slots.as_ptr() as usize,
        off: block.off,
        n: m,
        parts,
        host,
        links: Vec::new(),
        head: None,
        top: loc,
        top_dirty: 0,
        rounds: None,
        back_sext: None,
        groups: groups(insts),
    };
    let body = e.ops.new_dynamic_label();
    let bail = e.ops.new_dynamic_label();
    // From Rust, which has checked the block and the budget.
    // The frame every block chained from here shares: the callee-saved
    // registers, then rdi and rsi, which calls into Rust may clobber and
    // which stay the same for the whole call (see `call_and_restore`).
    dynasm!(e.ops
        ; .arch x64
        ; push rbx
        ; push rbp
        ; push r12
        ; push r13
        ; push r14
        ; push r15
        ; push rdi
        ; push rsi
        ; jmp =>body
    );
    // From another block: the checks of the executor's loop. The whole
    // block within the budget (else the executor runs it interpreted, as
    // far as the budget allows)...
    let chain = e.ops.offset().0;
    let chain_label = e.ops.new_dynamic_label();
    let page = i32::try_from(8 * (block.off >> 12)).ok()?;
    let own_slot = e.slots + slot * std::mem::size_of::<Block>();
    dynasm!(e.ops
        ; .arch x64
        ; =>chain_label
        ; cmp QWORD [rsi + CTX_LEFT], len as i32
        ; jb =>bail
        // ... its slot still holding this translation (a direct link
        // comes here whatever the slot holds now: see `Arena::link`)...
        ; mov rcx, QWORD own_slot as i64
        ; lea rax, [=>chain_label]
        ; cmp QWORD [rcx + BLOCK_CHAIN], rax
        ; jne =>bail
        // ... and its page's code state the one it was decoded with
        // (read from its slot: a translation found again for a block
        // decoded again serves a later state of the page).
        ; mov rdx, QWORD [rsi + CTX_CODE]
        ; mov rax, QWORD [rdx + page]
        ; cmp rax, QWORD [rcx + BLOCK_CODE]
        ; jne =>bail
    );
    // FTVM_VERIFY_CODE: RAM holding the bits it was decoded from too.
    let stale = crate::block::verify_code().then(|| e.ops.new_dynamic_label());
    if let Some(stale) = stale {
        dynasm!(e.ops
            ; .arch x64
            ; mov rdx, QWORD [rsi + CTX_RAM]
            ; mov rcx, QWORD block.base as i64
            ; add rdx, rcx
        );
        for b in unit {
            let at = (b.base - block.base) as i32;
            for (k, &w) in b.words[..b.nwords].iter().enumerate() {
                dynasm!(e.ops
                    ; .arch x64
                    ; mov rax, QWORD w as i64
                    ; cmp QWORD [rdx + at + 8 * k as i32], rax
                    ; jne =>stale
                );
            }
        }
    }
    dynasm!(e.ops ; .arch x64 ; =>body);
    if stale.is_none() {
        // A unit that goes back to its own start keeps guest registers in
        // host registers from one round to the next (see `Loop`).
        if let Some(back) = insts.iter().position(back_to_start) {
            let (top, dirty, ahead) = round(&accesses[..=back]);
            e.top = top;
            e.top_dirty = dirty;
            accesses = ahead;
        }
        for (r, l) in e.top.into_iter().enumerate() {
            if let Loc::Host(h) = l {
                dynasm!(e.ops ; .arch x64 ; mov Rq(h), QWORD [rdi + 8 * r as i32]);
            }
        }
        e.loc = e.top;
        e.dirty = e.top_dirty;
        let head = e.ops.new_dynamic_label();
        dynasm!(e.ops ; .arch x64 ; =>head);
        e.head = Some(head);
    }
    // A loop whose rounds sign-extend words (`sext.w`) is emitted twice:
    // the first round as it enters, knowing nothing of what the registers
    // hold, then the rounds after, each knowing what the first round's
    // end knows of which registers hold sign-extended words (the same
    // instructions from no more knowledge can only know as much again:
    // every later round's end knows it too), so that their `sext.w` are
    // copies.
    let looped = e.head.is_some() && insts.iter().any(back_to_start);
    let peeled = looped && insts.iter().any(|d| d.op == Op::Addiw && d.imm == 0);
    let later = e.ops.new_dynamic_label();
    if peeled {
        e.rounds = Some((later, 0));
    }
    let mut ended = e.body(insts, &accesses);
    if peeled {
        let known = e.back_sext.take().expect("the first round goes back");
        dynasm!(e.ops ; .arch x64 ; =>later);
        e.loc = e.top;
        e.dirty = e.top_dirty;
        e.sext = known;
        e.narrow = 0;
        e.rounds = Some((later, known));
        ended = e.body(insts, &accesses);
    }
    if !ended {
        e.writeback(e.dirty);
        if m < len {
            // The interpreter executes the rest.
            let code = e.resume(m);
            dynasm!(e.ops ; .arch x64 ; mov rax, QWORD code as i64 ; jmp =>epilogue);
        } else {
            // The block ran out: on to the next instruction.
            e.leave(insts[m - 1].next as i64);
        }
    }
    if let Some(stale) = stale {
        dynasm!(e.ops
            ; .arch x64
            ; =>stale
            ; mov rax, QWORD STALE as i64 | (slot as i64) << 16
            ; jmp =>epilogue
        );
    }
    dynasm!(e.ops
        ; .arch x64
        ; =>bail
        ; xor eax, eax
        ; =>epilogue
        ; add rsp, 16
        ; pop r15
        ; pop r14
        ; pop r13
        ; pop r12
        ; pop rbp
        ; pop rbx
        ; ret
    );
    e.emit_lookup();
    // Side exits, out of the straight line.
    for s in std::mem::take(&mut e.stubs) {
        dynasm!(e.ops ; .arch x64 ; =>s.label);
        e.loc = s.loc;
        e.narrow = s.narrow;
        e.writeback(s.dirty);
        let code = e.resume(s.resume);
        dynasm!(e.ops ; .arch x64 ; mov rax, QWORD code as i64 ; jmp =>epilogue);
    }
    let links = std::mem::take(&mut e.links);
    Some((e.ops.finalize().ok()?, chain, m, links))
}

/// Which of rs1 and rs2 an instruction reads.
fn reads(d: &Inst) -> (bool, bool) {
    use Op::*;
    match d.op {
        // An SC or AMO reads an address and a value.
        Other if general(d.insn) == Some(General::ScAmo) => (true, true),
        // A CSR access reads rs1 in its register forms (funct3 below 4);
        // the immediate forms' rs1 field is the immediate.
        Other if general(d.insn) == Some(General::FpCsr) => ((d.insn >> 12) & 7 < 4, false),
        // fmv.fmt.x and the conversions from an integer read an x register.
        Fp => (fp_x(d.insn) == Some(FpX::Reads), false),
        Other | Illegal | Nop | Lui | Auipc | Jal => (false, false),
        Jalr | Lb | Lh | Lw | Ld | Lbu | Lhu | Lwu | Fload | Fstore | CboZero => (true, false),
        Addi | Slti | Sltiu | Xori | Ori | Andi | Slli | Srli | Srai | Addiw | Slliw | Srliw | Sraiw => (true, false),
        // The rs2 field of these is part of the operation or the shift.
        SlliUw | Clz | Ctz | Cpop | Clzw | Ctzw | Cpopw | SextB | SextH | ZextH | Rori | Roriw | OrcB | Rev8
        | Bclri | Bexti | Binvi | Bseti => (true, false),
        _ => (true, true),
    }
}

/// The x registers `d` reads as rs1 and as rs2, each as a mask (x0 left
/// out: an empty mask).
fn read_masks(d: &Inst) -> (u32, u32) {
    let (r1, r2) = reads(d);
    (u32::from(r1) << d.rs1 & !1, u32::from(r2) << d.rs2 & !1)
}

/// Whether an instruction writes rd.
fn writes(d: &Inst) -> bool {
    use Op::*;
    match d.op {
        Other => matches!(general(d.insn), Some(General::ScAmo | General::FpCsr)),
        Fp => fp_x(d.insn) == Some(FpX::Writes),
        _ => !matches!(
            d.op,
            Illegal | Nop | Beq | Bne | Blt | Bge | Bltu | Bgeu | Sb | Sh | Sw | Sd | Fload | Fstore | CboZero
        ),
    }
}

/// The x register a floating-point computation reads (as rs1) or writes
/// (as rd), if any.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FpX {
    /// fmv.fmt.x, fcvt.fmt.{w,wu,l,lu}.
    Reads,
    /// Comparisons, fcvt.{w,wu,l,lu}.fmt, fmv.x.fmt, fclass.
    Writes,
}

fn fp_x(insn: u32) -> Option<FpX> {
    if insn & 0x7f != 0x53 {
        return None;
    }
    match insn >> 27 {
        0x1a | 0x1e => Some(FpX::Reads),
        0x14 | 0x18 | 0x1c => Some(FpX::Writes),
        _ => None,
    }
}

/// A side exit: where it starts, which registers it writes back, what it
/// does.
struct Stub {
    label: DynamicLabel,
    /// Where the guest registers were, and which were dirty, at the exit.
    loc: [Loc; 32],
    dirty: u32,
    /// Which of those held hold a word not yet sign-extended.
    narrow: u32,
    /// The instruction the interpreter goes on at.
    resume: usize,
}

/// What an instruction's emitter knows of the value it wrote to rd.
#[derive(Clone, Copy, Default)]
struct Written {
    /// It is a 32-bit value sign-extended (`Emitter::sext`).
    sext: bool,
    /// Its extension was left undone (`Emitter::narrow`).
    narrow: bool,
}

struct Emitter {
    ops: VecAssembler<X64Relocation>,
    loc: [Loc; 32],
    /// Guest registers held in host registers and written since entry.
    dirty: u32,
    /// Guest registers known to hold a 32-bit value sign-extended to 64
    /// bits (the results of the word operations, `lw`, `lui`, ...), x0
    /// among them: a `sext.w` of one is a copy, and two of them compare,
    /// and combine bit by bit, as their low words do.
    sext: u32,
    /// Of those, the ones held in a host register whose upper half was
    /// left as it was: the low word is the value's, the upper half
    /// undefined. A word operation's sign extension is an ALU operation
    /// on the chain of every value computed from it (`addw` after `addw`
    /// in a hash round); it is done only once something reads all 64
    /// bits (`Emitter::widen`): a 64-bit operation, an address, the
    /// register file (a write back, a side exit, a loop's way back).
    narrow: u32,
    /// Set by the emitter of the instruction being emitted, for rd.
    written: Written,
    stubs: Vec<Stub>,
    epilogue: DynamicLabel,
    /// The shared tail of the exits to a pc known only at run time, once
    /// one needs it (see `Emitter::lookup`).
    lookup: Option<DynamicLabel>,
    /// The first block's slot, the address of the table of slots, the
    /// first block's RAM offset and the number of instructions translated.
    slot: usize,
    slots: usize,
    off: usize,
    n: usize,
    /// Where each block of the unit starts among its instructions.
    parts: Vec<usize>,
    host: Host,
    /// The links to blocks on this page: the offset of each `jmp`'s
    /// displacement in the code, and the block's RAM offset.
    links: Vec<(usize, usize)>,
    /// Where the body starts, the guest registers of `top` in their host
    /// registers: a jump back to the unit's own start (a loop) goes there,
    /// not through its chain entry (see `Emitter::loop_back`). None under
    /// `FTVM_VERIFY_CODE`, whose check is in the chain entry.
    head: Option<DynamicLabel>,
    /// Where the guest registers are at `head`, and which of those in
    /// host registers may be dirty there (see `round`).
    top: [Loc; 32],
    top_dirty: u32,
    /// For a loop emitted twice (see `assemble`): the start of its later
    /// rounds, and the registers it takes to hold sign-extended words; a
    /// way back that knows as much goes there, others to `head`.
    rounds: Option<(DynamicLabel, u32)>,
    /// What the ways back emitted knew of sign-extended words (`sext`),
    /// all together.
    back_sext: Option<u32>,
    /// Each instruction's place in a group of loads or stores.
    groups: Vec<Option<Group>>,
}

/// An ALU operation's second operand: a host register, or a guest
/// register's place in the register file (x86 takes it straight from
/// memory: one instruction, not a load and the operation).
#[derive(Clone, Copy)]
enum Src {
    Reg(u8),
    Mem(i32),
}

impl Src {
    fn reg(self) -> Option<u8> {
        match self {
            Src::Reg(r) => Some(r),
            Src::Mem(_) => None,
        }
    }
}

/// An ALU operation `dst op= src`, 64 or 32 bits wide (a 32-bit one
/// clears the upper half).
type Alu = fn(&mut VecAssembler<X64Relocation>, u8, Src);

/// The `Alu` of the x86 instruction `op`, 64 bits wide; with `w`, 32 bits.
macro_rules! alu {
    ($op:tt) => {
        |o: &mut VecAssembler<X64Relocation>, d: u8, s: Src| match s {
            Src::Reg(s) => dynasm!(o ; .arch x64 ; $op Rq(d), Rq(s)),
            Src::Mem(m) => dynasm!(o ; .arch x64 ; $op Rq(d), QWORD [rdi + m]),
        }
    };
    ($op:tt w) => {
        |o: &mut VecAssembler<X64Relocation>, d: u8, s: Src| match s {
            Src::Reg(s) => dynasm!(o ; .arch x64 ; $op Rd(d), Rd(s)),
            Src::Mem(m) => dynasm!(o ; .arch x64 ; $op Rd(d), DWORD [rdi + m]),
        }
    };
}
/// A 64-bit ALU operation `dst op= imm`.
type AluImm = fn(&mut VecAssembler<X64Relocation>, u8, i32);

impl Emitter {
    /// Host register `scratch` := guest register `r`.
    fn get(&mut self, scratch: u8, r: u8) {
        match self.loc[r as usize] {
            Loc::Zero => dynasm!(self.ops ; .arch x64 ; xor Rd(scratch), Rd(scratch)),
            Loc::Host(h) => {
                if h != scratch {
                    dynasm!(self.ops ; .arch x64 ; mov Rq(scratch), Rq(h))
                }
            }
            Loc::Mem(o) => dynasm!(self.ops ; .arch x64 ; mov Rq(scratch), QWORD [rdi + o]),
        }
    }

    /// A host register holding guest register `r`: its own, or `scratch`
    /// loaded with it.
    fn src(&mut self, r: u8, scratch: u8) -> u8 {
        match self.loc[r as usize] {
            Loc::Host(h) => h,
            _ => {
                self.get(scratch, r);
                scratch
            }
        }
    }

    /// Guest register `r` := host register `v`. Writes to x0 are dropped.
    fn put(&mut self, r: u8, v: u8) {
        match self.loc[r as usize] {
            Loc::Zero => {}
            Loc::Host(h) => {
                if h != v {
                    dynasm!(self.ops ; .arch x64 ; mov Rq(h), Rq(v));
                }
                self.dirty |= 1 << r;
            }
            Loc::Mem(o) => dynasm!(self.ops ; .arch x64 ; mov QWORD [rdi + o], Rq(v)),
        }
    }

    /// Guest register `r` as a second operand: its host register, its
    /// place in the register file, or (x0) `scratch` cleared.
    fn operand(&mut self, r: u8, scratch: u8) -> Src {
        match self.loc[r as usize] {
            Loc::Host(h) => Src::Reg(h),
            Loc::Mem(o) => Src::Mem(o),
            Loc::Zero => {
                dynasm!(self.ops ; .arch x64 ; xor Rd(scratch), Rd(scratch));
                Src::Reg(scratch)
            }
        }
    }

    /// Where to compute a result for rd without a copy: rd's own host
    /// register unless the second operand lives there, else rax.
    fn dest(&self, rd: u8, other: Option<u8>) -> u8 {
        match self.loc[rd as usize] {
            Loc::Host(h) if Some(h) != other => h,
            _ => RAX,
        }
    }

    /// Before instruction `k`: the host registers `allocation` gives out,
    /// a guest register giving one up written back if dirty, one taken
    /// loaded if `k` reads it.
    fn allocate(&mut self, accesses: &[Access], k: usize) {
        let (ops, dirty, narrow) = (&mut self.ops, &mut self.dirty, &mut self.narrow);
        allocation(&mut self.loc, accesses, k, *dirty, |m| match m {
            Move::GiveUp { guest, host, dead } => {
                if *dirty & (1 << guest) != 0 && !dead {
                    if *narrow & (1 << guest) != 0 {
                        dynasm!(ops ; .arch x64 ; movsxd Rq(host), Rd(host));
                    }
                    dynasm!(ops ; .arch x64 ; mov QWORD [rdi + 8 * guest as i32], Rq(host));
                }
                *dirty &= !(1 << guest);
                *narrow &= !(1 << guest);
            }
            Move::Take { guest, host } => {
                if accesses[k].read & (1 << guest) != 0 {
                    dynasm!(ops ; .arch x64 ; mov Rq(host), QWORD [rdi + 8 * guest as i32]);
                }
            }
        });
    }

    /// Stores the registers of `dirty` to the register file, each
    /// sign-extended first if narrow. For the exits: it leaves `narrow`
    /// as it was, so that code emitted after it for another path (a
    /// loop's way back after a branch's fall-through exit) still knows
    /// what that path holds.
    fn writeback(&mut self, dirty: u32) {
        for r in 1..32 {
            if dirty & (1 << r) != 0 {
                if let Loc::Host(h) = self.loc[r] {
                    if self.narrow & (1 << r) != 0 {
                        dynasm!(self.ops ; .arch x64 ; movsxd Rq(h), Rd(h));
                    }
                    dynasm!(self.ops ; .arch x64 ; mov QWORD [rdi + 8 * r as i32], Rq(h));
                }
            }
        }
    }

    /// Sign-extends the narrow registers of `mask` in place.
    fn widen(&mut self, mask: u32) {
        for r in 1..32 {
            if self.narrow & mask & (1 << r) != 0 {
                if let Loc::Host(h) = self.loc[r] {
                    dynasm!(self.ops ; .arch x64 ; movsxd Rq(h), Rd(h));
                }
            }
        }
        self.narrow &= !mask;
    }

    /// Before `d`: sign-extends the narrow registers it reads unless it
    /// reads only their low words, or (two values both sign-extended)
    /// compares or combines them bit by bit, which their low words decide.
    fn widen_for(&mut self, d: &Inst) {
        use Op::*;
        let (b1, b2) = read_masks(d);
        let both_sext = self.reads_sext(d);
        let low_words = match d.op {
            Addw | Subw | Mulw | Addiw | Slliw | Srliw | Sraiw | Sllw | Srlw | Sraw | Roriw => b1 | b2,
            // The value stored; the address is all 64 bits.
            Sb | Sh | Sw => b2,
            // Copies: the copy is as narrow as the original.
            Addi if d.imm == 0 => b1,
            Add if d.rs1 == 0 || d.rs2 == 0 => b1 | b2,
            And | Or | Xor | Andi | Ori | Xori | Beq | Bne | Blt | Bge | Bltu | Bgeu if both_sext => b1 | b2,
            _ => 0,
        };
        self.widen((b1 | b2) & !low_words);
    }

    /// Whether every register `d` reads holds a sign-extended word.
    fn reads_sext(&self, d: &Inst) -> bool {
        let (r1, r2) = reads(d);
        (!r1 || self.sext & (1 << d.rs1) != 0) && (!r2 || self.sext & (1 << d.rs2) != 0)
    }

    /// After `d`: what rd holds, as its emitter said (`written`; nothing
    /// known unless it said so).
    fn wrote(&mut self, d: &Inst) {
        let w = std::mem::take(&mut self.written);
        if writes(d) && d.rd != 0 {
            let bit = 1 << d.rd;
            self.sext = (self.sext & !bit) | if w.sext { bit } else { 0 };
            let held = matches!(self.loc[d.rd as usize], Loc::Host(_));
            self.narrow = (self.narrow & !bit) | if w.narrow && held { bit } else { 0 };
        }
    }

    /// Guest register `rd` := the word in `v`'s low half, sign-extended:
    /// left narrow in rd's host register, extended on its way to the
    /// register file.
    fn put_word(&mut self, rd: u8, v: u8) {
        let held = matches!(self.loc[rd as usize], Loc::Host(_));
        if !held {
            dynasm!(self.ops ; .arch x64 ; movsxd Rq(v), Rd(v));
        }
        self.put(rd, v);
        self.written = Written { sext: true, narrow: held };
    }

    /// A side exit to the interpreter at instruction `k`, with the
    /// registers dirty now.
    fn stub(&mut self, k: usize) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        self.stubs.push(Stub { label, loc: self.loc, dirty: self.dirty, narrow: self.narrow, resume: k });
        label
    }

    /// What to return for the interpreter to go on at instruction `k` of
    /// the unit: its part and the instruction in that part.
    fn resume(&self, k: usize) -> u64 {
        let part = self.parts.iter().rposition(|&first| first <= k).expect("part 0 starts at 0");
        RESUME | ((k - self.parts[part]) as u64) << 8 | (self.slot as u64) << 16 | (part as u64) << RESUME_PART
    }

    /// The block retired whole (its registers are written back) and goes
    /// on at its pc plus `delta`: straight to that block's translation if
    /// it is on the same page and the slot holds one, else back to Rust.
    fn leave(&mut self, delta: i64) {
        let delta32 = i32::try_from(delta).expect("a jump within 1 MiB");
        dynasm!(self.ops
            ; .arch x64
            ; sub QWORD [rsi + CTX_LEFT], self.n as i32
            ; add QWORD [rsi + CTX_PC], delta32
        );
        let target = self.off as i64 + delta;
        if target >= 0 && (target as usize) >> 12 == self.off >> 12 {
            let target = target as usize;
            let slot = self.slots + slot_of(target) * std::mem::size_of::<Block>();
            let out = self.ops.new_dynamic_label();
            // A `jmp` to the next instruction, until the block cache
            // points it at the target's translation (`Arena::link`); the
            // lookup in the target's slot below serves until then.
            self.ops.extend([0xe9, 0, 0, 0, 0]);
            self.links.push((self.ops.offset().0 - 4, target));
            dynasm!(self.ops
                ; .arch x64
                ; mov rax, QWORD slot as i64
                ; mov rcx, QWORD target as i64
                ; cmp QWORD [rax + BLOCK_OFF], rcx
                ; jne =>out
                ; mov rax, QWORD [rax + BLOCK_CHAIN]
                ; test rax, rax
                ; jz =>out
                ; jmp rax
                ; =>out
            );
            dynasm!(self.ops ; .arch x64 ; xor eax, eax ; jmp =>self.epilogue);
        } else {
            // Another page, whose RAM only the fetch TLB knows.
            let lookup = self.lookup();
            dynasm!(self.ops ; .arch x64 ; mov r11, QWORD [rsi + CTX_PC] ; jmp =>lookup);
        }
    }

    /// Whether a jump or branch here to the unit's own start can go
    /// straight to `head`.
    fn loops(&self, d: &crate::block::Inst) -> bool {
        self.head.is_some() && back_to_start(d)
    }

    /// The unit retired whole and goes back to its own start, the pc
    /// unchanged: of the chain entry's checks only the budget's can fail
    /// (nothing in translated code changes a slot or a page's code
    /// state). The guest registers go where `head` takes them to be
    /// (`top`): those dirty and elsewhere written back first, then those
    /// in another host register moved, then those in the register file
    /// loaded (`top` gives each host register one guest register, so a
    /// load never lands on one in place).
    fn loop_back(&mut self) {
        let sext = self.sext;
        self.back_sext = Some(self.back_sext.map_or(sext, |s| s & sext));
        // A later round knows at its end what it knew at its start (the
        // same instructions from as much knowledge): the fall back to
        // `head` is for what that reasoning may have missed.
        debug_assert!(self.rounds.is_none_or(|(_, known)| sext & known == known));
        let head = match self.rounds {
            Some((later, known)) if sext & known == known => later,
            _ => self.head.expect("a loop has a head"),
        };
        // No head takes a register to hold a word unextended.
        self.widen(u32::MAX);
        let top = self.top;
        // (Dirty in place but not where `head` takes it may be: `round`
        // says that cannot be, but what is emitted does not rely on it.)
        let stays = self.top_dirty;
        for (r, (now, then)) in self.loc.into_iter().zip(top).enumerate() {
            if let Loc::Host(h) = now {
                if (then != now || stays & (1 << r) == 0) && self.dirty & (1 << r) != 0 {
                    dynasm!(self.ops ; .arch x64 ; mov QWORD [rdi + 8 * r as i32], Rq(h));
                }
            }
        }
        // Those in another host register move there, register to
        // register: a store and a load of the same place would put the
        // store's latency on the loop's chain of dependencies. A move
        // goes once no move still to come reads its destination; moves
        // that all wait on each other (a cycle) go through rax.
        let mut moves: Vec<(u8, u8)> = Vec::new();
        let mut loads: Vec<(u8, usize)> = Vec::new();
        for (r, (now, then)) in self.loc.into_iter().zip(top).enumerate() {
            if let Loc::Host(to) = then {
                match now {
                    Loc::Host(from) if from != to => moves.push((from, to)),
                    Loc::Host(_) => {}
                    _ => loads.push((to, r)),
                }
            }
        }
        while !moves.is_empty() {
            match moves.iter().position(|&(_, to)| !moves.iter().any(|&(from, _)| from == to)) {
                Some(i) => {
                    let (from, to) = moves.remove(i);
                    dynasm!(self.ops ; .arch x64 ; mov Rq(to), Rq(from));
                }
                None => {
                    let (from, _) = moves[0];
                    dynasm!(self.ops ; .arch x64 ; mov rax, Rq(from));
                    for m in moves.iter_mut().filter(|m| m.0 == from) {
                        m.0 = RAX;
                    }
                }
            }
        }
        // Then the loads: a host register they fill holds nothing still
        // to move.
        for (to, r) in loads {
            dynasm!(self.ops ; .arch x64 ; mov Rq(to), QWORD [rdi + 8 * r as i32]);
        }
        self.loc = top;
        self.dirty = stays;
        self.sext = 1;
        dynasm!(self.ops
            ; .arch x64
            // The count in rax, not compared in memory: a load of what
            // the `sub` just stored waits for the store (a SHA-256 round
            // took 7 % longer).
            ; mov rax, QWORD [rsi + CTX_LEFT]
            ; sub rax, self.n as i32
            ; mov QWORD [rsi + CTX_LEFT], rax
            ; cmp rax, self.n as i32
            ; jb >out
            ; jmp =>head
            ; out:
        );
        self.writeback(self.dirty);
        dynasm!(self.ops ; .arch x64 ; xor eax, eax ; jmp =>self.epilogue);
    }

    /// The label of the exit to the pc in r11 (already in `JitCtx::pc`,
    /// with the block's instructions counted and its registers written
    /// back): on to the translation of the block there if there is one,
    /// else back to Rust.
    fn lookup(&mut self) -> DynamicLabel {
        match self.lookup {
            Some(l) => l,
            None => {
                let l = self.ops.new_dynamic_label();
                self.lookup = Some(l);
                l
            }
        }
    }

    /// The code of `lookup`, once per block that uses it, out of the
    /// straight line. It does what the executor's loop does with the new
    /// pc: the RAM offset from the fetch cache or, if that holds another
    /// page, from the fetch TLB, refilling the cache (`Hart::fetch_offset`;
    /// a miss returns to Rust, which walks the page tables); the block at
    /// that offset from its slot of the block cache (`BlockCache::get`;
    /// another block there or none translated returns to Rust). The
    /// target's chain entry then checks the budget and the code state, as
    /// for the jumps within a page.
    fn emit_lookup(&mut self) {
        let Some(l) = self.lookup else { return };
        dynasm!(self.ops
            ; .arch x64
            ; =>l
            // rdx := the page's tag.
            ; mov rdx, r11
            ; and rdx, -4096
            ; or rdx, QWORD [rsi + CTX_FETCH_PRV]
            ; cmp rdx, QWORD [rsi + CTX_FETCH_TAG]
            ; je >cached
            // The fetch TLB's entry for the page.
            ; mov rcx, r11
            ; shr rcx, 12
            ; and ecx, (TLB_SIZE - 1) as i32
            ; shl ecx, 4
            ; add rcx, QWORD [rsi + CTX_FETCH_TLB]
            ; cmp rdx, QWORD [rcx + TLB_TAG]
            ; jne >out
            ; mov QWORD [rsi + CTX_FETCH_TAG], rdx
            ; mov rcx, QWORD [rcx + TLB_ADDEND]
            ; mov QWORD [rsi + CTX_FETCH_ADDEND], rcx
            ; cached:
            // rdx := the RAM offset of the pc.
            ; mov rdx, QWORD [rsi + CTX_FETCH_ADDEND]
            ; add rdx, r11
            // rax := its slot (`slot_of`).
            ; mov rax, rdx
            ; shr rax, 1
            ; mov rcx, rdx
            ; shr rcx, 14
            ; xor rax, rcx
            ; and eax, (SLOTS - 1) as i32
            ; imul rax, rax, BLOCK_SIZE
            ; mov rcx, QWORD self.slots as i64
            ; add rax, rcx
            ; cmp QWORD [rax + BLOCK_OFF], rdx
            ; jne >out
            ; mov rax, QWORD [rax + BLOCK_CHAIN]
            ; test rax, rax
            ; jz >out
            ; jmp rax
            ; out:
            ; xor eax, eax
            ; jmp =>self.epilogue
        );
    }

    /// rd := rs1 op rs2.
    fn alu(&mut self, rd: u8, rs1: u8, rs2: u8, f: Alu) {
        let b = self.operand(rs2, RCX);
        let dst = self.dest(rd, b.reg());
        self.get(dst, rs1);
        f(&mut self.ops, dst, b);
        self.put(rd, dst);
    }

    /// rd := rs1 op rs2 for an `op` whose operands may swap: computed in
    /// rd's host register when it holds rs2 (`or t2, s10, t2`), not in rax
    /// and copied.
    fn alu_commutative(&mut self, rd: u8, rs1: u8, rs2: u8, f: Alu) {
        let rd_is_rs2_in_host = matches!(self.loc[rd as usize], Loc::Host(_)) && rs2 == rd;
        if rd_is_rs2_in_host && rd != rs1 {
            self.alu(rd, rs2, rs1, f);
        } else {
            self.alu(rd, rs1, rs2, f);
        }
    }

    /// rd := rs (`mv`): one move at most.
    fn copy(&mut self, rd: u8, rs: u8) {
        let narrow = self.narrow & (1 << rs) != 0;
        if narrow && !matches!(self.loc[rd as usize], Loc::Host(_)) {
            self.widen(1 << rs);
        }
        self.written = Written { sext: self.sext & (1 << rs) != 0, narrow: self.narrow & (1 << rs) != 0 };
        if rd == rs {
            return;
        }
        let v = self.src(rs, RAX);
        self.put(rd, v);
    }

    /// rd := imm sign-extended (`li` of 12 bits, `lui`).
    fn constant(&mut self, rd: u8, imm: i32) {
        let dst = self.dest(rd, None);
        dynasm!(self.ops ; .arch x64 ; mov Rq(dst), DWORD imm);
        self.put(rd, dst);
        self.written.sext = true;
    }

    /// rd := sext32(rs) (`sext.w`): one sign extension, from rs's host
    /// register or the register file.
    fn sext32(&mut self, rd: u8, rs: u8) {
        if self.sext & (1 << rs) != 0 {
            return self.copy(rd, rs);
        }
        let dst = self.dest(rd, None);
        self.sext_into(dst, rs);
        self.put(rd, dst);
        self.written.sext = true;
    }

    /// Host register `dst` := sext32(guest register `rs`).
    fn sext_into(&mut self, dst: u8, rs: u8) {
        match self.loc[rs as usize] {
            Loc::Zero => dynasm!(self.ops ; .arch x64 ; xor Rd(dst), Rd(dst)),
            Loc::Host(h) => dynasm!(self.ops ; .arch x64 ; movsxd Rq(dst), Rd(h)),
            Loc::Mem(o) => dynasm!(self.ops ; .arch x64 ; movsxd Rq(dst), DWORD [rdi + o]),
        }
    }

    /// rd := rd + imm for rd in the register file: one addition there.
    fn add_in_place(&mut self, rd: u8, imm: i32) -> bool {
        match self.loc[rd as usize] {
            Loc::Mem(o) => {
                dynasm!(self.ops ; .arch x64 ; add QWORD [rdi + o], imm);
                true
            }
            _ => false,
        }
    }

    /// rd := rs1 op imm.
    fn alu_imm(&mut self, rd: u8, rs1: u8, imm: i32, f: AluImm) {
        let dst = self.dest(rd, None);
        self.get(dst, rs1);
        f(&mut self.ops, dst, imm);
        self.put(rd, dst);
    }

    /// rd := sext32(rs1 op rs2) for a 32-bit `f`, computed in rd's host
    /// register where it has one (one instruction fewer when rs1 is
    /// already there).
    fn alu_w(&mut self, rd: u8, rs1: u8, rs2: u8, f: Alu) {
        let b = self.operand(rs2, RCX);
        let dst = self.dest(rd, b.reg());
        self.get(dst, rs1);
        f(&mut self.ops, dst, b);
        self.put_word(rd, dst);
    }

    /// rd := sext32(rs1 + rs2) (`addw`): with both in host registers, a
    /// `lea` that reads them before writing rd's, and the extension.
    fn add_w(&mut self, rd: u8, rs1: u8, rs2: u8) {
        match (self.loc[rs1 as usize], self.loc[rs2 as usize]) {
            (Loc::Host(a), Loc::Host(b)) => {
                let dst = self.dest(rd, None);
                self.lea_indexed(false, dst, a, b, 0);
                self.put_word(rd, dst);
            }
            _ => self.alu_w(rd, rs1, rs2, alu!(add w)),
        }
    }

    /// dst := base + (index << scale), in 64 bits or (`wide` false) the
    /// low 32, as one `lea` of two parts. Why not dynasm's `lea`: given a
    /// base register it only learns at run time, it encodes a zero
    /// displacement (rbp and r13 as a base need one), and a `lea` of three
    /// parts takes two cycles where one of two takes one (AMD's Zen,
    /// Intel's before Ice Lake): a cycle more on each `addw` of a chain
    /// such as a hash round's. rbp or r13 as the base of a plain sum is
    /// swapped with the index; only when that cannot be done (both are,
    /// or the index is scaled) is the displacement kept.
    fn lea_indexed(&mut self, wide: bool, dst: u8, base: u8, index: u8, scale: u8) {
        let (base, index) = if base & 7 == 5 && scale == 0 { (index, base) } else { (base, index) };
        if base & 7 == 5 || index == 4 {
            match (wide, scale) {
                // Only addw's sum is a 32-bit one.
                (false, _) => dynasm!(self.ops ; .arch x64 ; lea Rd(dst), [Rq(base) + Rq(index)]),
                (true, 0) => dynasm!(self.ops ; .arch x64 ; lea Rq(dst), [Rq(base) + Rq(index)]),
                (true, 1) => dynasm!(self.ops ; .arch x64 ; lea Rq(dst), [Rq(base) + Rq(index) * 2]),
                (true, 2) => dynasm!(self.ops ; .arch x64 ; lea Rq(dst), [Rq(base) + Rq(index) * 4]),
                (true, _) => dynasm!(self.ops ; .arch x64 ; lea Rq(dst), [Rq(base) + Rq(index) * 8]),
            }
            return;
        }
        // REX.W, .R (dst), .X (index), .B (base); 8D /r; ModRM mod 00 with
        // a SIB byte (rm 100); SIB scale, index, base.
        let rex = 0x40 | (wide as u8) << 3 | (dst >> 3) << 2 | (index >> 3) << 1 | base >> 3;
        if rex != 0x40 {
            self.ops.push(rex);
        }
        self.ops.extend([0x8d, (dst & 7) << 3 | 4, scale << 6 | (index & 7) << 3 | base & 7]);
    }

    /// rd := sext32(rs1 op imm) for a 32-bit `f`, in rd's host register
    /// where it has one.
    fn alu_imm_w(&mut self, rd: u8, rs1: u8, imm: i32, f: AluImm) {
        let dst = self.dest(rd, None);
        self.get(dst, rs1);
        f(&mut self.ops, dst, imm);
        self.put_word(rd, dst);
    }

    /// rd := sext32(rs1 + imm) (`addiw`): a `lea` and the extension.
    fn add_imm_w(&mut self, rd: u8, rs1: u8, imm: i32) {
        let a = self.src(rs1, RAX);
        let dst = self.dest(rd, None);
        dynasm!(self.ops ; .arch x64 ; lea Rd(dst), [Rq(a) + imm]);
        self.put_word(rd, dst);
    }

    /// rd := sext32(rs1 >> sh) logical (`srliw`): for a shift of at
    /// least 1 the 32-bit result's sign bit is clear, so the zero
    /// extension x86 gives it is its sign extension.
    fn shift_right_w(&mut self, rd: u8, rs1: u8, sh: i8) {
        if sh == 0 {
            return self.sext32(rd, rs1);
        }
        let dst = self.dest(rd, None);
        self.get(dst, rs1);
        dynasm!(self.ops ; .arch x64 ; shr Rd(dst), sh);
        self.put(rd, dst);
        self.written.sext = true;
    }

    /// rd := sext32(rs1 >> sh) arithmetic (`sraiw`): the low word
    /// sign-extended, then shifted over all 64 bits.
    fn shift_right_arith_w(&mut self, rd: u8, rs1: u8, sh: i8) {
        let dst = self.dest(rd, None);
        self.sext_into(dst, rs1);
        dynasm!(self.ops ; .arch x64 ; sar Rq(dst), sh);
        self.put(rd, dst);
        self.written.sext = true;
    }

    /// Guest register `rd` := sext32(eax), sign-extended straight into
    /// rd's host register when it has one (no copy through rax).
    fn put_sext32(&mut self, rd: u8) {
        let dst = self.dest(rd, None);
        dynasm!(self.ops ; .arch x64 ; movsxd Rq(dst), eax);
        self.put(rd, dst);
    }

    /// A bitwise operation (and, or, xor, with a register or an
    /// immediate, which is a 12-bit value sign-extended) that `emit`
    /// emits: of words sign-extended, a word sign-extended, narrow if an
    /// operand is (bit by bit, the upper half is bit 31 of each again).
    /// A narrow result bound for the register file is extended first, by
    /// extending its operands.
    fn bitwise(&mut self, d: &Inst, emit: impl FnOnce(&mut Self)) {
        let (b1, b2) = read_masks(d);
        let operands = b1 | b2;
        let both_sext = self.reads_sext(d);
        let held = matches!(self.loc[d.rd as usize], Loc::Host(_));
        if !held {
            self.widen(operands);
        }
        let narrow = self.narrow & operands != 0;
        emit(self);
        self.written = Written { sext: both_sext, narrow };
    }

    /// rd := (rs1 op rs2) as 0/1, `f` setting al from the flags of a compare.
    fn set_if(&mut self, rd: u8, rs1: u8, rs2: Option<u8>, imm: i32, f: fn(&mut VecAssembler<X64Relocation>)) {
        let a = self.src(rs1, RAX);
        match rs2 {
            Some(rs2) => {
                let b = self.src(rs2, RCX);
                dynasm!(self.ops ; .arch x64 ; cmp Rq(a), Rq(b));
            }
            None => dynasm!(self.ops ; .arch x64 ; cmp Rq(a), DWORD imm),
        }
        f(&mut self.ops);
        dynasm!(self.ops ; .arch x64 ; movzx eax, al);
        self.put(rd, RAX);
        self.written.sext = true;
    }

    /// rdx := the pc of the instruction at `at` plus `add`.
    fn pc_plus(&mut self, reg: u8, at: u16, add: i64) {
        dynasm!(self.ops ; .arch x64 ; mov Rq(reg), QWORD [rsi + CTX_PC]);
        let total = at as i64 + add;
        if total != 0 {
            if let Ok(t) = i32::try_from(total) {
                dynasm!(self.ops ; .arch x64 ; add Rq(reg), DWORD t);
            } else {
                dynasm!(self.ops ; .arch x64 ; add Rq(reg), DWORD at as i32 ; add Rq(reg), DWORD add as i32);
            }
        }
    }

    /// Emits the unit's instructions from where the registers are now;
    /// true if the last ended the unit (a jump or branch).
    fn body(&mut self, insts: &[Inst], accesses: &[Access]) -> bool {
        let mut ended = false;
        for (k, d) in insts.iter().enumerate() {
            self.allocate(accesses, k);
            self.widen_for(d);
            let stubs = self.stubs.len();
            ended = self.inst(k, d);
            // `dead` counts on this.
            debug_assert!(may_exit(d) || (self.stubs.len() == stubs && !ended), "{:?} may exit", d.op);
            self.wrote(d);
        }
        ended
    }

    /// Emits `d`, instruction `k` of the block. True if it ends the block
    /// (a jump or branch, which left it).
    fn inst(&mut self, k: usize, d: &crate::block::Inst) -> bool {
        use Op::*;
        let (rd, rs1, rs2, imm) = (d.rd, d.rs1, d.rs2, d.imm);
        let len = (d.next - d.at) as i64;
        match d.op {
            Nop => {}
            // The last of its block (the general executor's): the block
            // leaves to the next instruction after it.
            Other => match general(d.insn) {
                // A fence that orders earlier stores before later loads
                // (Linux's smp_mb) is the one x86's own order (TSO) does
                // not give: harts on threads of their own need a locked
                // instruction for it, a cheaper full barrier than mfence.
                // Emitted whatever the mode: a translation may outlive a
                // change of mode, and such fences are rare.
                Some(General::Fence) if fence_needs_barrier(d.insn) => {
                    dynasm!(self.ops ; .arch x64 ; lock or DWORD [rsp], 0);
                }
                Some(General::Fence) => {}
                Some(General::ScAmo) => self.sc_amo(k, d),
                Some(General::FpCsr) => self.fp_csr(k, d),
                None => unreachable!("not translated"),
            },
            Lui => self.constant(rd, imm),
            Auipc => {
                let dst = self.dest(rd, None);
                self.pc_plus(dst, d.at, imm as i64);
                self.put(rd, dst);
            }
            Jal => {
                self.pc_plus(RAX, d.at, len);
                self.put(rd, RAX);
                if self.loops(d) {
                    self.loop_back();
                } else {
                    self.writeback(self.dirty);
                    self.leave(d.at as i64 + imm as i64);
                }
                return true;
            }
            Jalr => {
                // The target first: rd may be rs1.
                self.get(R11, rs1);
                dynasm!(self.ops ; .arch x64 ; add r11, DWORD imm ; and r11, BYTE -2);
                self.pc_plus(RAX, d.at, len);
                self.put(rd, RAX);
                self.writeback(self.dirty);
                dynasm!(self.ops
                    ; .arch x64
                    ; sub QWORD [rsi + CTX_LEFT], self.n as i32
                    ; mov QWORD [rsi + CTX_PC], r11
                );
                let lookup = self.lookup();
                dynasm!(self.ops ; .arch x64 ; jmp =>lookup);
                return true;
            }
            Beq | Bne | Blt | Bge | Bltu | Bgeu => {
                let a = self.src(rs1, RAX);
                // rs2 compared where it is; x0 by a `test` of rs1 (which
                // sets the flags as a compare with 0 does).
                let b = (rs2 != 0).then(|| self.operand(rs2, RCX));
                let back = self.loops(d);
                // Only moves between here and the jump: the flags stay.
                // A loop's way back writes back only what it must.
                if !back {
                    self.writeback(self.dirty);
                }
                let taken = self.ops.new_dynamic_label();
                // Two words sign-extended compare, signed and unsigned, as
                // their low words do (the extension keeps either order):
                // narrow ones need not be extended first.
                match (b, self.reads_sext(d)) {
                    (None, true) => dynasm!(self.ops ; .arch x64 ; test Rd(a), Rd(a)),
                    (None, false) => dynasm!(self.ops ; .arch x64 ; test Rq(a), Rq(a)),
                    (Some(b), true) => alu!(cmp w)(&mut self.ops, a, b),
                    (Some(b), false) => alu!(cmp)(&mut self.ops, a, b),
                }
                match d.op {
                    Beq => dynasm!(self.ops ; .arch x64 ; je =>taken),
                    Bne => dynasm!(self.ops ; .arch x64 ; jne =>taken),
                    Blt => dynasm!(self.ops ; .arch x64 ; jl =>taken),
                    Bge => dynasm!(self.ops ; .arch x64 ; jge =>taken),
                    Bltu => dynasm!(self.ops ; .arch x64 ; jb =>taken),
                    _ => dynasm!(self.ops ; .arch x64 ; jae =>taken),
                }
                if back {
                    self.writeback(self.dirty);
                }
                self.leave(d.next as i64);
                dynasm!(self.ops ; .arch x64 ; =>taken);
                if back {
                    self.loop_back();
                } else {
                    self.leave(d.at as i64 + imm as i64);
                }
                return true;
            }
            Lb | Lh | Lw | Ld | Lbu | Lhu | Lwu => {
                let size = match d.op {
                    Lb | Lbu => 1,
                    Lh | Lhu => 2,
                    Lw | Lwu => 4,
                    _ => 8,
                };
                // rdx: the host address, less `at`; the value straight
                // into rd's host register if it has one.
                let at = self.access_address(k, rs1, imm, size, 0);
                let v = self.dest(rd, None);
                match d.op {
                    Lb => dynasm!(self.ops ; .arch x64 ; movsx Rq(v), BYTE [rdx + at]),
                    Lbu => dynasm!(self.ops ; .arch x64 ; movzx Rd(v), BYTE [rdx + at]),
                    Lh => dynasm!(self.ops ; .arch x64 ; movsx Rq(v), WORD [rdx + at]),
                    Lhu => dynasm!(self.ops ; .arch x64 ; movzx Rd(v), WORD [rdx + at]),
                    Lw => dynasm!(self.ops ; .arch x64 ; movsxd Rq(v), DWORD [rdx + at]),
                    Lwu => dynasm!(self.ops ; .arch x64 ; mov Rd(v), DWORD [rdx + at]),
                    _ => dynasm!(self.ops ; .arch x64 ; mov Rq(v), QWORD [rdx + at]),
                }
                self.put(rd, v);
                // Bytes, halves and words, signed or not (below 2^31):
                // each a word's sign extension.
                self.written.sext = !matches!(d.op, Lwu | Ld);
            }
            Sb | Sh | Sw | Sd => {
                let size = match d.op {
                    Sb => 1,
                    Sh => 2,
                    Sw => 4,
                    _ => 8,
                };
                // rdx: the host address, less `at`.
                let at = self.access_address(k, rs1, imm, size, 1);
                let v = self.src(rs2, RAX);
                match size {
                    1 => dynasm!(self.ops ; .arch x64 ; mov BYTE [rdx + at], Rb(v)),
                    2 => dynasm!(self.ops ; .arch x64 ; mov WORD [rdx + at], Rw(v)),
                    4 => dynasm!(self.ops ; .arch x64 ; mov DWORD [rdx + at], Rd(v)),
                    _ => dynasm!(self.ops ; .arch x64 ; mov QWORD [rdx + at], Rq(v)),
                }
            }
            // `mv` and `li` (and a `nop`): a copy, or the constant.
            Addi if imm == 0 => self.copy(rd, rs1),
            Addi if rs1 == 0 => self.constant(rd, imm),
            // A pointer or counter stepped in the register file: in place.
            Addi if rd == rs1 && self.add_in_place(rd, imm) => {}
            Addi => self.alu_imm(rd, rs1, imm, |o, d, i| dynasm!(o ; .arch x64 ; add Rq(d), DWORD i)),
            Slti => self.set_if(rd, rs1, None, imm, |o| dynasm!(o ; .arch x64 ; setl al)),
            Sltiu => self.set_if(rd, rs1, None, imm, |o| dynasm!(o ; .arch x64 ; setb al)),
            Xori => self.bitwise(d, |e| e.alu_imm(rd, rs1, imm, |o, d, i| dynasm!(o ; .arch x64 ; xor Rq(d), DWORD i))),
            Ori => self.bitwise(d, |e| e.alu_imm(rd, rs1, imm, |o, d, i| dynasm!(o ; .arch x64 ; or Rq(d), DWORD i))),
            Andi => self.bitwise(d, |e| e.alu_imm(rd, rs1, imm, |o, d, i| dynasm!(o ; .arch x64 ; and Rq(d), DWORD i))),
            Slli => self.alu_imm(rd, rs1, imm & 63, |o, d, i| dynasm!(o ; .arch x64 ; shl Rq(d), i as i8)),
            Srli => self.alu_imm(rd, rs1, imm & 63, |o, d, i| dynasm!(o ; .arch x64 ; shr Rq(d), i as i8)),
            Srai => self.alu_imm(rd, rs1, imm & 63, |o, d, i| dynasm!(o ; .arch x64 ; sar Rq(d), i as i8)),
            // `sext.w`: one sign extension.
            Addiw if imm == 0 => self.sext32(rd, rs1),
            Addiw => self.add_imm_w(rd, rs1, imm),
            Slliw => self.alu_imm_w(rd, rs1, imm & 31, |o, d, i| dynasm!(o ; .arch x64 ; shl Rd(d), i as i8)),
            Srliw => self.shift_right_w(rd, rs1, (imm & 31) as i8),
            Sraiw => self.shift_right_arith_w(rd, rs1, (imm & 31) as i8),
            // `c.mv` is an `add` from x0.
            Add if rs1 == 0 => self.copy(rd, rs2),
            Add if rs2 == 0 => self.copy(rd, rs1),
            Add => self.alu_commutative(rd, rs1, rs2, alu!(add)),
            Sub => self.alu(rd, rs1, rs2, alu!(sub)),
            Xor => self.bitwise(d, |e| e.alu_commutative(rd, rs1, rs2, alu!(xor))),
            Or => self.bitwise(d, |e| e.alu_commutative(rd, rs1, rs2, alu!(or))),
            And => self.bitwise(d, |e| e.alu_commutative(rd, rs1, rs2, alu!(and))),
            Mul => self.alu(rd, rs1, rs2, alu!(imul)),
            Slt => self.set_if(rd, rs1, Some(rs2), 0, |o| dynasm!(o ; .arch x64 ; setl al)),
            Sltu => self.set_if(rd, rs1, Some(rs2), 0, |o| dynasm!(o ; .arch x64 ; setb al)),
            Sll | Srl | Sra => {
                // The count goes in cl; x86 masks it to 6 bits as RISC-V does.
                self.get(RCX, rs2);
                let dst = self.dest(rd, None);
                self.get(dst, rs1);
                match d.op {
                    Sll => dynasm!(self.ops ; .arch x64 ; shl Rq(dst), cl),
                    Srl => dynasm!(self.ops ; .arch x64 ; shr Rq(dst), cl),
                    _ => dynasm!(self.ops ; .arch x64 ; sar Rq(dst), cl),
                }
                self.put(rd, dst);
            }
            Addw => self.add_w(rd, rs1, rs2),
            Subw => self.alu_w(rd, rs1, rs2, alu!(sub w)),
            Mulw => self.alu_w(rd, rs1, rs2, alu!(imul w)),
            Sllw | Srlw | Sraw => {
                // 32-bit shifts: x86 masks the count to 5 bits, as RISC-V.
                self.get(RCX, rs2);
                self.get(RAX, rs1);
                match d.op {
                    Sllw => dynasm!(self.ops ; .arch x64 ; shl eax, cl),
                    Srlw => dynasm!(self.ops ; .arch x64 ; shr eax, cl),
                    _ => dynasm!(self.ops ; .arch x64 ; sar eax, cl),
                }
                self.put_word(rd, RAX);
            }
            Mulh | Mulhu | Mulhsu => {
                self.get(RAX, rs1);
                let b = self.src(rs2, RCX);
                match d.op {
                    Mulh => dynasm!(self.ops ; .arch x64 ; imul Rq(b)),
                    Mulhu => dynasm!(self.ops ; .arch x64 ; mul Rq(b)),
                    _ => {
                        // Signed by unsigned: the unsigned product's high
                        // half, less rs2 when rs1 is negative.
                        dynasm!(self.ops
                            ; .arch x64
                            ; mov r11, rax
                            ; sar r11, 63
                            ; and r11, Rq(b)
                            ; mul Rq(b)
                            ; sub rdx, r11
                        )
                    }
                }
                self.put(rd, RDX);
            }
            Div | Divu | Rem | Remu | Divw | Divuw | Remw | Remuw => self.div(d.op, rd, rs1, rs2),
            Fp => self.fp_compute(k, d),
            Fload | Fstore => self.fp_load_store(k, d),
            Sh1add | Sh2add | Sh3add | AddUw | Sh1addUw | Sh2addUw | Sh3addUw | SlliUw | Andn | Orn | Xnor | Clz
            | Ctz | Cpop | Clzw | Ctzw | Cpopw | Max | Maxu | Min | Minu | SextB | SextH | ZextH | Rol | Ror | Rori
            | Rolw | Rorw | Roriw | OrcB | Rev8 | Bclr | Bclri | Bext | Bexti | Binv | Binvi | Bset | Bseti
            | CzeroEqz | CzeroNez => self.bitmanip(d),
            CboZero => self.cbo_zero(k, d),
            Illegal => unreachable!("not translated"),
        }
        false
    }

    /// Zba, Zbb, Zbs and Zicond, as `exec` computes them. None of them
    /// can trap or has a slow path. rd is never x0 (the block cache made
    /// those `Nop`; `put` would drop the write anyway), and an operand
    /// another one or rd aliases is read, or copied to a scratch
    /// register, before rd's host register is written.
    fn bitmanip(&mut self, d: &crate::block::Inst) {
        use Op::*;
        let (rd, rs1, rs2) = (d.rd, d.rs1, d.rs2);
        // The immediate forms' shift amount (the word form's was taken
        // mod 32 by the decoder).
        let sh = (d.imm & 63) as i8;
        match d.op {
            Sh1add | Sh2add | Sh3add => {
                // lea reads both operands before it writes.
                let a = self.src(rs1, RAX);
                let b = self.src(rs2, RCX);
                let dst = self.dest(rd, None);
                let scale = match d.op {
                    Sh1add => 1,
                    Sh2add => 2,
                    _ => 3,
                };
                self.lea_indexed(true, dst, b, a, scale);
                self.put(rd, dst);
            }
            AddUw | Sh1addUw | Sh2addUw | Sh3addUw => {
                // rs2 first, in a register other than rax, which takes the
                // low word of rs1 zero-extended.
                let b = self.src(rs2, RCX);
                let a = self.src(rs1, RAX);
                dynasm!(self.ops ; .arch x64 ; mov eax, Rd(a));
                let dst = self.dest(rd, None);
                match d.op {
                    AddUw => dynasm!(self.ops ; .arch x64 ; lea Rq(dst), [Rq(b) + rax]),
                    Sh1addUw => dynasm!(self.ops ; .arch x64 ; lea Rq(dst), [Rq(b) + rax * 2]),
                    Sh2addUw => dynasm!(self.ops ; .arch x64 ; lea Rq(dst), [Rq(b) + rax * 4]),
                    _ => dynasm!(self.ops ; .arch x64 ; lea Rq(dst), [Rq(b) + rax * 8]),
                }
                self.put(rd, dst);
            }
            SlliUw => {
                let a = self.src(rs1, RAX);
                dynasm!(self.ops ; .arch x64 ; mov eax, Rd(a) ; shl rax, sh);
                self.put(rd, RAX);
            }
            Andn | Orn => {
                // !rs2 in rcx first: rd may be rs2.
                self.get(RCX, rs2);
                dynasm!(self.ops ; .arch x64 ; not rcx);
                let dst = self.dest(rd, None);
                self.get(dst, rs1);
                match d.op {
                    Andn => dynasm!(self.ops ; .arch x64 ; and Rq(dst), rcx),
                    _ => dynasm!(self.ops ; .arch x64 ; or Rq(dst), rcx),
                }
                self.put(rd, dst);
            }
            Xnor => self.alu(rd, rs1, rs2, |o, d, s| {
                alu!(xor)(o, d, s);
                dynasm!(o ; .arch x64 ; not Rq(d))
            }),
            Clz | Ctz | Cpop | Clzw | Ctzw | Cpopw => self.count(d.op, rd, rs1),
            Max | Maxu | Min | Minu => {
                // rax := rs1, replaced by rs2 where rs2 is the one wanted.
                let b = self.src(rs2, RCX);
                self.get(RAX, rs1);
                dynasm!(self.ops ; .arch x64 ; cmp rax, Rq(b));
                match d.op {
                    Max => dynasm!(self.ops ; .arch x64 ; cmovl rax, Rq(b)),
                    Maxu => dynasm!(self.ops ; .arch x64 ; cmovb rax, Rq(b)),
                    Min => dynasm!(self.ops ; .arch x64 ; cmovg rax, Rq(b)),
                    _ => dynasm!(self.ops ; .arch x64 ; cmova rax, Rq(b)),
                }
                self.put(rd, RAX);
            }
            SextB | SextH | ZextH => {
                let a = self.src(rs1, RAX);
                let dst = self.dest(rd, None);
                match d.op {
                    SextB => dynasm!(self.ops ; .arch x64 ; movsx Rq(dst), Rb(a)),
                    SextH => dynasm!(self.ops ; .arch x64 ; movsx Rq(dst), Rw(a)),
                    // A 32-bit destination clears the upper half.
                    _ => dynasm!(self.ops ; .arch x64 ; movzx Rd(dst), Rw(a)),
                }
                self.put(rd, dst);
            }
            Rol | Ror | Bclr | Bset | Binv => {
                // The count or bit index in rcx first (rd may be rs2). x86
                // takes a 64-bit rotate's count, and the bit index of a bit
                // test on a register, mod 64, as RISC-V does.
                self.get(RCX, rs2);
                let dst = self.dest(rd, None);
                self.get(dst, rs1);
                match d.op {
                    Rol => dynasm!(self.ops ; .arch x64 ; rol Rq(dst), cl),
                    Ror => dynasm!(self.ops ; .arch x64 ; ror Rq(dst), cl),
                    Bclr => dynasm!(self.ops ; .arch x64 ; btr Rq(dst), rcx),
                    Bset => dynasm!(self.ops ; .arch x64 ; bts Rq(dst), rcx),
                    _ => dynasm!(self.ops ; .arch x64 ; btc Rq(dst), rcx),
                }
                self.put(rd, dst);
            }
            Rolw | Rorw => {
                // A 32-bit rotate takes its count mod 32, as RISC-V does;
                // the result is sign-extended.
                self.get(RCX, rs2);
                self.get(RAX, rs1);
                match d.op {
                    Rolw => dynasm!(self.ops ; .arch x64 ; rol eax, cl),
                    _ => dynasm!(self.ops ; .arch x64 ; ror eax, cl),
                }
                self.put_sext32(rd);
            }
            Bext => {
                self.get(RCX, rs2);
                self.get(RAX, rs1);
                dynasm!(self.ops ; .arch x64 ; shr rax, cl ; and eax, 1);
                self.put(rd, RAX);
            }
            Rori => self.alu_imm(rd, rs1, sh as i32, |o, d, i| dynasm!(o ; .arch x64 ; ror Rq(d), i as i8)),
            Roriw => self.alu_imm_w(rd, rs1, sh as i32, |o, d, i| dynasm!(o ; .arch x64 ; ror Rd(d), i as i8)),
            // A bit test's immediate index is taken mod 64 too; `sh` is
            // below 64 anyway.
            Bclri => self.alu_imm(rd, rs1, sh as i32, |o, d, i| dynasm!(o ; .arch x64 ; btr Rq(d), BYTE i as i8)),
            Bseti => self.alu_imm(rd, rs1, sh as i32, |o, d, i| dynasm!(o ; .arch x64 ; bts Rq(d), BYTE i as i8)),
            Binvi => self.alu_imm(rd, rs1, sh as i32, |o, d, i| dynasm!(o ; .arch x64 ; btc Rq(d), BYTE i as i8)),
            Bexti => {
                self.alu_imm(rd, rs1, sh as i32, |o, d, i| dynasm!(o ; .arch x64 ; shr Rq(d), i as i8 ; and Rq(d), 1))
            }
            OrcB => {
                // As `exec::orc_b`: in each byte, the low seven bits plus
                // 0x7f carry into the top bit if any is set, or-ed with
                // the top bit itself; then 0x80 becomes 0xff.
                self.get(RAX, rs1);
                dynasm!(self.ops
                    ; .arch x64
                    ; mov rdx, QWORD 0x7f7f_7f7f_7f7f_7f7f_i64
                    ; mov rcx, rax
                    ; and rax, rdx
                    ; add rax, rdx
                    ; or rax, rcx
                    ; not rdx
                    ; and rax, rdx
                    ; shr rax, 7
                    ; imul rax, rax, DWORD 0xff
                );
                self.put(rd, RAX);
            }
            Rev8 => {
                let dst = self.dest(rd, None);
                self.get(dst, rs1);
                dynasm!(self.ops ; .arch x64 ; bswap Rq(dst));
                self.put(rd, dst);
            }
            CzeroEqz | CzeroNez => {
                // rax := rs1, or 0 (from rdx) by rs2's test. The zero is
                // made before the test: xor changes the flags.
                let b = self.src(rs2, RCX);
                self.get(RAX, rs1);
                dynasm!(self.ops ; .arch x64 ; xor edx, edx ; test Rq(b), Rq(b));
                match d.op {
                    CzeroEqz => dynasm!(self.ops ; .arch x64 ; cmovz rax, rdx),
                    _ => dynasm!(self.ops ; .arch x64 ; cmovnz rax, rdx),
                }
                self.put(rd, RAX);
            }
            _ => unreachable!("not a bitmanip operation"),
        }
    }

    /// clz, ctz, cpop and their word forms into rd: LZCNT, TZCNT and POPCNT
    /// where the host has them (see `Host`), else sequences that give the
    /// same results. BSR and BSF leave the destination undefined for a
    /// zero operand, so their zero flag picks the result for zero instead
    /// (cmov writes its destination, the upper half cleared, either way).
    fn count(&mut self, op: Op, rd: u8, rs1: u8) {
        use Op::*;
        // Not in rax or rcx, which the sequences write first.
        let a = self.src(rs1, RDX);
        let host = self.host;
        match op {
            Clz if host.lzcnt => dynasm!(self.ops ; .arch x64 ; lzcnt rax, Rq(a)),
            Clzw if host.lzcnt => dynasm!(self.ops ; .arch x64 ; lzcnt eax, Rd(a)),
            Ctz if host.tzcnt => dynasm!(self.ops ; .arch x64 ; tzcnt rax, Rq(a)),
            Ctzw if host.tzcnt => dynasm!(self.ops ; .arch x64 ; tzcnt eax, Rd(a)),
            Cpop if host.popcnt => dynasm!(self.ops ; .arch x64 ; popcnt rax, Rq(a)),
            Cpopw if host.popcnt => dynasm!(self.ops ; .arch x64 ; popcnt eax, Rd(a)),
            // The index of the highest set bit, or -1 for none: 63 (31)
            // less it counts the leading zeros, 64 (32) for zero.
            Clz => dynasm!(self.ops
                ; .arch x64
                ; mov rcx, -1
                ; bsr rax, Rq(a)
                ; cmovz rax, rcx
                ; neg rax
                ; add rax, 63
            ),
            Clzw => dynasm!(self.ops
                ; .arch x64
                ; mov ecx, -1
                ; bsr eax, Rd(a)
                ; cmovz eax, ecx
                ; neg eax
                ; add eax, 31
            ),
            Ctz => dynasm!(self.ops ; .arch x64 ; mov ecx, 64 ; bsf rax, Rq(a) ; cmovz rax, rcx),
            Ctzw => dynasm!(self.ops ; .arch x64 ; mov ecx, 32 ; bsf eax, Rd(a) ; cmovz eax, ecx),
            _ => {
                // The bits summed in pairs, nibbles, bytes, then the bytes
                // by a multiplication (the word form counts the low word,
                // zero-extended).
                if op == Cpopw {
                    dynasm!(self.ops ; .arch x64 ; mov eax, Rd(a));
                } else {
                    dynasm!(self.ops ; .arch x64 ; mov rax, Rq(a));
                }
                dynasm!(self.ops
                    ; .arch x64
                    ; mov rcx, rax
                    ; shr rcx, 1
                    ; mov rdx, QWORD 0x5555_5555_5555_5555_i64
                    ; and rcx, rdx
                    ; sub rax, rcx
                    ; mov rdx, QWORD 0x3333_3333_3333_3333_i64
                    ; mov rcx, rax
                    ; shr rcx, 2
                    ; and rcx, rdx
                    ; and rax, rdx
                    ; add rax, rcx
                    ; mov rcx, rax
                    ; shr rcx, 4
                    ; add rax, rcx
                    ; mov rdx, QWORD 0x0f0f_0f0f_0f0f_0f0f_i64
                    ; and rax, rdx
                    ; mov rdx, QWORD 0x0101_0101_0101_0101_i64
                    ; imul rax, rdx
                    ; shr rax, 56
                );
            }
        }
        self.put(rd, RAX);
    }

    /// Floating-point computation `k`: inline where `fp_inline` has a fast
    /// path for it, else (and where the fast path's checks fail) a call of
    /// `fp_helper`. FS off is illegal: the interpreter carries on at `k`
    /// and traps exactly, as it does when the helper declines. For the
    /// call, the x register some of these read (fmv.d.x, fcvt from an
    /// integer) is written back first if a host register holds a newer
    /// value; the one others write (fmv.x.d, comparisons, fclass, fcvt to
    /// an integer) is loaded again after.
    fn fp_compute(&mut self, k: usize, d: &Inst) {
        let i = d.insn;
        let declined = self.stub(k);
        dynasm!(self.ops
            ; .arch x64
            ; test QWORD [rdi + MSTATUS_REL], MSTATUS_FS as i32
            ; jz =>declined
        );
        let slow = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        let dirty = self.dirty;
        let inline = self.fp_inline(d, slow);
        if inline {
            dynasm!(self.ops ; .arch x64 ; jmp =>done ; =>slow);
            self.dirty = dirty;
        }
        let rs1 = d.rs1 as usize;
        if fp_x(i) == Some(FpX::Reads) && self.dirty & (1 << rs1) != 0 {
            if let Loc::Host(h) = self.loc[rs1] {
                dynasm!(self.ops ; .arch x64 ; mov QWORD [rdi + 8 * rs1 as i32], Rq(h));
            }
        }
        dynasm!(self.ops ; .arch x64 ; add QWORD [rsi + CTX_FP_CALLS], 1);
        let saved = self.save_for_call();
        dynasm!(self.ops
            ; .arch x64
            ; sub rdi, X_OFF
            ; mov esi, i as i32
            ; mov edx, d.imm
        );
        self.call_and_restore(fp_helper as *const (), saved);
        dynasm!(self.ops ; .arch x64 ; test eax, eax ; jz =>declined);
        let rd = d.rd as usize;
        if fp_x(i) == Some(FpX::Writes) {
            if let Loc::Host(h) = self.loc[rd] {
                dynasm!(self.ops ; .arch x64 ; mov Rq(h), QWORD [rdi + 8 * rd as i32]);
                // The register file holds the value now; the fast path
                // leaves it dirty, and both paths must agree where they
                // meet.
                if inline {
                    self.dirty |= 1 << rd;
                } else {
                    self.dirty &= !(1 << rd);
                }
            }
        }
        if inline {
            dynasm!(self.ops ; .arch x64 ; =>done);
        }
    }

    /// The inline fast path of floating-point computation `d` if it has
    /// one (false: nothing emitted), after the FS check; it goes to `slow`
    /// (the software FPU) before writing anything wherever the host's
    /// result or flags could differ from the guest's. It covers what
    /// compiled code runs most, in the rounding mode it runs in (round to
    /// nearest even, static or dynamic): the arithmetic, square roots,
    /// fused multiply-adds (with FMA3), comparisons, minimum and maximum,
    /// sign injection, moves, the classification of normal numbers, and
    /// the conversions between the formats and to and from the signed
    /// integers (truncating too, C's casts).
    ///
    /// The host's SSE arithmetic is IEEE 754's, correctly rounded, so a
    /// result is the guest's whenever both are finite, nonzero numbers
    /// well clear of the subnormal range: a result whose biased exponent
    /// is 0 (zero, subnormal), 1 (possibly tiny before rounding: RISC-V
    /// detects tininess after rounding) or all ones (an infinity, a NaN:
    /// RISC-V's canonical NaN is not x86's default one) takes the slow
    /// path. Such a result can have raised only inexact (invalid needs a
    /// NaN result, overflow an infinite one, divide-by-zero an infinite
    /// one, underflow a tiny one), and x86's own inexact flag is exact, so
    /// fflags' NX is set from it: MXCSR's flags are cleared before the
    /// operation and read after, unless NX is set already (then nothing
    /// can change). Comparisons take the slow path on an unordered pair
    /// (NaNs, which may raise invalid), conversions to an integer on
    /// x86's out-of-range value (NaNs, out of range, and the most
    /// negative integer itself), single-precision operands that are not
    /// NaN-boxed on the check before use (they read as the canonical NaN).
    fn fp_inline(&mut self, d: &Inst, slow: DynamicLabel) -> bool {
        let i = d.insn;
        let opcode = i & 0x7f;
        let fmt = (i >> 25) & 3;
        let f3 = (i >> 12) & 7;
        let rs2 = ((i >> 20) & 31) as u8;
        let (rd, rs1) = (((i >> 7) & 31) as u8, ((i >> 15) & 31) as u8);
        if fmt > 1 {
            return false;
        }
        let single = fmt == 0;
        // Whether the rounding mode is round to nearest even: statically,
        // or frm's (checked at run time); None for any other.
        let nearest = match f3 {
            0 => Some(false),
            7 => Some(true),
            _ => None,
        };
        if opcode != 0x53 {
            // fmadd, fmsub, fnmsub, fnmadd.
            let Some(dynamic) = nearest.filter(|_| self.host.fma) else {
                return false;
            };
            self.frm_nearest(dynamic, slow);
            self.load_f(0, rs1, single, slow);
            self.load_f(1, rs2, single, slow);
            self.load_f(2, (i >> 27) as u8, single, slow);
            self.inexact_begin();
            match (opcode, single) {
                (0x43, false) => dynasm!(self.ops ; .arch x64 ; vfmadd213sd xmm0, xmm1, xmm2),
                (0x47, false) => dynasm!(self.ops ; .arch x64 ; vfmsub213sd xmm0, xmm1, xmm2),
                (0x4b, false) => dynasm!(self.ops ; .arch x64 ; vfnmadd213sd xmm0, xmm1, xmm2),
                (_, false) => dynasm!(self.ops ; .arch x64 ; vfnmsub213sd xmm0, xmm1, xmm2),
                (0x43, true) => dynasm!(self.ops ; .arch x64 ; vfmadd213ss xmm0, xmm1, xmm2),
                (0x47, true) => dynasm!(self.ops ; .arch x64 ; vfmsub213ss xmm0, xmm1, xmm2),
                (0x4b, true) => dynasm!(self.ops ; .arch x64 ; vfnmadd213ss xmm0, xmm1, xmm2),
                (_, true) => dynasm!(self.ops ; .arch x64 ; vfnmsub213ss xmm0, xmm1, xmm2),
            }
            self.result_f(single, slow);
            self.inexact_end();
            self.store_f(rd, single);
            return true;
        }
        match i >> 27 {
            // fadd, fsub, fmul, fdiv, fsqrt.
            group @ (0x00..=0x03 | 0x0b) => {
                let Some(dynamic) = nearest.filter(|_| group != 0x0b || rs2 == 0) else {
                    return false;
                };
                self.frm_nearest(dynamic, slow);
                self.load_f(0, rs1, single, slow);
                if group != 0x0b {
                    self.load_f(1, rs2, single, slow);
                }
                self.inexact_begin();
                match (group, single) {
                    (0, false) => dynasm!(self.ops ; .arch x64 ; addsd xmm0, xmm1),
                    (1, false) => dynasm!(self.ops ; .arch x64 ; subsd xmm0, xmm1),
                    (2, false) => dynasm!(self.ops ; .arch x64 ; mulsd xmm0, xmm1),
                    (3, false) => dynasm!(self.ops ; .arch x64 ; divsd xmm0, xmm1),
                    (_, false) => dynasm!(self.ops ; .arch x64 ; sqrtsd xmm0, xmm0),
                    (0, true) => dynasm!(self.ops ; .arch x64 ; addss xmm0, xmm1),
                    (1, true) => dynasm!(self.ops ; .arch x64 ; subss xmm0, xmm1),
                    (2, true) => dynasm!(self.ops ; .arch x64 ; mulss xmm0, xmm1),
                    (3, true) => dynasm!(self.ops ; .arch x64 ; divss xmm0, xmm1),
                    (_, true) => dynasm!(self.ops ; .arch x64 ; sqrtss xmm0, xmm0),
                }
                self.result_f(single, slow);
                self.inexact_end();
                self.store_f(rd, single);
            }
            // fsgnj, fsgnjn, fsgnjx: the sign bit of rs2, its inverse, or
            // the two signs' exclusive or, on rs1's magnitude.
            0x04 if f3 < 3 => {
                let (a, b) = (F_REL + 8 * rs1 as i32, F_REL + 8 * rs2 as i32);
                if single {
                    self.check_boxed(rs1, slow);
                    self.check_boxed(rs2, slow);
                }
                // The whole registers, with the format's sign bit: rs1's
                // magnitude, the sign from rcx. For singles the bits above
                // the sign that come along are ORed into rs1's upper half,
                // which is all ones (NaN-boxed).
                let sign: i8 = if single { 31 } else { 63 };
                dynasm!(self.ops
                    ; .arch x64
                    ; mov rax, QWORD [rdi + a]
                    ; mov rcx, QWORD [rdi + b]
                );
                match f3 {
                    1 => dynasm!(self.ops ; .arch x64 ; not rcx),
                    2 => dynasm!(self.ops ; .arch x64 ; xor rcx, rax),
                    _ => {}
                }
                dynasm!(self.ops
                    ; .arch x64
                    ; btr rax, BYTE sign
                    ; shr rcx, BYTE sign
                    ; shl rcx, BYTE sign
                    ; or rax, rcx
                );
                self.store_f(rd, single);
            }
            // fmin, fmax of two ordered, different numbers (equal ones
            // may be zeros of either sign): the smaller or larger one's
            // bits, no flag.
            0x05 if f3 < 2 => {
                self.compare_f(rs1, rs2, single, slow);
                dynasm!(self.ops
                    ; .arch x64
                    ; je =>slow
                    ; mov rax, QWORD [rdi + F_REL + 8 * rs1 as i32]
                    ; mov rcx, QWORD [rdi + F_REL + 8 * rs2 as i32]
                );
                if f3 == 0 {
                    dynasm!(self.ops ; .arch x64 ; cmova rax, rcx);
                } else {
                    dynasm!(self.ops ; .arch x64 ; cmovb rax, rcx);
                }
                dynasm!(self.ops ; .arch x64 ; mov QWORD [rdi + F_REL + 8 * rd as i32], rax);
                self.fs_dirty();
            }
            // fle, flt, feq: exact, no flag, unless unordered.
            0x14 if f3 < 3 => {
                self.compare_f(rs1, rs2, single, slow);
                match f3 {
                    0 => dynasm!(self.ops ; .arch x64 ; setbe al),
                    1 => dynasm!(self.ops ; .arch x64 ; setb al),
                    _ => dynasm!(self.ops ; .arch x64 ; sete al),
                }
                dynasm!(self.ops ; .arch x64 ; movzx eax, al);
                self.fs_dirty();
                self.put(rd, RAX);
            }
            // fcvt.s.d, fcvt.d.s (exact).
            0x08 => {
                let Some(dynamic) = nearest.filter(|_| rs2 == 1 - fmt as u8) else {
                    return false;
                };
                self.frm_nearest(dynamic, slow);
                self.load_f(0, rs1, !single, slow);
                if single {
                    self.inexact_begin();
                    dynasm!(self.ops ; .arch x64 ; cvtsd2ss xmm0, xmm0);
                    self.result_f(true, slow);
                    self.inexact_end();
                } else {
                    dynasm!(self.ops ; .arch x64 ; cvtss2sd xmm0, xmm0);
                    self.result_f(false, slow);
                }
                self.store_f(rd, single);
            }
            // fcvt.w.fmt, fcvt.l.fmt, rounding to nearest or truncating.
            0x18 if rs2 == 0 || rs2 == 2 => {
                let truncate = f3 == 1;
                let Some(dynamic) = (if truncate { Some(false) } else { nearest }) else {
                    return false;
                };
                self.frm_nearest(dynamic, slow);
                self.load_f(0, rs1, single, slow);
                self.inexact_begin();
                match (rs2 == 2, single, truncate) {
                    (false, false, false) => dynasm!(self.ops ; .arch x64 ; cvtsd2si eax, xmm0),
                    (false, false, true) => dynasm!(self.ops ; .arch x64 ; cvttsd2si eax, xmm0),
                    (false, true, false) => dynasm!(self.ops ; .arch x64 ; cvtss2si eax, xmm0),
                    (false, true, true) => dynasm!(self.ops ; .arch x64 ; cvttss2si eax, xmm0),
                    (true, false, false) => dynasm!(self.ops ; .arch x64 ; cvtsd2si rax, xmm0),
                    (true, false, true) => dynasm!(self.ops ; .arch x64 ; cvttsd2si rax, xmm0),
                    (true, true, false) => dynasm!(self.ops ; .arch x64 ; cvtss2si rax, xmm0),
                    (true, true, true) => dynasm!(self.ops ; .arch x64 ; cvttss2si rax, xmm0),
                }
                // x86's "integer indefinite": NaN, out of range (or the
                // most negative value itself).
                if rs2 == 2 {
                    dynasm!(self.ops
                        ; .arch x64
                        ; mov rcx, QWORD i64::MIN
                        ; cmp rax, rcx
                        ; je =>slow
                    );
                } else {
                    dynasm!(self.ops
                        ; .arch x64
                        ; cmp eax, i32::MIN
                        ; je =>slow
                        ; movsxd rax, eax
                    );
                }
                self.inexact_end();
                self.fs_dirty();
                self.put(rd, RAX);
            }
            // fcvt.fmt.w, fcvt.fmt.wu, fcvt.fmt.l, fcvt.fmt.lu: every
            // result finite (zero is +0, as the guest's).
            0x1a if rs2 < 4 => {
                let Some(dynamic) = nearest else {
                    return false;
                };
                self.frm_nearest(dynamic, slow);
                let x = self.src(rs1, RAX);
                match rs2 {
                    1 => dynasm!(self.ops ; .arch x64 ; mov eax, Rd(x)),
                    3 => dynasm!(self.ops ; .arch x64 ; test Rq(x), Rq(x) ; js =>slow),
                    _ => {}
                }
                let x = if rs2 == 1 { RAX } else { x };
                // From 32 bits to double is exact.
                let exact = !single && rs2 < 2;
                if !exact {
                    self.inexact_begin();
                }
                match (rs2 == 0, single) {
                    (true, false) => dynasm!(self.ops ; .arch x64 ; cvtsi2sd xmm0, Rd(x)),
                    (true, true) => dynasm!(self.ops ; .arch x64 ; cvtsi2ss xmm0, Rd(x)),
                    (false, false) => dynasm!(self.ops ; .arch x64 ; cvtsi2sd xmm0, Rq(x)),
                    (false, true) => dynasm!(self.ops ; .arch x64 ; cvtsi2ss xmm0, Rq(x)),
                }
                if !exact {
                    self.inexact_end();
                }
                if single {
                    dynasm!(self.ops ; .arch x64 ; movd eax, xmm0);
                } else {
                    dynasm!(self.ops ; .arch x64 ; movq rax, xmm0);
                }
                self.store_f(rd, single);
            }
            // fclass of a normal number (glibc's isinf, isnan and
            // fpclassify use it): bit 1 negative, bit 6 positive; no FP
            // state written. The other classes take the slow path.
            0x1c if f3 == 1 && rs2 == 0 => {
                let a = F_REL + 8 * rs1 as i32;
                if single {
                    self.check_boxed(rs1, slow);
                    dynasm!(self.ops
                        ; .arch x64
                        ; mov eax, DWORD [rdi + a]
                        ; mov ecx, eax
                        ; shr ecx, 23
                        ; and ecx, 0xff
                        ; dec ecx
                        ; cmp ecx, 0xfd
                        ; ja =>slow
                        ; shr eax, 31
                    );
                } else {
                    dynasm!(self.ops
                        ; .arch x64
                        ; mov rax, QWORD [rdi + a]
                        ; mov rcx, rax
                        ; shr rcx, 52
                        ; and ecx, 0x7ff
                        ; dec ecx
                        ; cmp ecx, 0x7fd
                        ; ja =>slow
                        ; shr rax, 63
                    );
                }
                // 64 >> (5 * sign).
                dynasm!(self.ops
                    ; .arch x64
                    ; lea ecx, [rax + rax * 4]
                    ; mov eax, 64
                    ; shr eax, cl
                );
                self.put(rd, RAX);
            }
            // fmv.x.w (sign-extended), fmv.x.d: no FP state written.
            0x1c if f3 == 0 && rs2 == 0 => {
                let a = F_REL + 8 * rs1 as i32;
                if single {
                    dynasm!(self.ops ; .arch x64 ; movsxd rax, DWORD [rdi + a]);
                } else {
                    dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rdi + a]);
                }
                self.put(rd, RAX);
            }
            // fmv.w.x (NaN-boxed), fmv.d.x.
            0x1e if f3 == 0 && rs2 == 0 => {
                self.get(RAX, rs1);
                if single {
                    dynasm!(self.ops ; .arch x64 ; mov eax, eax);
                }
                self.store_f(rd, single);
            }
            _ => return false,
        }
        true
    }

    /// Goes to `slow` unless the rounding mode is round to nearest even:
    /// when `dynamic`, frm's (a static one was checked at translation).
    fn frm_nearest(&mut self, dynamic: bool, slow: DynamicLabel) {
        if dynamic {
            dynasm!(self.ops ; .arch x64 ; cmp BYTE [rdi + FRM_REL], 0 ; jne =>slow);
        }
    }

    /// To `slow` unless f register `r` holds a NaN-boxed single (upper half
    /// all ones; anything else reads as the canonical NaN).
    fn check_boxed(&mut self, r: u8, slow: DynamicLabel) {
        dynasm!(self.ops
            ; .arch x64
            ; cmp DWORD [rdi + F_REL + 8 * r as i32 + 4], -1
            ; jne =>slow
        );
    }

    /// xmm`x` := f register `r`; single precision: its low 32 bits, after
    /// checking it is NaN-boxed (else to `slow`).
    fn load_f(&mut self, x: u8, r: u8, single: bool, slow: DynamicLabel) {
        let a = F_REL + 8 * r as i32;
        if single {
            self.check_boxed(r, slow);
            dynasm!(self.ops ; .arch x64 ; movd Rx(x), DWORD [rdi + a]);
        } else {
            dynasm!(self.ops ; .arch x64 ; movq Rx(x), QWORD [rdi + a]);
        }
    }

    /// The host's flags := f registers `rs1` and `rs2` compared (CF: less,
    /// ZF: equal); to `slow` if unordered (a NaN).
    fn compare_f(&mut self, rs1: u8, rs2: u8, single: bool, slow: DynamicLabel) {
        self.load_f(0, rs1, single, slow);
        self.load_f(1, rs2, single, slow);
        if single {
            dynasm!(self.ops ; .arch x64 ; ucomiss xmm0, xmm1);
        } else {
            dynasm!(self.ops ; .arch x64 ; ucomisd xmm0, xmm1);
        }
        dynasm!(self.ops ; .arch x64 ; jp =>slow);
    }

    /// rax := xmm0's result bits; to `slow` unless its biased exponent is
    /// between 2 and the largest finite one (see `fp_inline`).
    fn result_f(&mut self, single: bool, slow: DynamicLabel) {
        if single {
            dynasm!(self.ops
                ; .arch x64
                ; movd eax, xmm0
                ; mov ecx, eax
                ; shr ecx, 23
                ; and ecx, 0xff
                ; sub ecx, 2
                ; cmp ecx, 0xfc
                ; ja =>slow
            );
        } else {
            dynasm!(self.ops
                ; .arch x64
                ; movq rax, xmm0
                ; mov rcx, rax
                ; shr rcx, 52
                ; and ecx, 0x7ff
                ; sub ecx, 2
                ; cmp ecx, 0x7fc
                ; ja =>slow
            );
        }
    }

    /// Before an operation whose inexact flag counts: MXCSR's flags
    /// cleared, unless fflags has NX already.
    fn inexact_begin(&mut self) {
        dynasm!(self.ops
            ; .arch x64
            ; test BYTE [rdi + FFLAGS_REL], 1
            ; jnz >accrued
            ; ldmxcsr DWORD [rsi + CTX_MXCSR_DEFAULT]
            ; accrued:
        );
    }

    /// After it, once it is known to go on inline: x86's inexact flag
    /// (PE) into fflags' NX.
    fn inexact_end(&mut self) {
        dynasm!(self.ops
            ; .arch x64
            ; test BYTE [rdi + FFLAGS_REL], 1
            ; jnz >accrued
            ; stmxcsr DWORD [rsi + CTX_MXCSR]
            ; test BYTE [rsi + CTX_MXCSR], 0x20
            ; jz >accrued
            ; or BYTE [rdi + FFLAGS_REL], 1
            ; accrued:
        );
    }

    /// f register `rd` := rax (its low 32 bits NaN-boxed for single
    /// precision); FS dirty.
    fn store_f(&mut self, rd: u8, single: bool) {
        if single {
            dynasm!(self.ops
                ; .arch x64
                ; mov rcx, QWORD -0x1_0000_0000
                ; or rax, rcx
            );
        }
        dynasm!(self.ops ; .arch x64 ; mov QWORD [rdi + F_REL + 8 * rd as i32], rax);
        self.fs_dirty();
    }

    /// mstatus.FS := dirty (and SD), as the interpreter marks it.
    fn fs_dirty(&mut self) {
        dynasm!(self.ops
            ; .arch x64
            ; mov rcx, QWORD (MSTATUS_FS_DIRTY | MSTATUS_SD) as i64
            ; or QWORD [rdi + MSTATUS_REL], rcx
        );
    }

    /// Before a call from translated code into Rust: of the pool, r8-r10
    /// are caller-saved, so those holding guest registers in this block
    /// are pushed (and the stack aligned for the call); rdi and rsi come
    /// back from the frame (see `assemble`). The arguments are set after
    /// this.
    fn save_for_call(&mut self) -> Saved {
        let regs: Vec<u8> = [8u8, 9, 10].into_iter().filter(|&h| self.loc.contains(&Loc::Host(h))).collect();
        for &r in &regs {
            dynasm!(self.ops ; .arch x64 ; push Rq(r));
        }
        let saved = Saved { regs };
        if saved.pad() {
            dynasm!(self.ops ; .arch x64 ; sub rsp, 8);
        }
        saved
    }

    /// Calls `f` and restores what `save_for_call` saved, and rdi and rsi
    /// from the frame; its result is in rax.
    fn call_and_restore(&mut self, f: *const (), saved: Saved) {
        dynasm!(self.ops ; .arch x64 ; mov rax, QWORD f as i64 ; call rax);
        if saved.pad() {
            dynasm!(self.ops ; .arch x64 ; add rsp, 8);
        }
        for &r in saved.regs.iter().rev() {
            dynasm!(self.ops ; .arch x64 ; pop Rq(r));
        }
        dynasm!(self.ops
            ; .arch x64
            ; mov rsi, QWORD [rsp + FRAME_RSI]
            ; mov rdi, QWORD [rsp + FRAME_RDI]
        );
    }

    /// SC or AMO `k` (see `General::ScAmo`). Nothing here reads or writes
    /// the register file or changes what the block keeps in host
    /// registers: the helper sees only the state's reservation and RAM.
    fn sc_amo(&mut self, k: usize, d: &Inst) {
        let size = if (d.insn >> 12) & 7 == 2 { 4 } else { 8 };
        let resume = self.stub(k);
        // Misaligned: the interpreter raises the misaligned fault.
        let a = self.src(d.rs1, R11);
        dynasm!(self.ops ; .arch x64 ; test Rq(a), DWORD size - 1 ; jnz =>resume);
        // rdx := the RAM offset, on a store TLB hit (aligned, so the
        // lookup's test for an access across the page never fails).
        self.tlb_lookup(d.rs1, 0, size, CTX_STORE_TLB, resume);
        self.get(RAX, d.rs2);
        // Arguments: the state, RAM, the offset (in rdx), the instruction,
        // rs2's value.
        let saved = self.save_for_call();
        dynasm!(self.ops
            ; .arch x64
            ; mov r8, rax
            ; mov rsi, QWORD [rsi + CTX_RAM]
            ; sub rdi, X_OFF
            ; mov ecx, d.insn as i32
        );
        self.call_and_restore(amo_helper as *const (), saved);
        self.put(d.rd, RAX);
    }

    /// An access to fflags, frm or fcsr (see `General::FpCsr`), as the
    /// general executor's `system` makes it: FS off is illegal (left to
    /// the interpreter at this instruction); the old value goes to rd; a
    /// csrrw, or a csrrs/csrrc whose source is not x0 (or a zero
    /// immediate), writes the new value's bits of the field and marks FS
    /// dirty. None of them can trap once FS is on (the three are
    /// read-write at every privilege level), and nothing a block depends
    /// on changes.
    fn fp_csr(&mut self, k: usize, d: &Inst) {
        let i = d.insn;
        let f3 = (i >> 12) & 7;
        let csr = (i >> 20) as u16;
        let uimm = ((i >> 15) & 31) as i32;
        let write = f3 & 3 == 1 || uimm != 0;
        let resume = self.stub(k);
        dynasm!(self.ops
            ; .arch x64
            ; test QWORD [rdi + MSTATUS_REL], MSTATUS_FS as i32
            ; jz =>resume
        );
        // rcx := the source, read before rd is written (rd may be rs1).
        if write {
            if f3 >= 5 {
                dynasm!(self.ops ; .arch x64 ; mov ecx, uimm);
            } else {
                self.get(RCX, d.rs1);
            }
        }
        // rax := the old value.
        match csr {
            FFLAGS => dynasm!(self.ops ; .arch x64 ; movzx eax, BYTE [rdi + FFLAGS_REL]),
            FRM => dynasm!(self.ops ; .arch x64 ; movzx eax, BYTE [rdi + FRM_REL]),
            _ => dynasm!(self.ops
                ; .arch x64
                ; movzx eax, BYTE [rdi + FRM_REL]
                ; shl eax, 5
                ; movzx edx, BYTE [rdi + FFLAGS_REL]
                ; or eax, edx
            ),
        }
        if write {
            // rdx := the value written: the source, or the old value with
            // its bits set or cleared.
            match f3 & 3 {
                1 => dynasm!(self.ops ; .arch x64 ; mov rdx, rcx),
                2 => dynasm!(self.ops ; .arch x64 ; mov rdx, rax ; or rdx, rcx),
                _ => dynasm!(self.ops ; .arch x64 ; mov rdx, rcx ; not rdx ; and rdx, rax),
            }
            match csr {
                FFLAGS => dynasm!(self.ops
                    ; .arch x64
                    ; and edx, 0x1f
                    ; mov BYTE [rdi + FFLAGS_REL], dl
                ),
                FRM => dynasm!(self.ops
                    ; .arch x64
                    ; and edx, 7
                    ; mov BYTE [rdi + FRM_REL], dl
                ),
                _ => dynasm!(self.ops
                    ; .arch x64
                    ; mov ecx, edx
                    ; and ecx, 0x1f
                    ; mov BYTE [rdi + FFLAGS_REL], cl
                    ; shr edx, 5
                    ; and edx, 7
                    ; mov BYTE [rdi + FRM_REL], dl
                ),
            }
            self.fs_dirty();
        }
        self.put(d.rd, RAX);
    }

    /// flw, fld, fsw, fsd: the integer loads' and stores' TLB fast paths,
    /// after the check the interpreter makes first (FS off: illegal, which
    /// the interpreter raises); a load marks FS dirty, as the interpreter's.
    fn fp_load_store(&mut self, k: usize, d: &crate::block::Inst) {
        let double = (d.insn >> 12) & 7 == 3;
        let size = if double { 8 } else { 4 };
        let i = d.insn as i32;
        let resume = self.stub(k);
        dynasm!(self.ops
            ; .arch x64
            ; test QWORD [rdi + MSTATUS_REL], MSTATUS_FS as i32
            ; jz =>resume
        );
        if d.op == Op::Fload {
            self.tlb_lookup(d.rs1, i >> 20, size, CTX_LOAD_TLB, resume);
            dynasm!(self.ops ; .arch x64 ; add rdx, QWORD [rsi + CTX_RAM]);
            if double {
                dynasm!(self.ops ; .arch x64 ; mov rax, QWORD [rdx]);
            } else {
                // NaN-boxed.
                dynasm!(self.ops
                    ; .arch x64
                    ; mov eax, DWORD [rdx]
                    ; mov rcx, QWORD -0x1_0000_0000
                    ; or rax, rcx
                );
            }
            dynasm!(self.ops
                ; .arch x64
                ; mov QWORD [rdi + F_REL + 8 * d.rd as i32], rax
            );
            self.fs_dirty();
        } else {
            let imm = ((i >> 25) << 5) | ((i >> 7) & 31);
            self.tlb_lookup(d.rs1, imm, size, CTX_STORE_TLB, resume);
            dynasm!(self.ops
                ; .arch x64
                ; mov rcx, QWORD [rsi + CTX_RAM]
                ; add rcx, rdx
                ; mov rax, QWORD [rdi + F_REL + 8 * d.rs2 as i32]
            );
            if double {
                dynasm!(self.ops ; .arch x64 ; mov QWORD [rcx], rax);
            } else {
                dynasm!(self.ops ; .arch x64 ; mov DWORD [rcx], eax);
            }
        }
    }

    /// cbo.zero (Zicboz), as the interpreter's fast path does it: the
    /// enable (menvcfg.CBZE, and senvcfg.CBZE in U-mode), then the store
    /// TLB; the 64 bytes of the block are in the entry's page. Everything
    /// else goes back to the interpreter at this instruction: a TLB miss,
    /// an enable off (illegal there, or M-mode, which needs none and is
    /// left to the interpreter for being rare). Like a store, it cannot
    /// reach the block's own bytes (see the module's comment).
    fn cbo_zero(&mut self, k: usize, d: &crate::block::Inst) {
        let resume = self.stub(k);
        let cbze = ENVCFG_CBZE as u8 as i8;
        dynasm!(self.ops
            ; .arch x64
            ; test BYTE [rdi + MENVCFG_REL], cbze
            ; jz =>resume
            // U-mode (0) needs senvcfg's too; S and M menvcfg's alone.
            // The privilege level is the low two bits of the fetch tag's
            // (the address space's context is above them).
            ; test BYTE [rsi + CTX_FETCH_PRV], 3
            ; jnz >enabled
            ; test BYTE [rdi + SENVCFG_REL], cbze
            ; jz =>resume
            ; enabled:
        );
        // The byte at rs1: its page's entry covers the whole block.
        self.tlb_lookup(d.rs1, 0, 1, CTX_STORE_TLB, resume);
        // rdx: the RAM offset of the block (rs1's, less rs1's offset in
        // the block, which r11 holds); rcx: its host address.
        dynasm!(self.ops
            ; .arch x64
            ; and r11d, (CBO_BLOCK_BYTES - 1) as i32
            ; sub rdx, r11
            ; mov rcx, QWORD [rsi + CTX_RAM]
            ; add rcx, rdx
            ; xor eax, eax
        );
        for q in 0..(CBO_BLOCK_BYTES / 8) as i32 {
            dynasm!(self.ops ; .arch x64 ; mov QWORD [rcx + 8 * q], rax);
        }
    }

    /// Division with RISC-V's results for a zero divisor (all ones, or the
    /// dividend for a remainder) and for MIN / -1 (MIN, remainder 0),
    /// where x86 would fault.
    fn div(&mut self, op: Op, rd: u8, rs1: u8, rs2: u8) {
        use Op::*;
        self.get(RAX, rs1);
        self.get(RCX, rs2);
        let rem = matches!(op, Rem | Remu | Remw | Remuw);
        match op {
            Div | Rem => {
                dynasm!(self.ops
                    ; .arch x64
                    ; test rcx, rcx
                    ; jz >zero
                    ; cmp rcx, -1
                    ; jne >divide
                );
                // x / -1 = -x (wrapping: MIN stays MIN); x % -1 = 0.
                if rem {
                    dynasm!(self.ops ; .arch x64 ; xor eax, eax);
                } else {
                    dynasm!(self.ops ; .arch x64 ; neg rax);
                }
                dynasm!(self.ops ; .arch x64 ; jmp >done ; divide: ; cqo ; idiv rcx);
            }
            Divu | Remu => {
                dynasm!(self.ops ; .arch x64 ; test rcx, rcx ; jz >zero ; xor edx, edx ; div rcx);
            }
            Divw | Remw => {
                dynasm!(self.ops
                    ; .arch x64
                    ; test ecx, ecx
                    ; jz >zero
                    ; cmp ecx, -1
                    ; jne >divide
                );
                if rem {
                    dynasm!(self.ops ; .arch x64 ; xor eax, eax);
                } else {
                    dynasm!(self.ops ; .arch x64 ; neg eax);
                }
                dynasm!(self.ops ; .arch x64 ; jmp >done ; divide: ; cdq ; idiv ecx);
            }
            _ => {
                dynasm!(self.ops ; .arch x64 ; test ecx, ecx ; jz >zero ; xor edx, edx ; div ecx);
            }
        }
        if rem {
            dynasm!(self.ops ; .arch x64 ; mov rax, rdx);
        }
        dynasm!(self.ops ; .arch x64 ; jmp >done ; zero:);
        // Division by zero: all ones; a remainder is the dividend, already
        // in rax.
        if !rem {
            dynasm!(self.ops ; .arch x64 ; mov rax, -1);
        }
        dynasm!(self.ops ; .arch x64 ; done:);
        if matches!(op, Divw | Divuw | Remw | Remuw) {
            dynasm!(self.ops ; .arch x64 ; movsxd rax, eax);
        }
        self.put(rd, RAX);
    }

    /// rdx := the host address of load (`kind` 0) or store (1) `k`, a
    /// `size`-byte access at rs1 + imm, less the offset returned: its
    /// group's first access checks the TLB for the group's span and keeps
    /// the span's address, the others take it (see `Group`); an access in
    /// no group checks its own bytes. A miss leaves at `k`.
    fn access_address(&mut self, k: usize, rs1: u8, imm: i32, size: i32, kind: usize) -> i32 {
        let tlb = [CTX_LOAD_TLB, CTX_STORE_TLB][kind];
        let kept = CTX_GROUP + 8 * kind as i32;
        match self.groups[k] {
            Some(g) if !g.first => {
                dynasm!(self.ops ; .arch x64 ; mov rdx, QWORD [rsi + kept]);
                imm - g.lo
            }
            Some(g) => {
                let miss = self.stub(k);
                self.tlb_lookup(rs1, g.lo, g.hi - g.lo, tlb, miss);
                dynasm!(self.ops
                    ; .arch x64
                    ; add rdx, QWORD [rsi + CTX_RAM]
                    ; mov QWORD [rsi + kept], rdx
                );
                imm - g.lo
            }
            None => {
                let miss = self.stub(k);
                self.tlb_lookup(rs1, imm, size, tlb, miss);
                dynasm!(self.ops ; .arch x64 ; add rdx, QWORD [rsi + CTX_RAM]);
                0
            }
        }
    }

    /// The inlined TLB hit test of a `size`-byte access at rs1 + imm: on a
    /// hit rdx is the RAM offset, else it jumps to `miss`. r11 is left
    /// holding the address; clobbers rcx.
    fn tlb_lookup(&mut self, rs1: u8, imm: i32, size: i32, tlb: i32, miss: DynamicLabel) {
        match self.loc[rs1 as usize] {
            Loc::Host(h) if imm != 0 => dynasm!(self.ops ; .arch x64 ; lea r11, [Rq(h) + imm]),
            _ => {
                self.get(R11, rs1);
                if imm != 0 {
                    dynasm!(self.ops ; .arch x64 ; add r11, DWORD imm);
                }
            }
        }
        dynasm!(self.ops
            ; .arch x64
            // The entry: tlb[(vaddr >> 12) % TLB_SIZE], 16 bytes each, its
            // offset in the table taken from the address in one shift.
            ; mov rcx, r11
            ; shr rcx, 12 - 4
            ; and ecx, ((TLB_SIZE - 1) << 4) as i32
            ; add rcx, QWORD [rsi + tlb]
        );
        // The tag: the page and the privilege level. Taken from the
        // access's last byte, so that one running into the next page fails
        // the compare (the entry is the first byte's page's) and takes the
        // slow path, which splits it.
        if size > 1 {
            dynasm!(self.ops ; .arch x64 ; lea rdx, [r11 + size - 1]);
        } else {
            dynasm!(self.ops ; .arch x64 ; mov rdx, r11);
        }
        dynasm!(self.ops
            ; .arch x64
            ; and rdx, -4096
            ; or rdx, QWORD [rsi + CTX_PRV]
            ; cmp rdx, QWORD [rcx + TLB_TAG]
            ; jne =>miss
            ; mov rdx, QWORD [rcx + TLB_ADDEND]
            ; add rdx, r11
        );
    }
}

#[cfg(test)]
mod tests {
    /// Only a fence ordering stores before loads needs the host's barrier
    /// (Linux's smp_mb, `fence rw,rw`); its acquire and release fences
    /// (`fence r,rw`, `fence rw,w`), `fence.tso` and `fence.i` do not.
    #[test]
    fn only_a_store_to_load_fence_needs_a_barrier() {
        let fence = |pred: u32, succ: u32| pred << 24 | succ << 20 | 0x0f;
        const R: u32 = 2;
        const W: u32 = 1;
        assert!(super::fence_needs_barrier(fence(R | W, R | W)));
        assert!(super::fence_needs_barrier(fence(W, R)));
        assert!(!super::fence_needs_barrier(fence(R, R | W)));
        assert!(!super::fence_needs_barrier(fence(R | W, W)));
        assert!(!super::fence_needs_barrier(0x8330_000f), "fence.tso");
        assert!(!super::fence_needs_barrier(0x0000_100f), "fence.i");
    }
}
