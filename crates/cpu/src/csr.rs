//! Control and status registers: numbering, WARL rules, and the access
//! checks of Zicsr (privilege, read-only, counter enables).

use crate::ext::Extensions;
use crate::hart::{Hart, PrivilegeMode};
use crate::trap::Trap;
use crate::Bus;

pub const FFLAGS: u16 = 0x001;
pub const FRM: u16 = 0x002;
pub const FCSR: u16 = 0x003;
pub const CYCLE: u16 = 0xc00;
pub const TIME: u16 = 0xc01;
pub const INSTRET: u16 = 0xc02;
pub const SSTATUS: u16 = 0x100;
pub const SIE: u16 = 0x104;
pub const STVEC: u16 = 0x105;
pub const SCOUNTEREN: u16 = 0x106;
pub const SENVCFG: u16 = 0x10a;
pub const SSCRATCH: u16 = 0x140;
pub const SEPC: u16 = 0x141;
pub const SCAUSE: u16 = 0x142;
pub const STVAL: u16 = 0x143;
pub const SIP: u16 = 0x144;
pub const STIMECMP: u16 = 0x14d;
pub const SATP: u16 = 0x180;
pub const MVENDORID: u16 = 0xf11;
pub const MARCHID: u16 = 0xf12;
pub const MIMPID: u16 = 0xf13;
pub const MHARTID: u16 = 0xf14;
pub const MCONFIGPTR: u16 = 0xf15;
pub const MSTATUS: u16 = 0x300;
pub const MISA: u16 = 0x301;
pub const MEDELEG: u16 = 0x302;
pub const MIDELEG: u16 = 0x303;
pub const MIE: u16 = 0x304;
pub const MTVEC: u16 = 0x305;
pub const MCOUNTEREN: u16 = 0x306;
pub const MENVCFG: u16 = 0x30a;
pub const MCOUNTINHIBIT: u16 = 0x320;
pub const MSCRATCH: u16 = 0x340;
pub const MEPC: u16 = 0x341;
pub const MCAUSE: u16 = 0x342;
pub const MTVAL: u16 = 0x343;
pub const MIP: u16 = 0x344;
pub const PMPCFG0: u16 = 0x3a0;
pub const PMPADDR0: u16 = 0x3b0;
pub const MCYCLE: u16 = 0xb00;
pub const MINSTRET: u16 = 0xb02;
pub const TSELECT: u16 = 0x7a0;
pub const TDATA1: u16 = 0x7a1;
pub const TDATA2: u16 = 0x7a2;
pub const TDATA3: u16 = 0x7a3;

pub const MSTATUS_SIE: u64 = 1 << 1;
pub const MSTATUS_MIE: u64 = 1 << 3;
pub const MSTATUS_SPIE: u64 = 1 << 5;
pub const MSTATUS_MPIE: u64 = 1 << 7;
pub const MSTATUS_SPP: u64 = 1 << 8;
pub const MSTATUS_MPP_SHIFT: u64 = 11;
pub const MSTATUS_MPP: u64 = 3 << 11;
pub const MSTATUS_FS: u64 = 3 << 13;
pub const MSTATUS_FS_DIRTY: u64 = 3 << 13;
pub const MSTATUS_MPRV: u64 = 1 << 17;
pub const MSTATUS_SUM: u64 = 1 << 18;
pub const MSTATUS_MXR: u64 = 1 << 19;
pub const MSTATUS_TVM: u64 = 1 << 20;
pub const MSTATUS_TW: u64 = 1 << 21;
pub const MSTATUS_TSR: u64 = 1 << 22;
pub const MSTATUS_UXL_SXL: u64 = (2 << 32) | (2 << 34);
pub const MSTATUS_SD: u64 = 1 << 63;
/// menvcfg.STCE: Sstc's stimecmp is on (and STIP follows it).
pub const MENVCFG_STCE: u64 = 1 << 63;
/// The cache-block enables of menvcfg and senvcfg (same bits in both):
/// CBIE (2 bits: 00 cbo.inval illegal, 01 it flushes, 11 it invalidates;
/// 10 reserved), CBCFE (cbo.clean and cbo.flush) and CBZE (cbo.zero).
/// Each gates the instructions of the privilege levels below the
/// register's: menvcfg S and U, senvcfg U.
pub const ENVCFG_CBIE: u64 = 3 << 4;
pub const ENVCFG_CBIE_FLUSH: u64 = 1 << 4;
pub const ENVCFG_CBCFE: u64 = 1 << 6;
pub const ENVCFG_CBZE: u64 = 1 << 7;
pub const MIP_STIP: u64 = 1 << 5;
/// mcounteren.TM: S-mode may read `time` and, with Sstc, access stimecmp.
const MCOUNTEREN_TM: u64 = 1 << 1;

const MSTATUS_WRITABLE: u64 = MSTATUS_SIE
    | MSTATUS_MIE
    | MSTATUS_SPIE
    | MSTATUS_MPIE
    | MSTATUS_SPP
    | MSTATUS_MPP
    | MSTATUS_FS
    | MSTATUS_MPRV
    | MSTATUS_SUM
    | MSTATUS_MXR
    | MSTATUS_TVM
    | MSTATUS_TW
    | MSTATUS_TSR;
const SSTATUS_VISIBLE: u64 =
    MSTATUS_SIE | MSTATUS_SPIE | MSTATUS_SPP | MSTATUS_FS | MSTATUS_SUM | MSTATUS_MXR | (3 << 32) | MSTATUS_SD;
const SSTATUS_WRITABLE: u64 = MSTATUS_SIE | MSTATUS_SPIE | MSTATUS_SPP | MSTATUS_FS | MSTATUS_SUM | MSTATUS_MXR;

/// RV64 with A, C, D, F, I, M, S, U.
pub const MISA_VALUE: u64 =
    (2 << 62) | (1 << 0) | (1 << 2) | (1 << 3) | (1 << 5) | (1 << 8) | (1 << 12) | (1 << 18) | (1 << 20);

const S_INTERRUPTS: u64 = (1 << 1) | (1 << 5) | (1 << 9);
const ALL_INTERRUPTS: u64 = S_INTERRUPTS | (1 << 3) | (1 << 7) | (1 << 11);
/// Exceptions that may be delegated: all defined causes but ecall from M.
const DELEGABLE_EXCEPTIONS: u64 = 0xb3ff;

/// What a CSR write did beyond storing a value: lets the run loop know when
/// cached translations or interrupt state must be re-derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteEffect {
    None,
    /// Interrupt enables or pending bits may have changed.
    Interrupts,
    /// Address translation changed: flush the TLB.
    Translation,
    /// satp names an address space in the mode it had: switch the TLB's
    /// context to its ASID, flushing nothing (the guest flushes what it
    /// changed with `sfence.vma`, as the privileged spec has it).
    AddressSpace,
    /// A timer deadline changed (stimecmp, or whether it counts): the
    /// platform must re-derive STIP and when the next timer fires, as
    /// after a store to the CLINT's mtimecmp.
    Timer,
}

impl Hart {
    fn check_csr_access(&self, csr: u16, write: bool, insn: u32) -> Result<(), Trap> {
        let min_priv = ((csr >> 8) & 3) as u8;
        if (self.s.prv as u8) < min_priv {
            return Err(Trap::illegal(insn));
        }
        if write && (csr >> 10) & 3 == 3 {
            return Err(Trap::illegal(insn));
        }
        Ok(())
    }

    fn counter_enabled(&self, csr: u16) -> bool {
        let bit = 1u64 << (csr & 31);
        match self.s.prv {
            PrivilegeMode::Machine => true,
            PrivilegeMode::Supervisor => self.s.mcounteren & bit != 0,
            PrivilegeMode::User => self.s.mcounteren & bit != 0 && self.s.scounteren & bit != 0,
        }
    }

    /// Sstc: below M-mode, stimecmp needs menvcfg.STCE and, in S-mode,
    /// mcounteren.TM; without Sstc it does not exist.
    fn stimecmp_accessible(&self) -> bool {
        self.s.ext.has(Extensions::SSTC)
            && match self.s.prv {
                PrivilegeMode::Machine => true,
                PrivilegeMode::Supervisor => self.sstc_enabled() && self.s.mcounteren & MCOUNTEREN_TM != 0,
                PrivilegeMode::User => false,
            }
    }

    fn fs_enabled(&self) -> bool {
        self.s.mstatus & MSTATUS_FS != 0
    }

    pub(crate) fn mark_fs_dirty(&mut self) {
        self.s.mstatus |= MSTATUS_FS_DIRTY | MSTATUS_SD;
    }

    fn read_mstatus(&self) -> u64 {
        let st = self.s.mstatus;
        if st & MSTATUS_FS == MSTATUS_FS_DIRTY {
            st | MSTATUS_SD
        } else {
            st & !MSTATUS_SD
        }
    }

    pub(crate) fn csr_read(&mut self, csr: u16, insn: u32, bus: &mut dyn Bus) -> Result<u64, Trap> {
        self.check_csr_access(csr, false, insn)?;
        let s = &self.s;
        let v = match csr {
            FFLAGS | FRM | FCSR if !self.fs_enabled() => return Err(Trap::illegal(insn)),
            FFLAGS => s.fflags as u64,
            FRM => s.frm as u64,
            FCSR => ((s.frm as u64) << 5) | s.fflags as u64,
            CYCLE | INSTRET | TIME | 0xc03..=0xc1f => {
                if !self.counter_enabled(csr) {
                    return Err(Trap::illegal(insn));
                }
                match csr {
                    CYCLE => s.instret.wrapping_add(s.cycle_offset),
                    INSTRET => s.instret,
                    TIME => bus.time(self.progress),
                    _ => 0,
                }
            }
            SSTATUS => self.read_mstatus() & SSTATUS_VISIBLE,
            SIE => s.mie & s.mideleg,
            STVEC => s.stvec,
            SCOUNTEREN => s.scounteren,
            SENVCFG => s.senvcfg,
            SSCRATCH => s.sscratch,
            SEPC => s.sepc,
            SCAUSE => s.scause,
            STVAL => s.stval,
            SIP => self.mip() & s.mideleg,
            STIMECMP if !self.stimecmp_accessible() => return Err(Trap::illegal(insn)),
            STIMECMP => s.stimecmp,
            SATP => {
                if s.prv == PrivilegeMode::Supervisor && s.mstatus & MSTATUS_TVM != 0 {
                    return Err(Trap::illegal(insn));
                }
                s.satp
            }
            MVENDORID | MARCHID | MIMPID | MCONFIGPTR => 0,
            MHARTID => s.id,
            MSTATUS => self.read_mstatus(),
            MISA => MISA_VALUE,
            MEDELEG => s.medeleg,
            MIDELEG => s.mideleg,
            MIE => s.mie,
            MTVEC => s.mtvec,
            MCOUNTEREN => s.mcounteren,
            MENVCFG => s.menvcfg,
            MCOUNTINHIBIT => s.mcountinhibit,
            MSCRATCH => s.mscratch,
            MEPC => s.mepc,
            MCAUSE => s.mcause,
            MTVAL => s.mtval,
            MIP => self.mip(),
            0x3a0..=0x3af => {
                // RV64: only even pmpcfg registers exist; we have 16 entries.
                match csr - PMPCFG0 {
                    0 => s.pmpcfg[0],
                    2 => s.pmpcfg[1],
                    n if n % 2 == 1 => return Err(Trap::illegal(insn)),
                    _ => 0,
                }
            }
            0x3b0..=0x3ef => {
                let i = (csr - PMPADDR0) as usize;
                if i < 16 {
                    s.pmpaddr[i]
                } else {
                    0
                }
            }
            MCYCLE => s.instret.wrapping_add(s.cycle_offset),
            MINSTRET => s.instret,
            0xb03..=0xb1f | 0x323..=0x33f => 0,
            TSELECT => s.tselect,
            TDATA1 | TDATA2 | TDATA3 => 0,
            _ => return Err(Trap::illegal(insn)),
        };
        Ok(v)
    }

    pub(crate) fn csr_write(&mut self, csr: u16, v: u64, insn: u32) -> Result<WriteEffect, Trap> {
        self.check_csr_access(csr, true, insn)?;
        if csr == STIMECMP && !self.stimecmp_accessible() {
            return Err(Trap::illegal(insn));
        }
        let s = &mut self.s;
        let mut effect = WriteEffect::None;
        match csr {
            FFLAGS | FRM | FCSR if s.mstatus & MSTATUS_FS == 0 => return Err(Trap::illegal(insn)),
            FFLAGS => {
                s.fflags = (v & 0x1f) as u8;
                self.mark_fs_dirty();
            }
            FRM => {
                s.frm = (v & 7) as u8;
                self.mark_fs_dirty();
            }
            FCSR => {
                s.fflags = (v & 0x1f) as u8;
                s.frm = ((v >> 5) & 7) as u8;
                self.mark_fs_dirty();
            }
            SSTATUS => {
                let old = s.mstatus;
                s.mstatus = (old & !SSTATUS_WRITABLE) | (v & SSTATUS_WRITABLE);
                effect = status_effect(old, s.mstatus);
            }
            SIE => {
                s.mie = (s.mie & !s.mideleg) | (v & s.mideleg);
                effect = WriteEffect::Interrupts;
            }
            STVEC => s.stvec = v & !2,
            SCOUNTEREN => s.scounteren = v & 0xffff_ffff,
            SENVCFG => s.senvcfg = warl_envcfg(s.senvcfg, v, cbo_bits(s.ext)),
            SSCRATCH => s.sscratch = v,
            SEPC => s.sepc = v & !1,
            SCAUSE => s.scause = v,
            STVAL => s.stval = v,
            STIMECMP => {
                s.stimecmp = v;
                effect = WriteEffect::Timer;
            }
            SIP => {
                // Only SSIP is writable through sip.
                let mask = s.mideleg & (1 << 1);
                s.mip = (s.mip & !mask) | (v & mask);
                effect = WriteEffect::Interrupts;
            }
            SATP => {
                if s.prv == PrivilegeMode::Supervisor && s.mstatus & MSTATUS_TVM != 0 {
                    return Err(Trap::illegal(insn));
                }
                // WARL: a write selecting an unsupported mode has no effect,
                // which is how Linux probes Sv57 -> Sv48 -> Sv39.
                let mode = v >> 60;
                if matches!(mode, 0 | 8 | 9) {
                    // Kept whole: 4-bit mode, 16-bit ASID, 44-bit root PPN
                    // fill the register. A new mode changes what every
                    // entry means (Bare's are the identity): a flush.
                    effect = if mode == s.satp >> 60 { WriteEffect::AddressSpace } else { WriteEffect::Translation };
                    s.satp = v;
                }
            }
            MSTATUS => {
                let old = s.mstatus;
                let mut nv = (old & !MSTATUS_WRITABLE) | (v & MSTATUS_WRITABLE);
                // MPP is WARL: the reserved value 2 keeps the old one.
                if (nv & MSTATUS_MPP) >> MSTATUS_MPP_SHIFT == 2 {
                    nv = (nv & !MSTATUS_MPP) | (old & MSTATUS_MPP);
                }
                s.mstatus = nv;
                effect = status_effect(old, nv);
            }
            MISA => {}
            MEDELEG => s.medeleg = v & DELEGABLE_EXCEPTIONS,
            MIDELEG => {
                s.mideleg = v & S_INTERRUPTS;
                effect = WriteEffect::Interrupts;
            }
            MIE => {
                s.mie = v & ALL_INTERRUPTS;
                effect = WriteEffect::Interrupts;
            }
            MTVEC => s.mtvec = v & !2,
            MCOUNTEREN => s.mcounteren = v & 0xffff_ffff,
            // Of menvcfg, Sstc's STCE and the cache-block enables of the
            // extensions the hart has are implemented (the rest, FIOM and
            // the page-attribute enables, read zero).
            MENVCFG => {
                let stce = if s.ext.has(Extensions::SSTC) { MENVCFG_STCE } else { 0 };
                if (s.menvcfg ^ v) & stce != 0 {
                    effect = WriteEffect::Timer;
                }
                s.menvcfg = warl_envcfg(s.menvcfg, v, stce | cbo_bits(s.ext));
            }
            MCOUNTINHIBIT => s.mcountinhibit = v & !2,
            MSCRATCH => s.mscratch = v,
            MEPC => s.mepc = v & !1,
            MCAUSE => s.mcause = v,
            MTVAL => s.mtval = v,
            MIP => {
                // With Sstc on, STIP is read-only: stimecmp drives it.
                let stce = s.menvcfg & MENVCFG_STCE != 0;
                let mask = if stce { S_INTERRUPTS & !MIP_STIP } else { S_INTERRUPTS };
                s.mip = (s.mip & !mask) | (v & mask);
                effect = WriteEffect::Interrupts;
            }
            0x3a0..=0x3af => match csr - PMPCFG0 {
                0 => s.pmpcfg[0] = warl_pmpcfg(s.pmpcfg[0], v),
                2 => s.pmpcfg[1] = warl_pmpcfg(s.pmpcfg[1], v),
                n if n % 2 == 1 => return Err(Trap::illegal(insn)),
                _ => {}
            },
            0x3b0..=0x3ef => {
                let i = (csr - PMPADDR0) as usize;
                if i < 16 && !pmp_locked(s.pmpcfg, i) {
                    s.pmpaddr[i] = v & ((1u64 << 54) - 1);
                }
            }
            // A write to a counter is the value it holds after the writing
            // instruction: it replaces that instruction's increment (the
            // executor adds one to instret when the instruction retires,
            // and mcycle follows instret), and the other counter runs on.
            MCYCLE => s.cycle_offset = v.wrapping_sub(s.instret.wrapping_add(1)),
            MINSTRET => {
                let cycle_after = s.instret.wrapping_add(s.cycle_offset).wrapping_add(1);
                s.instret = v.wrapping_sub(1);
                s.cycle_offset = cycle_after.wrapping_sub(v);
            }
            0xb03..=0xb1f | 0x323..=0x33f => {}
            TSELECT => {}
            TDATA1 | TDATA2 | TDATA3 => {}
            _ => return Err(Trap::illegal(insn)),
        }
        Ok(effect)
    }
}

/// The cache-block enables a hart with `ext` has in menvcfg and senvcfg:
/// none without the extensions, so a hart without them keeps reading
/// zero there as before them.
fn cbo_bits(ext: Extensions) -> u64 {
    let mut bits = 0;
    if ext.has(Extensions::ZICBOM) {
        bits |= ENVCFG_CBIE | ENVCFG_CBCFE;
    }
    if ext.has(Extensions::ZICBOZ) {
        bits |= ENVCFG_CBZE;
    }
    bits
}

/// menvcfg or senvcfg written with `new`, of which the bits `writable`
/// are implemented. CBIE is WARL: the reserved value 10 keeps the old
/// field (as mstatus.MPP does with its reserved value).
fn warl_envcfg(old: u64, new: u64, writable: u64) -> u64 {
    let mut v = new & writable;
    if writable & ENVCFG_CBIE != 0 && v & ENVCFG_CBIE == 2 << 4 {
        v = (v & !ENVCFG_CBIE) | (old & ENVCFG_CBIE);
    }
    v
}

fn status_effect(old: u64, new: u64) -> WriteEffect {
    let changed = old ^ new;
    // MPRV, MPP and SUM change which TLB tag a data access looks for
    // (`Hart::data_tag_prv`), never what an entry means: no flush. MXR
    // changes what a load may read through the entries there are.
    if changed & MSTATUS_MXR != 0 {
        WriteEffect::Translation
    } else if changed & (MSTATUS_MIE | MSTATUS_SIE) != 0 {
        WriteEffect::Interrupts
    } else {
        WriteEffect::None
    }
}

fn pmp_locked(cfg: [u64; 2], i: usize) -> bool {
    (cfg[i / 8] >> ((i % 8) * 8)) & 0x80 != 0
}

/// Per-entry WARL rules: locked entries keep their value; the reserved
/// combination R=0,W=1 reads back as R=0,W=0.
fn warl_pmpcfg(old: u64, new: u64) -> u64 {
    let mut out = 0u64;
    for i in 0..8 {
        let o = (old >> (i * 8)) & 0xff;
        let mut n = (new >> (i * 8)) & 0xff;
        if o & 0x80 != 0 {
            n = o;
        } else {
            n &= 0x9f;
            if n & 3 == 2 {
                n &= !3;
            }
        }
        out |= n << (i * 8);
    }
    out
}
