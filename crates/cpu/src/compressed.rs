//! RV64C: expansion of each 16-bit instruction into the 32-bit instruction
//! it stands for, so the executor has one decoder.

#[inline(always)]
fn bits(x: u32, hi: u32, lo: u32) -> u32 {
    (x >> lo) & ((1 << (hi - lo + 1)) - 1)
}

#[inline(always)]
fn bit(x: u32, b: u32) -> u32 {
    (x >> b) & 1
}

fn i_type(imm: i32, rs1: u32, f3: u32, rd: u32, op: u32) -> u32 {
    ((imm as u32 & 0xfff) << 20) | (rs1 << 15) | (f3 << 12) | (rd << 7) | op
}

fn s_type(imm: i32, rs2: u32, rs1: u32, f3: u32, op: u32) -> u32 {
    let imm = imm as u32;
    (bits(imm, 11, 5) << 25) | (rs2 << 20) | (rs1 << 15) | (f3 << 12) | (bits(imm, 4, 0) << 7) | op
}

fn b_type(imm: i32, rs2: u32, rs1: u32, f3: u32) -> u32 {
    let imm = imm as u32;
    (bit(imm, 12) << 31)
        | (bits(imm, 10, 5) << 25)
        | (rs2 << 20)
        | (rs1 << 15)
        | (f3 << 12)
        | (bits(imm, 4, 1) << 8)
        | (bit(imm, 11) << 7)
        | 0x63
}

fn j_type(imm: i32, rd: u32) -> u32 {
    let imm = imm as u32;
    (bit(imm, 20) << 31)
        | (bits(imm, 10, 1) << 21)
        | (bit(imm, 11) << 20)
        | (bits(imm, 19, 12) << 12)
        | (rd << 7)
        | 0x6f
}

fn r_type(f7: u32, rs2: u32, rs1: u32, f3: u32, rd: u32, op: u32) -> u32 {
    (f7 << 25) | (rs2 << 20) | (rs1 << 15) | (f3 << 12) | (rd << 7) | op
}

/// Sign-extend the low `n` bits.
fn sext(v: u32, n: u32) -> i32 {
    ((v << (32 - n)) as i32) >> (32 - n)
}

const OP_IMM: u32 = 0x13;
const OP_IMM_32: u32 = 0x1b;
const OP: u32 = 0x33;
const OP_32: u32 = 0x3b;
const LOAD: u32 = 0x03;
const STORE: u32 = 0x23;
const LOAD_FP: u32 = 0x07;
const STORE_FP: u32 = 0x27;
const JALR: u32 = 0x67;
const EBREAK: u32 = 0x0010_0073;

/// The 32-bit equivalent of compressed instruction `c`, or `None` if it is
/// reserved or illegal.
pub(crate) fn expand(c: u32) -> Option<u32> {
    let rd = bits(c, 11, 7);
    let rs2 = bits(c, 6, 2);
    let rdp = bits(c, 4, 2) + 8;
    let rs1p = bits(c, 9, 7) + 8;
    let f3 = bits(c, 15, 13);
    let imm6 = sext((bit(c, 12) << 5) | bits(c, 6, 2), 6);
    let e = match (c & 3, f3) {
        (0, 0) => {
            let imm = (bits(c, 12, 11) << 4) | (bits(c, 10, 7) << 6) | (bit(c, 6) << 2) | (bit(c, 5) << 3);
            if imm == 0 {
                return None;
            }
            i_type(imm as i32, 2, 0, rdp, OP_IMM)
        }
        (0, 1) => i_type(((bits(c, 12, 10) << 3) | (bits(c, 6, 5) << 6)) as i32, rs1p, 3, rdp, LOAD_FP),
        (0, 2) => i_type(((bits(c, 12, 10) << 3) | (bit(c, 6) << 2) | (bit(c, 5) << 6)) as i32, rs1p, 2, rdp, LOAD),
        (0, 3) => i_type(((bits(c, 12, 10) << 3) | (bits(c, 6, 5) << 6)) as i32, rs1p, 3, rdp, LOAD),
        (0, 5) => s_type(((bits(c, 12, 10) << 3) | (bits(c, 6, 5) << 6)) as i32, rdp, rs1p, 3, STORE_FP),
        (0, 6) => s_type(((bits(c, 12, 10) << 3) | (bit(c, 6) << 2) | (bit(c, 5) << 6)) as i32, rdp, rs1p, 2, STORE),
        (0, 7) => s_type(((bits(c, 12, 10) << 3) | (bits(c, 6, 5) << 6)) as i32, rdp, rs1p, 3, STORE),
        (1, 0) => i_type(imm6, rd, 0, rd, OP_IMM),
        (1, 1) => {
            if rd == 0 {
                return None;
            }
            i_type(imm6, rd, 0, rd, OP_IMM_32)
        }
        (1, 2) => i_type(imm6, 0, 0, rd, OP_IMM),
        (1, 3) => {
            if rd == 2 {
                let imm =
                    (bit(c, 12) << 9) | (bit(c, 6) << 4) | (bit(c, 5) << 6) | (bits(c, 4, 3) << 7) | (bit(c, 2) << 5);
                if imm == 0 {
                    return None;
                }
                i_type(sext(imm, 10), 2, 0, 2, OP_IMM)
            } else {
                let imm = (bit(c, 12) << 17) | (bits(c, 6, 2) << 12);
                if imm == 0 {
                    return None;
                }
                (sext(imm, 18) as u32 & 0xffff_f000) | (rd << 7) | 0x37
            }
        }
        (1, 4) => {
            let shamt = (bit(c, 12) << 5) | bits(c, 6, 2);
            match bits(c, 11, 10) {
                0 => i_type(shamt as i32, rs1p, 5, rs1p, OP_IMM),
                1 => i_type((shamt | 0x400) as i32, rs1p, 5, rs1p, OP_IMM),
                2 => i_type(imm6, rs1p, 7, rs1p, OP_IMM),
                _ => {
                    let f = bits(c, 6, 5);
                    let rs2p = rdp;
                    match (bit(c, 12), f) {
                        (0, 0) => r_type(0x20, rs2p, rs1p, 0, rs1p, OP),
                        (0, 1) => r_type(0, rs2p, rs1p, 4, rs1p, OP),
                        (0, 2) => r_type(0, rs2p, rs1p, 6, rs1p, OP),
                        (0, 3) => r_type(0, rs2p, rs1p, 7, rs1p, OP),
                        (1, 0) => r_type(0x20, rs2p, rs1p, 0, rs1p, OP_32),
                        (1, 1) => r_type(0, rs2p, rs1p, 0, rs1p, OP_32),
                        _ => return None,
                    }
                }
            }
        }
        (1, 5) => {
            let imm = (bit(c, 12) << 11)
                | (bit(c, 11) << 4)
                | (bits(c, 10, 9) << 8)
                | (bit(c, 8) << 10)
                | (bit(c, 7) << 6)
                | (bit(c, 6) << 7)
                | (bits(c, 5, 3) << 1)
                | (bit(c, 2) << 5);
            j_type(sext(imm, 12), 0)
        }
        (1, 6) | (1, 7) => {
            let imm = (bit(c, 12) << 8)
                | (bits(c, 11, 10) << 3)
                | (bits(c, 6, 5) << 6)
                | (bits(c, 4, 3) << 1)
                | (bit(c, 2) << 5);
            b_type(sext(imm, 9), 0, rs1p, f3 - 6)
        }
        (2, 0) => {
            let shamt = (bit(c, 12) << 5) | bits(c, 6, 2);
            i_type(shamt as i32, rd, 1, rd, OP_IMM)
        }
        (2, 1) => i_type(((bit(c, 12) << 5) | (bits(c, 6, 5) << 3) | (bits(c, 4, 2) << 6)) as i32, 2, 3, rd, LOAD_FP),
        (2, 2) => {
            if rd == 0 {
                return None;
            }
            i_type(((bit(c, 12) << 5) | (bits(c, 6, 4) << 2) | (bits(c, 3, 2) << 6)) as i32, 2, 2, rd, LOAD)
        }
        (2, 3) => {
            if rd == 0 {
                return None;
            }
            i_type(((bit(c, 12) << 5) | (bits(c, 6, 5) << 3) | (bits(c, 4, 2) << 6)) as i32, 2, 3, rd, LOAD)
        }
        (2, 4) => match (bit(c, 12), rd, rs2) {
            (0, 0, 0) => return None,
            (0, _, 0) => i_type(0, rd, 0, 0, JALR),
            (0, _, _) => r_type(0, rs2, 0, 0, rd, OP),
            (1, 0, 0) => EBREAK,
            (1, _, 0) => i_type(0, rd, 0, 1, JALR),
            (1, _, _) => r_type(0, rs2, rd, 0, rd, OP),
            _ => return None,
        },
        (2, 5) => s_type(((bits(c, 12, 10) << 3) | (bits(c, 9, 7) << 6)) as i32, rs2, 2, 3, STORE_FP),
        (2, 6) => s_type(((bits(c, 12, 9) << 2) | (bits(c, 8, 7) << 6)) as i32, rs2, 2, 2, STORE),
        (2, 7) => s_type(((bits(c, 12, 10) << 3) | (bits(c, 9, 7) << 6)) as i32, rs2, 2, 3, STORE),
        _ => return None,
    };
    Some(e)
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn known_encodings() {
        // c.addi4spn a0, sp, 16 -> addi a0, sp, 16
        assert_eq!(expand(0x0808), Some(0x0101_0513));
        // c.li a0, -1 -> addi a0, zero, -1
        assert_eq!(expand(0x557d), Some(0xfff0_0513));
        // c.ldsp ra, 8(sp) -> ld ra, 8(sp)
        assert_eq!(expand(0x60a2), Some(0x0081_3083));
        // c.sdsp ra, 8(sp) -> sd ra, 8(sp)
        assert_eq!(expand(0xe406), Some(0x0011_3423));
        // c.jr ra -> jalr zero, 0(ra)
        assert_eq!(expand(0x8082), Some(0x0000_8067));
        // c.mv a0, a1 -> add a0, zero, a1
        assert_eq!(expand(0x852e), Some(0x00b0_0533));
        // c.addi16sp sp, -64 -> addi sp, sp, -64
        assert_eq!(expand(0x7139), Some(0xfc01_0113));
        // c.lui a5, 0x1 -> lui a5, 0x1
        assert_eq!(expand(0x6785), Some(0x0000_17b7));
        // c.sub a0, a1 -> sub a0, a0, a1
        assert_eq!(expand(0x8d0d), Some(0x40b5_0533));
        // c.addiw a0, 1 -> addiw a0, a0, 1
        assert_eq!(expand(0x2505), Some(0x0015_051b));
        // c.ebreak
        assert_eq!(expand(0x9002), Some(0x0010_0073));
    }

    #[test]
    fn reserved_encodings_are_illegal() {
        assert_eq!(expand(0x0000), None); // all zeros
        assert_eq!(expand(0x8002), None); // c.jr x0
        assert_eq!(expand(0x6101), None); // c.addi16sp 0
    }
}
