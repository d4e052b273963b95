//! The interpreter: runs blocks of decoded instructions from the block
//! cache, with TLB fast paths for fetch, load and store, and a general
//! executor for the instructions without a fast path. Interrupts are
//! checked only at slice entry and after instructions that can change
//! them, never per instruction.

use crate::block::{slot_of, Block, BlockCache};
use crate::csr;
use crate::decode::{decode, Op};
use crate::ext::{Extensions, CBO_BLOCK_BYTES};
use crate::fpu::{self, Rm};
use crate::hart::{Exit, Hart, HartState, PrivilegeMode};
use crate::jit::{self, JitCtx, JitFn};
use crate::mmu::{index, tag};
use crate::trap::{self, Access, Trap};
use crate::Bus;
use ftvm_memory::GuestRam;
use std::borrow::Cow;

/// What the block loop does after a block.
enum Then {
    /// On to the block at the new pc.
    Next,
    /// Back to the caller of `execute_block` with this.
    Leave(Option<Exit>),
}

/// What the general executor's instruction asks of the loop.
enum Flow {
    Next,
    /// Interrupt enables or pending bits may have changed.
    Reeval,
    /// The instruction touched a device.
    Device,
    /// WFI with nothing pending.
    Idle,
}

const BOX32: u64 = 0xffff_ffff_0000_0000;

#[inline(always)]
fn rd(i: u32) -> usize {
    ((i >> 7) & 31) as usize
}
#[inline(always)]
fn rs1(i: u32) -> usize {
    ((i >> 15) & 31) as usize
}
#[inline(always)]
fn rs2(i: u32) -> usize {
    ((i >> 20) & 31) as usize
}
#[inline(always)]
fn rs3(i: u32) -> usize {
    (i >> 27) as usize
}
#[inline(always)]
fn funct3(i: u32) -> u32 {
    (i >> 12) & 7
}
#[inline(always)]
fn imm_i(i: u32) -> u64 {
    ((i as i32) >> 20) as i64 as u64
}
#[inline(always)]
fn imm_s(i: u32) -> u64 {
    ((((i as i32) >> 25) << 5) | ((i >> 7) & 31) as i32) as i64 as u64
}
#[inline(always)]
fn sext32(v: u64) -> u64 {
    v as i32 as i64 as u64
}

/// RISC-V division never traps: x/0 is all ones, MIN/-1 overflows to MIN.
#[inline(always)]
fn div_signed(a: u64, b: u64) -> u64 {
    if b == 0 {
        u64::MAX
    } else {
        (a as i64).wrapping_div(b as i64) as u64
    }
}

/// x%0 is x, MIN%-1 is 0.
#[inline(always)]
fn rem_signed(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        (a as i64).wrapping_rem(b as i64) as u64
    }
}

/// orc.b: each byte all ones if any of its bits is set, else zero.
#[inline(always)]
pub(crate) fn orc_b(x: u64) -> u64 {
    // A byte's top bit, set if any bit of the byte is: the low seven bits
    // plus 0x7f carry into it, and the top bit itself is or-ed in.
    let low = 0x7f7f_7f7f_7f7f_7f7f;
    let top = (((x & low) + low) | x) & !low;
    // 0x80 -> 0xff in each byte.
    (top >> 7) * 0xff
}

#[inline(always)]
fn unbox32(v: u64) -> u32 {
    if v & BOX32 == BOX32 {
        v as u32
    } else {
        fpu::F32_CANONICAL_NAN
    }
}

impl Hart {
    #[inline(always)]
    fn set_x(&mut self, r: usize, v: u64) {
        self.s.x[r] = v;
        self.s.x[0] = 0;
    }

    /// A load that hits the load TLB; `None` when the slow path must do it.
    #[inline(always)]
    fn load_fast(&self, ram: &GuestRam, vaddr: u64, size: u8) -> Option<u64> {
        let e = self.tlb.load[index(vaddr)];
        if e.tag == tag(vaddr, self.data_tag_prv()) && (vaddr & 0xfff) <= 0x1000 - size as u64 {
            return Some(ram.load_le(e.offset(vaddr), size));
        }
        None
    }

    #[inline(always)]
    fn load(&mut self, ram: &GuestRam, bus: &mut dyn Bus, vaddr: u64, size: u8, dev: &mut bool) -> Result<u64, Trap> {
        match self.load_fast(ram, vaddr, size) {
            Some(v) => Ok(v),
            None => self.load_slow(ram, bus, vaddr, size, dev),
        }
    }

    /// The slow path of a load operation of the block executor: the value
    /// extended as `op` asks, and whether a device answered.
    #[cold]
    #[inline(never)]
    fn load_op_slow(&mut self, ram: &GuestRam, bus: &mut dyn Bus, op: Op, vaddr: u64) -> Result<(u64, bool), Trap> {
        let size = match op {
            Op::Lb | Op::Lbu => 1,
            Op::Lh | Op::Lhu => 2,
            Op::Lw | Op::Lwu => 4,
            _ => 8,
        };
        let mut dev = false;
        let raw = self.load_slow(ram, bus, vaddr, size, &mut dev)?;
        let v = match op {
            Op::Lb => raw as i8 as i64 as u64,
            Op::Lh => raw as i16 as i64 as u64,
            Op::Lw => raw as i32 as i64 as u64,
            _ => raw,
        };
        Ok((v, dev))
    }

    /// A store that hits the store TLB, done at once; returns the RAM
    /// offset written, or `None` when the slow path must do it.
    #[inline(always)]
    fn store_fast(&mut self, ram: &GuestRam, vaddr: u64, size: u8, value: u64) -> Option<usize> {
        let e = self.tlb.store[index(vaddr)];
        if e.tag == tag(vaddr, self.data_tag_prv()) && (vaddr & 0xfff) <= 0x1000 - size as u64 {
            let off = e.offset(vaddr);
            ram.store_le_untracked(off, size, value);
            return Some(off);
        }
        None
    }

    #[inline(always)]
    fn store(
        &mut self,
        ram: &GuestRam,
        bus: &mut dyn Bus,
        vaddr: u64,
        size: u8,
        value: u64,
        dev: &mut bool,
    ) -> Result<(), Trap> {
        if self.store_fast(ram, vaddr, size, value).is_some() {
            return Ok(());
        }
        self.store_slow(ram, bus, vaddr, size, value, dev)
    }

    /// Whether the privilege level running may execute the cache-block
    /// operations that `enable` of menvcfg and senvcfg allows (CBZE,
    /// CBCFE, or CBIE, which allows cbo.inval when not 00): M-mode always,
    /// S-mode if menvcfg allows them, U-mode if both do. Without the
    /// hypervisor extension there is no virtual-instruction case.
    #[inline(always)]
    fn cbo_enabled(&self, enable: u64) -> bool {
        match self.s.prv {
            PrivilegeMode::Machine => true,
            PrivilegeMode::Supervisor => self.s.menvcfg & enable != 0,
            // Both CBIE fields' allowed values (01, 11) have the low bit.
            PrivilegeMode::User => self.s.menvcfg & self.s.senvcfg & enable != 0,
        }
    }

    /// `cbo.zero` at `vaddr` through the store TLB: the block zeroed, and
    /// its RAM offset; `None` when the slow path must do it. A hit needs no
    /// dirty bookkeeping, as for a store: the page was marked dirty when it
    /// entered the store TLB.
    #[inline(always)]
    fn cbo_zero_fast(&mut self, ram: &GuestRam, vaddr: u64) -> Option<usize> {
        let e = self.tlb.store[index(vaddr)];
        if e.tag == tag(vaddr, self.data_tag_prv()) {
            // A block lies within its page: the entry covers it whole.
            let off = e.offset(vaddr & !(CBO_BLOCK_BYTES - 1));
            ram.zero_untracked(off, CBO_BLOCK_BYTES as usize);
            return Some(off);
        }
        None
    }

    /// `cbo.zero` at `vaddr` translated as a store (A and D set, the page
    /// marked dirty as it enters the store TLB). Its faults report `vaddr`,
    /// the address the instruction was given, not the block's start (the
    /// CMO spec, as the Sail model does). A block outside RAM is a store
    /// access fault: no device here takes a block of zeros.
    #[inline(never)]
    fn cbo_zero_slow(&mut self, ram: &GuestRam, vaddr: u64) -> Result<(), Trap> {
        let start = vaddr & !(CBO_BLOCK_BYTES - 1);
        let pa = self.translate_fill(ram, start, Access::Store).map_err(|t| Trap::new(t.cause, vaddr))?;
        let off = ram.offset_of(pa, CBO_BLOCK_BYTES).ok_or(Access::Store.access_fault(vaddr))?;
        // translate_fill marked the page dirty as it entered the store TLB.
        ram.zero_untracked(off, CBO_BLOCK_BYTES as usize);
        Ok(())
    }

    /// cbo.clean, cbo.flush and cbo.inval: RAM here has no caches in front
    /// of it (one thread runs every hart, devices read RAM itself), so
    /// each only checks that its block may be accessed. As the Sail model
    /// does, that is a load's translation (the A bit set), whose faults
    /// are reported as the store faults the CMO spec gives, with the
    /// instruction's address. With no PMP enforced, a physical address
    /// raises nothing.
    #[inline(never)]
    fn cbo_manage(&mut self, ram: &GuestRam, vaddr: u64) -> Result<(), Trap> {
        match self.translate_fill(ram, vaddr, Access::Load) {
            Ok(_) => Ok(()),
            Err(t) if t.cause == trap::LOAD_PAGE_FAULT => Err(Access::Store.page_fault(vaddr)),
            Err(_) => Err(Access::Store.access_fault(vaddr)),
        }
    }

    /// The cache-block operations without a fast path (MISC-MEM, funct3
    /// 2): the management ones, and any `cbo.zero` the decoder left to the
    /// general executor. Those of an extension the hart lacks, reserved
    /// encodings (rd not x0, other funct12 values) and those the enables
    /// forbid are illegal.
    #[inline(never)]
    fn cbo(&mut self, ram: &GuestRam, i: u32, raw: u32, next: u64) -> Result<Flow, Trap> {
        let ext = self.s.ext;
        let enable = match i >> 20 {
            _ if rd(i) != 0 => return Err(Trap::illegal(raw)),
            0 if ext.has(Extensions::ZICBOM) => csr::ENVCFG_CBIE,
            1 | 2 if ext.has(Extensions::ZICBOM) => csr::ENVCFG_CBCFE,
            4 if ext.has(Extensions::ZICBOZ) => csr::ENVCFG_CBZE,
            _ => return Err(Trap::illegal(raw)),
        };
        if !self.cbo_enabled(enable) {
            return Err(Trap::illegal(raw));
        }
        let vaddr = self.s.x[rs1(i)];
        if enable == csr::ENVCFG_CBZE {
            self.cbo_zero_slow(ram, vaddr)?;
        } else {
            // cbo.inval with CBIE = 01 is a flush, and a flush is this.
            self.cbo_manage(ram, vaddr)?;
        }
        self.s.pc = next;
        Ok(Flow::Next)
    }

    /// Run blocks of instructions until the budget is used or something
    /// needs the outer loop. `None` means "check interrupts and come back".
    pub(crate) fn execute_block(
        &mut self,
        ram: &GuestRam,
        bus: &mut dyn Bus,
        budget: u64,
        steps: &mut u64,
    ) -> Option<Exit> {
        // The executor borrows a block from the cache while it changes the
        // hart, so the cache leaves the hart for the duration (a pointer
        // swap, not a copy).
        let mut cache = std::mem::take(&mut self.blocks);
        let exit = loop {
            if *steps >= budget {
                break Some(Exit::Budget);
            }
            let pc = self.s.pc;
            let then = match self.fetch_offset(pc) {
                Some(off) => match cache.get(ram, &mut self.tlb, off, self.s.ext) {
                    // Translated code only runs whole blocks: the budget
                    // must not end inside it.
                    Some(block) => match block.jit {
                        Some(code) if budget - *steps >= block.jit_len as u64 => {
                            self.run_translated(ram, bus, &cache, code, pc, budget, steps)
                        }
                        _ => self.run_block(ram, bus, block, pc, budget, steps, 0),
                    },
                    None => self.step_uncached(ram, bus, budget, steps),
                },
                None => self.step_uncached(ram, bus, budget, steps),
            };
            if let Then::Leave(exit) = then {
                break exit;
            }
        };
        self.blocks = cache;
        exit
    }

    /// The RAM offset of the instruction at `pc` if its page is in the
    /// fetch TLB.
    #[inline(always)]
    fn fetch_offset(&mut self, pc: u64) -> Option<usize> {
        let t = tag(pc, self.fetch_tag_prv());
        if t != self.fetch_tag {
            let e = self.tlb.fetch[index(pc)];
            if e.tag != t {
                return None;
            }
            self.fetch_tag = t;
            self.fetch_addend = e.addend;
        }
        Some(self.fetch_addend.wrapping_add(pc as usize))
    }

    /// One instruction fetched through the MMU's slow path: the first on a
    /// page the fetch TLB does not hold yet (this fills it), one that
    /// crosses a page, or one outside RAM (the fetch faults).
    #[inline(never)]
    fn step_uncached(&mut self, ram: &GuestRam, bus: &mut dyn Bus, budget: u64, steps: &mut u64) -> Then {
        let pc = self.s.pc;
        let half = |h: &mut Hart, ram: &GuestRam, va: u64| -> Result<u32, Trap> {
            let pa = h.translate_fill(ram, va, Access::Fetch)?;
            ram.read_u16(pa).map(|v| v as u32).map_err(|_| Access::Fetch.access_fault(va))
        };
        // Only a 32-bit instruction may touch the next page.
        let raw = half(self, ram, pc).and_then(|lo| {
            if lo & 3 != 3 {
                Ok(lo)
            } else {
                half(self, ram, pc.wrapping_add(2)).map(|hi| lo | hi << 16)
            }
        });
        match raw {
            Ok(raw) => self.run_block(ram, bus, &Block::single(&decode(raw, self.s.ext)), pc, budget, steps, 0),
            Err(t) => self.trap_at(0, pc, t, steps),
        }
    }

    /// Runs the translation `code` of the block at `pc`, which fits in the
    /// budget, and the blocks it goes on to. What the code could not do (a
    /// TLB miss, an instruction it does not handle) the interpreter
    /// finishes from where the code stopped, as if it had run the block
    /// from the start. Not inlined: the interpreter's loop stays as small
    /// as without translation.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn run_translated(
        &mut self,
        ram: &GuestRam,
        bus: &mut dyn Bus,
        cache: &BlockCache,
        code: JitFn,
        pc: u64,
        budget: u64,
        steps: &mut u64,
    ) -> Then {
        let left = budget - *steps;
        let mut ctx = JitCtx {
            pc,
            left,
            ram: ram.host_ptr(),
            load_tlb: self.tlb.load.as_ptr(),
            store_tlb: self.tlb.store.as_ptr(),
            prv: self.data_tag_prv(),
            fetch_tlb: self.tlb.fetch.as_ptr(),
            fetch_prv: self.fetch_tag_prv(),
            fetch_tag: self.fetch_tag,
            fetch_addend: self.fetch_addend,
            code: ram.code_states(),
            mxcsr_default: jit::MXCSR_DEFAULT,
            mxcsr: 0,
            fp_calls: 0,
            group: [0; 2],
        };
        // The x registers' address, derived from the whole state's: the
        // code also reaches the f registers and mstatus from it, and hands
        // the state to `jit::fp_helper`.
        let state: *mut HartState = &mut self.s;
        // SAFETY: a place projection of a pointer just made from a
        // reference, not dereferenced.
        let regs = unsafe { std::ptr::addr_of_mut!((*state).x) }.cast::<u64>();
        // SAFETY: `code` is the translation of the block (the block cache
        // keeps the two together and drops the code with the decoding).
        // It reads and writes the hart's state (registers, f registers,
        // mstatus; fflags through `fp_compute`) through the first pointer
        // and the context behind the second, both live and not otherwise
        // borrowed for the call; through the context it reads the load and
        // store TLBs and, at the RAM offsets their entries give (pages
        // inside RAM, accesses checked not to cross them), guest RAM, as
        // the interpreter's fast paths do; it reads the fetch TLB and the
        // block cache's table, which is borrowed shared for the call, and
        // RAM's code states (one `u64` a page, for the pages of blocks in
        // the table).
        let r = unsafe { code(regs, &mut ctx) };
        self.jit_stats.calls += 1;
        self.jit_stats.fp_calls += ctx.fp_calls;
        // The fetch cache as the jumps through the fetch TLB left it.
        self.fetch_tag = ctx.fetch_tag;
        self.fetch_addend = ctx.fetch_addend;
        // What the blocks retired whole, and where they leave off.
        self.retire(left - ctx.left, ctx.pc, steps);
        if r & 0xff == jit::END {
            return Then::Next;
        }
        let head = cache.slot((r >> 16 & 0xff_ffff) as usize);
        if r & 0xff == jit::STALE {
            crate::block::stale(head);
        }
        let k = (r >> 8 & 0xff) as usize;
        // The translation ran on from the block in the slot into `part`
        // blocks after it: those retired whole, and the one it stopped in
        // is decoded as it was when translated (the page's code state is
        // unchanged), from its own slot if that holds it still.
        let mut block = Cow::Borrowed(head);
        let mut pc = ctx.pc;
        let mut before = 0;
        let part = r >> jit::RESUME_PART;
        if part > 0 {
            self.jit_stats.later_resumes += 1;
        }
        for _ in 0..part {
            let off = block.off + block.bytes;
            pc = pc.wrapping_add(block.bytes as u64);
            before += block.n;
            self.retire(block.n as u64, pc, steps);
            let s = cache.slot(slot_of(off));
            block = if s.off == off && s.n != 0 && s.code == ram.code_state(off) {
                Cow::Borrowed(s)
            } else {
                Cow::Owned(Block::decode_at(ram.as_slice(), off, self.s.ext).expect("decoded when translated"))
            };
        }
        if before + k == head.jit_n && !matches!(block.insts[k].op, Op::Other | Op::Illegal) {
            self.jit_stats.handoffs += 1;
        }
        self.run_block(ram, bus, &block, pc, budget, steps, k)
    }

    /// Executes `block`, which starts at `pc`, or as much of it as the
    /// budget allows, from instruction `start` on (those before it were
    /// executed by translated code but not yet counted). Instructions
    /// before the last do not touch `pc`, `steps` or `instret` (what the
    /// block executed is added up once at its end); any path out of the
    /// middle (a trap, a device access, the general executor) brings them
    /// up to date first.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn run_block(
        &mut self,
        ram: &GuestRam,
        bus: &mut dyn Bus,
        block: &Block,
        pc: u64,
        budget: u64,
        steps: &mut u64,
        start: usize,
    ) -> Then {
        use Op::*;
        let limit = (budget - *steps).min(block.n as u64) as usize;
        for (j, &d) in block.insts[start..limit].iter().enumerate() {
            let i = start + j;
            // The instruction's own pc, for the operations that need it.
            let at = || pc.wrapping_add(d.at as u64);
            let x1 = self.s.x[(d.rs1 & 31) as usize];
            let x2 = self.s.x[(d.rs2 & 31) as usize];
            let rd = (d.rd & 31) as usize;
            let imm = d.imm as i64 as u64;
            // Instructions up to and including this one, once it retires.
            let done = i as u64 + 1;
            let v = match d.op {
                Lui => imm,
                Auipc => at().wrapping_add(imm),
                Jal => {
                    self.set_x(rd, at().wrapping_add(d.len()));
                    return self.retire(done, at().wrapping_add(imm), steps);
                }
                Jalr => {
                    let target = x1.wrapping_add(imm) & !1;
                    self.set_x(rd, at().wrapping_add(d.len()));
                    return self.retire(done, target, steps);
                }
                // One arm per condition: a nested match would dispatch twice.
                Beq => return self.branch(x1 == x2, at(), imm, d.len(), done, steps),
                Bne => return self.branch(x1 != x2, at(), imm, d.len(), done, steps),
                Blt => return self.branch((x1 as i64) < (x2 as i64), at(), imm, d.len(), done, steps),
                Bge => return self.branch((x1 as i64) >= (x2 as i64), at(), imm, d.len(), done, steps),
                Bltu => return self.branch(x1 < x2, at(), imm, d.len(), done, steps),
                Bgeu => return self.branch(x1 >= x2, at(), imm, d.len(), done, steps),
                Lb | Lh | Lw | Ld | Lbu | Lhu | Lwu => {
                    let addr = x1.wrapping_add(imm);
                    // One arm per size, so each inlined TLB hit reads its
                    // size directly.
                    let hit = match d.op {
                        Lb => self.load_fast(ram, addr, 1).map(|v| v as i8 as i64 as u64),
                        Lh => self.load_fast(ram, addr, 2).map(|v| v as i16 as i64 as u64),
                        Lw => self.load_fast(ram, addr, 4).map(|v| v as i32 as i64 as u64),
                        Ld => self.load_fast(ram, addr, 8),
                        Lbu => self.load_fast(ram, addr, 1),
                        Lhu => self.load_fast(ram, addr, 2),
                        _ => self.load_fast(ram, addr, 4),
                    };
                    if let Some(v) = hit {
                        self.set_x(rd, v);
                        continue;
                    }
                    self.progress = *steps + done;
                    match self.load_op_slow(ram, bus, d.op, addr) {
                        Ok((v, dev)) => {
                            self.set_x(rd, v);
                            if dev {
                                self.retire(done, at().wrapping_add(d.len()), steps);
                                return Then::Leave(Some(Exit::Device));
                            }
                        }
                        Err(t) => return self.trap_at(i, at(), t, steps),
                    }
                    continue;
                }
                Sb | Sh | Sw | Sd => {
                    let addr = x1.wrapping_add(imm);
                    // One arm per size, as for loads.
                    let (size, hit) = match d.op {
                        Sb => (1, self.store_fast(ram, addr, 1, x2)),
                        Sh => (2, self.store_fast(ram, addr, 2, x2)),
                        Sw => (4, self.store_fast(ram, addr, 4, x2)),
                        _ => (8, self.store_fast(ram, addr, 8, x2)),
                    };
                    match hit {
                        // A store into the block itself: what follows
                        // must be fetched again.
                        Some(off) if off.wrapping_sub(block.off) < block.bytes => {
                            return self.retire(done, at().wrapping_add(d.len()), steps);
                        }
                        Some(_) => {}
                        None => {
                            let mut dev = false;
                            self.progress = *steps + done;
                            if let Err(t) = self.store_slow(ram, bus, addr, size, x2, &mut dev) {
                                return self.trap_at(i, at(), t, steps);
                            }
                            // The slow path may have written anything
                            // (page-table bits, a device's DMA): end here.
                            self.retire(done, at().wrapping_add(d.len()), steps);
                            return if dev { Then::Leave(Some(Exit::Device)) } else { Then::Next };
                        }
                    }
                    continue;
                }
                Other | Illegal => {
                    // Always the last of its block: bring the counters up
                    // to date for the general executor, which may read
                    // them, trap, or leave the slice.
                    self.retire(i as u64, at(), steps);
                    *steps += 1;
                    self.progress = *steps;
                    let result = if d.op == Illegal {
                        Err(Trap::illegal(d.imm as u32))
                    } else {
                        self.execute(ram, bus, d.insn, d.len(), d.imm as u32)
                    };
                    return match result {
                        Ok(flow) => {
                            self.s.instret = self.s.instret.wrapping_add(1);
                            match flow {
                                Flow::Next => Then::Next,
                                Flow::Reeval => Then::Leave(None),
                                Flow::Device => Then::Leave(Some(Exit::Device)),
                                Flow::Idle => {
                                    self.s.wfi = true;
                                    Then::Leave(None)
                                }
                            }
                        }
                        Err(t) => {
                            self.take_trap(t.cause, t.tval);
                            Then::Next
                        }
                    };
                }
                Nop => {
                    continue;
                }
                CboZero => {
                    // Illegal as the general executor finds it (decoding
                    // checked the extension and the encoding).
                    if !self.cbo_enabled(csr::ENVCFG_CBZE) {
                        return self.trap_at(i, at(), Trap::illegal(d.imm as u32), steps);
                    }
                    match self.cbo_zero_fast(ram, x1) {
                        // Into the block itself, as for the stores above.
                        Some(off) if off < block.off + block.bytes && block.off < off + CBO_BLOCK_BYTES as usize => {
                            return self.retire(done, at().wrapping_add(d.len()), steps);
                        }
                        Some(_) => {}
                        None => {
                            if let Err(t) = self.cbo_zero_slow(ram, x1) {
                                return self.trap_at(i, at(), t, steps);
                            }
                            // As after a store's slow path: page-table bits
                            // (or the block itself) may have changed.
                            return self.retire(done, at().wrapping_add(d.len()), steps);
                        }
                    }
                    continue;
                }
                Fp => match self.s.fp_compute(d.insn, d.imm as u32) {
                    Ok(()) => continue,
                    Err(t) => return self.trap_at(i, at(), t, steps),
                },
                Fload | Fstore => {
                    // As the general executor's `float` does, in the
                    // block: the same checks in the same order, and the
                    // loads' and stores' paths of the operations above.
                    if self.s.mstatus & csr::MSTATUS_FS == 0 {
                        return self.trap_at(i, at(), Trap::illegal(d.imm as u32), steps);
                    }
                    let double = funct3(d.insn) == 3;
                    let size = if double { 8 } else { 4 };
                    if d.op == Fload {
                        let addr = x1.wrapping_add(imm_i(d.insn));
                        let mut dev = false;
                        let v = match self.load_fast(ram, addr, size) {
                            Some(v) => v,
                            None => {
                                self.progress = *steps + done;
                                match self.load_slow(ram, bus, addr, size, &mut dev) {
                                    Ok(v) => v,
                                    Err(t) => return self.trap_at(i, at(), t, steps),
                                }
                            }
                        };
                        self.s.f[(d.rd & 31) as usize] = if double { v } else { BOX32 | v as u32 as u64 };
                        self.mark_fs_dirty();
                        if dev {
                            self.retire(done, at().wrapping_add(d.len()), steps);
                            return Then::Leave(Some(Exit::Device));
                        }
                        continue;
                    }
                    let addr = x1.wrapping_add(imm_s(d.insn));
                    let v = self.s.f[(d.rs2 & 31) as usize];
                    let v = if double { v } else { v & 0xffff_ffff };
                    match self.store_fast(ram, addr, size, v) {
                        // Into the block itself, as for the stores above.
                        Some(off) if off.wrapping_sub(block.off) < block.bytes => {
                            return self.retire(done, at().wrapping_add(d.len()), steps);
                        }
                        Some(_) => {}
                        None => {
                            let mut dev = false;
                            self.progress = *steps + done;
                            if let Err(t) = self.store_slow(ram, bus, addr, size, v, &mut dev) {
                                return self.trap_at(i, at(), t, steps);
                            }
                            self.retire(done, at().wrapping_add(d.len()), steps);
                            return if dev { Then::Leave(Some(Exit::Device)) } else { Then::Next };
                        }
                    }
                    continue;
                }
                Addi => x1.wrapping_add(imm),
                Slti => ((x1 as i64) < (imm as i64)) as u64,
                Sltiu => (x1 < imm) as u64,
                Xori => x1 ^ imm,
                Ori => x1 | imm,
                Andi => x1 & imm,
                Slli => x1 << (imm & 63),
                Srli => x1 >> (imm & 63),
                Srai => ((x1 as i64) >> (imm & 63)) as u64,
                Addiw => sext32(x1.wrapping_add(imm)),
                Slliw => sext32(((x1 as u32) << (imm & 31)) as u64),
                Srliw => sext32(((x1 as u32) >> (imm & 31)) as u64),
                Sraiw => ((x1 as i32) >> (imm & 31)) as i64 as u64,
                Add => x1.wrapping_add(x2),
                Sub => x1.wrapping_sub(x2),
                Sll => x1 << (x2 & 63),
                Slt => ((x1 as i64) < (x2 as i64)) as u64,
                Sltu => (x1 < x2) as u64,
                Xor => x1 ^ x2,
                Srl => x1 >> (x2 & 63),
                Sra => ((x1 as i64) >> (x2 & 63)) as u64,
                Or => x1 | x2,
                And => x1 & x2,
                Addw => sext32((x1 as u32).wrapping_add(x2 as u32) as u64),
                Subw => sext32((x1 as u32).wrapping_sub(x2 as u32) as u64),
                Sllw => sext32(((x1 as u32) << (x2 & 31)) as u64),
                Srlw => sext32(((x1 as u32) >> (x2 & 31)) as u64),
                Sraw => ((x1 as i32) >> (x2 & 31)) as i64 as u64,
                Mul => x1.wrapping_mul(x2),
                Mulh => (((x1 as i64 as i128) * (x2 as i64 as i128)) >> 64) as u64,
                Mulhsu => (((x1 as i64 as i128) * (x2 as i128)) >> 64) as u64,
                Mulhu => (((x1 as u128) * (x2 as u128)) >> 64) as u64,
                Div => div_signed(x1, x2),
                Divu => x1.checked_div(x2).unwrap_or(u64::MAX),
                Rem => rem_signed(x1, x2),
                Remu => x1.checked_rem(x2).unwrap_or(x1),
                Mulw => sext32((x1 as u32).wrapping_mul(x2 as u32) as u64),
                Divw => sext32(div_signed(x1 as i32 as i64 as u64, x2 as i32 as i64 as u64)),
                Divuw => sext32((x1 as u32).checked_div(x2 as u32).unwrap_or(u32::MAX) as u64),
                Remw => sext32(rem_signed(x1 as i32 as i64 as u64, x2 as i32 as i64 as u64)),
                Remuw => sext32((x1 as u32).checked_rem(x2 as u32).unwrap_or(x1 as u32) as u64),
                Sh1add => (x1 << 1).wrapping_add(x2),
                Sh2add => (x1 << 2).wrapping_add(x2),
                Sh3add => (x1 << 3).wrapping_add(x2),
                AddUw => (x1 as u32 as u64).wrapping_add(x2),
                Sh1addUw => ((x1 as u32 as u64) << 1).wrapping_add(x2),
                Sh2addUw => ((x1 as u32 as u64) << 2).wrapping_add(x2),
                Sh3addUw => ((x1 as u32 as u64) << 3).wrapping_add(x2),
                SlliUw => (x1 as u32 as u64) << (imm & 63),
                Andn => x1 & !x2,
                Orn => x1 | !x2,
                Xnor => !(x1 ^ x2),
                Clz => x1.leading_zeros() as u64,
                Ctz => x1.trailing_zeros() as u64,
                Cpop => x1.count_ones() as u64,
                Clzw => (x1 as u32).leading_zeros() as u64,
                Ctzw => (x1 as u32).trailing_zeros() as u64,
                Cpopw => (x1 as u32).count_ones() as u64,
                Max => (x1 as i64).max(x2 as i64) as u64,
                Maxu => x1.max(x2),
                Min => (x1 as i64).min(x2 as i64) as u64,
                Minu => x1.min(x2),
                SextB => x1 as i8 as i64 as u64,
                SextH => x1 as i16 as i64 as u64,
                ZextH => x1 as u16 as u64,
                Rol => x1.rotate_left((x2 & 63) as u32),
                Ror => x1.rotate_right((x2 & 63) as u32),
                Rori => x1.rotate_right((imm & 63) as u32),
                Rolw => sext32((x1 as u32).rotate_left((x2 & 31) as u32) as u64),
                Rorw => sext32((x1 as u32).rotate_right((x2 & 31) as u32) as u64),
                Roriw => sext32((x1 as u32).rotate_right((imm & 31) as u32) as u64),
                OrcB => orc_b(x1),
                Rev8 => x1.swap_bytes(),
                Bclr => x1 & !(1 << (x2 & 63)),
                Bclri => x1 & !(1 << (imm & 63)),
                Bext => (x1 >> (x2 & 63)) & 1,
                Bexti => (x1 >> (imm & 63)) & 1,
                Binv => x1 ^ (1 << (x2 & 63)),
                Binvi => x1 ^ (1 << (imm & 63)),
                Bset => x1 | (1 << (x2 & 63)),
                Bseti => x1 | (1 << (imm & 63)),
                CzeroEqz => {
                    if x2 == 0 {
                        0
                    } else {
                        x1
                    }
                }
                CzeroNez => {
                    if x2 != 0 {
                        0
                    } else {
                        x1
                    }
                }
            };
            // Operations that reach here never have rd = 0 (the block
            // cache made those `Nop`), so x0 needs no reset.
            debug_assert!(rd != 0);
            self.s.x[rd] = v;
        }
        self.retire(limit as u64, pc.wrapping_add(block.insts[limit - 1].next as u64), steps)
    }

    /// A conditional branch at `pc`, the last of its block, retires.
    #[inline(always)]
    fn branch(&mut self, taken: bool, pc: u64, offset: u64, len: u64, n: u64, steps: &mut u64) -> Then {
        let next = if taken { pc.wrapping_add(offset) } else { pc.wrapping_add(len) };
        self.retire(n, next, steps)
    }

    /// Counts `n` instructions retired and moves to `next`.
    #[inline(always)]
    fn retire(&mut self, n: u64, next: u64, steps: &mut u64) -> Then {
        *steps += n;
        self.s.instret = self.s.instret.wrapping_add(n);
        self.s.pc = next;
        Then::Next
    }

    /// Instruction `i` of a block (or the single one fetched uncached), at
    /// `pc`, trapped: the ones before it retired, the trap itself is a step.
    #[cold]
    fn trap_at(&mut self, i: usize, pc: u64, t: Trap, steps: &mut u64) -> Then {
        self.retire(i as u64, pc, steps);
        *steps += 1;
        self.take_trap(t.cause, t.tval);
        Then::Next
    }

    /// Instructions without a fast path: fences, cache-block management,
    /// system, atomics, and the floating-point loads and stores of the
    /// widths without F or D.
    /// Encodings of fast-path opcodes that reach here are the invalid
    /// ones.
    #[inline(never)]
    fn execute(&mut self, ram: &GuestRam, bus: &mut dyn Bus, i: u32, len: u64, raw: u32) -> Result<Flow, Trap> {
        let next = self.s.pc.wrapping_add(len);
        match i & 0x7f {
            0x0f => match funct3(i) {
                // FENCE: on one thread with the other harts, memory is
                // always coherent; beside them on threads of their own, the
                // host's order (TSO) keeps all but a store before a load,
                // which needs a full barrier. FENCE.I: a block is reused
                // only while RAM holds the bits it was decoded from (with
                // parallel harts, see `Tlb::purge_and_wait`), so none is
                // ever stale.
                0 | 1 => {
                    if self.s.parallel && crate::jit::fence_needs_barrier(i) {
                        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                    }
                    self.s.pc = next;
                    Ok(Flow::Next)
                }
                2 => self.cbo(ram, i, raw, next),
                _ => Err(Trap::illegal(raw)),
            },
            0x73 => self.system(bus, i, raw, next),
            0x2f => self.atomic(ram, i, raw, next),
            0x07 | 0x27 | 0x43 | 0x47 | 0x4b | 0x4f | 0x53 => self.float(ram, bus, i, raw, next),
            _ => Err(Trap::illegal(raw)),
        }
    }

    #[inline(never)]
    fn system(&mut self, bus: &mut dyn Bus, i: u32, raw: u32, next: u64) -> Result<Flow, Trap> {
        use crate::csr::*;
        let f3 = funct3(i);
        if f3 == 0 {
            match i {
                0x0000_0073 => {
                    let cause = match self.s.prv {
                        PrivilegeMode::User => trap::ECALL_FROM_U,
                        PrivilegeMode::Supervisor => trap::ECALL_FROM_S,
                        PrivilegeMode::Machine => trap::ECALL_FROM_M,
                    };
                    return Err(Trap::new(cause, 0));
                }
                0x0010_0073 => return Err(Trap::new(trap::BREAKPOINT, self.s.pc)),
                0x3020_0073 => {
                    if self.s.prv != PrivilegeMode::Machine {
                        return Err(Trap::illegal(raw));
                    }
                    let st = self.s.mstatus;
                    let mpp = PrivilegeMode::from_bits((st & MSTATUS_MPP) >> MSTATUS_MPP_SHIFT);
                    let mut nst = st & !(MSTATUS_MIE | MSTATUS_MPP);
                    if st & MSTATUS_MPIE != 0 {
                        nst |= MSTATUS_MIE;
                    }
                    nst |= MSTATUS_MPIE;
                    if mpp != PrivilegeMode::Machine {
                        nst &= !MSTATUS_MPRV;
                    }
                    self.s.mstatus = nst;
                    self.s.prv = mpp;
                    self.s.pc = self.s.mepc;
                    self.s.reservation = None;
                    self.mode_changed();
                    return Ok(Flow::Reeval);
                }
                0x1020_0073 => {
                    if self.s.prv == PrivilegeMode::User
                        || (self.s.prv == PrivilegeMode::Supervisor && self.s.mstatus & MSTATUS_TSR != 0)
                    {
                        return Err(Trap::illegal(raw));
                    }
                    let st = self.s.mstatus;
                    let spp = if st & MSTATUS_SPP != 0 { PrivilegeMode::Supervisor } else { PrivilegeMode::User };
                    let mut nst = st & !(MSTATUS_SIE | MSTATUS_SPP | MSTATUS_MPRV);
                    if st & MSTATUS_SPIE != 0 {
                        nst |= MSTATUS_SIE;
                    }
                    nst |= MSTATUS_SPIE;
                    self.s.mstatus = nst;
                    self.s.prv = spp;
                    self.s.pc = self.s.sepc;
                    self.s.reservation = None;
                    self.mode_changed();
                    return Ok(Flow::Reeval);
                }
                0x1050_0073 => {
                    if self.s.prv == PrivilegeMode::User
                        || (self.s.prv == PrivilegeMode::Supervisor && self.s.mstatus & MSTATUS_TW != 0)
                    {
                        return Err(Trap::illegal(raw));
                    }
                    self.s.pc = next;
                    return Ok(if self.wake_pending() { Flow::Next } else { Flow::Idle });
                }
                _ if i >> 25 == 0x09 && rd(i) == 0 => {
                    if self.s.prv == PrivilegeMode::User
                        || (self.s.prv == PrivilegeMode::Supervisor && self.s.mstatus & MSTATUS_TVM != 0)
                    {
                        return Err(Trap::illegal(raw));
                    }
                    // As the spec has it: rs1 x0 all addresses, rs2 x0 all
                    // address spaces, global mappings included; an ASID in
                    // rs2 spares the global ones and other ASIDs'.
                    let vaddr = (rs1(i) != 0).then(|| self.s.x[rs1(i)]);
                    match (vaddr, rs2(i)) {
                        (None, 0) => self.flush_tlb(),
                        (Some(v), 0) => self.flush_tlb_page(v),
                        (v, r) => self.flush_tlb_asid(v, self.s.x[r] as u16),
                    }
                    self.s.pc = next;
                    return Ok(Flow::Next);
                }
                _ => return Err(Trap::illegal(raw)),
            }
        }
        let csr = (i >> 20) as u16;
        let src = if f3 >= 5 { rs1(i) as u64 } else { self.s.x[rs1(i)] };
        // csrrs/csrrc with x0 (or a zero immediate) as the source do not write.
        let write = f3 & 3 == 1 || rs1(i) != 0;
        if f3 == 4 {
            return Err(Trap::illegal(raw));
        }
        // Our CSR reads have no side effects, so reading even when rd is x0
        // is harmless and performs the access checks a write also needs.
        let old = self.csr_read(csr, raw, bus)?;
        let mut effect = WriteEffect::None;
        if write {
            // The interrupt controller's SEIP line shows in reads of mip but
            // is not part of the value a csrrs/csrrc writes back: otherwise
            // firmware setting STIP would latch SEIP in software for good.
            let base = if csr == MIP { self.s.mip } else { old };
            let v = match f3 & 3 {
                1 => src,
                2 => base | src,
                _ => base & !src,
            };
            effect = self.csr_write(csr, v, raw)?;
        }
        self.set_x(rd(i), old);
        self.s.pc = next;
        match effect {
            WriteEffect::None => Ok(Flow::Next),
            WriteEffect::Interrupts => Ok(Flow::Reeval),
            WriteEffect::Translation => {
                self.flush_tlb();
                Ok(Flow::Reeval)
            }
            WriteEffect::AddressSpace => {
                self.switch_address_space();
                Ok(Flow::Reeval)
            }
            // The platform re-derives STIP and its next deadline at the
            // end of the slice, as after a store to mtimecmp.
            WriteEffect::Timer => Ok(Flow::Device),
        }
    }

    #[inline(never)]
    fn atomic(&mut self, ram: &GuestRam, i: u32, raw: u32, next: u64) -> Result<Flow, Trap> {
        let size: u8 = match funct3(i) {
            2 => 4,
            3 => 8,
            _ => return Err(Trap::illegal(raw)),
        };
        let addr = self.s.x[rs1(i)];
        let src = self.s.x[rs2(i)];
        let funct5 = i >> 27;
        let sext = |v: u64| if size == 4 { sext32(v) } else { v };
        match funct5 {
            0b00010 => {
                if rs2(i) != 0 {
                    return Err(Trap::illegal(raw));
                }
                if addr & (size as u64 - 1) != 0 {
                    return Err(Access::Load.misaligned(addr));
                }
                let pa = self.translate_fill(ram, addr, Access::Load)?;
                let off = ram.offset_of(pa, size as u64).ok_or(Access::Load.access_fault(addr))?;
                let v = ram.load_le(off, size);
                self.s.reservation = Some(off as u64);
                self.s.reserved_value = v;
                self.set_x(rd(i), sext(v));
            }
            _ => {
                let off = self.amo_offset(ram, addr, size)?;
                let v = self.s.sc_or_amo(ram.host_ptr(), off as u64, i, src).ok_or(Trap::illegal(raw))?;
                self.set_x(rd(i), v);
            }
        }
        self.s.pc = next;
        Ok(Flow::Next)
    }

    #[inline(never)]
    fn float(&mut self, ram: &GuestRam, bus: &mut dyn Bus, i: u32, raw: u32, next: u64) -> Result<Flow, Trap> {
        if self.s.mstatus & csr::MSTATUS_FS == 0 {
            return Err(Trap::illegal(raw));
        }
        let op = i & 0x7f;
        let mut dev = false;
        match op {
            0x07 => {
                let addr = self.s.x[rs1(i)].wrapping_add(imm_i(i));
                match funct3(i) {
                    2 => {
                        let v = self.load(ram, bus, addr, 4, &mut dev)?;
                        self.s.set_f32(rd(i), v as u32);
                    }
                    3 => self.s.f[rd(i)] = self.load(ram, bus, addr, 8, &mut dev)?,
                    _ => return Err(Trap::illegal(raw)),
                }
                self.mark_fs_dirty();
            }
            0x27 => {
                let addr = self.s.x[rs1(i)].wrapping_add(imm_s(i));
                let v = self.s.f[rs2(i)];
                match funct3(i) {
                    2 => self.store(ram, bus, addr, 4, v & 0xffff_ffff, &mut dev)?,
                    3 => self.store(ram, bus, addr, 8, v, &mut dev)?,
                    _ => return Err(Trap::illegal(raw)),
                }
            }
            _ => self.s.fp_compute(i, raw)?,
        }
        self.s.pc = next;
        Ok(if dev { Flow::Device } else { Flow::Next })
    }
}

impl HartState {
    /// An SC or an AMO (funct5 of `i`, .w or .d by its funct3) on the
    /// word at RAM offset `off` of the RAM at `ram`, already translated for
    /// a store and checked aligned: the memory and reservation effects,
    /// and what rd gets (an AMO's old value, sign-extended for .w; an SC's
    /// 0 on success). `None` for a funct5 that is neither (illegal), having
    /// changed nothing. The general executor's and translated code's
    /// (`jit::amo_helper`) one implementation, so the two cannot differ.
    ///
    /// The word is changed with the host's atomic instructions, so that
    /// harts on other host threads ([`HartState::parallel`]) neither split
    /// an AMO nor lose a store to it.
    pub(crate) fn sc_or_amo(&mut self, ram: *mut u8, off: u64, i: u32, src: u64) -> Option<u64> {
        use std::sync::atomic::{
            AtomicU32, AtomicU64,
            Ordering::{Relaxed, SeqCst},
        };
        let funct5 = i >> 27;
        let word4 = funct3(i) == 2;
        let new = |old: u64| -> Option<u64> {
            let (o, s) = if word4 { (old as i32 as i64, src as i32 as i64) } else { (old as i64, src as i64) };
            let (ou, su) = if word4 { (old as u32 as u64, src as u32 as u64) } else { (old, src) };
            Some(match funct5 {
                0b00001 => src,
                0b00000 => old.wrapping_add(src),
                0b00100 => old ^ src,
                0b01100 => old & src,
                0b01000 => old | src,
                0b10000 => o.min(s) as u64,
                0b10100 => o.max(s) as u64,
                0b11000 => ou.min(su),
                0b11100 => ou.max(su),
                _ => return None,
            })
        };
        if funct5 != 0b00011 && new(0).is_none() {
            return None;
        }
        let word = ram.wrapping_add(off as usize);
        let (w4, w8) = if word4 {
            // SAFETY: `ram + off` is an aligned word of the access's size in
            // guest RAM (the caller translated and checked it), and RAM's
            // words may be shared with other harts.
            (Some(unsafe { AtomicU32::from_ptr(word as *mut u32) }), None)
        } else {
            // SAFETY: as for the 4-byte word.
            (None, Some(unsafe { AtomicU64::from_ptr(word as *mut u64) }))
        };
        if funct5 == 0b00011 {
            let reserved = self.reservation == Some(off);
            self.reservation = None;
            // One thread: the reservation alone says (a store by another
            // hart cleared it when that hart's turn began). Parallel: the
            // word must also still hold what LR read.
            let ok = reserved
                && match (w4, w8, self.parallel) {
                    (Some(w), _, true) => {
                        w.compare_exchange(self.reserved_value as u32, src as u32, SeqCst, SeqCst).is_ok()
                    }
                    (_, Some(w), true) => w.compare_exchange(self.reserved_value, src, SeqCst, SeqCst).is_ok(),
                    (Some(w), _, false) => {
                        w.store(src as u32, Relaxed);
                        true
                    }
                    (_, Some(w), false) => {
                        w.store(src, Relaxed);
                        true
                    }
                    (None, None, _) => unreachable!(),
                };
            return Some((!ok) as u64);
        }
        // One compare-and-swap loop for all of them: on one thread it is
        // one locked instruction, and min/max have no single one anyway.
        Some(match (w4, w8) {
            (Some(w), _) => {
                let old = w.fetch_update(SeqCst, SeqCst, |v| new(v as u64).map(|n| n as u32)).unwrap_or_else(|v| v);
                sext32(old as u64)
            }
            (_, Some(w)) => w.fetch_update(SeqCst, SeqCst, new).unwrap_or_else(|v| v),
            (None, None) => unreachable!(),
        })
    }

    #[inline(always)]
    fn set_x(&mut self, r: usize, v: u64) {
        self.x[r] = v;
        self.x[0] = 0;
    }

    #[inline(always)]
    fn mark_fs_dirty(&mut self) {
        self.mstatus |= csr::MSTATUS_FS_DIRTY | csr::MSTATUS_SD;
    }

    fn rounding(&self, i: u32, raw: u32) -> Result<Rm, Trap> {
        let f = funct3(i);
        let f = if f == 7 { self.frm as u32 } else { f };
        Rm::from_bits(f).ok_or(Trap::illegal(raw))
    }

    #[inline]
    fn set_f32(&mut self, r: usize, v: u32) {
        self.f[r] = BOX32 | v as u64;
    }

    /// A floating-point computation: OP-FP or a fused multiply-add, at
    /// any place in a block (it reads and writes registers, fflags and
    /// mstatus.FS, nothing else), and from translated code. An `Err`
    /// leaves the state untouched: every check comes before any write.
    pub(crate) fn fp_compute(&mut self, i: u32, raw: u32) -> Result<(), Trap> {
        if self.mstatus & csr::MSTATUS_FS == 0 {
            return Err(Trap::illegal(raw));
        }
        let op = i & 0x7f;
        if op == 0x53 {
            return self.op_fp(i, raw);
        }
        match op {
            0x43 | 0x47 | 0x4b | 0x4f => {
                let rm = self.rounding(i, raw)?;
                let mut fl = 0u8;
                // fmsub negates the addend, fnmsub the product, fnmadd both;
                // flipping sign bits is exact, so one fused operation serves.
                let (neg_prod, neg_add) = match op {
                    0x43 => (false, false),
                    0x47 => (false, true),
                    0x4b => (true, false),
                    _ => (true, true),
                };
                match (i >> 25) & 3 {
                    0 => {
                        let mut a = unbox32(self.f[rs1(i)]);
                        let b = unbox32(self.f[rs2(i)]);
                        let mut c = unbox32(self.f[rs3(i)]);
                        if neg_prod {
                            a ^= 1 << 31;
                        }
                        if neg_add {
                            c ^= 1 << 31;
                        }
                        let r = fpu::f32_fma(a, b, c, rm, &mut fl);
                        self.set_f32(rd(i), r);
                    }
                    1 => {
                        let mut a = self.f[rs1(i)];
                        let b = self.f[rs2(i)];
                        let mut c = self.f[rs3(i)];
                        if neg_prod {
                            a ^= 1 << 63;
                        }
                        if neg_add {
                            c ^= 1 << 63;
                        }
                        self.f[rd(i)] = fpu::f64_fma(a, b, c, rm, &mut fl);
                    }
                    _ => return Err(Trap::illegal(raw)),
                }
                self.fflags |= fl;
                self.mark_fs_dirty();
            }
            _ => return Err(Trap::illegal(raw)),
        }
        Ok(())
    }

    fn op_fp(&mut self, i: u32, raw: u32) -> Result<(), Trap> {
        let funct7 = i >> 25;
        let fmt = funct7 & 3;
        if fmt > 1 {
            return Err(Trap::illegal(raw));
        }
        let double = fmt == 1;
        let (r1, r2, d) = (rs1(i), rs2(i), rd(i));
        let f3 = funct3(i);
        let mut fl = 0u8;
        let fa = self.f[r1];
        let fb = self.f[r2];
        let (a32, b32) = (unbox32(fa), unbox32(fb));
        match funct7 >> 2 {
            0x00..=0x03 => {
                let rm = self.rounding(i, raw)?;
                if double {
                    let f = [fpu::f64_add, fpu::f64_sub, fpu::f64_mul, fpu::f64_div][(funct7 >> 2) as usize];
                    self.f[d] = f(fa, fb, rm, &mut fl);
                } else {
                    let f = [fpu::f32_add, fpu::f32_sub, fpu::f32_mul, fpu::f32_div][(funct7 >> 2) as usize];
                    let r = f(a32, b32, rm, &mut fl);
                    self.set_f32(d, r);
                }
            }
            0x0b => {
                if r2 != 0 {
                    return Err(Trap::illegal(raw));
                }
                let rm = self.rounding(i, raw)?;
                if double {
                    self.f[d] = fpu::f64_sqrt(fa, rm, &mut fl);
                } else {
                    let r = fpu::f32_sqrt(a32, rm, &mut fl);
                    self.set_f32(d, r);
                }
            }
            0x04 => {
                if double {
                    let sign = match f3 {
                        0 => fb,
                        1 => !fb,
                        2 => fa ^ fb,
                        _ => return Err(Trap::illegal(raw)),
                    } & (1 << 63);
                    self.f[d] = (fa & !(1 << 63)) | sign;
                } else {
                    let sign = match f3 {
                        0 => b32,
                        1 => !b32,
                        2 => a32 ^ b32,
                        _ => return Err(Trap::illegal(raw)),
                    } & (1 << 31);
                    self.set_f32(d, (a32 & !(1 << 31)) | sign);
                }
            }
            0x05 => {
                if f3 > 1 {
                    return Err(Trap::illegal(raw));
                }
                if double {
                    self.f[d] = if f3 == 0 { fpu::f64_min(fa, fb, &mut fl) } else { fpu::f64_max(fa, fb, &mut fl) };
                } else {
                    let r = if f3 == 0 { fpu::f32_min(a32, b32, &mut fl) } else { fpu::f32_max(a32, b32, &mut fl) };
                    self.set_f32(d, r);
                }
            }
            0x08 => {
                let rm = self.rounding(i, raw)?;
                match (fmt, r2) {
                    (0, 1) => {
                        let r = fpu::f64_to_f32(fa, rm, &mut fl);
                        self.set_f32(d, r);
                    }
                    (1, 0) => self.f[d] = fpu::f32_to_f64(a32, &mut fl),
                    _ => return Err(Trap::illegal(raw)),
                }
            }
            0x14 => {
                let v = match (double, f3) {
                    (true, 2) => fpu::f64_eq(fa, fb, &mut fl),
                    (true, 1) => fpu::f64_lt(fa, fb, &mut fl),
                    (true, 0) => fpu::f64_le(fa, fb, &mut fl),
                    (false, 2) => fpu::f32_eq(a32, b32, &mut fl),
                    (false, 1) => fpu::f32_lt(a32, b32, &mut fl),
                    (false, 0) => fpu::f32_le(a32, b32, &mut fl),
                    _ => return Err(Trap::illegal(raw)),
                };
                self.set_x(d, v as u64);
            }
            0x18 => {
                let rm = self.rounding(i, raw)?;
                let v = match (double, r2) {
                    (false, 0) => fpu::f32_to_i32(a32, rm, &mut fl) as i64 as u64,
                    (false, 1) => fpu::f32_to_u32(a32, rm, &mut fl) as i32 as i64 as u64,
                    (false, 2) => fpu::f32_to_i64(a32, rm, &mut fl) as u64,
                    (false, 3) => fpu::f32_to_u64(a32, rm, &mut fl),
                    (true, 0) => fpu::f64_to_i32(fa, rm, &mut fl) as i64 as u64,
                    (true, 1) => fpu::f64_to_u32(fa, rm, &mut fl) as i32 as i64 as u64,
                    (true, 2) => fpu::f64_to_i64(fa, rm, &mut fl) as u64,
                    (true, 3) => fpu::f64_to_u64(fa, rm, &mut fl),
                    _ => return Err(Trap::illegal(raw)),
                };
                self.set_x(d, v);
            }
            0x1a => {
                let rm = self.rounding(i, raw)?;
                let x = self.x[r1];
                match (double, r2) {
                    (false, 0) => {
                        let r = fpu::i32_to_f32(x as i32, rm, &mut fl);
                        self.set_f32(d, r)
                    }
                    (false, 1) => {
                        let r = fpu::u32_to_f32(x as u32, rm, &mut fl);
                        self.set_f32(d, r)
                    }
                    (false, 2) => {
                        let r = fpu::i64_to_f32(x as i64, rm, &mut fl);
                        self.set_f32(d, r)
                    }
                    (false, 3) => {
                        let r = fpu::u64_to_f32(x, rm, &mut fl);
                        self.set_f32(d, r)
                    }
                    (true, 0) => self.f[d] = fpu::i32_to_f64(x as i32, rm, &mut fl),
                    (true, 1) => self.f[d] = fpu::u32_to_f64(x as u32, rm, &mut fl),
                    (true, 2) => self.f[d] = fpu::i64_to_f64(x as i64, rm, &mut fl),
                    (true, 3) => self.f[d] = fpu::u64_to_f64(x, rm, &mut fl),
                    _ => return Err(Trap::illegal(raw)),
                }
            }
            0x1c => {
                if r2 != 0 {
                    return Err(Trap::illegal(raw));
                }
                let v = match (double, f3) {
                    (false, 0) => fa as u32 as i32 as i64 as u64,
                    (true, 0) => fa,
                    (false, 1) => fpu::f32_classify(a32),
                    (true, 1) => fpu::f64_classify(fa),
                    _ => return Err(Trap::illegal(raw)),
                };
                self.set_x(d, v);
                // Moves and classification write no FP state.
                return Ok(());
            }
            0x1e => {
                if r2 != 0 || f3 != 0 {
                    return Err(Trap::illegal(raw));
                }
                let x = self.x[r1];
                if double {
                    self.f[d] = x;
                } else {
                    self.set_f32(d, x as u32);
                }
            }
            _ => return Err(Trap::illegal(raw)),
        }
        self.fflags |= fl;
        self.mark_fs_dirty();
        Ok(())
    }
}
