//! Telling code from data without running it: whether the bytes at a
//! program's start are RV64GC instructions. The loader uses this to
//! refuse a file that is not a program before the guest starts; it checks
//! opcodes and function fields (compressed instructions in full, through
//! the same expansion the hart uses), not every operand.

use crate::compressed;

/// The instruction at the start of a byte slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// An instruction of `len` bytes (2 or 4), and where control goes
    /// after it.
    Instruction { len: usize, flow: Flow },
    /// These bits (16 for a compressed parcel, else 32) are no RV64GC
    /// instruction.
    Invalid(u32),
    /// The slice ends inside the instruction (or is empty).
    Cut,
}

/// Where control goes after an instruction, as far as its bits say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// To the next instruction (perhaps also elsewhere: a branch, a call).
    Next,
    /// Only to this offset from the instruction (`j`, `jal x0`).
    Jump(i64),
    /// Somewhere its bits do not say (`jr`, `ret`, `mret`, `sret`): what
    /// follows it may be data.
    Unknown,
}

/// Looks at the instruction at the start of `bytes`.
pub fn peek_instruction(bytes: &[u8]) -> Peek {
    let Some(lo) = bytes.get(..2) else { return Peek::Cut };
    let half = u16::from_le_bytes([lo[0], lo[1]]) as u32;
    if half & 3 != 3 {
        return match compressed::expand(half) {
            Some(inst) => Peek::Instruction { len: 2, flow: flow(inst) },
            None => Peek::Invalid(half),
        };
    }
    let Some(word) = bytes.get(..4) else { return Peek::Cut };
    let inst = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
    if valid32(inst) {
        Peek::Instruction { len: 4, flow: flow(inst) }
    } else {
        Peek::Invalid(inst)
    }
}

fn flow(inst: u32) -> Flow {
    let rd = (inst >> 7) & 31;
    match inst & 0x7f {
        0x6f if rd == 0 => {
            let imm = ((inst >> 31) << 20)
                | (((inst >> 12) & 0xff) << 12)
                | (((inst >> 20) & 1) << 11)
                | (((inst >> 21) & 0x3ff) << 1);
            Flow::Jump(((imm << 11) as i32 >> 11) as i64)
        }
        0x67 if rd == 0 => Flow::Unknown,
        // mret, sret
        0x73 if inst == 0x3020_0073 || inst == 0x1020_0073 => Flow::Unknown,
        _ => Flow::Next,
    }
}

/// The major opcodes of RV64IMAFD with Zicsr and Zifencei, and their
/// function fields.
fn valid32(i: u32) -> bool {
    let f3 = (i >> 12) & 7;
    let f7 = i >> 25;
    let fmt = f7 & 3;
    match i & 0x7f {
        0x03 => f3 != 7,                    // loads
        0x07 | 0x27 => matches!(f3, 2 | 3), // flw, fld, fsw, fsd
        0x0f => f3 <= 1,                    // fence, fence.i
        0x13 => match f3 {
            1 => f7 >> 1 == 0,                // slli (6-bit shamt)
            5 => matches!(f7 >> 1, 0 | 0x10), // srli, srai
            _ => true,
        },
        0x1b => match f3 {
            0 => true,                   // addiw
            1 => f7 == 0,                // slliw
            5 => matches!(f7, 0 | 0x20), // srliw, sraiw
            _ => false,
        },
        0x23 => f3 <= 3, // stores
        0x2f => matches!(f3, 2 | 3) && matches!(i >> 27, 0 | 1 | 2 | 3 | 4 | 8 | 12 | 16 | 20 | 24 | 28),
        0x33 => match f7 {
            0 | 1 => true,               // base, M
            0x20 => matches!(f3, 0 | 5), // sub, sra
            _ => false,
        },
        0x3b => match f7 {
            0 => matches!(f3, 0 | 1 | 5),
            0x20 => matches!(f3, 0 | 5),
            1 => matches!(f3, 0 | 4 | 5 | 6 | 7),
            _ => false,
        },
        0x43 | 0x47 | 0x4b | 0x4f | 0x53 => fmt <= 1, // F and D only
        0x17 | 0x37 | 0x6f => true,                   // auipc, lui, jal
        0x63 => !matches!(f3, 2 | 3),                 // branches
        0x67 => f3 == 0,                              // jalr
        0x73 => f3 != 4,                              // system, CSRs
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_and_data() {
        // wfi
        assert_eq!(peek_instruction(&[0x73, 0x00, 0x50, 0x10]), Peek::Instruction { len: 4, flow: Flow::Next });
        // c.jr ra (ret)
        assert_eq!(peek_instruction(&[0x82, 0x80]), Peek::Instruction { len: 2, flow: Flow::Unknown });
        // "MZ", the first parcel of an EFI-stub Linux Image: c.li s4, -13
        assert_eq!(peek_instruction(b"MZ"), Peek::Instruction { len: 2, flow: Flow::Next });
        // j . ; j -8 ; c.j +16 ; jal ra, 8 (a call goes on)
        assert_eq!(peek_instruction(&[0x6f, 0, 0, 0]), Peek::Instruction { len: 4, flow: Flow::Jump(0) });
        assert_eq!(peek_instruction(&0xff9f_f06fu32.to_le_bytes()), Peek::Instruction { len: 4, flow: Flow::Jump(-8) });
        assert_eq!(peek_instruction(&0xa801u16.to_le_bytes()), Peek::Instruction { len: 2, flow: Flow::Jump(16) });
        assert_eq!(peek_instruction(&0x0080_00efu32.to_le_bytes()), Peek::Instruction { len: 4, flow: Flow::Next });
        assert_eq!(peek_instruction(&[0, 0, 0, 0]), Peek::Invalid(0));
        assert_eq!(peek_instruction(&[0xff; 4]), Peek::Invalid(0xffff_ffff));
        assert_eq!(peek_instruction(&[0x13]), Peek::Cut);
        assert_eq!(peek_instruction(&[0x13, 0x05]), Peek::Cut);
        assert_eq!(peek_instruction(&[]), Peek::Cut);
    }
}
