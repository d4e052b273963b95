//! One hart: architectural state, the translation caches, and the run loop
//! that executes a bounded slice of instructions.

use crate::block::BlockCache;
use crate::ext::Extensions;
use crate::mmu::Tlb;
use crate::trap;
use crate::Bus;
use ftvm_memory::GuestRam;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum PrivilegeMode {
    User = 0,
    Supervisor = 1,
    Machine = 3,
}

impl PrivilegeMode {
    pub fn from_bits(b: u64) -> PrivilegeMode {
        match b & 3 {
            0 => PrivilegeMode::User,
            1 => PrivilegeMode::Supervisor,
            _ => PrivilegeMode::Machine,
        }
    }
}

/// Why a slice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The step budget ran out.
    Budget,
    /// The hart executed WFI with nothing pending and is now idle.
    Idle,
    /// The last instruction touched a device (or changed interrupt masks):
    /// the board should re-evaluate interrupt lines before continuing.
    Device,
}

/// What wakes a hart that waits for an interrupt ([`Hart::wake_condition`]),
/// as it stands while the hart does not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeCondition {
    soft: u64,
    mie: u64,
    /// Its Sstc timer, if on (see [`Hart::stimecmp_deadline`]).
    pub stimecmp: Option<u64>,
}

impl WakeCondition {
    /// Whether the hart would wake with the platform's interrupt lines
    /// `lines` (as [`Hart::set_irq_lines`] would set them) at time `now`.
    pub fn wakes(&self, lines: u64, now: u64) -> bool {
        let stip = if self.stimecmp.is_some_and(|t| now >= t) { crate::csr::MIP_STIP } else { 0 };
        (self.soft | lines | stip) & self.mie != 0
    }
}

/// Architectural state of a hart, everything a snapshot must carry.
/// Caches (TLB, fetch page) are derived and rebuilt after a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HartState {
    pub id: u64,
    pub x: [u64; 32],
    pub f: [u64; 32],
    pub pc: u64,
    pub prv: PrivilegeMode,
    pub instret: u64,
    pub wfi: bool,
    pub reservation: Option<u64>,
    /// What LR read at the reserved word. Not saved: only a hart with
    /// [`HartState::parallel`] compares it, and such a hart's SC after a
    /// restore may fail (the spec lets any SC fail).
    pub reserved_value: u64,
    /// The hart runs beside others on their own host threads: its SC
    /// succeeds only if the reserved word still holds what LR read (the
    /// other harts' stores are not seen by the reservation), as QEMU's
    /// parallel harts do. Not saved: how a machine runs, not its state.
    pub parallel: bool,
    pub mstatus: u64,
    pub medeleg: u64,
    pub mideleg: u64,
    pub mie: u64,
    /// Software-writable pending bits (SSIP, STIP, SEIP).
    pub mip: u64,
    /// Pending bits driven by the platform (MSIP, MTIP, MEIP, SEIP).
    pub irq_lines: u64,
    pub mtvec: u64,
    pub mcounteren: u64,
    pub mcountinhibit: u64,
    pub mscratch: u64,
    pub mepc: u64,
    pub mcause: u64,
    pub mtval: u64,
    pub menvcfg: u64,
    pub stvec: u64,
    pub scounteren: u64,
    pub sscratch: u64,
    pub sepc: u64,
    pub scause: u64,
    pub stval: u64,
    pub satp: u64,
    pub senvcfg: u64,
    pub fflags: u8,
    pub frm: u8,
    pub pmpcfg: [u64; 2],
    pub pmpaddr: [u64; 16],
    pub tselect: u64,
    /// The optional extensions this hart implements (fixed when the
    /// machine is built, as misa is).
    pub ext: Extensions,
    /// Sstc's supervisor timer compare register.
    pub stimecmp: u64,
    /// `mcycle` minus `instret`: the cycle counter is defined from the
    /// instructions retired, but a write to either counter leaves the
    /// other running on.
    pub cycle_offset: u64,
}

/// What translated code did, for tests and measurements: nothing the
/// guest sees depends on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JitStats {
    /// Calls of translated code from the executor (not counting the blocks
    /// it went on to by itself).
    pub calls: u64,
    /// Returns from translated code to the interpreter at an instruction
    /// the translator left to it although the interpreter has a fast path
    /// for it (unlike the general executor's instructions, which end
    /// translated code by design): every one is a missing translation.
    pub handoffs: u64,
    /// Floating-point computations translated code left to the software
    /// FPU (`jit::fp_helper`): those without an inline fast path, and
    /// those whose fast path's checks sent them there.
    pub fp_calls: u64,
    /// Returns to the interpreter inside a later block of a translation
    /// that runs on from its own block into those after it (see
    /// `jit::translate`).
    pub later_resumes: u64,
}

pub struct Hart {
    pub s: HartState,
    pub(crate) tlb: Box<Tlb>,
    /// Tag of the page the fetch cache holds (see `mmu::tag`), or an
    /// impossible tag when empty.
    pub(crate) fetch_tag: u64,
    /// That page's entry's `TlbEntry::addend`.
    pub(crate) fetch_addend: usize,
    /// Steps executed so far in the current slice (see `Bus`).
    pub(crate) progress: u64,
    pub(crate) blocks: BlockCache,
    pub(crate) jit_stats: JitStats,
}

impl Hart {
    pub fn new(id: u64) -> Hart {
        let s = HartState {
            id,
            x: [0; 32],
            f: [0; 32],
            pc: 0x1000,
            prv: PrivilegeMode::Machine,
            instret: 0,
            wfi: false,
            reservation: None,
            reserved_value: 0,
            parallel: false,
            mstatus: crate::csr::MSTATUS_UXL_SXL,
            medeleg: 0,
            mideleg: 0,
            mie: 0,
            mip: 0,
            irq_lines: 0,
            mtvec: 0,
            mcounteren: 0,
            mcountinhibit: 0,
            mscratch: 0,
            mepc: 0,
            mcause: 0,
            mtval: 0,
            menvcfg: 0,
            stvec: 0,
            scounteren: 0,
            sscratch: 0,
            sepc: 0,
            scause: 0,
            stval: 0,
            satp: 0,
            senvcfg: 0,
            fflags: 0,
            frm: 0,
            pmpcfg: [0; 2],
            pmpaddr: [0; 16],
            tselect: 0,
            ext: Extensions::ALL,
            // No supervisor timer until the kernel sets one.
            stimecmp: u64::MAX,
            cycle_offset: 0,
        };
        Hart {
            s,
            tlb: Box::new(Tlb::new()),
            fetch_tag: crate::mmu::NO_TAG,
            fetch_addend: 0,
            progress: 0,
            blocks: BlockCache::new(),
            jit_stats: JitStats::default(),
        }
    }

    pub fn from_state(s: HartState) -> Hart {
        let mut h = Hart::new(s.id);
        h.s = s;
        // The TLB's address space is satp's (`Tlb::enter`).
        h.flush_tlb();
        h
    }

    /// Translates blocks of guest code to host code once entered `hot`
    /// times, or never if `hot` is 0 (the default comes from `FTVM_JIT`,
    /// see the block cache). Whatever the setting, the hart executes
    /// exactly the same instructions with the same results: this is for
    /// comparing and testing.
    pub fn set_jit(&mut self, hot: u32) {
        self.blocks.set_jit(hot);
    }

    /// Translates as for a host without LZCNT, TZCNT and POPCNT (true) or
    /// with what this host has (false, the default): for testing the
    /// translations made for older hosts on a newer one.
    pub fn set_jit_portable(&mut self, portable: bool) {
        self.blocks.set_jit_portable(portable);
    }

    /// What translated code has done so far.
    pub fn jit_stats(&self) -> JitStats {
        self.jit_stats
    }

    /// How many blocks have host code now.
    pub fn translated_blocks(&self) -> usize {
        self.blocks.translated()
    }

    /// Drop every cached translation (after restore, a change of satp's
    /// mode or of MXR, `sfence.vma` without operands).
    pub fn flush_tlb(&mut self) {
        self.tlb.flush((self.s.satp >> 44) as u16);
        self.fetch_tag = crate::mmu::NO_TAG;
    }

    /// Drop the cached translations of the page mapping `vaddr`
    /// (`sfence.vma` with an address; see `Tlb::flush_page`).
    pub(crate) fn flush_tlb_page(&mut self, vaddr: u64) {
        self.tlb.flush_page(vaddr);
        self.fetch_tag = crate::mmu::NO_TAG;
    }

    /// Drop the cached translations of address space `asid`, or only of
    /// its page mapping `vaddr` (`sfence.vma` with an ASID).
    pub(crate) fn flush_tlb_asid(&mut self, vaddr: Option<u64>, asid: u16) {
        match vaddr {
            Some(v) => self.tlb.flush_page_asid(v, asid),
            None => self.tlb.flush_asid(asid),
        }
        self.fetch_tag = crate::mmu::NO_TAG;
    }

    /// satp names another address space in the same mode: its cached
    /// translations (and the global ones) serve from now on, the others
    /// are kept for when it comes back.
    pub(crate) fn switch_address_space(&mut self) {
        self.tlb.enter((self.s.satp >> 44) as u16);
        self.mode_changed();
    }

    /// Drop cached store translations. The store TLB marks a page dirty when
    /// it caches it, so after the board resets the dirty map it must call
    /// this, or later stores through old entries would go unrecorded.
    pub fn flush_store_tlb(&mut self) {
        self.tlb.flush_stores();
    }

    /// Set the interrupt-pending bits the platform drives (MSIP, MTIP,
    /// MEIP, and the external part of SEIP). Wakes the hart from WFI when
    /// an enabled interrupt becomes pending.
    pub fn set_irq_lines(&mut self, lines: u64) {
        self.s.irq_lines = lines;
    }

    pub fn clear_reservation(&mut self) {
        self.s.reservation = None;
    }

    #[inline]
    pub(crate) fn mip(&self) -> u64 {
        // With Sstc on, STIP is the platform's comparison of time with
        // stimecmp (in `irq_lines`), not the software bit.
        let soft = if self.sstc_enabled() { self.s.mip & !crate::csr::MIP_STIP } else { self.s.mip };
        soft | self.s.irq_lines
    }

    /// Whether Sstc's timer drives STIP: implemented and enabled by
    /// M-mode (menvcfg.STCE).
    #[inline]
    pub fn sstc_enabled(&self) -> bool {
        self.s.menvcfg & crate::csr::MENVCFG_STCE != 0
    }

    /// The `time` at which Sstc's timer makes STIP pending, if it is on.
    /// The platform sets STIP in the interrupt lines from `time` on, as it
    /// sets MTIP from mtimecmp, and ends slices there.
    pub fn stimecmp_deadline(&self) -> Option<u64> {
        self.sstc_enabled().then_some(self.s.stimecmp)
    }

    /// True when an interrupt is pending and enabled in mie: what wakes WFI,
    /// whatever the global enables say.
    pub fn wake_pending(&self) -> bool {
        self.mip() & self.s.mie != 0
    }

    /// What would wake this hart from waiting for an interrupt, for
    /// another thread to watch while the hart sits a run out.
    pub fn wake_condition(&self) -> WakeCondition {
        let soft = if self.sstc_enabled() { self.s.mip & !crate::csr::MIP_STIP } else { self.s.mip };
        WakeCondition { soft, mie: self.s.mie, stimecmp: self.stimecmp_deadline() }
    }

    pub fn is_idle(&self) -> bool {
        self.s.wfi
    }

    /// The interrupt to take now, if any, honouring delegation, the global
    /// enables and the fixed priority order MEI, MSI, MTI, SEI, SSI, STI.
    pub(crate) fn pending_interrupt(&self) -> Option<u64> {
        let pending = self.mip() & self.s.mie;
        if pending == 0 {
            return None;
        }
        let m_enabled = self.s.prv < PrivilegeMode::Machine || self.s.mstatus & crate::csr::MSTATUS_MIE != 0;
        let s_enabled = self.s.prv < PrivilegeMode::Supervisor
            || (self.s.prv == PrivilegeMode::Supervisor && self.s.mstatus & crate::csr::MSTATUS_SIE != 0);
        let m_pending = pending & !self.s.mideleg;
        let s_pending = pending & self.s.mideleg;
        let candidates = if m_enabled && m_pending != 0 {
            m_pending
        } else if s_enabled && s_pending != 0 {
            s_pending
        } else {
            return None;
        };
        [trap::IRQ_M_EXT, trap::IRQ_M_SOFT, trap::IRQ_M_TIMER, trap::IRQ_S_EXT, trap::IRQ_S_SOFT, trap::IRQ_S_TIMER]
            .into_iter()
            .find(|&irq| candidates & (1 << irq) != 0)
    }

    /// Enter the trap handler for `cause` (with the interrupt bit for
    /// interrupts), delegating to S-mode where medeleg/mideleg say so.
    pub(crate) fn take_trap(&mut self, cause: u64, tval: u64) {
        use crate::csr::*;
        let is_irq = cause & trap::INTERRUPT_BIT != 0;
        let code = cause & !trap::INTERRUPT_BIT;
        let deleg = if is_irq { self.s.mideleg } else { self.s.medeleg };
        let prv = self.s.prv;
        self.s.reservation = None;
        if prv <= PrivilegeMode::Supervisor && (deleg >> code) & 1 != 0 {
            self.s.sepc = self.s.pc;
            self.s.scause = cause;
            self.s.stval = tval;
            let mut st = self.s.mstatus;
            st = set_bit(st, MSTATUS_SPIE, st & MSTATUS_SIE != 0);
            st = set_bit(st, MSTATUS_SPP, prv == PrivilegeMode::Supervisor);
            st &= !MSTATUS_SIE;
            self.s.mstatus = st;
            self.s.prv = PrivilegeMode::Supervisor;
            self.s.pc = trap_vector(self.s.stvec, is_irq, code);
        } else {
            self.s.mepc = self.s.pc;
            self.s.mcause = cause;
            self.s.mtval = tval;
            let mut st = self.s.mstatus;
            st = set_bit(st, MSTATUS_MPIE, st & MSTATUS_MIE != 0);
            st = (st & !MSTATUS_MPP) | ((prv as u64) << MSTATUS_MPP_SHIFT);
            st &= !MSTATUS_MIE;
            self.s.mstatus = st;
            self.s.prv = PrivilegeMode::Machine;
            self.s.pc = trap_vector(self.s.mtvec, is_irq, code);
        }
        self.mode_changed();
    }

    /// Recompute what the translation caches key on after a change of
    /// privilege level, satp, or the MPRV/SUM/MXR bits.
    pub(crate) fn mode_changed(&mut self) {
        // Tags include the effective privilege level, so a mode switch does
        // not need a flush; MXR and satp's mode changes do, and an ASID
        // change switches the tags' context, where they happen.
        self.fetch_tag = crate::mmu::NO_TAG;
    }

    /// Execute up to `budget` steps (instructions retired plus traps taken).
    /// Returns the number of steps and why it stopped. A slice always stops
    /// at an instruction boundary.
    pub fn run(&mut self, ram: &GuestRam, bus: &mut dyn Bus, budget: u64) -> (u64, Exit) {
        // Pages another hart made code must leave the store TLB before
        // this hart stores again.
        let purges = ram.code_purges();
        self.tlb.catch_up(purges);
        let Some(index) = self.tlb.parallel else { return self.run_slice(ram, bus, budget) };
        // Beside other harts' threads, they may wait for this (see
        // `Tlb::purge_and_wait`).
        ram.publish_store_tlb(index, purges);
        let out = self.run_slice(ram, bus, budget);
        ram.publish_store_tlb(index, u64::MAX);
        out
    }

    /// Runs this hart on its own host thread beside the machine's other
    /// harts (`on`), or on the machine's one thread with them: see
    /// [`HartState::parallel`] and [`Tlb::purge_and_wait`]. Nothing of the
    /// hart's state changes.
    pub fn set_parallel(&mut self, on: bool) {
        self.s.parallel = on;
        self.tlb.parallel = on.then_some(self.s.id as usize);
    }

    fn run_slice(&mut self, ram: &GuestRam, bus: &mut dyn Bus, budget: u64) -> (u64, Exit) {
        let mut steps = 0u64;
        loop {
            if let Some(irq) = self.pending_interrupt() {
                self.s.wfi = false;
                if steps >= budget {
                    return (steps, Exit::Budget);
                }
                self.take_trap(trap::INTERRUPT_BIT | irq, 0);
                steps += 1;
            }
            if self.s.wfi {
                if self.wake_pending() {
                    self.s.wfi = false;
                } else {
                    return (steps, Exit::Idle);
                }
            }
            match self.execute_block(ram, bus, budget, &mut steps) {
                Some(exit) => return (steps, exit),
                None => continue,
            }
        }
    }
}

#[inline]
fn set_bit(v: u64, bit: u64, on: bool) -> u64 {
    if on {
        v | bit
    } else {
        v & !bit
    }
}

#[inline]
fn trap_vector(tvec: u64, is_irq: bool, code: u64) -> u64 {
    let base = tvec & !3;
    if is_irq && tvec & 3 == 1 {
        base + 4 * code
    } else {
        base
    }
}
