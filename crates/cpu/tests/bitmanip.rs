//! Zba, Zbb, Zbs and Zicond, one instruction at a time against values
//! worked out from the ratified specifications' definitions (not from the
//! interpreter's own expressions), on the edge operands: zero, all ones,
//! the sign bits of 64 and 32 bits, and shift amounts at and above 32 for
//! the word forms. And a hart without an extension traps on its
//! instructions as illegal.

mod common;

use common::NoDevices;
use ftvm_cpu::{Extensions, Hart};
use ftvm_memory::GuestRam;

const BASE: u64 = 0x8000_0000;
const HANDLER: u64 = BASE + 0x100;

fn r(f7: u32, f3: u32, opc: u32) -> u32 {
    // rd = x10, rs1 = x11, rs2 = x12
    f7 << 25 | 12 << 20 | 11 << 15 | f3 << 12 | 10 << 7 | opc
}
/// An I-type with the whole 12-bit field given (a shift's funct6 and
/// shamt, or a unary operation's selector); rd = x10, rs1 = x11.
fn i(f12: u32, f3: u32, opc: u32) -> u32 {
    f12 << 20 | 11 << 15 | f3 << 12 | 10 << 7 | opc
}

/// Runs `insn` with x11 = a, x12 = b on a hart with `ext`: x10, or `None`
/// if it trapped (an illegal instruction: mcause 2).
fn run_with(ext: Extensions, insn: u32, a: u64, b: u64) -> Option<u64> {
    let ram = GuestRam::new(BASE, 1 << 16).unwrap();
    ram.write_u32(BASE, insn).unwrap();
    let mut hart = Hart::new(0);
    hart.s.ext = ext;
    hart.set_jit(0);
    hart.s.pc = BASE;
    hart.s.mtvec = HANDLER;
    hart.s.x[10] = 0xdead_beef;
    hart.s.x[11] = a;
    hart.s.x[12] = b;
    hart.run(&ram, &mut NoDevices, 1);
    if hart.s.pc == HANDLER {
        assert_eq!(hart.s.mcause, 2, "{insn:#010x}: a trap other than illegal instruction");
        assert_eq!(hart.s.x[10], 0xdead_beef);
        return None;
    }
    assert_eq!(hart.s.pc, BASE + 4);
    assert_eq!(hart.s.instret, 1);
    Some(hart.s.x[10])
}

fn run(insn: u32, a: u64, b: u64) -> u64 {
    run_with(Extensions::ALL, insn, a, b).unwrap_or_else(|| panic!("{insn:#010x} trapped"))
}

const MAX: u64 = u64::MAX;
const MIN64: u64 = 1 << 63;
const W_MIN: u64 = 0xffff_ffff_8000_0000;

// Zba
const SH1ADD: u32 = 0x2000_2033 | 12 << 20 | 11 << 15 | 10 << 7;
fn sh_add(n: u32) -> u32 {
    r(0x10, 2 * n, 0x33)
}
fn sh_add_uw(n: u32) -> u32 {
    r(0x10, 2 * n, 0x3b)
}

#[test]
fn zba() {
    assert_eq!(sh_add(1), SH1ADD);
    for (a, b) in [(0, 0), (1, 2), (MAX, 1), (MIN64, 5), (0x4000_0000_0000_0001, 3)] {
        for n in 1..=3 {
            // (rs1 << n) + rs2, modulo 2^64.
            let want = ((a as u128) << n).wrapping_add(b as u128) as u64;
            assert_eq!(run(sh_add(n), a, b), want, "sh{n}add {a:#x} {b:#x}");
            let want = ((a & 0xffff_ffff) << n).wrapping_add(b);
            assert_eq!(run(sh_add_uw(n), a, b), want, "sh{n}add.uw {a:#x} {b:#x}");
        }
    }
    let add_uw = r(0x04, 0, 0x3b);
    assert_eq!(run(add_uw, MAX, 1), 0x1_0000_0000);
    assert_eq!(run(add_uw, W_MIN, 0), 0x8000_0000);
    assert_eq!(run(add_uw, 0, MAX), MAX);
    // slli.uw: the shift amount is 6 bits, above 32 included.
    let slli_uw = |sh: u32| i(0x080 | sh, 1, 0x1b);
    assert_eq!(run(slli_uw(0), MAX, 0), 0xffff_ffff);
    assert_eq!(run(slli_uw(1), W_MIN, 0), 0x1_0000_0000);
    assert_eq!(run(slli_uw(32), MAX, 0), 0xffff_ffff_0000_0000);
    assert_eq!(run(slli_uw(63), 0xffff_ffff, 0), MIN64);
    assert_eq!(run(slli_uw(40), 0x1234_5678_0000_0001, 0), 1 << 40);
}

#[test]
fn zbb_logic_min_max_extend() {
    let (andn, orn, xnor) = (r(0x20, 7, 0x33), r(0x20, 6, 0x33), r(0x20, 4, 0x33));
    assert_eq!(run(andn, 0xff00, 0x0ff0), 0xf000);
    assert_eq!(run(andn, MAX, 0), MAX);
    assert_eq!(run(orn, 0, 0), MAX);
    assert_eq!(run(orn, 0x1, MAX), 0x1);
    assert_eq!(run(xnor, 0, 0), MAX);
    assert_eq!(run(xnor, MAX, 0), 0);
    assert_eq!(run(xnor, 0xf0, 0xff), !0x0f);
    let (min, minu, max, maxu) = (r(5, 4, 0x33), r(5, 5, 0x33), r(5, 6, 0x33), r(5, 7, 0x33));
    assert_eq!(run(min, MAX, 1), MAX);
    assert_eq!(run(minu, MAX, 1), 1);
    assert_eq!(run(max, MIN64, 0), 0);
    assert_eq!(run(maxu, MIN64, 0), MIN64);
    assert_eq!(run(min, MIN64, MIN64 - 1), MIN64);
    assert_eq!(run(max, 0, 0), 0);
    let (sext_b, sext_h) = (i(0x604, 1, 0x13), i(0x605, 1, 0x13));
    let zext_h = 0x04 << 25 | 11 << 15 | 4 << 12 | 10 << 7 | 0x3b;
    assert_eq!(run(sext_b, 0x80, 0), 0xffff_ffff_ffff_ff80);
    assert_eq!(run(sext_b, 0xffff_ff7f, 0), 0x7f);
    assert_eq!(run(sext_h, 0x1_8000, 0), 0xffff_ffff_ffff_8000);
    assert_eq!(run(sext_h, MAX ^ 0x8000, 0), 0x7fff);
    assert_eq!(run(zext_h, MAX, 0), 0xffff);
    assert_eq!(run(zext_h, 0, 0), 0);
}

#[test]
fn zbb_counts() {
    let (clz, ctz, cpop) = (i(0x600, 1, 0x13), i(0x601, 1, 0x13), i(0x602, 1, 0x13));
    let (clzw, ctzw, cpopw) = (i(0x600, 1, 0x1b), i(0x601, 1, 0x1b), i(0x602, 1, 0x1b));
    // Zero counts the whole width.
    assert_eq!(run(clz, 0, 0), 64);
    assert_eq!(run(ctz, 0, 0), 64);
    assert_eq!(run(cpop, 0, 0), 0);
    assert_eq!(run(clzw, 0xffff_ffff_0000_0000, 0), 32);
    assert_eq!(run(ctzw, 0xffff_ffff_0000_0000, 0), 32);
    assert_eq!(run(cpopw, 0xffff_ffff_0000_0000, 0), 0);
    assert_eq!(run(clz, MAX, 0), 0);
    assert_eq!(run(ctz, MIN64, 0), 63);
    assert_eq!(run(cpop, MAX, 0), 64);
    assert_eq!(run(clz, 1, 0), 63);
    assert_eq!(run(clzw, 1, 0), 31);
    assert_eq!(run(clzw, W_MIN, 0), 0);
    assert_eq!(run(ctzw, W_MIN, 0), 31);
    assert_eq!(run(cpopw, MAX, 0), 32);
    assert_eq!(run(cpop, 0x8000_0000_0000_0101, 0), 3);
}

#[test]
fn zbb_rotates_and_bytes() {
    let (rol, ror, rolw, rorw) = (r(0x30, 1, 0x33), r(0x30, 5, 0x33), r(0x30, 1, 0x3b), r(0x30, 5, 0x3b));
    assert_eq!(run(rol, MIN64 | 1, 1), 3);
    assert_eq!(run(ror, 1, 1), MIN64);
    // The amount is rs2's low 6 (word forms: 5) bits.
    assert_eq!(run(rol, 0x1234, 64), 0x1234);
    assert_eq!(run(ror, 0x1234, 68), 0x4000_0000_0000_0123);
    assert_eq!(run(rolw, 0x8000_0001, 1), 3);
    assert_eq!(run(rorw, 1, 1), W_MIN);
    assert_eq!(run(rorw, 1, 33), W_MIN);
    assert_eq!(run(rolw, 0xffff_ffff_0000_0001, 32), 1);
    assert_eq!(run(rolw, 0x4000_0000, 1), W_MIN);
    let rori = |sh: u32| i(0x600 | sh, 5, 0x13);
    let roriw = |sh: u32| i(0x600 | sh, 5, 0x1b);
    assert_eq!(run(rori(0), 0x1234, 0), 0x1234);
    assert_eq!(run(rori(4), 0x1234, 0), 0x4000_0000_0000_0123);
    assert_eq!(run(rori(63), MIN64, 0), 1);
    assert_eq!(run(rori(32), 0x1, 0), 0x1_0000_0000);
    assert_eq!(run(roriw(31), W_MIN, 0), 1);
    assert_eq!(run(roriw(1), 1, 0), W_MIN);
    assert_eq!(run(roriw(0), 0x1_7fff_ffff, 0), 0x7fff_ffff);
    let (orc_b, rev8) = (i(0x287, 5, 0x13), i(0x6b8, 5, 0x13));
    assert_eq!(run(orc_b, 0, 0), 0);
    assert_eq!(run(orc_b, 0x0100_8000_7f00_0001, 0), 0xff00_ff00_ff00_00ff);
    assert_eq!(run(orc_b, MAX, 0), MAX);
    assert_eq!(run(orc_b, 0x8080_8080_8080_8080, 0), MAX);
    assert_eq!(run(rev8, 0x0102_0304_0506_0708, 0), 0x0807_0605_0403_0201);
    assert_eq!(run(rev8, 0xff, 0), 0xff00_0000_0000_0000);
}

#[test]
fn zbs() {
    let (bclr, bext, binv, bset) = (r(0x24, 1, 0x33), r(0x24, 5, 0x33), r(0x34, 1, 0x33), r(0x14, 1, 0x33));
    // The index is rs2 mod 64.
    assert_eq!(run(bclr, MAX, 63), MAX >> 1);
    assert_eq!(run(bclr, MAX, 64), MAX - 1);
    assert_eq!(run(bset, 0, 63), MIN64);
    assert_eq!(run(bset, 0, 32), 1 << 32);
    assert_eq!(run(binv, MIN64, 127), 0);
    assert_eq!(run(binv, 0, 0), 1);
    assert_eq!(run(bext, MIN64, 63), 1);
    assert_eq!(run(bext, MIN64, 62), 0);
    assert_eq!(run(bext, 1 << 33, 33), 1);
    let imm = |f6: u32, sh: u32, f3: u32| i(f6 << 6 | sh, f3, 0x13);
    assert_eq!(run(imm(0x12, 63, 1), MAX, 0), MAX >> 1); // bclri
    assert_eq!(run(imm(0x0a, 40, 1), 0, 0), 1 << 40); // bseti
    assert_eq!(run(imm(0x1a, 0, 1), MAX, 0), MAX - 1); // binvi
    assert_eq!(run(imm(0x12, 32, 5), 1 << 32, 0), 1); // bexti
    assert_eq!(run(imm(0x12, 31, 5), 1 << 32, 0), 0);
}

#[test]
fn zicond() {
    let (eqz, nez) = (r(0x07, 5, 0x33), r(0x07, 7, 0x33));
    assert_eq!(run(eqz, 42, 0), 0);
    assert_eq!(run(eqz, 42, MIN64), 42);
    assert_eq!(run(eqz, MAX, 1), MAX);
    assert_eq!(run(nez, 42, 0), 42);
    assert_eq!(run(nez, 42, MAX), 0);
    assert_eq!(run(nez, MAX, 1 << 32), 0);
}

/// Every new instruction is illegal on a hart without its extension,
/// and executes on one with it.
#[test]
fn each_traps_without_its_extension() {
    let zba =
        [sh_add(1), sh_add(2), sh_add(3), sh_add_uw(1), sh_add_uw(2), sh_add_uw(3), r(4, 0, 0x3b), i(0x080, 1, 0x1b)];
    let zbb = [
        r(0x20, 7, 0x33),
        r(0x20, 6, 0x33),
        r(0x20, 4, 0x33),
        i(0x600, 1, 0x13),
        i(0x601, 1, 0x13),
        i(0x602, 1, 0x13),
        i(0x600, 1, 0x1b),
        i(0x601, 1, 0x1b),
        i(0x602, 1, 0x1b),
        r(5, 4, 0x33),
        r(5, 5, 0x33),
        r(5, 6, 0x33),
        r(5, 7, 0x33),
        i(0x604, 1, 0x13),
        i(0x605, 1, 0x13),
        0x04 << 25 | 11 << 15 | 4 << 12 | 10 << 7 | 0x3b,
        r(0x30, 1, 0x33),
        r(0x30, 5, 0x33),
        i(0x605, 5, 0x13),
        r(0x30, 1, 0x3b),
        r(0x30, 5, 0x3b),
        i(0x605, 5, 0x1b),
        i(0x287, 5, 0x13),
        i(0x6b8, 5, 0x13),
    ];
    let zbs = [
        r(0x24, 1, 0x33),
        r(0x24, 5, 0x33),
        r(0x34, 1, 0x33),
        r(0x14, 1, 0x33),
        i(0x480, 1, 0x13),
        i(0x480, 5, 0x13),
        i(0x680, 1, 0x13),
        i(0x280, 1, 0x13),
    ];
    let zicond = [r(7, 5, 0x33), r(7, 7, 0x33)];
    let groups: [(&[u32], Extensions); 4] =
        [(&zba, Extensions::ZBA), (&zbb, Extensions::ZBB), (&zbs, Extensions::ZBS), (&zicond, Extensions::ZICOND)];
    for (insns, ext) in groups {
        for &insn in insns {
            assert!(run_with(ext, insn, 3, 5).is_some(), "{insn:#010x} with its extension");
            let others = Extensions::from_bits(Extensions::ALL.bits() & !ext.bits()).unwrap();
            assert_eq!(run_with(others, insn, 3, 5), None, "{insn:#010x} without its extension");
        }
    }
}
