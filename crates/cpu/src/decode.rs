//! The decoder: the raw bits at an instruction's location into an
//! operation with a fast path and its operands, or `Other` for the general
//! executor. Decoding depends only on the bits (pc-relative targets are
//! computed at execution) and on the hart's optional extensions (an
//! instruction of one it lacks is left to the general executor, which
//! finds it illegal); the block cache keeps what it decodes.

use crate::compressed;
use crate::ext::Extensions;

/// Operations with a fast path. Everything else is `Other`, executed by
/// the general decoder from the expanded 32-bit instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Op {
    Other,
    Illegal,
    /// An operation whose only effect is writing x0 (the block cache
    /// turns those into this, so that others never write x0).
    Nop,
    Lui,
    Auipc,
    Jal,
    Jalr,
    Beq,
    Bne,
    Blt,
    Bge,
    Bltu,
    Bgeu,
    Lb,
    Lh,
    Lw,
    Ld,
    Lbu,
    Lhu,
    Lwu,
    Sb,
    Sh,
    Sw,
    Sd,
    Addi,
    Slti,
    Sltiu,
    Xori,
    Ori,
    Andi,
    Slli,
    Srli,
    Srai,
    Addiw,
    Slliw,
    Srliw,
    Sraiw,
    Add,
    Sub,
    Sll,
    Slt,
    Sltu,
    Xor,
    Srl,
    Sra,
    Or,
    And,
    Addw,
    Subw,
    Sllw,
    Srlw,
    Sraw,
    Mul,
    Mulh,
    Mulhsu,
    Mulhu,
    Div,
    Divu,
    Rem,
    Remu,
    Mulw,
    Divw,
    Divuw,
    Remw,
    Remuw,
    /// Floating point: the computational operations (OP-FP and the fused
    /// multiply-adds), executed by `HartState::fp_compute`, and the loads
    /// and stores (flw, fld, fsw, fsd). Their `Inst::imm` is the raw bits,
    /// as for `Other` (the offsets come from `Inst::insn`).
    Fp,
    Fload,
    Fstore,
    // Zba.
    Sh1add,
    Sh2add,
    Sh3add,
    AddUw,
    Sh1addUw,
    Sh2addUw,
    Sh3addUw,
    SlliUw,
    // Zbb.
    Andn,
    Orn,
    Xnor,
    Clz,
    Ctz,
    Cpop,
    Clzw,
    Ctzw,
    Cpopw,
    Max,
    Maxu,
    Min,
    Minu,
    SextB,
    SextH,
    ZextH,
    Rol,
    Ror,
    Rori,
    Rolw,
    Rorw,
    Roriw,
    OrcB,
    Rev8,
    // Zbs.
    Bclr,
    Bclri,
    Bext,
    Bexti,
    Binv,
    Binvi,
    Bset,
    Bseti,
    // Zicond.
    CzeroEqz,
    CzeroNez,
    /// Zicboz's `cbo.zero`: a store of zeros to the cache block holding
    /// rs1's address. Its `Inst::imm` is the raw bits, as for `Other` (an
    /// illegal-instruction trap reports them when the enables forbid it).
    CboZero,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Decoded {
    /// The bits at the instruction's location when it was decoded (the
    /// 32 bits starting there, even for a 16-bit instruction).
    pub raw: u32,
    /// The instruction as a 32-bit encoding (compressed ones expanded).
    pub insn: u32,
    pub imm: u64,
    pub op: Op,
    pub len: u8,
    pub rd: u8,
    pub rs1: u8,
    pub rs2: u8,
}

#[inline(always)]
fn sext(v: u32, bits: u32) -> u64 {
    (((v << (32 - bits)) as i32) >> (32 - bits)) as i64 as u64
}

/// Decode the 32 raw bits at an instruction's location, for a hart with
/// the extensions `ext`.
pub(crate) fn decode(raw: u32, ext: Extensions) -> Decoded {
    let (insn, len) = if raw & 3 != 3 {
        match compressed::expand(raw & 0xffff) {
            Some(i) => (i, 2),
            None => return Decoded { raw, insn: raw & 0xffff, imm: 0, op: Op::Illegal, len: 2, rd: 0, rs1: 0, rs2: 0 },
        }
    } else {
        (raw, 4)
    };
    let rd = ((insn >> 7) & 31) as u8;
    let rs1 = ((insn >> 15) & 31) as u8;
    let rs2 = ((insn >> 20) & 31) as u8;
    let f3 = (insn >> 12) & 7;
    let f7 = insn >> 25;
    let imm_i = sext(insn >> 20, 12);
    let imm_s = sext(((insn >> 25) << 5) | ((insn >> 7) & 31), 12);
    let imm_b = sext(
        ((insn >> 31) << 12) | (((insn >> 7) & 1) << 11) | (((insn >> 25) & 0x3f) << 5) | (((insn >> 8) & 0xf) << 1),
        13,
    );
    let imm_j =
        sext(((insn >> 31) << 20) | (insn & 0xff000) | (((insn >> 20) & 1) << 11) | (((insn >> 21) & 0x3ff) << 1), 21);
    let imm_u = (insn & 0xffff_f000) as i32 as i64 as u64;
    let shamt = ((insn >> 20) & 0x3f) as u64;
    let (zba, zbb, zbs) = (ext.has(Extensions::ZBA), ext.has(Extensions::ZBB), ext.has(Extensions::ZBS));
    let zicond = ext.has(Extensions::ZICOND);
    let zicboz = ext.has(Extensions::ZICBOZ);
    // The bits above a 6-bit shift amount, and the whole immediate field
    // (which selects the unary operations of Zbb).
    let f6 = insn >> 26;
    let f12 = insn >> 20;
    use Op::*;
    let (op, imm) = match insn & 0x7f {
        0x37 => (Lui, imm_u),
        0x17 => (Auipc, imm_u),
        0x6f => (Jal, imm_j),
        0x67 if f3 == 0 => (Jalr, imm_i),
        0x63 => match f3 {
            0 => (Beq, imm_b),
            1 => (Bne, imm_b),
            4 => (Blt, imm_b),
            5 => (Bge, imm_b),
            6 => (Bltu, imm_b),
            7 => (Bgeu, imm_b),
            _ => (Other, 0),
        },
        0x03 => match f3 {
            0 => (Lb, imm_i),
            1 => (Lh, imm_i),
            2 => (Lw, imm_i),
            3 => (Ld, imm_i),
            4 => (Lbu, imm_i),
            5 => (Lhu, imm_i),
            6 => (Lwu, imm_i),
            _ => (Other, 0),
        },
        0x23 => match f3 {
            0 => (Sb, imm_s),
            1 => (Sh, imm_s),
            2 => (Sw, imm_s),
            3 => (Sd, imm_s),
            _ => (Other, 0),
        },
        0x13 => match f3 {
            0 => (Addi, imm_i),
            2 => (Slti, imm_i),
            3 => (Sltiu, imm_i),
            4 => (Xori, imm_i),
            6 => (Ori, imm_i),
            7 => (Andi, imm_i),
            1 if f6 == 0 => (Slli, shamt),
            5 if f6 == 0 => (Srli, shamt),
            5 if f6 == 0x10 => (Srai, shamt),
            1 if zbb && f12 == 0x600 => (Clz, 0),
            1 if zbb && f12 == 0x601 => (Ctz, 0),
            1 if zbb && f12 == 0x602 => (Cpop, 0),
            1 if zbb && f12 == 0x604 => (SextB, 0),
            1 if zbb && f12 == 0x605 => (SextH, 0),
            5 if zbb && f6 == 0x18 => (Rori, shamt),
            5 if zbb && f12 == 0x287 => (OrcB, 0),
            5 if zbb && f12 == 0x6b8 => (Rev8, 0),
            1 if zbs && f6 == 0x12 => (Bclri, shamt),
            1 if zbs && f6 == 0x1a => (Binvi, shamt),
            1 if zbs && f6 == 0x0a => (Bseti, shamt),
            5 if zbs && f6 == 0x12 => (Bexti, shamt),
            _ => (Other, 0),
        },
        0x1b => match (f3, f7) {
            (0, _) => (Addiw, imm_i),
            (1, 0) => (Slliw, shamt & 31),
            (5, 0) => (Srliw, shamt & 31),
            (5, 0x20) => (Sraiw, shamt & 31),
            (1, _) if zba && f6 == 0x02 => (SlliUw, shamt),
            (1, 0x30) if zbb && rs2 == 0 => (Clzw, 0),
            (1, 0x30) if zbb && rs2 == 1 => (Ctzw, 0),
            (1, 0x30) if zbb && rs2 == 2 => (Cpopw, 0),
            (5, 0x30) if zbb => (Roriw, shamt & 31),
            _ => (Other, 0),
        },
        0x33 => match (f7, f3) {
            (0, 0) => (Add, 0),
            (0x20, 0) => (Sub, 0),
            (0, 1) => (Sll, 0),
            (0, 2) => (Slt, 0),
            (0, 3) => (Sltu, 0),
            (0, 4) => (Xor, 0),
            (0, 5) => (Srl, 0),
            (0x20, 5) => (Sra, 0),
            (0, 6) => (Or, 0),
            (0, 7) => (And, 0),
            (1, 0) => (Mul, 0),
            (1, 1) => (Mulh, 0),
            (1, 2) => (Mulhsu, 0),
            (1, 3) => (Mulhu, 0),
            (1, 4) => (Div, 0),
            (1, 5) => (Divu, 0),
            (1, 6) => (Rem, 0),
            (1, 7) => (Remu, 0),
            (0x10, 2) if zba => (Sh1add, 0),
            (0x10, 4) if zba => (Sh2add, 0),
            (0x10, 6) if zba => (Sh3add, 0),
            (0x20, 7) if zbb => (Andn, 0),
            (0x20, 6) if zbb => (Orn, 0),
            (0x20, 4) if zbb => (Xnor, 0),
            (0x05, 4) if zbb => (Min, 0),
            (0x05, 5) if zbb => (Minu, 0),
            (0x05, 6) if zbb => (Max, 0),
            (0x05, 7) if zbb => (Maxu, 0),
            (0x30, 1) if zbb => (Rol, 0),
            (0x30, 5) if zbb => (Ror, 0),
            (0x24, 1) if zbs => (Bclr, 0),
            (0x24, 5) if zbs => (Bext, 0),
            (0x34, 1) if zbs => (Binv, 0),
            (0x14, 1) if zbs => (Bset, 0),
            (0x07, 5) if zicond => (CzeroEqz, 0),
            (0x07, 7) if zicond => (CzeroNez, 0),
            _ => (Other, 0),
        },
        // The cache-block operations (MISC-MEM, funct3 2, rd 0): cbo.zero
        // has a fast path; cbo.clean/flush/inval, which Linux issues only
        // for devices that are not DMA-coherent (none here), are left to
        // the general executor.
        0x0f if zicboz && f3 == 2 && rd == 0 && f12 == 4 => (CboZero, 0),
        0x07 if f3 == 2 || f3 == 3 => (Fload, 0),
        0x27 if f3 == 2 || f3 == 3 => (Fstore, 0),
        0x53 | 0x43 | 0x47 | 0x4b | 0x4f => (Fp, 0),
        0x3b => match (f7, f3) {
            (0, 0) => (Addw, 0),
            (0x20, 0) => (Subw, 0),
            (0, 1) => (Sllw, 0),
            (0, 5) => (Srlw, 0),
            (0x20, 5) => (Sraw, 0),
            (1, 0) => (Mulw, 0),
            (1, 4) => (Divw, 0),
            (1, 5) => (Divuw, 0),
            (1, 6) => (Remw, 0),
            (1, 7) => (Remuw, 0),
            (0x04, 0) if zba => (AddUw, 0),
            (0x10, 2) if zba => (Sh1addUw, 0),
            (0x10, 4) if zba => (Sh2addUw, 0),
            (0x10, 6) if zba => (Sh3addUw, 0),
            (0x04, 4) if zbb && rs2 == 0 => (ZextH, 0),
            (0x30, 1) if zbb => (Rolw, 0),
            (0x30, 5) if zbb => (Rorw, 0),
            _ => (Other, 0),
        },
        _ => (Other, 0),
    };
    Decoded { raw, insn, imm, op, len, rd, rs1, rs2 }
}
