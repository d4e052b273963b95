//! The decoder: the raw bits at an instruction's location into an
//! operation with a fast path and its operands, or `Other` for the general
//! executor. Decoding depends only on the bits (pc-relative targets are
//! computed at execution); the block cache keeps what it decodes.

use crate::compressed;

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

/// Decode the 32 raw bits at an instruction's location.
pub(crate) fn decode(raw: u32) -> Decoded {
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
            1 if insn >> 26 == 0 => (Slli, shamt),
            5 if insn >> 26 == 0 => (Srli, shamt),
            5 if insn >> 26 == 0x10 => (Srai, shamt),
            _ => (Other, 0),
        },
        0x1b => match (f3, f7) {
            (0, _) => (Addiw, imm_i),
            (1, 0) => (Slliw, shamt & 31),
            (5, 0) => (Srliw, shamt & 31),
            (5, 0x20) => (Sraiw, shamt & 31),
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
            _ => (Other, 0),
        },
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
            _ => (Other, 0),
        },
        _ => (Other, 0),
    };
    Decoded { raw, insn, imm, op, len, rd, rs1, rs2 }
}
