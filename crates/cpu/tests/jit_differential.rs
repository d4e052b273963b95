//! The translation tier against the interpreter: random programs of the
//! operations it translates (fences, SCs and AMOs among them, and some it
//! does not: CSR reads, LR, ecall, illegal instructions), with loads and
//! stores that hit RAM, a device, nothing (access faults) and the
//! program's own code, and atomics on RAM, misaligned, on the device and
//! on nothing, run from the same state with translation off and on, in the same and in
//! different slices. Everything must come out identical: registers, CSRs,
//! pc, instret, every slice's step count and exit, what the device saw
//! and when, and RAM. The translated runs must also have run translated
//! code, and never have left an instruction with an interpreter fast path
//! (the bitmanip and Zicond ones among them) to the interpreter: else the
//! comparison would be of the interpreter with itself.

use ftvm_cpu::{csr, Bus, Exit, Hart, HartState, PrivilegeMode};
use ftvm_memory::GuestRam;

const BASE: u64 = 0x8000_0000;
const RAM: u64 = 1 << 20;
const DATA: u64 = BASE + 0x18000;
const HANDLER: u64 = BASE + 0xf000;
const DEVICE: u64 = 0x1000_0000;

/// A device whose reads return where in the run they happen (so a read
/// at the wrong step shows) and which logs every write with its step.
#[derive(Default)]
struct Device {
    /// Steps executed before the current slice.
    slice_start: u64,
    log: Vec<(u64, u64, u8, u64)>,
}

impl Bus for Device {
    fn read(&mut self, _: &GuestRam, paddr: u64, size: u8, progress: u64) -> Option<u64> {
        if paddr & !0xfff != DEVICE {
            return None;
        }
        let at = self.slice_start + progress;
        self.log.push((at, paddr, size, 0));
        Some((at.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ paddr) & (u64::MAX >> (64 - 8 * size as u32)))
    }
    fn write(&mut self, _: &GuestRam, paddr: u64, size: u8, value: u64, progress: u64) -> bool {
        if paddr & !0xfff != DEVICE {
            return false;
        }
        self.log.push((self.slice_start + progress, paddr, size, value));
        true
    }
    fn time(&mut self, progress: u64) -> u64 {
        self.slice_start + progress
    }
}

/// xorshift64*: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

fn r_type(f7: u32, rs2: u32, rs1: u32, f3: u32, rd: u32, opc: u32) -> u32 {
    f7 << 25 | rs2 << 20 | rs1 << 15 | f3 << 12 | rd << 7 | opc
}
fn i_type(imm: i32, rs1: u32, f3: u32, rd: u32, opc: u32) -> u32 {
    ((imm as u32) & 0xfff) << 20 | rs1 << 15 | f3 << 12 | rd << 7 | opc
}
fn s_type(imm: i32, rs2: u32, rs1: u32, f3: u32) -> u32 {
    let imm = imm as u32;
    ((imm >> 5) & 0x7f) << 25 | rs2 << 20 | rs1 << 15 | f3 << 12 | (imm & 31) << 7 | 0x23
}
fn b_type(imm: i32, rs2: u32, rs1: u32, f3: u32) -> u32 {
    let imm = imm as u32;
    ((imm >> 12) & 1) << 31
        | ((imm >> 5) & 0x3f) << 25
        | rs2 << 20
        | rs1 << 15
        | f3 << 12
        | ((imm >> 1) & 0xf) << 8
        | ((imm >> 11) & 1) << 7
        | 0x63
}
fn j_type(imm: i32, rd: u32) -> u32 {
    let imm = imm as u32;
    ((imm >> 20) & 1) << 31
        | ((imm >> 1) & 0x3ff) << 21
        | ((imm >> 11) & 1) << 20
        | ((imm >> 12) & 0xff) << 12
        | rd << 7
        | 0x6f
}

/// Registers the generator keeps fixed: x1 = -1, x2 = i64::MIN and x3 =
/// i32::MIN (the division cases x86 faults on), x4 counts the loop, x5
/// points at data, x6 at the device, x7 at nothing, x8 at the code.
const FIXED: u32 = 8;

/// (funct7, funct3) of every OP instruction (RV64I and M): add, sub,
/// sll, slt, sltu, xor, srl, sra, or, and, then mul to remu.
const OP_FUNCTS: [(u32, u32); 18] = [
    (0, 0),
    (0x20, 0),
    (0, 1),
    (0, 2),
    (0, 3),
    (0, 4),
    (0, 5),
    (0x20, 5),
    (0, 6),
    (0, 7),
    (1, 0),
    (1, 1),
    (1, 2),
    (1, 3),
    (1, 4),
    (1, 5),
    (1, 6),
    (1, 7),
];
/// The same for OP-32: addw, subw, sllw, srlw, sraw, mulw, divw to remuw.
const OP32_FUNCTS: [(u32, u32); 10] =
    [(0, 0), (0x20, 0), (0, 1), (0, 5), (0x20, 5), (1, 0), (1, 4), (1, 5), (1, 6), (1, 7)];

/// Every Zba, Zbb, Zbs and Zicond instruction with these registers, the
/// immediate forms shifting by `sh` (taken mod 32 for the word forms).
fn bitmanip(rd: u32, rs1: u32, rs2: u32, sh: u32) -> Vec<u32> {
    let rr = |f7: u32, f3: u32, opc: u32| r_type(f7, rs2, rs1, f3, rd, opc);
    let unary = |f12: u32, f3: u32, opc: u32| i_type(f12 as i32, rs1, f3, rd, opc);
    let (sh, shw) = (sh & 63, sh & 31);
    vec![
        // Zba
        rr(0x10, 2, 0x33),
        rr(0x10, 4, 0x33),
        rr(0x10, 6, 0x33),
        rr(0x04, 0, 0x3b),
        rr(0x10, 2, 0x3b),
        rr(0x10, 4, 0x3b),
        rr(0x10, 6, 0x3b),
        unary(0x080 | sh, 1, 0x1b), // slli.uw
        // Zbb
        rr(0x20, 7, 0x33),
        rr(0x20, 6, 0x33),
        rr(0x20, 4, 0x33),
        unary(0x600, 1, 0x13),
        unary(0x601, 1, 0x13),
        unary(0x602, 1, 0x13),
        unary(0x600, 1, 0x1b),
        unary(0x601, 1, 0x1b),
        unary(0x602, 1, 0x1b),
        rr(0x05, 4, 0x33),
        rr(0x05, 5, 0x33),
        rr(0x05, 6, 0x33),
        rr(0x05, 7, 0x33),
        unary(0x604, 1, 0x13),
        unary(0x605, 1, 0x13),
        unary(0x080, 4, 0x3b), // zext.h
        rr(0x30, 1, 0x33),
        rr(0x30, 5, 0x33),
        unary(0x600 | sh, 5, 0x13), // rori
        rr(0x30, 1, 0x3b),
        rr(0x30, 5, 0x3b),
        unary(0x600 | shw, 5, 0x1b), // roriw
        unary(0x287, 5, 0x13),       // orc.b
        unary(0x6b8, 5, 0x13),       // rev8
        // Zbs
        rr(0x24, 1, 0x33),
        rr(0x24, 5, 0x33),
        rr(0x34, 1, 0x33),
        rr(0x14, 1, 0x33),
        unary(0x480 | sh, 1, 0x13),
        unary(0x480 | sh, 5, 0x13),
        unary(0x680 | sh, 1, 0x13),
        unary(0x280 | sh, 1, 0x13),
        // Zicond
        rr(0x07, 5, 0x33),
        rr(0x07, 7, 0x33),
    ]
}

/// What random programs are made of besides the integer operations, loads,
/// stores, jumps and system instructions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mix {
    Int,
    /// Floating point, two instructions in five.
    Fp,
    /// Zba, Zbb, Zbs and Zicond, two in five (else one in a hundred).
    Bits,
    /// LR/SC pairs, lone SCs and AMOs, two in five: on data, misaligned,
    /// on the device and on nothing (the last three trap).
    Atomic,
    /// cbo.zero, one in five, run in M-, S- or U-mode with the enables
    /// each way (see `setup_with`).
    Cbo,
    /// Straight lines: no branch, jump or instruction the translator
    /// leaves to the interpreter before the loop's end, so that blocks end
    /// at their length and translations run on through the blocks after
    /// their own; loads and stores as in `Int` (RAM, the device, nothing,
    /// the code: stores into the loop's later blocks among them); now and
    /// then a fence, which ends a block (one that is also a block's 32nd
    /// instruction ends the translation there).
    Straight,
}

/// The funct5 of every AMO: amoswap, amoadd, amoxor, amoor, amoand, amomin,
/// amomax, amominu, amomaxu.
const AMO_FUNCT5: [u32; 9] = [0b00001, 0, 0b00100, 0b01000, 0b01100, 0b10000, 0b10100, 0b11000, 0b11100];

/// An A-extension instruction: funct5 `f5`, .w (`d` false) or .d.
fn atomic(f5: u32, d: bool, rs2: u32, rs1: u32, rd: u32) -> u32 {
    r_type(f5 << 2, rs2, rs1, if d { 3 } else { 2 }, rd, 0x2f)
}

/// Atomics for `Mix::Atomic`: the address into a free register `t` first
/// (rd and rs2 are now and then `t` too), then an LR and an SC of it with
/// maybe an operation between, an SC alone (which succeeds only if an
/// earlier LR's reservation is still there), or an AMO.
fn atomic_insns(rng: &mut Rng, rd: u32, rs2: u32, p: &mut Vec<u32>) {
    let d = rng.below(2) == 0;
    let t = 9 + rng.below(23) as u32;
    let (base, off) = match rng.below(16) {
        0 => (6, 0),
        1 => (7, 8 * rng.below(8) as i32),
        // Misaligned (now and then aligned after all).
        2 => (5, rng.below(4096) as i32 - 2048),
        // Aligned, in a few words so that LRs and SCs meet.
        _ => (5, 8 * rng.below(4) as i32 + if d { 0 } else { 4 * rng.below(2) as i32 }),
    };
    p.push(i_type(off, base, 0, t, 0x13));
    let rd = if rng.below(8) == 0 { t } else { rd };
    let rs2 = if rng.below(8) == 0 { t } else { rs2 };
    match rng.below(4) {
        0 => {
            let lr_rd = if rng.below(4) == 0 { 0 } else { 9 + rng.below(23) as u32 };
            p.push(atomic(0b00010, d, 0, t, if lr_rd == t { 0 } else { lr_rd }));
            if rng.below(2) == 0 {
                p.push(r_type(0, rs2, lr_rd, 0, 9 + rng.below(23) as u32, 0x33));
            }
            // Now and then of the other width (which only succeeds if
            // aligned for it: the reservation is of the address).
            let sc_d = if rng.below(4) == 0 { !d } else { d };
            p.push(atomic(0b00011, sc_d, rs2, t, rd));
        }
        1 => p.push(atomic(0b00011, d, rs2, t, rd)),
        _ => p.push(atomic(rng.pick(&AMO_FUNCT5), d, rs2, t, rd)),
    }
}

/// A random program at BASE: a loop over `len` random instructions.
fn program(rng: &mut Rng, len: usize, mix: Mix) -> Vec<u32> {
    let mut p = Vec::new();
    let any =
        |rng: &mut Rng| if rng.below(4) == 0 { rng.below(FIXED as u64 + 1) as u32 } else { 9 + rng.below(23) as u32 };
    // Destinations: mostly the free registers, sometimes x0.
    let dst = |rng: &mut Rng| if rng.below(16) == 0 { 0 } else { 9 + rng.below(23) as u32 };
    while p.len() < len {
        let left = len - p.len();
        let kind = match mix {
            Mix::Straight => match rng.below(80) {
                79 => 94,
                k => k,
            },
            _ => rng.below(100),
        };
        let (rd, rs1, rs2) = (dst(rng), any(rng), any(rng));
        if mix == Mix::Fp && kind < 40 {
            fp_insns(rng, rd, rs1, &mut p, len);
            continue;
        }
        if mix == Mix::Atomic && kind < 40 {
            atomic_insns(rng, rd, rs2, &mut p);
            continue;
        }
        if mix == Mix::Bits && kind < 40 {
            // rd as an operand too, one time in four each.
            let rs1 = if rng.below(4) == 0 { rd } else { rs1 };
            let rs2 = if rng.below(4) == 0 { rd } else { rs2 };
            let ops = bitmanip(rd, rs1, rs2, rng.below(64) as u32);
            p.push(rng.pick(&ops));
            continue;
        }
        if mix == Mix::Cbo && kind < 20 && left >= 2 {
            // cbo.zero at an address near the data (any offset in its
            // block), the device or nothing (access faults), or rarely a
            // block of the loop's body (then illegal zeros the handler
            // skips; never the loop's control at its end, which would
            // leave nothing but zeros to run).
            let t = 9 + rng.below(23) as u32;
            let (base, off) = match rng.below(40) {
                0 | 1 => (6, rng.below(4096) as i32 - 2048),
                2 | 3 => (7, rng.below(4096) as i32 - 2048),
                4 if len >= 32 => (8, rng.below(len as u64 * 4 / 64 - 1) as i32 * 64 + rng.below(64) as i32),
                _ => (5, rng.below(4096) as i32 - 2048),
            };
            p.push(i_type(off, base, 0, t, 0x13));
            p.push(4 << 20 | t << 15 | 2 << 12 | 0x0f);
            continue;
        }
        let insn = match kind {
            // reg-reg, M included
            0..=29 => {
                let (f7, f3) = rng.pick(&OP_FUNCTS);
                r_type(f7, rs2, rs1, f3, rd, 0x33)
            }
            30..=39 => {
                let (f7, f3) = rng.pick(&OP32_FUNCTS);
                r_type(f7, rs2, rs1, f3, rd, 0x3b)
            }
            40..=54 => {
                let imm = rng.below(4096) as i32 - 2048;
                match rng.below(12) {
                    f3 @ (0 | 2 | 3 | 4 | 6 | 7) => i_type(imm, rs1, f3 as u32, rd, 0x13),
                    8 => i_type((rng.below(64)) as i32, rs1, 1, rd, 0x13),
                    9 => i_type((rng.below(64)) as i32 | (rng.below(2) as i32) << 10, rs1, 5, rd, 0x13),
                    // addiw, a `sext.w` one time in three.
                    10 => i_type(if rng.below(3) == 0 { 0 } else { imm }, rs1, 0, rd, 0x1b),
                    _ => {
                        let (f3, hi) = rng.pick(&[(1, 0), (5, 0), (5, 0x20)]);
                        i_type(rng.below(32) as i32 | hi << 5, rs1, f3, rd, 0x1b)
                    }
                }
            }
            55..=58 => (rng.next() as u32 & 0xffff_f000) | rd << 7 | if rng.below(2) == 0 { 0x37 } else { 0x17 },
            // loads and stores
            59..=74 => {
                let (base, off) = match rng.below(20) {
                    0 => (6, rng.below(64) as i32 * 8),
                    1 => (7, rng.below(64) as i32),
                    _ => (5, rng.below(4096) as i32 - 2048),
                };
                if rng.below(2) == 0 {
                    i_type(off, base, rng.pick(&[0, 1, 2, 3, 4, 5, 6]), rd, 0x03)
                } else {
                    s_type(off, rs2, base, rng.pick(&[0, 1, 2, 3]))
                }
            }
            // The code: reads, or a word written back unchanged, mostly
            // near here (the store still cuts a block it lands in, which
            // changes the next block's start).
            75..=78 => {
                let off = if rng.below(4) == 0 {
                    rng.below((len * 4) as u64) as i32 & !3
                } else {
                    4 * (p.len() as i32 + 1 - rng.below(6) as i32).max(0)
                };
                let choice = rng.below(8);
                if choice < 2 && left >= 3 {
                    // Code that changes: a new instruction (an addi or xori
                    // into a free register) over one of the loop's.
                    let off = rng.below(len as u64) as i32 * 4;
                    let w = i_type(
                        rng.below(4096) as i32 - 2048,
                        any(rng),
                        rng.pick(&[0, 4]),
                        9 + rng.below(23) as u32,
                        0x13,
                    );
                    let t = 9 + rng.below(23) as u32;
                    let lo = ((w & 0xfff) as i32) << 20 >> 20;
                    let hi = w.wrapping_sub(lo as u32) & 0xffff_f000;
                    p.push(hi | t << 7 | 0x37);
                    p.push(i_type(lo, t, 0, t, 0x1b));
                    s_type(off, t, 8, 2)
                } else if choice < 6 && left >= 2 {
                    let t = 9 + rng.below(23) as u32;
                    p.push(i_type(off, 8, 2, t, 0x03));
                    s_type(off, t, 8, 2)
                } else {
                    i_type(off, 8, rng.pick(&[0, 1, 2, 3, 4, 5, 6]), rd, 0x03)
                }
            }
            // forward branches and jumps within the loop body
            79..=90 if left > 2 => {
                let skip = 1 + rng.below((left as u64 - 1).min(6)) as i32;
                match rng.below(8) {
                    0 => j_type(4 * skip, dst(rng)),
                    1 => {
                        // auipc t; jalr rd, t + 4*skip (t = the auipc's pc)
                        let t = 9 + rng.below(23) as u32;
                        p.push(0x17 | t << 7);
                        i_type(4 * (skip + 1), t, 0, dst(rng), 0x67)
                    }
                    _ => b_type(4 * skip, rs2, rs1, rng.pick(&[0, 1, 4, 5, 6, 7])),
                }
            }
            // fences (translated: steps over them, as the interpreter)
            94 => rng.pick(&[0x0ff0_000f, 0x0330_000f, 0x8330_000f, 0x0000_100f]), // fence, fence rw,rw, fence.tso, fence.i
            // what the translator leaves to the interpreter
            91..=93 => i_type(0x340, 0, 2, rd, 0x73), // csrr rd, mscratch
            95 => 0x0000_0073,                        // ecall: trap, handler skips it
            96 => 0,                                  // illegal: likewise
            97 => i_type(0x340, rs1, 1, 0, 0x73),     // csrw mscratch, rs1
            98 => {
                let ops = bitmanip(rd, rs1, rs2, rng.below(64) as u32);
                rng.pick(&ops)
            }
            _ => r_type(0, rs2, rs1, 0, rd, 0x33),
        };
        p.push(insn);
    }
    p.truncate(len);
    // addi x4, x4, -1; bne x4, x0, BASE; j .
    p.push(i_type(-1, 4, 0, 4, 0x13));
    let back = -(4 * (len as i32 + 1));
    p.push(b_type(back, 0, 4, 1));
    p.push(j_type(0, 0));
    p
}

/// The tests under Sv39 paging: virtual addresses from `VA` (1 GiB), the
/// page tables at `ROOT`, the pages' RAM from `PAGED` on.
const VA: u64 = 0x4000_0000;
const ROOT: u64 = BASE + 0x20000;
const PAGED: u64 = BASE + 0x40000;

/// The trap handler at `HANDLER`: skip the instruction (all are 4 bytes,
/// and the illegal all-zero one is two zero halfwords) and note the cause.
fn write_skip_handler(ram: &GuestRam) {
    let handler = [
        0x3410_2ff3u32, // csrr x31, mepc
        i_type(4, 31, 0, 31, 0x13),
        0x3412_9073, // csrw mepc, x31
        0x3420_2f73, // csrr x30, mcause
        0x3020_0073, // mret
    ];
    for (i, w) in handler.iter().enumerate() {
        ram.write_u32(HANDLER + 4 * i as u64, *w).unwrap();
    }
}

/// Sv39 tables at `ROOT` (root[1] -> l1[0] -> l0[page]) mapping virtual
/// page `v` (at `VA` + v * 4 KiB) to the RAM at `pa` with the PTE's low
/// bits `bits`, for each (v, pa, bits).
fn sv39(ram: &GuestRam, maps: impl IntoIterator<Item = (u64, u64, u64)>) {
    let (l1, l0) = (ROOT + 0x1000, ROOT + 0x2000);
    ram.write_u64(ROOT + 8, (l1 >> 12) << 10 | 1).unwrap();
    ram.write_u64(l1, (l0 >> 12) << 10 | 1).unwrap();
    for (v, pa, bits) in maps {
        ram.write_u64(l0 + 8 * v, (pa >> 12) << 10 | bits).unwrap();
    }
}

/// A hart in S-mode under the tables of `sv39`, at `VA`, trapping to
/// `HANDLER`, translating after `hot` entries.
fn s_mode_hart(hot: u32) -> Hart {
    let mut hart = Hart::new(0);
    hart.set_jit(hot);
    hart.s.satp = 8 << 60 | ROOT >> 12;
    hart.s.prv = PrivilegeMode::Supervisor;
    hart.s.mtvec = HANDLER;
    hart.s.pc = VA;
    hart
}

/// Ends program `p` with x4 counting down and a branch back to its start
/// while not zero, then a jump to itself.
fn close_loop(p: &mut Vec<u32>) {
    p.push(i_type(-1, 4, 0, 4, 0x13));
    p.push(b_type(-4 * (p.len() as i32), 0, 4, 1));
    p.push(j_type(0, 0));
}

/// RAM for a test under paging: program `p` at `PAGED`, the handler,
/// `words` u64s of `fill(i)` from the page after the program's, and the
/// Sv39 tables of `maps` (see `sv39`).
fn paged_ram(
    p: &[u32],
    words: u64,
    fill: impl Fn(u64) -> u64,
    maps: impl IntoIterator<Item = (u64, u64, u64)>,
) -> GuestRam {
    let ram = GuestRam::new(BASE, RAM).unwrap();
    for (i, w) in p.iter().enumerate() {
        ram.write_u32(PAGED + 4 * i as u64, *w).unwrap();
    }
    write_skip_handler(&ram);
    for i in 0..words {
        ram.write_u64(PAGED + 0x1000 + 8 * i, fill(i)).unwrap();
    }
    sv39(&ram, maps);
    ram
}

/// Runs `make(0)` interpreted for `total` steps in the slices `slices`
/// gives, then `make(1)` and `make(32)` (translating at the first entry
/// and after 32) in the same slices, each checked against it after every
/// slice and each having called translated code more than `min_calls`
/// times. Returns the interpreted run.
fn interpreted_then_translated<S: FnMut() -> u64>(
    seed: u64,
    total: u64,
    slices: impl Fn() -> S,
    make: impl Fn(u32) -> Run,
    min_calls: u64,
) -> Run {
    let mut states = Vec::new();
    let mut interp = make(0);
    run(&mut interp, total, slices(), |r| states.push(r.hart.s.clone()));
    for hot in [1, 32] {
        let mut jit = make(hot);
        follow(&format!("seed {seed}, hot {hot}"), &interp, &states, &mut jit, total, slices());
        assert!(jit.hart.jit_stats().calls > min_calls, "seed {seed}, hot {hot}: hardly translated");
    }
    interp
}

struct Run {
    hart: Hart,
    ram: GuestRam,
    bus: Device,
    slices: Vec<(u64, Exit)>,
}

fn setup_with(seed: u64, len: usize, jit: u32, mix: Mix) -> Run {
    let mut rng = Rng(seed | 1);
    let prog = program(&mut rng, len, mix);
    let fp = mix == Mix::Fp;
    assert!(BASE + 4 * prog.len() as u64 <= HANDLER);
    let ram = GuestRam::new(BASE, RAM).unwrap();
    for (i, w) in prog.iter().enumerate() {
        ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
    }
    write_skip_handler(&ram);
    for i in 0..0x1000u64 {
        ram.write_u64(DATA - 0x800 + 8 * i, rng.next()).unwrap();
    }
    let mut hart = Hart::new(0);
    hart.set_jit(jit);
    hart.s.pc = BASE;
    hart.s.mtvec = HANDLER;
    if fp {
        // FS initial (off in one run of five: every FP instruction traps);
        // frm anything, the reserved modes included (dynamic rounding then
        // traps); some flags already accrued.
        if !seed.is_multiple_of(5) {
            hart.s.mstatus |= 1 << 13;
        }
        hart.s.frm = rng.below(8) as u8;
        hart.s.fflags = rng.below(32) as u8;
        for f in 0..32 {
            hart.s.f[f] = if rng.below(2) == 0 { rng.pick(&F64_EDGE) } else { rng.pick(&F32_EDGE) };
        }
    }
    if mix == Mix::Cbo {
        // The privilege level and the cache-block enables, per seed (the
        // handler's mret returns to the level that trapped; paging is off,
        // so every level reaches RAM and the device alike).
        hart.s.prv = [PrivilegeMode::Machine, PrivilegeMode::Supervisor, PrivilegeMode::User][seed as usize % 3];
        hart.s.menvcfg = if seed % 4 != 3 { csr::ENVCFG_CBZE } else { 0 };
        hart.s.senvcfg = if seed % 5 != 4 { csr::ENVCFG_CBZE } else { 0 };
    }
    let special = [0, 1, u64::MAX, 1 << 63, 0xffff_ffff_8000_0000, 0x7fff_ffff, 0x8000_0000, 63, 64, 31];
    for r in 1..32 {
        hart.s.x[r] = if rng.below(3) == 0 { rng.pick(&special) } else { rng.next() };
    }
    hart.s.x[1] = u64::MAX;
    hart.s.x[2] = 1 << 63;
    hart.s.x[3] = 0xffff_ffff_8000_0000;
    hart.s.x[4] = 60;
    hart.s.x[5] = DATA;
    hart.s.x[6] = DEVICE;
    hart.s.x[7] = 0;
    hart.s.x[8] = BASE;
    Run { hart, ram, bus: Device::default(), slices: Vec::new() }
}

/// Runs `total` steps in slices of the sizes `slice` picks; `each` sees
/// the run after every slice.
fn run(r: &mut Run, total: u64, mut slice: impl FnMut() -> u64, mut each: impl FnMut(&Run)) {
    let mut done = 0;
    while done < total {
        r.bus.slice_start = done;
        let (n, exit) = r.hart.run(&r.ram, &mut r.bus, slice().min(total - done));
        r.slices.push((n, exit));
        done += n;
        assert!(n > 0 || exit != Exit::Idle, "the program never idles");
        each(r);
    }
}

/// Slice lengths drawn from `seed`: half of them up to `short`, half up
/// to `long`, so that slices end inside blocks as well as after many.
fn random_slices(seed: u64, short: u64, long: u64) -> impl FnMut() -> u64 {
    let mut rng = Rng(seed);
    move || {
        let max = if rng.below(2) == 0 { short } else { long };
        1 + rng.below(max)
    }
}

/// Runs `jit` with the slices `interp` ran with (`slices` gives the same
/// lengths again) and checks it against the interpreter: the hart after
/// every slice (`states`, the interpreter's), each slice's steps and
/// exit, and the end state.
fn follow(what: &str, interp: &Run, states: &[HartState], jit: &mut Run, total: u64, slices: impl FnMut() -> u64) {
    let mut i = 0;
    run(jit, total, slices, |r| {
        assert_eq!(r.hart.s, states[i], "{what}: hart state after slice {i}");
        i += 1;
    });
    assert_eq!(interp.slices, jit.slices, "{what}: slice steps and exits");
    check(what, interp, jit);
}

fn check(what: &str, a: &Run, b: &Run) {
    let (sa, sb): (&HartState, &HartState) = (&a.hart.s, &b.hart.s);
    assert_eq!(sa, sb, "{what}: hart state");
    assert_eq!(a.bus.log, b.bus.log, "{what}: device accesses");
    assert!(a.ram.as_slice() == b.ram.as_slice(), "{what}: RAM");
}

#[test]
fn translated_code_matches_the_interpreter() {
    random_programs(Mix::Int, false);
}

/// Programs dense with Zba, Zbb, Zbs and Zicond instructions (rd also an
/// operand now and then), translated with the host's LZCNT, TZCNT and
/// POPCNT where it has them and with the portable sequences.
#[test]
fn straight_lines_translated_match_the_interpreter() {
    random_programs(Mix::Straight, false);
}

#[test]
fn bitmanip_translated_matches_the_interpreter() {
    random_programs(Mix::Bits, false);
    random_programs(Mix::Bits, true);
}

/// Programs dense with LR, SC and AMOs (see `atomic_insns`): the SCs and
/// AMOs are translated, their misaligned and faulting cases and TLB misses
/// go back to the interpreter at the instruction, LR is interpreted; the
/// reservation is part of the state compared after every slice.
#[test]
fn atomics_translated_match_the_interpreter() {
    random_programs(Mix::Atomic, false);
}

/// Programs with cbo.zero in every privilege level, enabled and not,
/// into the data, the device, nothing and their own code.
#[test]
fn cbo_zero_translated_matches_the_interpreter() {
    random_programs(Mix::Cbo, false);
}

/// Linux's clear_page at 64-byte blocks: a loop of cbo.zero over a page.
/// Translated, it runs in one call of translated code after the first
/// iteration's TLB miss (the loop jumps to itself), and leaves what the
/// interpreter leaves; an enable off (illegal below M-mode, or M-mode,
/// left to the interpreter) goes back to it every time, with the same
/// result.
#[test]
fn a_cbo_zero_loop_runs_translated() {
    use PrivilegeMode::*;
    // A store first, so that the enables are what the translated
    // cbo.zero checks when it first runs (not a TLB miss).
    let prog = [
        s_type(0, 0, 12, 3),                 // sd x0, 0(x12)
        4 << 20 | 11 << 15 | 2 << 12 | 0x0f, // cbo.zero (x11)
        i_type(64, 11, 0, 11, 0x13),         // addi x11, x11, 64
        i_type(-1, 4, 0, 4, 0x13),           // addi x4, x4, -1
        b_type(-12, 0, 4, 1),                // bne x4, x0, BASE + 4
        j_type(0, 0),                        // j .
    ];
    let cbze = csr::ENVCFG_CBZE;
    for (prv, menvcfg, senvcfg, fast) in [
        (Machine, cbze, 0, true),
        (Supervisor, cbze, 0, true),
        (User, cbze, cbze, true),
        (Machine, 0, 0, false),
        (User, cbze, 0, false),
    ] {
        let mut runs = Vec::new();
        for jit in [0, 1] {
            let ram = GuestRam::new(BASE, RAM).unwrap();
            for (i, w) in prog.iter().enumerate() {
                ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
            }
            ram.write(DATA, &[0xa5; 0x1000]).unwrap();
            // The handler spins: an illegal cbo.zero stops there.
            ram.write_u32(HANDLER, j_type(0, 0)).unwrap();
            let mut hart = Hart::new(0);
            hart.set_jit(jit);
            hart.s.pc = BASE;
            hart.s.mtvec = HANDLER;
            hart.s.prv = prv;
            hart.s.menvcfg = menvcfg;
            hart.s.senvcfg = senvcfg;
            hart.s.x[11] = DATA + 0x11;
            hart.s.x[12] = DATA;
            hart.s.x[4] = 64;
            let mut bus = Device::default();
            let mut steps = 0;
            while steps < 4 * 64 + 2 {
                steps += hart.run(&ram, &mut bus, 4 * 64 + 2 - steps).0;
            }
            if jit == 1 && fast {
                assert!(hart.jit_stats().calls <= 3, "{prv:?}: {} calls", hart.jit_stats().calls);
            }
            let mut data = vec![0; 0x1000];
            ram.read(DATA, &mut data).unwrap();
            runs.push((hart.s.clone(), data));
        }
        assert_eq!(runs[0], runs[1], "{prv:?}, menvcfg {menvcfg:#x}, senvcfg {senvcfg:#x}");
        let zeroed = runs[0].1.iter().all(|&b| b == 0);
        assert_eq!(zeroed, fast || prv == Machine, "{prv:?}: the page zeroed");
    }
}

/// Program `prog` at BASE in RAM, and a machine-mode hart about to run
/// it, translating after `jit` entries (0: interpreted), its traps going
/// to HANDLER.
fn at_base(prog: &[u32], jit: u32) -> (Hart, GuestRam) {
    let ram = GuestRam::new(BASE, RAM).unwrap();
    for (i, w) in prog.iter().enumerate() {
        ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
    }
    let mut hart = Hart::new(0);
    hart.set_jit(jit);
    hart.s.pc = BASE;
    hart.s.mtvec = HANDLER;
    (hart, ram)
}

/// Runs `prog` (ended by `close_loop`) at BASE for 200 rounds of its loop,
/// translated after `jit` entries (0: interpreted), on a machine-mode hart
/// that `setup` prepares further; the hart and RAM after.
fn run_loop(prog: &[u32], jit: u32, setup: impl Fn(&mut Hart)) -> (Hart, GuestRam) {
    let iterations = 200;
    let (mut hart, ram) = at_base(prog, jit);
    hart.s.x[4] = iterations;
    setup(&mut hart);
    let mut bus = Device::default();
    let total = iterations * (prog.len() as u64 - 1);
    let mut steps = 0;
    while steps < total {
        steps += hart.run(&ram, &mut bus, total - steps).0;
    }
    (hart, ram)
}

/// A loop of loads and stores of every size on three pages stays in
/// translated code once the TLB holds the pages: the inlined TLB lookup
/// finds the entries the interpreter filled (a lookup that always missed
/// would still compute the right values, through the interpreter, so only
/// the number of returns to Rust shows it).
#[test]
fn a_loop_of_loads_and_stores_runs_translated() {
    let mut prog = Vec::new();
    for (k, page) in [0i32, 1, 3].into_iter().enumerate() {
        let base = 12 + k as u32;
        for f3 in 0..4 {
            let at = 8 * f3 as i32 + 64 * page;
            prog.push(i_type(at, base, f3, 16, 0x03)); // l{b,h,w,d} x16, at(base)
            prog.push(s_type(at + 32, 16, base, f3)); // s{b,h,w,d} x16, at+32(base)
        }
        prog.push(i_type(0, base, 4, 17, 0x03)); // lbu
        prog.push(i_type(0, base, 6, 17, 0x03)); // lwu
    }
    close_loop(&mut prog);
    let mut runs = Vec::new();
    for jit in [0, 1] {
        let (hart, ram) = run_loop(&prog, jit, |hart| {
            hart.s.prv = PrivilegeMode::Supervisor;
            for (k, page) in [0u64, 1, 3].into_iter().enumerate() {
                hart.s.x[12 + k] = DATA + 0x1000 * page;
            }
        });
        if jit == 1 {
            // The first iteration misses once for each page and kind.
            assert!(hart.jit_stats().calls <= 12, "{} calls into translated code", hart.jit_stats().calls);
        }
        runs.push((hart.s.clone(), ram.as_slice().to_vec()));
    }
    assert!(runs[0] == runs[1], "translated and interpreted runs differ");
}

/// Random programs of `mix`, interpreted and translated (with the
/// portable sequences for clz, ctz and cpop if `portable`).
fn random_programs(mix: Mix, portable: bool) {
    let mut translated = 0;
    let mut calls = 0;
    for seed in 1..=60u64 {
        let len = 20 + (seed as usize * 37) % 200;
        let total = 50_000;
        let slices = |s: u64| random_slices(s * 7919 + 1, 40, 3000);
        let jit_setup = |hot: u32| {
            let mut r = setup_with(seed, len, hot, mix);
            r.hart.set_jit_portable(portable);
            r
        };
        // The same slices, interpreted and translated (translating at the
        // first entry and at the default threshold).
        // Each slice's end state, interpreted.
        let mut states = Vec::new();
        let mut interp = setup_with(seed, len, 0, mix);
        run(&mut interp, total, slices(seed), |r| states.push(r.hart.s.clone()));
        for hot in [1, 32] {
            let mut jit = jit_setup(hot);
            follow(&format!("seed {seed}, hot {hot}, same slices"), &interp, &states, &mut jit, total, slices(seed));
            translated += jit.hart.translated_blocks();
            let stats = jit.hart.jit_stats();
            assert_eq!(stats.handoffs, 0, "seed {seed}, hot {hot}: left to the interpreter untranslated");
            calls += stats.calls;
        }
        // Other slices, interpreted and translated: the same state after
        // the same number of steps.
        let mut whole = jit_setup(1);
        run(&mut whole, total, || 1 << 20, |_| {});
        assert_eq!(whole.hart.jit_stats().handoffs, 0, "seed {seed}: left to the interpreter untranslated");
        let mut interp2 = setup_with(seed, len, 0, mix);
        run(&mut interp2, total, slices(seed + 1000), |_| {});
        check(&format!("seed {seed}, one slice against others"), &interp2, &whole);
    }
    assert!(translated > 100, "only {translated} blocks were translated");
    assert!(calls > 10_000, "translated code called only {calls} times");
}

/// Every translated ALU operation on operands chosen for their edge cases
/// (zero, ±1, the extremes of 64 and 32 bits, shift counts around 31, 32
/// and 63, single bytes and bits) and random ones, interpreted and
/// translated (clz, ctz and cpop both ways: with the host's instructions
/// and with the portable sequences). Every run must be one call of
/// translated code that leaves nothing to the interpreter.
#[test]
fn each_operation_on_edge_operands() {
    let mut ops = Vec::new();
    for (f7, f3) in OP_FUNCTS {
        ops.push(r_type(f7, 12, 11, f3, 10, 0x33));
    }
    for (f7, f3) in OP32_FUNCTS {
        ops.push(r_type(f7, 12, 11, f3, 10, 0x3b));
    }
    for imm in [0, 1, -1, 2047, -2048, 0x7ff, 0x555] {
        for f3 in [0, 2, 3, 4, 6, 7] {
            ops.push(i_type(imm, 11, f3, 10, 0x13));
        }
        ops.push(i_type(imm, 11, 0, 10, 0x1b));
    }
    for sh in [0, 1, 31, 32, 63] {
        ops.push(i_type(sh, 11, 1, 10, 0x13));
        ops.push(i_type(sh, 11, 5, 10, 0x13));
        ops.push(i_type(sh | 0x400, 11, 5, 10, 0x13));
        if sh < 32 {
            ops.push(i_type(sh, 11, 1, 10, 0x1b));
            ops.push(i_type(sh, 11, 5, 10, 0x1b));
            ops.push(i_type(sh | 0x400, 11, 5, 10, 0x1b));
        }
    }
    for sh in [0, 1, 31, 32, 63] {
        ops.extend(bitmanip(10, 11, 12, sh));
    }
    // The bitmanip operations with rd as an operand (rs1, rs2, both), x0
    // as one and as rd (a no-op).
    for sh in [1, 63] {
        for (rd, rs1, rs2) in [(11, 11, 12), (12, 11, 12), (11, 11, 11), (10, 0, 12), (10, 11, 0), (0, 11, 12)] {
            ops.extend(bitmanip(rd, rs1, rs2, sh));
        }
    }
    // rd = rs1 = rs2 and rd = rs2 alias cases.
    ops.push(r_type(0x20, 10, 11, 0, 10, 0x33)); // sub x10, x11, x10
    ops.push(r_type(0, 10, 10, 1, 10, 0x33)); // sll x10, x10, x10
    ops.push(r_type(1, 10, 11, 4, 10, 0x33)); // div x10, x11, x10
    let edge = [
        0u64,
        1,
        2,
        u64::MAX,
        u64::MAX - 1,
        1 << 63,
        (1 << 63) - 1,
        0xffff_ffff,
        0x8000_0000,
        0x7fff_ffff,
        0xffff_ffff_8000_0000,
        31,
        32,
        33,
        63,
        64,
        0x80,
        0x8000,
        0x0100_0000_0000_0000,
        0x1234_5678_9abc_def0,
    ];
    let mut rng = Rng(99);
    let mut pairs = Vec::new();
    for &a in &edge {
        for &b in &edge {
            pairs.push((a, b));
        }
    }
    for _ in 0..200 {
        pairs.push((rng.next(), rng.next()));
    }
    let ram = GuestRam::new(BASE, RAM).unwrap();
    let mut harts = [Hart::new(0), Hart::new(0), Hart::new(0)];
    harts[0].set_jit(0);
    harts[1].set_jit(1);
    harts[2].set_jit(1);
    harts[2].set_jit_portable(true);
    let mut bus = Device::default();
    for &op in &ops {
        ram.write_u32(BASE, op).unwrap();
        ram.write_u32(BASE + 4, j_type(0, 0)).unwrap();
        for &(a, b) in &pairs {
            // Two instructions: the whole block, so translated code runs.
            let out = run_each_from_base(&mut harts, &ram, &mut bus, [0x5555, a, b], 2, op);
            assert_eq!(out[0], out[1], "{op:#010x} with {a:#x}, {b:#x}: interpreted, translated");
            assert_eq!(out[0], out[2], "{op:#010x} with {a:#x}, {b:#x}: interpreted, translated portably");
        }
    }
    for h in &harts[1..] {
        assert!(h.translated_blocks() > 0);
        assert_eq!(h.jit_stats().handoffs, 0, "left to the interpreter untranslated");
    }
}

/// Two harts: one interpreting, one translating every block at its first
/// entry.
fn interpreted_and_translated() -> [Hart; 2] {
    let mut harts = [Hart::new(0), Hart::new(0)];
    harts[0].set_jit(0);
    harts[1].set_jit(1);
    harts
}

/// Each hart from BASE with x10, x11, x12 = `x`, `steps` steps in one run
/// (every hart after the first in one call of translated code, the code
/// at BASE being `op`'s block): their registers after.
fn run_each_from_base(
    harts: &mut [Hart],
    ram: &GuestRam,
    bus: &mut Device,
    x: [u64; 3],
    steps: u64,
    op: u32,
) -> Vec<[u64; 32]> {
    let mut out = Vec::new();
    for (i, h) in harts.iter_mut().enumerate() {
        h.s.pc = BASE;
        h.s.x[10..13].copy_from_slice(&x);
        let calls = h.jit_stats().calls;
        assert_eq!(h.run(ram, bus, steps), (steps, Exit::Budget));
        out.push(h.s.x);
        if i > 0 {
            assert_eq!(h.jit_stats().calls, calls + 1, "{op:#010x}: not run translated");
        }
    }
    out
}

/// The operations translated as a copy, a constant or one sign extension
/// (`mv` as `add` from x0 either side and as `addi` of 0, `li` as `addi`
/// from x0, `sext.w` as `addiw` of 0) and the commutative ones computed in
/// rd's own register when rd is rs2: with their operands in host
/// registers (each used again after, so the allocation gives them one)
/// and in the register file (used once), on edge values, translated and
/// interpreted, the same registers after.
#[test]
fn copies_constants_and_sign_extensions_in_and_out_of_host_registers() {
    let (add, and, or, xor) = ((0, 0), (0, 7), (0, 6), (0, 4));
    let mut ops = Vec::new();
    for (rd, rs1, rs2) in [(10, 0, 11), (10, 11, 0), (10, 11, 12), (11, 12, 11), (11, 11, 11), (0, 11, 12)] {
        for (f7, f3) in [add, and, or, xor] {
            ops.push(r_type(f7, rs2, rs1, f3, rd, 0x33));
        }
    }
    for (rd, rs1) in [(10, 11), (11, 11), (10, 0), (0, 11)] {
        for imm in [0, 1, -1, 2047, -2048] {
            ops.push(i_type(imm, rs1, 0, rd, 0x13)); // addi
            ops.push(i_type(imm, rs1, 0, rd, 0x1b)); // addiw
        }
    }
    let edge = [0u64, 1, u64::MAX, 1 << 63, 0xffff_ffff, 0x8000_0000, 0x7fff_ffff, 0x1234_5678_9abc_def0];
    let ram = GuestRam::new(BASE, RAM).unwrap();
    let mut harts = interpreted_and_translated();
    let mut bus = Device::default();
    for &op in &ops {
        for in_host in [false, true] {
            // After the operation, x10, x11 and x12 read again (so they get
            // host registers) or not at all.
            let after: &[u32] =
                if in_host { &[r_type(0, 11, 10, 0, 13, 0x33), r_type(0, 10, 12, 0, 14, 0x33)] } else { &[] };
            let prog: Vec<u32> = [op].iter().chain(after).copied().chain([j_type(0, 0)]).collect();
            for (i, w) in prog.iter().enumerate() {
                ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
            }
            let steps = prog.len() as u64;
            for &a in &edge {
                for &b in &edge {
                    let out = run_each_from_base(&mut harts, &ram, &mut bus, [0x5555_aaaa_8000_0001, a, b], steps, op);
                    assert_eq!(out[0], out[1], "{op:#010x} (host registers: {in_host}) with {a:#x}, {b:#x}");
                }
            }
        }
    }
}

/// Each branch on edge values, taken or not (the pc after it), with its
/// operands in host registers (read before it as well), in the register
/// file (read by it alone), known sign-extended (each just `sext.w`'d, so
/// compared in 32 bits), and against x0 either side: values alike in
/// their low word and not in their high one tell a 32-bit compare from a
/// 64-bit one.
#[test]
fn each_branch_on_edge_operands() {
    let branches = [0, 1, 4, 5, 6, 7]; // beq, bne, blt, bge, bltu, bgeu
    let add = |rd, rs1, rs2| r_type(0, rs2, rs1, 0, rd, 0x33);
    let sext = |r| i_type(0, r, 0, r, 0x1b);
    let before: [&[u32]; 3] = [&[], &[add(13, 11, 12), add(14, 12, 11)], &[sext(11), sext(12)]];
    let edge = [
        0u64,
        1,
        u64::MAX,
        1 << 63,
        1 << 32,
        0xffff_ffff,
        0x8000_0000,
        0x7fff_ffff,
        0xffff_ffff_8000_0000,
        0x0000_0001_8000_0000,
        0xffff_ffff_0000_0001,
    ];
    let ram = GuestRam::new(BASE, RAM).unwrap();
    let mut harts = interpreted_and_translated();
    let mut bus = Device::default();
    for f3 in branches {
        for (rs1, rs2) in [(11, 12), (11, 0), (0, 12), (11, 11)] {
            for pre in before {
                let prog: Vec<u32> =
                    pre.iter().copied().chain([b_type(8, rs2, rs1, f3), j_type(0, 0), j_type(0, 0)]).collect();
                for (i, w) in prog.iter().enumerate() {
                    ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
                }
                // The branch and the `j .` it goes to, which stays.
                let steps = pre.len() as u64 + 2;
                for &a in &edge {
                    for &b in &edge {
                        let mut out = Vec::new();
                        for (i, h) in harts.iter_mut().enumerate() {
                            h.s.pc = BASE;
                            h.s.x[11] = a;
                            h.s.x[12] = b;
                            let calls = h.jit_stats().calls;
                            assert_eq!(h.run(&ram, &mut bus, steps), (steps, Exit::Budget));
                            assert!(i == 0 || h.jit_stats().calls > calls, "not run translated");
                            out.push((h.s.pc, h.s.x));
                        }
                        let what = format!("branch f3 {f3} x{rs1}, x{rs2} after {pre:x?}, with {a:#x}, {b:#x}");
                        assert_eq!(out[0], out[1], "{what}: interpreted, translated");
                    }
                }
            }
        }
    }
}

/// Calls from translated code into Rust (the software FPU for a division
/// in another rounding mode, the AMO helper) with every host register of
/// the pool holding a guest register, each dirty: those the call may
/// clobber must come back, translated as interpreted.
#[test]
fn calls_into_rust_keep_the_guest_registers_held() {
    let regs = 9..=20u32;
    let mut prog: Vec<u32> = regs.clone().map(|r| i_type(r as i32, r, 0, r, 0x13)).collect();
    // fdiv.d f1, f2, f3, rtz
    prog.push(r_type(0x0d, 3, 2, 1, 1, 0x53));
    prog.extend(regs.clone().map(|r| i_type(1, r, 0, r, 0x13)));
    // amoadd.d x22, x23, (x5): a call, the block's last instruction.
    prog.push(atomic(0, true, 23, 5, 22));
    prog.push(j_type(0, 0));
    let ram = GuestRam::new(BASE, RAM).unwrap();
    for (i, w) in prog.iter().enumerate() {
        ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
    }
    let mut harts = interpreted_and_translated();
    let mut bus = Device::default();
    let mut after = Vec::new();
    for h in harts.iter_mut() {
        ram.write_u64(DATA, 0).unwrap();
        h.s.pc = BASE;
        h.s.mstatus |= 1 << 13;
        h.s.f[2] = 1.0f64.to_bits();
        h.s.f[3] = 3.0f64.to_bits();
        for r in regs.clone() {
            h.s.x[r as usize] = 0x0123_4567_89ab_cdef_u64.rotate_left(r);
        }
        h.s.x[5] = DATA;
        h.s.x[23] = 7;
        let steps = prog.len() as u64 - 1;
        assert_eq!(h.run(&ram, &mut bus, steps), (steps, Exit::Budget));
        after.push((h.s.x, h.s.f[1], h.jit_stats()));
    }
    assert_eq!(after[0].0, after[1].0, "the x registers");
    assert_eq!(after[0].1, after[1].1, "the quotient");
    let stats = after[1].2;
    assert!(stats.calls == 1 && stats.fp_calls == 1, "one call of translated code, one of the FPU: {stats:?}");
}

/// Every SC and AMO, .w and .d, on edge values in memory and in rs2, with
/// rd a third register, x0, rs1 or rs2, and rs1 = rs2 (the address is
/// the value) and an SC with a reservation of the address, of another and
/// none: translated (a single call of translated code, so no return to
/// the interpreter) and interpreted, the same registers, memory and
/// reservation after.
#[test]
fn each_atomic_on_edge_operands() {
    let mut ops = Vec::new();
    for d in [false, true] {
        for f5 in AMO_FUNCT5.into_iter().chain([0b00011]) {
            for (rd, rs1, rs2) in [(10, 11, 12), (0, 11, 12), (11, 11, 12), (12, 11, 12), (10, 11, 11), (11, 11, 11)] {
                ops.push(atomic(f5, d, rs2, rs1, rd));
            }
        }
    }
    let edge = [
        0u64,
        1,
        u64::MAX,
        1 << 63,
        (1 << 63) - 1,
        0xffff_ffff,
        0x8000_0000,
        0x7fff_ffff,
        0xffff_ffff_8000_0000,
        0x0000_0001_ffff_fffe,
        0x1234_5678_9abc_def0,
    ];
    let mut rng = Rng(7);
    let mut pairs = Vec::new();
    for &a in &edge {
        for &b in &edge {
            pairs.push((a, b));
        }
    }
    for _ in 0..100 {
        pairs.push((rng.next(), rng.next()));
    }
    let off = DATA - BASE;
    let reservations = [None, Some(off), Some(off + 8), Some(off + 4)];
    let ram = GuestRam::new(BASE, RAM).unwrap();
    let mut harts = interpreted_and_translated();
    let mut bus = Device::default();
    for &op in &ops {
        // The jump's block is decoded and translated again for each op
        // (its RAM word holds the atomic too).
        let mut warm = false;
        ram.write_u32(BASE, op).unwrap();
        ram.write_u32(BASE + 4, j_type(0, 0)).unwrap();
        for &(a, b) in &pairs {
            for &res in &reservations {
                let mut out = Vec::new();
                for (i, h) in harts.iter_mut().enumerate() {
                    ram.write_u64(DATA, a).unwrap();
                    ram.write_u64(DATA + 8, !a).unwrap();
                    h.s.pc = BASE;
                    h.s.x[10] = 0x5555;
                    h.s.x[11] = DATA;
                    h.s.x[12] = b;
                    h.s.reservation = res;
                    let calls = h.jit_stats().calls;
                    // The atomic's block, then the jump's.
                    assert_eq!(h.run(&ram, &mut bus, 2), (2, Exit::Budget));
                    out.push((h.s.clone(), ram.read_u64(DATA).unwrap(), ram.read_u64(DATA + 8).unwrap()));
                    // Once the store TLB holds the page and the jump is
                    // translated: one call, which ran both blocks.
                    if i > 0 && warm {
                        assert_eq!(h.jit_stats().calls, calls + 1, "{op:#010x}: not run translated alone");
                    }
                }
                warm = true;
                assert_eq!(out[0], out[1], "{op:#010x} with {a:#x} in memory, {b:#x}, reservation {res:?}");
            }
        }
    }
    assert_eq!(harts[1].jit_stats().handoffs, 0, "left to the interpreter untranslated");
}

/// SCs and AMOs under Sv39 paging, in S-mode, on a page they may write,
/// one they may only read (which loads put in the load TLB, not the store
/// TLB), one with no mapping and one not yet dirty: the translated ones
/// must take the store TLB's fast path only where the interpreter's
/// `amo_offset` does, and leave page faults (to an M-mode handler that
/// skips the instruction) to the interpreter, slice by slice the same.
#[test]
fn atomics_on_pages_they_may_not_write() {
    let mut traps = 0;
    for seed in 1..=24u64 {
        let mut rng = Rng(seed * 131 + 5);
        let len = 20 + rng.below(60) as usize;
        let mut p = Vec::new();
        while p.len() < len {
            // x5..x8: the writable, read-only, unmapped and clean pages.
            let base = 5 + rng.below(4) as u32;
            let t = 10 + rng.below(6) as u32;
            let (rd, rs2) = (rng.pick(&[0, 16, 17, 18, t]), 16 + rng.below(3) as u32);
            let d = rng.below(2) == 0;
            match rng.below(5) {
                0 => p.push(i_type(8 * rng.below(4) as i32, base, 3, 19, 0x03)),
                k => {
                    p.push(i_type(8 * rng.below(4) as i32, base, 0, t, 0x13));
                    let f5 = match k {
                        1 => 0b00010,
                        2 => 0b00011,
                        _ => rng.pick(&AMO_FUNCT5),
                    };
                    p.push(atomic(f5, d, if f5 == 0b00010 { 0 } else { rs2 }, t, rd));
                }
            }
        }
        close_loop(&mut p);
        let make = |hot: u32| -> Run {
            // Code V R X A; data V R W A D; read-only V R A; page 3 none;
            // page 4 V R W A, not D.
            let maps = [(0u64, 0x4b), (1, 0xc7), (2, 0x43), (4, 0x47)].map(|(v, bits)| (v, PAGED + 0x1000 * v, bits));
            let ram = paged_ram(&p, 0x800, |i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15), maps);
            let mut hart = s_mode_hart(hot);
            for (k, x) in (5..=8).enumerate() {
                hart.s.x[x] = VA + 0x1000 * (k as u64 + 1);
            }
            let mut r = Rng(seed);
            for x in 16..=18 {
                hart.s.x[x] = r.next();
            }
            hart.s.x[4] = 300;
            Run { hart, ram, bus: Device::default(), slices: Vec::new() }
        };
        let interp = interpreted_then_translated(seed, 20_000, || random_slices(seed * 7919 + 11, 30, 2000), make, 100);
        traps += (interp.hart.s.mcause != 0) as u32;
    }
    assert!(traps > 12, "only {traps} programs trapped");
}

/// Loads and stores (integer and floating point, every size) running
/// into the next page under Sv39 paging, in S-mode, where the next
/// virtual page maps to RAM that is not the next physical page: the
/// translated ones must leave such an access to the interpreter (which
/// splits it between the two pages) exactly where the interpreter's fast
/// path does, and so read and write the same bytes. Without paging the
/// bytes after a page are the next page's anyway, so only this shows an
/// access that wrongly stays on its first page.
#[test]
fn accesses_across_pages_under_paging() {
    let mut crossed = 0;
    for seed in 1..=16u64 {
        let mut rng = Rng(seed * 7 + 3);
        let len = 20 + rng.below(40) as usize;
        let mut p = Vec::new();
        while p.len() < len {
            // x5 is the middle of virtual page 1, whose next page (2) is
            // physical page 3, and page 2's next (3) is physical page 1.
            // Offsets near the end of page 1 or 2: some accesses fit,
            // some run over.
            let base = 5 + rng.below(2) as u32;
            let imm = 0x7f0 + rng.below(16) as i32;
            let r = 10 + rng.below(6) as u32;
            match rng.below(4) {
                0 => p.push(i_type(imm, base, rng.below(7) as u32, r, 0x03)),
                1 => p.push(s_type(imm, r, base, rng.below(4) as u32)),
                2 => p.push(i_type(imm, base, 2 + rng.below(2) as u32, rng.below(4) as u32, 0x07)),
                _ => p.push(s_type(imm, rng.below(4) as u32, base, 2 + rng.below(2) as u32) & !0x7f | 0x27),
            }
        }
        close_loop(&mut p);
        let make = |hot: u32| -> Run {
            // Code V R X A; data pages V R W A D, out of order.
            let maps = [(0u64, 0u64, 0x4b), (1, 1, 0xc7), (2, 3, 0xc7), (3, 1, 0xc7)]
                .map(|(v, p, bits)| (v, PAGED + 0x1000 * p, bits));
            let ram = paged_ram(&p, 0x1000, |i| (i + seed).wrapping_mul(0x9e37_79b9_7f4a_7c15), maps);
            let mut hart = s_mode_hart(hot);
            hart.s.mstatus = 1 << 13;
            hart.s.x[5] = VA + 0x1800;
            hart.s.x[6] = VA + 0x2800;
            let mut r = Rng(seed);
            for x in 10..=15 {
                hart.s.x[x] = r.next();
            }
            hart.s.x[4] = 200;
            Run { hart, ram, bus: Device::default(), slices: Vec::new() }
        };
        let interp = interpreted_then_translated(seed, 12_000, || random_slices(seed * 31 + 7, 30, 2000), make, 50);
        assert_eq!(interp.hart.s.mcause, 0, "seed {seed}: an access trapped");
        crossed += p.iter().filter(|&&w| (w >> 20 & 0xf) + 8 > 0x10 || (w >> 7 & 0xf) + 8 > 0x10).count();
    }
    assert!(crossed > 50, "only {crossed} accesses that may cross");
}

/// A loop of one block (its branch back to its own start goes straight to
/// the top of its body, past the chain entry's checks), stopped by budgets
/// that end anywhere in it and by a load that misses the TLB now and then:
/// after every slice, the interpreter's state, RAM and instruction count.
#[test]
fn a_loop_of_one_block_matches_the_interpreter() {
    let prog = [
        i_type(0, 8, 2, 11, 0x03),      // 0: lw x11, 0(x8)
        r_type(0, 4, 11, 0, 11, 0x3b),  // 4: addw x11, x11, x4
        s_type(0, 11, 8, 2),            // 8: sw x11, 0(x8)
        i_type(3, 11, 1, 12, 0x1b),     // 12: slliw x12, x11, 3
        r_type(0, 12, 10, 4, 10, 0x33), // 16: xor x10, x10, x12
        i_type(4, 8, 0, 8, 0x13),       // 20: addi x8, x8, 4 (a page further every 1024 rounds)
        i_type(-1, 4, 0, 4, 0x13),      // 24: addi x4, x4, -1
        b_type(-28, 0, 4, 1),           // 28: bne x4, x0, 0
        j_type(0, 0),                   // 32: j .
    ];
    for seed in 1..=4u64 {
        let make = |hot: u32| {
            let (mut hart, ram) = at_base(&prog, hot);
            hart.s.x[8] = DATA;
            hart.s.x[10] = seed;
            hart.s.x[4] = 20_000;
            Run { hart, ram, bus: Device::default(), slices: Vec::new() }
        };
        let interp = interpreted_then_translated(seed, 100_000, || random_slices(seed * 31, 20, 4000), make, 10);
        assert_eq!(interp.hart.s.x[4], 20_000 - 100_000 / 8, "seed {seed}: the loop's count");
    }
}

/// A word a loop's round computes last and the next round reads whole:
/// translated code leaves a word operation's sign extension undone while
/// only low words are read (`addw` after `addw`), and must do it on the
/// way back to the loop's start, whose 64-bit `add` takes all of it. The
/// word crosses 2^31 every few rounds, where an extension left undone
/// (x86 clears the upper half) changes the sum.
#[test]
fn a_word_carried_round_a_loop_is_sign_extended() {
    let prog = [
        r_type(0, 11, 10, 0, 10, 0x33), // 0: add x10, x10, x11
        i_type(-1, 4, 0, 4, 0x13),      // 4: addi x4, x4, -1
        r_type(0, 12, 11, 0, 11, 0x3b), // 8: addw x11, x11, x12
        b_type(-12, 0, 4, 1),           // 12: bne x4, x0, 0
        j_type(0, 0),                   // 16: j .
    ];
    let runs = both_ways(&prog, 4 * 10_000, 11, |hart, _| {
        hart.s.x[4] = 10_000;
        hart.s.x[11] = 0x7fff_0000;
        hart.s.x[12] = 0x1234_5679;
    });
    assert_eq!(runs[0].0.x[4], 0);
    assert!(runs[0] == runs[1], "x10: interpreted {:#x}, translated {:#x}", runs[0].0.x[10], runs[1].0.x[10]);
}

/// A loop whose rounds sign-extend words is translated twice: its first
/// round, and the rounds after, which take what the first round's end
/// knows of sign-extended registers to hold at their start (a `sext.w`
/// of one is a copy there). x11 is a word from the last round's `addw`
/// (known after the first round); x15 is never written in the loop (never
/// known: its upper half is not its low word's extension, so a `sext.w`
/// of it taken as a copy changes the sum).
#[test]
fn a_loop_translated_twice_knows_only_what_its_first_round_ends_with() {
    let prog = [
        i_type(0, 11, 0, 13, 0x1b),     // 0: sext.w x13, x11
        r_type(0, 13, 10, 0, 10, 0x33), // 4: add x10, x10, x13
        i_type(-1, 4, 0, 4, 0x13),      // 8: addi x4, x4, -1
        r_type(0, 12, 11, 0, 11, 0x3b), // 12: addw x11, x11, x12
        i_type(0, 15, 0, 14, 0x1b),     // 16: sext.w x14, x15
        r_type(0, 14, 10, 0, 10, 0x33), // 20: add x10, x10, x14
        b_type(-24, 0, 4, 1),           // 24: bne x4, x0, 0
        j_type(0, 0),                   // 28: j .
    ];
    let runs = both_ways(&prog, 7 * 10_000, 13, |hart, _| {
        hart.s.x[4] = 10_000;
        hart.s.x[11] = 0x7fff_0000_9abc_def0;
        hart.s.x[12] = 0x1234_5679;
        hart.s.x[15] = 0x1234_5678_9abc_def0;
    });
    assert_eq!(runs[0].0.x[4], 0);
    assert!(runs[0] == runs[1], "x10: interpreted {:#x}, translated {:#x}", runs[0].0.x[10], runs[1].0.x[10]);
}

/// Loads and stores through one base register share one TLB check (a
/// group): a write of the base register between two of them ends the
/// group, so the second checks, and reads, where the base points now.
/// Here every round reads through x12, moves x12 on, and reads and writes
/// through it again (and through x15, a load into its own base register
/// between); the words differ everywhere, so an access through a stale
/// base shows in the sums.
#[test]
fn a_base_register_written_between_accesses_ends_their_group() {
    let mut prog = vec![
        i_type(0, 12, 2, 13, 0x03),     // lw x13, 0(x12)
        i_type(4, 12, 2, 14, 0x03),     // lw x14, 4(x12)
        i_type(8, 12, 0, 12, 0x13),     // addi x12, x12, 8
        i_type(0, 12, 2, 16, 0x03),     // lw x16, 0(x12)
        s_type(8, 13, 12, 2),           // sw x13, 8(x12)
        i_type(0, 15, 3, 15, 0x03),     // ld x15, 0(x15): a pointer to the next
        s_type(12, 14, 12, 2),          // sw x14, 12(x12)
        i_type(8, 15, 2, 17, 0x03),     // lw x17, 8(x15)
        r_type(0, 13, 10, 0, 10, 0x33), // add x10, x10, x13
        r_type(0, 16, 10, 0, 10, 0x33), // add x10, x10, x16
        r_type(0, 17, 10, 0, 10, 0x33), // add x10, x10, x17
    ];
    close_loop(&mut prog);
    let rounds = 300;
    let runs = both_ways(&prog, rounds * (prog.len() as u64 - 1), 17, |hart, ram| {
        // Words of their own addresses' hash; from DATA + 0x2000, a chain
        // of pointers 16 bytes apart.
        for i in 0..0x800u64 {
            ram.write_u32(DATA + 4 * i, (i as u32).wrapping_mul(0x9e37_79b9) ^ 0x5555).unwrap();
        }
        for i in 0..(rounds + 2) {
            ram.write_u64(DATA + 0x2000 + 16 * i, DATA + 0x2000 + 16 * (i + 1)).unwrap();
        }
        hart.s.x[4] = rounds;
        hart.s.x[12] = DATA;
        hart.s.x[15] = DATA + 0x2000;
    });
    assert_eq!(runs[0].0.x[4], 0);
    assert!(runs[0] == runs[1], "x10: interpreted {:#x}, translated {:#x}", runs[0].0.x[10], runs[1].0.x[10]);
}

/// Runs `prog` at BASE for `steps` instructions, in slices of random
/// lengths (seeded by `seed`), interpreted and then translated at the
/// first entry, each from a machine-mode hart and RAM that `setup`
/// prepares; each run's state and RAM. The translated run must have
/// stayed in translated code (a few calls in all).
fn both_ways(prog: &[u32], steps: u64, seed: u64, setup: impl Fn(&mut Hart, &GuestRam)) -> Vec<(HartState, Vec<u8>)> {
    let mut runs = Vec::new();
    for jit in [0, 1] {
        let (mut hart, ram) = at_base(prog, jit);
        setup(&mut hart, &ram);
        let mut bus = Device::default();
        let mut rng = Rng(seed);
        let mut done = 0;
        while done < steps {
            done += hart.run(&ram, &mut bus, (1 + rng.below(3000)).min(steps - done)).0;
        }
        if jit == 1 {
            assert!(hart.jit_stats().calls < 100, "{} calls into translated code", hart.jit_stats().calls);
        }
        runs.push((hart.s.clone(), ram.as_slice().to_vec()));
    }
    runs
}

/// A loop whose second block rewrites an instruction of its first (which
/// it then reaches straight from translated code): every iteration must
/// run the new instruction. With translation at the first entry, every
/// iteration translates the changed block again, so the arena also fills
/// up and starts over many times.
#[test]
fn code_changed_under_a_translated_loop() {
    // x8 = BASE; x12 = the bits that turn `addi x10, x10, 1` into
    // `addi x10, x10, 2` and back; x4 counts down.
    let prog = [
        i_type(1, 10, 0, 10, 0x13),     // 0: addi x10, x10, 1 (rewritten)
        j_type(8, 0),                   // 4: j 12
        0,                              // 8: (never reached)
        i_type(0, 8, 2, 11, 0x03),      // 12: lw x11, 0(x8)
        r_type(0, 12, 11, 4, 11, 0x33), // xor x11, x11, x12
        s_type(0, 11, 8, 2),            // sw x11, 0(x8)
        i_type(-1, 4, 0, 4, 0x13),      // addi x4, x4, -1
        b_type(-28, 0, 4, 1),           // bne x4, x0, 0
        j_type(0, 0),                   // j .
    ];
    let mut runs = Vec::new();
    for hot in [0, 1, 2, 32] {
        let ram = GuestRam::new(BASE, RAM).unwrap();
        for (i, w) in prog.iter().enumerate() {
            ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
        }
        let mut hart = Hart::new(0);
        hart.set_jit(hot);
        hart.s.pc = BASE;
        hart.s.x[8] = BASE;
        hart.s.x[12] = 3 << 20;
        hart.s.x[4] = 60_000;
        let mut bus = Device::default();
        let mut rng = Rng(5);
        let mut done = 0;
        while done < 500_000 {
            let (n, _) = hart.run(&ram, &mut bus, 1 + rng.below(5000));
            done += n;
        }
        runs.push(hart.s.clone());
    }
    // 30000 iterations adding 1 and 30000 adding 2.
    assert_eq!(runs[0].x[10], 90_000);
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r, &runs[0], "run {i}");
    }
}

/// A loop of 76 instructions without a branch, then 2 (every 64th round
/// 5) ending it: blocks of 32, 32 and 14, which one translation runs
/// through. Loads from the device in the second and third blocks return
/// to the interpreter there (every round), and every 64th round a store
/// after the loop's body rewrites an instruction of the second block
/// (alternately adding 1 and 2): the translation must not be found again
/// for the first block, whose bytes did not change, while the second's
/// differ from what it was made from.
#[test]
fn a_translation_runs_on_through_the_blocks_after_its_own() {
    let mut prog = Vec::new();
    for i in 0..76 {
        prog.push(match i {
            // x10 += 1 or 2 (the instruction rewritten).
            40 => i_type(1, 10, 0, 10, 0x13),
            // Device reads, at steps the device's answers depend on.
            45 => i_type(0, 6, 3, 13, 0x03),
            70 => i_type(8, 6, 3, 13, 0x03),
            50 | 71 => r_type(0, 13, 14, 4, 14, 0x33),
            // Busy work on the other registers, kept in host registers.
            i => r_type(0, 15 + (i % 7) as u32, 15 + ((i + 3) % 7) as u32, [0, 4, 6][i % 3], 15 + (i % 7) as u32, 0x33),
        });
    }
    prog.extend([
        i_type(63, 4, 7, 9, 0x13),      // andi x9, x4, 63
        b_type(16, 0, 9, 1),            // bne x9, x0, +16
        i_type(160, 8, 2, 11, 0x03),    // lw x11, 160(x8)
        r_type(0, 12, 11, 4, 11, 0x33), // xor x11, x11, x12 (1 <-> 2)
        s_type(160, 11, 8, 2),          // sw x11, 160(x8)
    ]);
    close_loop(&mut prog);
    const STEPS: u64 = 300_000;
    // What the interpreter must come to: each round's steps and sum.
    let (mut x4, mut imm, mut sum, mut steps) = (5_000u64, 1, 0, 0);
    loop {
        let round = 76 + 2 + if x4 & 63 == 0 { 3 } else { 0 } + 2;
        if steps + round > STEPS {
            break;
        }
        steps += round;
        sum += imm;
        if x4 & 63 == 0 {
            imm ^= 3;
        }
        x4 -= 1;
    }
    for seed in 1..=3u64 {
        let make = |hot: u32| {
            let (mut hart, ram) = at_base(&prog, hot);
            hart.s.x[6] = DEVICE;
            hart.s.x[8] = BASE;
            hart.s.x[12] = 3 << 20;
            hart.s.x[4] = 5_000;
            for r in 15..22 {
                hart.s.x[r] = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> r;
            }
            Run { hart, ram, bus: Device::default(), slices: Vec::new() }
        };
        let interp = interpreted_then_translated(seed, STEPS, || random_slices(seed * 17, 100, 6000), make, 10);
        // The last round may have got past its instruction 40.
        let partial = u64::from(STEPS - steps > 40) * imm;
        assert_eq!(interp.hart.s.x[10], sum + partial, "seed {seed}: the rewritten instruction's sum");
        let mut jit = make(32);
        run(&mut jit, STEPS, || 6000, |_| {});
        assert!(jit.hart.jit_stats().later_resumes > 1000, "seed {seed}: device reads returned from later blocks");
    }
}

/// A store from one hart into code another hart runs, the storing hart's
/// store TLB having held the page before it became code: the page must
/// leave that TLB before the hart stores again, or the store would reach
/// RAM behind the code's back and the other hart would run the old
/// instruction. Interpreted and translated alike; the expected sum is
/// counted, not compared with another run (both would run the same stale
/// block).
/// A loop of the floating-point computations compiled code runs most, on
/// normal numbers in round to nearest (fflags cleared each time round, so
/// the inexact flag is taken from the host's every time), stays inline:
/// no call of the software FPU once translated. Every one of them is
/// still correct through that call, so only the count shows a fast path
/// that gives up.
#[test]
fn a_loop_of_floating_point_stays_inline() {
    let r = |f7: u32, rs2: u32, rs1: u32, f3: u32, rd: u32| r_type(f7, rs2, rs1, f3, rd, 0x53);
    let mut prog = vec![
        i_type(1, 0, 1, 0, 0x73), // csrrw x0, fflags, x0
        r(0x01, 2, 1, 0, 3),      // fadd.d f3, f1, f2
        r(0x09, 2, 3, 0, 4),      // fmul.d f4, f3, f2
        r(0x05, 1, 4, 0, 5),      // fsub.d f5, f4, f1
        r(0x0d, 2, 5, 0, 6),      // fdiv.d f6, f5, f2
        r(0x2d, 0, 3, 0, 7),      // fsqrt.d f7, f3
        r(0x09, 2, 1, 7, 13),     // fmul.d f13, f1, f2, dyn (frm 0)
        r(0x51, 2, 1, 1, 16),     // flt.d x16, f1, f2
        r(0x61, 2, 6, 1, 17),     // fcvt.l.d x17, f6, rtz
        r(0x69, 2, 17, 0, 8),     // fcvt.d.l f8, x17
        r(0x71, 0, 7, 0, 18),     // fmv.x.d x18, f7
        r(0x79, 0, 18, 0, 14),    // fmv.d.x f14, x18
        r(0x11, 2, 1, 1, 9),      // fsgnjn.d f9, f1, f2
        r(0x15, 2, 1, 0, 15),     // fmin.d f15, f1, f2
        r(0x71, 0, 1, 1, 19),     // fclass.d x19, f1
        r(0x00, 12, 11, 0, 10),   // fadd.s f10, f11, f12
        r(0x20, 1, 6, 0, 20),     // fcvt.s.d f20, f6
    ];
    close_loop(&mut prog);
    let mut runs = Vec::new();
    for jit in [0, 1] {
        let (hart, _) = run_loop(&prog, jit, |hart| {
            hart.s.mstatus = 1 << 13;
            hart.s.f[1] = 1.5f64.to_bits();
            hart.s.f[2] = 1.3f64.to_bits();
            hart.s.f[11] = 0xffff_ffff_0000_0000 | 1.5f32.to_bits() as u64;
            hart.s.f[12] = 0xffff_ffff_0000_0000 | 0.1f32.to_bits() as u64;
        });
        if jit == 1 {
            assert_eq!(hart.jit_stats().fp_calls, 0, "calls of the software FPU");
            assert!(hart.jit_stats().calls <= 3, "{} calls into translated code", hart.jit_stats().calls);
        }
        runs.push(hart.s.clone());
    }
    assert_eq!(runs[0], runs[1], "translated, interpreted");
    assert_eq!(runs[1].fflags, 1, "NX, and only NX");
}

/// A direct link between translations (a block's jump straight to the
/// translation of the next block on its page) is taken only while the
/// target's slot still holds that translation. Here the target's code
/// changes while a block of another page holds its slot, and that page's
/// code state ends equal to the target page's, so nothing else stops the
/// old translation from running (the code state check compares the page
/// with the decoding in the slot).
#[test]
fn a_direct_link_to_a_block_pushed_out_of_its_slot() {
    // RAM offsets 0x40 and 0x40060 share a slot of the block cache.
    let b = BASE + 0x40;
    let c = BASE + 0x4_0060;
    let prog = [
        (BASE, i_type(-1, 4, 0, 4, 0x13)), // addi x4, x4, -1
        (BASE + 4, b_type(0x7c, 0, 4, 0)), // beq x4, x0, BASE + 0x80
        (BASE + 8, j_type(0x38, 0)),       // j b
        (b, i_type(1, 10, 0, 10, 0x13)),   // b: addi x10, x10, 1 (then 2)
        (b + 4, j_type(-0x44, 0)),         // j BASE
        (BASE + 0x80, j_type(0, 0)),       // j .
        (c, i_type(1, 11, 0, 11, 0x13)),   // c: addi x11, x11, 1
        (c + 4, j_type(0, 0)),             // j .
    ];
    let mut runs = Vec::new();
    for hot in [0, 1] {
        let mut ram = GuestRam::new(BASE, RAM).unwrap();
        for &(at, w) in &prog {
            ram.write_u32(at, w).unwrap();
        }
        let mut hart = Hart::new(0);
        hart.set_jit(hot);
        hart.s.x[4] = 1000;
        let mut bus = Device::default();
        let mut go = |ram: &GuestRam, pc: u64, n: u64| {
            hart.s.pc = pc;
            let mut done = 0;
            while done < n {
                done += hart.run(ram, &mut bus, n - done).0;
            }
            hart.s.clone()
        };
        // Five rounds of the loop: every block translated and linked.
        go(&mut ram, BASE, 25);
        // c takes b's slot (its page becomes code), its page is written.
        go(&mut ram, c, 3);
        ram.write_u32(c + 0x100, 0).unwrap();
        // b back in its slot (its translation found again).
        go(&mut ram, BASE, 25);
        // b changes; c takes the slot again, its page's code state now
        // what b's page's will be when it is code again.
        ram.write_u32(b, i_type(2, 10, 0, 10, 0x13)).unwrap();
        go(&mut ram, c, 3);
        let end = go(&mut ram, BASE, 25);
        assert_eq!(ram.code_state(0), ram.code_state(0x4_0060), "hot {hot}: the code states differ");
        runs.push(end);
    }
    assert_eq!(runs[0].x[10], 5 + 5 + 2 * 5);
    assert_eq!(runs[1], runs[0], "translated, interpreted");
}

#[test]
fn a_store_from_another_hart_reaches_code_decoded_after_it_cached_the_page() {
    const CODE: u64 = BASE + 0x1000;
    let add = |n| i_type(n, 10, 0, 10, 0x13); // addi x10, x10, n
    let storer = [
        s_type(0x7f8, 0, 8, 2), // sw x0, 0x7f8(x8): the code's page enters the store TLB
        s_type(0, 12, 8, 2),    // sw x12, 0(x8): addi x10, x10, 1 becomes 2
        j_type(0, 0),           // j .
    ];
    let looper = [
        add(1),                    // addi x10, x10, 1 (rewritten)
        i_type(-1, 4, 0, 4, 0x13), // addi x4, x4, -1
        b_type(-8, 0, 4, 1),       // bne x4, x0, -8
        j_type(0, 0),              // j .
    ];
    for hot in [0, 1, 32] {
        let ram = GuestRam::new(BASE, RAM).unwrap();
        for (i, w) in storer.iter().enumerate() {
            ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
        }
        for (i, w) in looper.iter().enumerate() {
            ram.write_u32(CODE + 4 * i as u64, *w).unwrap();
        }
        let mut harts = [Hart::new(0), Hart::new(1)];
        for h in harts.iter_mut() {
            h.set_jit(hot);
        }
        harts[0].s.pc = BASE;
        harts[0].s.x[8] = CODE;
        harts[0].s.x[12] = add(2) as u64;
        harts[1].s.pc = CODE;
        harts[1].s.x[4] = 200;
        let mut bus = Device::default();
        assert_eq!(harts[0].run(&ram, &mut bus, 1).0, 1);
        // 100 rounds of three instructions.
        assert_eq!(harts[1].run(&ram, &mut bus, 300).0, 300);
        assert_eq!(harts[1].s.x[10], 100, "hot {hot}: before the rewrite");
        assert_eq!(harts[0].run(&ram, &mut bus, 1).0, 1);
        assert_eq!(ram.read_u32(CODE).unwrap(), add(2));
        assert_eq!(harts[1].run(&ram, &mut bus, 300).0, 300);
        assert_eq!(harts[1].s.x[10], 300, "hot {hot}: the rewritten instruction did not run");
    }
}

/// Calls and returns across pages under Sv39 paging, in S-mode: a loop in
/// one page calls functions in others, directly (`jal`) and through a
/// register (`auipc` + `jalr`), each function returns with `jalr`, and
/// most run on over the end of their page into the next. The virtual pages
/// map to RAM pages in shuffled order, and two more pages alias the RAM of
/// two of them at virtual addresses that share their fetch TLB entries,
/// so jumps between the aliases miss the TLB, refill it, and run the same
/// blocks (keyed by RAM offset) at two pcs; blocks of different pages
/// share slots of the block table. Translated code follows these
/// jumps through the fetch TLB and the block table itself; everything must
/// come out as interpreted, slice by slice.
#[test]
fn jumps_across_pages_and_through_registers() {
    const CODE: u64 = PAGED;
    // Virtual pages 0..8 (main, six functions, the last one's tail), and
    // 256 + 3, 256 + 4 aliasing 3 and 4.
    const ALIAS: u64 = 256;
    let mut translated = 0;
    for seed in 1..=24u64 {
        let mut rng = Rng(seed * 31 + 7);
        let mut perm: Vec<u64> = (0..8).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let phys = |vpage: u64| -> u64 {
            let p = if vpage >= ALIAS { vpage - ALIAS } else { vpage };
            // 16 KiB apart: `block::slot_of` folds the bits from 14 up onto
            // the low ones, so blocks at nearby offsets of two of these
            // pages share slots of the block table (at offsets o and o ^ 8
            // when the pages' numbers differ in bit 2 alone), and jumps
            // find other blocks in the slots they look in.
            CODE + 0x4000 * perm[p as usize]
        };
        let mut words: Vec<(u64, u32)> = Vec::new();
        // Functions 1..=6: a random body over x10..x20 ending in `jalr x0,
        // 0(x9)`, starting `back` words before the end of page k.
        let mut starts = Vec::new();
        for k in 1..=6u64 {
            let len = 4 + rng.below(40) as usize;
            let back = 1 + rng.below(len as u64 + 4);
            let start = VA + 0x1000 * (k + 1) - 4 * back;
            starts.push(start);
            let reg = |rng: &mut Rng| 10 + rng.below(11) as u32;
            let mut body = Vec::new();
            while body.len() < len {
                let left = len - body.len();
                let (rd, rs1, rs2) = (reg(&mut rng), reg(&mut rng), reg(&mut rng));
                body.push(match rng.below(10) {
                    0..=3 => {
                        let (f7, f3) = rng.pick(&OP_FUNCTS);
                        r_type(f7, rs2, rs1, f3, rd, 0x33)
                    }
                    4 => {
                        let (f7, f3) = rng.pick(&OP32_FUNCTS);
                        r_type(f7, rs2, rs1, f3, rd, 0x3b)
                    }
                    5 | 6 => i_type(rng.below(4096) as i32 - 2048, rs1, rng.pick(&[0, 4, 6, 7]), rd, 0x13),
                    // The pc, which differs between the aliases.
                    7 => (rng.next() as u32 & 0xffff_f000) | rd << 7 | 0x17,
                    _ if left > 2 => {
                        let skip = 1 + rng.below((left as u64 - 1).min(4)) as i32;
                        b_type(4 * skip, rs2, rs1, rng.pick(&[0, 1, 4, 5, 6, 7]))
                    }
                    _ => i_type(1, rs1, 0, rd, 0x13),
                });
            }
            body.push(i_type(0, 9, 0, 0, 0x67));
            for (i, w) in body.into_iter().enumerate() {
                words.push((start + 4 * i as u64, w));
            }
        }
        // Main, at the start of page 0: calls, then the loop's end.
        let mut main = Vec::new();
        for _ in 0..12 {
            let f = rng.below(7) as usize;
            let target = if f == 6 { starts[2] + 0x1000 * ALIAS } else { starts[f] };
            let at = VA + 4 * main.len() as u64;
            let off = target.wrapping_sub(at) as i64;
            if rng.below(2) == 0 && off.abs() < 1 << 20 {
                main.push(j_type(off as i32, 9));
            } else {
                // auipc x21, hi; jalr x9, lo(x21)
                let lo = ((off as i32) << 20) >> 20;
                let hi = (off as i32).wrapping_sub(lo) as u32 & 0xffff_f000;
                main.push(hi | 21 << 7 | 0x17);
                main.push(i_type(lo, 21, 0, 9, 0x67));
            }
        }
        main.push(i_type(-1, 4, 0, 4, 0x13));
        main.push(b_type(-4 * (main.len() as i32), 0, 4, 1));
        main.push(j_type(0, 0));
        for (i, w) in main.into_iter().enumerate() {
            words.push((VA + 4 * i as u64, w));
        }

        let make = |hot: u32| -> Run {
            let ram = GuestRam::new(BASE, RAM).unwrap();
            for &(va, w) in &words {
                let vpage = (va - VA) >> 12;
                ram.write_u32(phys(vpage) + (va & 0xfff), w).unwrap();
            }
            // V, R, W, X, A, D.
            sv39(&ram, (0..8).chain([ALIAS + 3, ALIAS + 4]).map(|v| (v, phys(v), 0xcf)));
            let mut hart = Hart::new(0);
            hart.set_jit(hot);
            hart.s.satp = 8 << 60 | ROOT >> 12;
            hart.s.prv = ftvm_cpu::PrivilegeMode::Supervisor;
            hart.s.pc = VA;
            let mut r = Rng(seed);
            for x in 10..=20 {
                hart.s.x[x] = r.next();
            }
            hart.s.x[4] = 200;
            Run { hart, ram, bus: Device::default(), slices: Vec::new() }
        };
        let total = 30_000;
        let slices = || random_slices(seed * 7919 + 3, 30, 2000);
        let mut states = Vec::new();
        let mut interp = make(0);
        run(&mut interp, total, slices(), |r| states.push(r.hart.s.clone()));
        assert_eq!(interp.hart.s.mcause, 0, "seed {seed}: the program traps");
        assert!(interp.hart.s.x[4] < 200, "seed {seed}: the loop does not run");
        for hot in [1, 2, 32] {
            let mut jit = make(hot);
            follow(&format!("seed {seed}, hot {hot}"), &interp, &states, &mut jit, total, slices());
            translated += jit.hart.translated_blocks();
        }
        // One slice for everything, against the interpreter's slices.
        let mut whole = make(1);
        run(&mut whole, total, || 1 << 20, |_| {});
        check(&format!("seed {seed}, one slice"), &interp, &whole);
    }
    assert!(translated > 100, "only {translated} blocks were translated");
}

/// Doubles chosen for their edge cases: signed zeros, the smallest and
/// largest subnormals and normals, infinities, quiet and signaling NaNs
/// with and without payload, values at integer conversion limits, ties.
const F64_EDGE: [u64; 30] = [
    0,
    1 << 63,
    0x3ff0_0000_0000_0000, // 1
    0xbff0_0000_0000_0000, // -1
    0x3ff8_0000_0000_0000, // 1.5
    0x4004_0000_0000_0000, // 2.5
    0x3fb9_9999_9999_999a, // 0.1
    1,                     // smallest subnormal
    0x000f_ffff_ffff_ffff, // largest subnormal
    0x8010_0000_0000_0000, // -smallest normal
    0x7fef_ffff_ffff_ffff, // largest
    0x7ff0_0000_0000_0000, // inf
    0xfff0_0000_0000_0000, // -inf
    0x7ff8_0000_0000_0000, // canonical NaN
    0x7ff0_0000_0000_0001, // signaling NaN
    0xfff8_0000_dead_beef, // quiet NaN with payload
    0x43e0_0000_0000_0000, // 2^63
    0xc3e0_0000_0000_0000, // -2^63
    0x43f0_0000_0000_0000, // 2^64
    0x41e0_0000_0000_0000, // 2^31
    0xc1e0_0000_0020_0000, // -2^31 - 1
    0x3ca0_0000_0000_0000, // 2^-53
    0x4340_0000_0000_0001, // 2^54 + 2
    0x7ff4_0000_0000_0000, // signaling NaN
    // Near the ends of the normal range, where the host's result and
    // flags may differ from the guest's (translated code goes to the
    // software FPU): 1 - 2^-53 times the smallest normal is tiny before
    // rounding and rounds to the smallest normal (UF and NX); twice
    // 2^1023 overflows.
    0x3fef_ffff_ffff_ffff, // 1 - 2^-53
    0x3ff0_0000_0000_0001, // 1 + 2^-52
    0x0020_0000_0000_0000, // 2^-1021
    0x7fe0_0000_0000_0000, // 2^1023
    0xc008_0000_0000_0000, // -3
    0x4024_0000_0000_0000, // 10
];

/// The same for singles, NaN-boxed, and a few that are not (upper half
/// not all ones: read as the canonical NaN).
const F32_EDGE: [u64; 28] = [
    0xffff_ffff_0000_0000,
    0xffff_ffff_8000_0000,
    0xffff_ffff_3f80_0000, // 1
    0xffff_ffff_bfc0_0000, // -1.5
    0xffff_ffff_3dcc_cccd, // 0.1
    0xffff_ffff_0000_0001, // smallest subnormal
    0xffff_ffff_807f_ffff, // -largest subnormal
    0xffff_ffff_0080_0000, // smallest normal
    0xffff_ffff_7f7f_ffff, // largest
    0xffff_ffff_7f80_0000, // inf
    0xffff_ffff_ff80_0000, // -inf
    0xffff_ffff_7fc0_0000, // canonical NaN
    0xffff_ffff_7f80_0001, // signaling NaN
    0xffff_ffff_ffc0_1234, // quiet NaN with payload
    0xffff_ffff_4f00_0000, // 2^31
    0xffff_ffff_cf00_0000, // -2^31
    0xffff_ffff_5f80_0000, // 2^64
    0xffff_ffff_4b00_0001, // 2^23 + 1
    0xffff_ffff_3400_0000, // 2^-23
    0xffff_ffff_3f7f_ffff, // 1 - 2^-24
    0xffff_ffff_3f80_0001, // 1 + 2^-23
    0xffff_ffff_0100_0000, // 2^-125
    0xffff_ffff_7f00_0000, // 2^127
    0xffff_ffff_4040_0000, // 3
    0xffff_ffff_c120_0000, // -10
    0x0000_0000_3f80_0000, // 1, not boxed
    0xffff_fffe_3f80_0000, // nearly boxed
    0x3ff0_0000_0000_0000, // a double
];

/// Every floating-point computation of F and D (opcode, funct7 and rs2
/// for the encodings that fix them, whether funct3 is a rounding mode, and
/// the funct3 values otherwise), over f10 := f11 op f12 (op f13), or the x
/// registers x10 and x11 where the operation takes or gives an integer.
fn fp_templates() -> Vec<u32> {
    let mut t = Vec::new();
    let r = |f7: u32, rs2: u32, f3: u32| r_type(f7, rs2, 11, f3, 10, 0x53);
    for fmt in [0, 1] {
        for op in [0x00, 0x04, 0x08, 0x0c] {
            t.push(r(op | fmt, 12, 0)); // fadd fsub fmul fdiv, rm patched
        }
        t.push(r(0x2c | fmt, 0, 0)); // fsqrt
        for f3 in 0..3 {
            t.push(r(0x10 | fmt, 12, f3)); // fsgnj, fsgnjn, fsgnjx
        }
        for f3 in 0..2 {
            t.push(r(0x14 | fmt, 12, f3)); // fmin, fmax
        }
        for f3 in 0..3 {
            t.push(r(0x50 | fmt, 12, f3)); // fle, flt, feq
        }
        for rs2 in 0..4 {
            t.push(r(0x60 | fmt, rs2, 0)); // fcvt.{w,wu,l,lu}.fmt
            t.push(r(0x68 | fmt, rs2, 0)); // fcvt.fmt.{w,wu,l,lu}
        }
        t.push(r(0x70 | fmt, 0, 0)); // fmv.x.fmt
        t.push(r(0x70 | fmt, 0, 1)); // fclass
        t.push(r(0x78 | fmt, 0, 0)); // fmv.fmt.x
        for opc in [0x43, 0x47, 0x4b, 0x4f] {
            // fmadd fmsub fnmsub fnmadd: rs3 = f13
            t.push(13 << 27 | fmt << 25 | 12 << 20 | 11 << 15 | 10 << 7 | opc);
        }
    }
    t.push(r(0x20, 1, 0)); // fcvt.s.d
    t.push(r(0x21, 0, 0)); // fcvt.d.s
                           // Reserved: fmt 2 (Q is not implemented), fsgnj with funct3 3.
    t.push(r(0x02, 12, 0));
    t.push(r(0x10, 12, 3));
    t
}

/// Whether template `t`'s funct3 is a rounding mode.
fn has_rm(t: u32) -> bool {
    let g = t >> 27;
    t & 0x7f != 0x53 || matches!(g, 0x00..=0x03 | 0x0b | 0x08 | 0x18 | 0x1a)
}

/// Random floating-point instructions for `program`, pushed onto `p`: a
/// computation on random registers with a random rounding mode (a
/// reserved one now and then; an x register it reads is written just
/// before, so translated code holds a newer value than the register file),
/// a load or store of an f register to the data, the device, no memory or
/// the code (a new instruction written through an f register just ahead),
/// a write of frm or fflags, or FS set back from dirty to initial (so that
/// the loads that dirty it show).
fn fp_insns(rng: &mut Rng, rd: u32, rs1: u32, p: &mut Vec<u32>, len: usize) {
    let f = |rng: &mut Rng| rng.below(32) as u32;
    let free = |rng: &mut Rng| 9 + rng.below(23) as u32;
    match rng.below(12) {
        0..=5 => {
            let ts = fp_templates();
            let t = rng.pick(&ts);
            // Replace the registers: f or x as the operation reads them;
            // an x destination is a free register (or x0).
            let g = t >> 27;
            let x_dst = t & 0x7f == 0x53 && matches!(g, 0x14 | 0x18 | 0x1c);
            let x_src = t & 0x7f == 0x53 && matches!(g, 0x1a | 0x1e);
            let mut i = t & !(31 << 7 | 31 << 15);
            i |= if x_dst { rd } else { f(rng) } << 7;
            let src = if x_src {
                let t = free(rng);
                p.push(i_type(rng.below(4096) as i32 - 2048, rs1, 0, t, 0x13));
                t
            } else {
                f(rng)
            };
            i |= src << 15;
            if (t >> 20) & 31 == 12 {
                i = (i & !(31 << 20)) | f(rng) << 20;
            }
            if t & 0x7f != 0x53 {
                i = (i & !(31 << 27)) | f(rng) << 27;
            }
            if has_rm(t) {
                let rm = if rng.below(20) == 0 { 5 + rng.below(2) as u32 } else { rng.pick(&[0, 1, 2, 3, 4, 7, 7, 7]) };
                i = (i & !(7 << 12)) | rm << 12;
            }
            p.push(i);
        }
        6..=8 => {
            let (base, off) = match rng.below(12) {
                0 => (6, rng.below(64) as i32 * 8),
                1 => (7, rng.below(64) as i32),
                // The code, read.
                2 => (8, 4 * rng.below(len as u64) as i32),
                _ => (5, rng.below(4096) as i32 - 2048),
            };
            let f3 = rng.pick(&[2, 3]);
            if rng.below(2) == 0 || base == 8 {
                p.push(i_type(off, base, f3, f(rng), 0x07));
            } else {
                p.push(s_type(off, f(rng), base, f3) & !0x7f | 0x27);
            }
        }
        9 if p.len() + 6 < len => {
            // fsw of a new instruction (an addi or xori into a free
            // register) a little ahead: the block must end after it.
            let w = i_type(rng.below(4096) as i32 - 2048, free(rng), rng.pick(&[0, 4]), free(rng), 0x13);
            let t = free(rng);
            let lo = ((w & 0xfff) as i32) << 20 >> 20;
            let hi = w.wrapping_sub(lo as u32) & 0xffff_f000;
            let ft = f(rng);
            p.push(hi | t << 7 | 0x37);
            p.push(i_type(lo, t, 0, t, 0x1b));
            p.push(r_type(0x78, 0, t, 0, ft, 0x53)); // fmv.w.x
            let off = 4 * (p.len() + 1 + rng.below(3) as usize) as i32;
            p.push(s_type(off, ft, 8, 2) & !0x7f | 0x27);
        }
        10 => {
            // FS from dirty back to initial: csrc mstatus, (1 << 14).
            let t = free(rng);
            p.push(4 << 12 | t << 7 | 0x37);
            p.push(i_type(0x300, t, 3, 0, 0x73));
        }
        // An access to fflags, frm or fcsr in any form (a reserved mode
        // written to frm now and then), into a free register or x0, its
        // source now and then its destination too.
        _ => {
            let csr = 1 + rng.below(3) as i32;
            let f3 = rng.pick(&[1, 2, 3, 5, 6, 7]);
            let src = if f3 >= 5 {
                rng.below(32) as u32
            } else if rng.below(4) == 0 {
                rd
            } else {
                rs1
            };
            let rd = if rng.below(4) == 0 { 0 } else { rd };
            p.push(i_type(csr, src, f3, rd, 0x73));
        }
    }
}

/// Random programs with floating point in them: computations, loads and
/// stores of f registers, accesses to fflags, frm and fcsr, interpreted
/// and translated.
#[test]
fn floating_point_translated_matches_the_interpreter() {
    let mut translated = 0;
    for seed in 1..=40u64 {
        let len = 20 + (seed as usize * 53) % 180;
        let total = 40_000;
        let slices = |s: u64| random_slices(s * 104729 + 5, 40, 3000);
        let mut states = Vec::new();
        let mut interp = setup_with(seed, len, 0, Mix::Fp);
        run(&mut interp, total, slices(seed), |r| states.push(r.hart.s.clone()));
        for hot in [1, 32] {
            let mut jit = setup_with(seed, len, hot, Mix::Fp);
            follow(&format!("seed {seed}, hot {hot}"), &interp, &states, &mut jit, total, slices(seed));
            translated += jit.hart.translated_blocks();
        }
    }
    assert!(translated > 100, "only {translated} blocks were translated");
}

/// Every floating-point computation on edge operands (signed zeros,
/// subnormals, infinities, quiet and signaling NaNs, NaN boxing, values
/// at the limits of the integer conversions and of the normal range), in
/// every rounding mode, static and dynamic, the reserved ones included
/// (which trap), with no fflags and with some accrued before, and with FS
/// off (which traps): interpreted and translated, the whole hart compared.
#[test]
fn each_floating_point_operation_on_edge_operands() {
    let mut values: Vec<u64> = F64_EDGE.iter().chain(F32_EDGE.iter()).copied().collect();
    let mut rng = Rng(77);
    for _ in 0..8 {
        values.push(rng.next());
    }
    let ints =
        [0u64, 1, u64::MAX, 1 << 63, (1 << 63) - 1, 0x7fff_ffff, 0xffff_ffff_8000_0000, 0xffff_ffff, 3, 1 << 53 | 1];
    let (ram, mut harts, mut bus) = one_op_bench();
    let mut runs = 0;
    for t in fp_templates() {
        let rms: &[u32] = if has_rm(t) { &[0, 1, 2, 3, 4, 5, 7] } else { &[(t >> 12) & 7] };
        for &rm in rms {
            let insn = (t & !(7 << 12)) | rm << 12;
            ram.write_u32(BASE, insn).unwrap();
            let mut k = 0u64;
            for (ai, &a) in values.iter().enumerate() {
                for (bi, &b) in values.iter().enumerate() {
                    // All pairs for the two-operand ones; a sample for the
                    // rest (the second operand only matters to them).
                    if (t >> 20) & 31 != 12 && bi % 7 != ai % 7 {
                        continue;
                    }
                    k += 1;
                    let c = values[(ai * 7 + bi * 3) % values.len()];
                    let x = ints[(ai + bi) % ints.len()];
                    let frm = [0u8, 1, 2, 3, 4, 5, 6, 7][(k % 8) as usize];
                    let fs_off = k.is_multiple_of(97);
                    // No flag accrued (each flag raised shows), and some.
                    for fflags in [0, 1 + (k % 31) as u8] {
                        let mut out = Vec::new();
                        for h in harts.iter_mut() {
                            h.s.pc = BASE;
                            h.s.mtvec = BASE + 8;
                            h.s.mstatus = if fs_off { 0 } else { 1 << 13 };
                            h.s.frm = frm;
                            h.s.fflags = fflags;
                            h.s.f[10] = 0x5555;
                            h.s.f[11] = a;
                            h.s.f[12] = b;
                            h.s.f[13] = c;
                            h.s.x[10] = 0x5555;
                            h.s.x[11] = x;
                            h.s.mcause = 0;
                            h.s.mepc = 0;
                            h.s.mtval = 0;
                            // Two instructions: the whole block, so translated
                            // code runs (or a trap and the handler's `j .`).
                            assert_eq!(h.run(&ram, &mut bus, 2).0, 2);
                            out.push(h.s.clone());
                        }
                        runs += 1;
                        assert_eq!(
                            out[0], out[1],
                            "{insn:#010x} with {a:#x}, {b:#x}, {c:#x}, x {x:#x}, frm {frm}, fflags {fflags:#x}, \
                         FS off {fs_off}: interpreted, translated"
                        );
                    }
                }
            }
        }
    }
    assert!(runs > 50_000, "{runs}");
    // Loads and stores: flw, fld, fsw, fsd of every value, aligned,
    // misaligned, across a page and to no memory, with FS off, initial
    // (a load makes it dirty) and dirty.
    let data = BASE + 0x3000;
    let loads_stores = [
        i_type(0, 11, 2, 10, 0x07),
        i_type(8, 11, 3, 10, 0x07),
        s_type(0, 12, 11, 2) & !0x7f | 0x27,
        s_type(-8, 12, 11, 3) & !0x7f | 0x27,
    ];
    for insn in loads_stores {
        ram.write_u32(BASE, insn).unwrap();
        for (k, &v) in values.iter().enumerate() {
            for (j, addr) in [data, data + 3, data + 0xffc, data + 0x800, 0].into_iter().enumerate() {
                let fs = [0u64, 1, 3][(k + j) % 3];
                ram.write_u64(data + 0x800, v.rotate_left(k as u32)).unwrap();
                let mut out = Vec::new();
                for h in harts.iter_mut() {
                    h.s.pc = BASE;
                    h.s.mtvec = BASE + 8;
                    h.s.mstatus = fs << 13;
                    h.s.f[10] = 0x5555;
                    h.s.f[12] = v;
                    h.s.x[11] = addr;
                    h.s.mcause = 0;
                    h.s.mtval = 0;
                    assert_eq!(h.run(&ram, &mut bus, 2).0, 2);
                    out.push((h.s.clone(), ram.read_u64(data + 0x800).unwrap(), ram.read_u64(data).unwrap()));
                }
                assert_eq!(out[0], out[1], "{insn:#010x} at {addr:#x} with {v:#x}, FS {fs}: interpreted, translated");
            }
        }
    }
    assert!(harts[1].translated_blocks() > 0);
}

/// A store of an f register into the block it is in (a new instruction
/// just ahead, then the old one back) ends the block, as the interpreter
/// does: every iteration must run the new instruction.
#[test]
fn fp_store_into_its_own_block() {
    let new = i_type(2, 10, 0, 10, 0x13);
    let old = i_type(1, 10, 0, 10, 0x13);
    let prog = [
        r_type(0x78, 0, 12, 0, 1, 0x53),    // 0: fmv.w.x f1, x12 (new)
        s_type(12, 1, 8, 2) & !0x7f | 0x27, // 4: fsw f1, 12(x8)
        r_type(0x78, 0, 13, 0, 2, 0x53),    // 8: fmv.w.x f2, x13 (old)
        old,                                // 12: addi x10, x10, 1 (rewritten)
        s_type(12, 2, 8, 2) & !0x7f | 0x27, // 16: fsw f2, 12(x8)
        i_type(-1, 4, 0, 4, 0x13),          // 20: addi x4, x4, -1
        b_type(-24, 0, 4, 1),               // 24: bne x4, x0, 0
        j_type(0, 0),                       // 28: j .
    ];
    let mut runs = Vec::new();
    for hot in [0, 1, 2, 32] {
        let ram = GuestRam::new(BASE, RAM).unwrap();
        for (i, w) in prog.iter().enumerate() {
            ram.write_u32(BASE + 4 * i as u64, *w).unwrap();
        }
        let mut hart = Hart::new(0);
        hart.set_jit(hot);
        hart.s.pc = BASE;
        hart.s.mstatus = 1 << 13;
        hart.s.x[8] = BASE;
        hart.s.x[12] = new as u64;
        hart.s.x[13] = old as u64;
        hart.s.x[4] = 10_000;
        let mut bus = Device::default();
        let mut rng = Rng(9);
        let mut done = 0;
        while done < 100_000 {
            let (n, _) = hart.run(&ram, &mut bus, 1 + rng.below(3000));
            done += n;
        }
        runs.push(hart.s.clone());
    }
    assert_eq!(runs[0].x[10], 20_000);
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r, &runs[0], "run {i}");
    }
}

/// Every access to fflags, frm and fcsr (csrrw, csrrs, csrrc and their
/// immediate forms: frflags, fsflags, frrm, fsrm, frcsr, fscsr, and the
/// csrrs/csrrc that write nothing), with rd a third register, x0 and rs1,
/// on values with bits in and out of each field, with FS off (illegal,
/// left to the interpreter), initial and dirty, and every frm and
/// fflags: interpreted and translated, the whole hart compared; where FS
/// is on, one call of translated code ran the access and the jump after.
#[test]
fn each_fp_csr_access() {
    let mut ops = Vec::new();
    for csr in 1..=3 {
        for f3 in [1, 2, 3] {
            for (rd, rs1) in [(10, 11), (0, 11), (11, 11), (10, 0), (0, 0)] {
                ops.push(i_type(csr, rs1, f3, rd, 0x73));
            }
        }
        for f3 in [5, 6, 7] {
            for uimm in [0, 1, 0x15, 0x1f] {
                for rd in [10, 0] {
                    ops.push(i_type(csr, uimm, f3, rd, 0x73));
                }
            }
        }
    }
    let values = [0u64, 1, 0x1f, 0x20, 0xe0, 0xff, 0x15a, u64::MAX, 1 << 63 | 0xa5, 0x1234_5678_9abc_def0];
    let (ram, mut harts, mut bus) = one_op_bench();
    let mut runs = 0;
    for &op in &ops {
        ram.write_u32(BASE, op).unwrap();
        let mut warm = false;
        for (vi, &v) in values.iter().enumerate() {
            for fs in [0u64, 1, 3] {
                for flags in [0u8, 0x0a, 0x1f] {
                    let frm = ((vi as u8) + flags) % 8;
                    let mut out = Vec::new();
                    for (i, h) in harts.iter_mut().enumerate() {
                        h.s.pc = BASE;
                        h.s.mtvec = BASE + 8;
                        h.s.mstatus = fs << 13;
                        h.s.frm = frm;
                        h.s.fflags = flags;
                        h.s.x[10] = 0x5555;
                        h.s.x[11] = v;
                        h.s.mcause = 0;
                        h.s.mepc = 0;
                        h.s.mtval = 0;
                        let calls = h.jit_stats().calls;
                        assert_eq!(h.run(&ram, &mut bus, 2).0, 2);
                        out.push(h.s.clone());
                        if i > 0 && warm && fs != 0 {
                            assert_eq!(h.jit_stats().calls, calls + 1, "{op:#010x}: not run translated alone");
                        }
                    }
                    warm |= fs != 0;
                    runs += 1;
                    assert_eq!(
                        out[0], out[1],
                        "{op:#010x} with {v:#x}, FS {fs}, frm {frm}, fflags {flags:#x}: interpreted, translated"
                    );
                }
            }
        }
    }
    assert!(runs > 1000, "{runs}");
    assert_eq!(harts[1].jit_stats().handoffs, 0, "left to the interpreter untranslated");
}

/// RAM for one instruction at BASE followed by a `j .`, traps going to a
/// `j .` of their own at BASE + 8, and two harts to run it on: the
/// interpreter's (translation off) and the translator's (every block
/// translated at first entry).
fn one_op_bench() -> (GuestRam, [Hart; 2], Device) {
    let ram = GuestRam::new(BASE, RAM).unwrap();
    let harts = interpreted_and_translated();
    ram.write_u32(BASE + 4, j_type(0, 0)).unwrap();
    ram.write_u32(BASE + 8, j_type(0, 0)).unwrap();
    (ram, harts, Device::default())
}

/// Two user processes, each in an address space of its own (ASIDs 1 and
/// 2), taking turns through an `ecall` to an M-mode "kernel" at `HANDLER`
/// that switches satp (`satp ^= x29`) and resumes the other process where
/// it left off (x19, which then keeps this one's `mepc + 4`). Both run the same program (`process`)
/// from one physical code page unless the kernel copies it on write.
mod processes {
    use super::*;

    pub const CODE_VA: u64 = 0x4000_0000;
    pub const DATA_VA: u64 = 0x4000_8000;
    pub const P_CODE: u64 = BASE + 0x40000;
    pub const P_COPY: u64 = BASE + 0x41000;
    pub const P_DATA: [u64; 2] = [BASE + 0x42000, BASE + 0x43000];
    const ROOTS: [u64; 2] = [BASE + 0x50000, BASE + 0x54000];
    pub const LIMIT: u64 = 300;
    /// Where the patched instruction is, and what it becomes.
    pub const PATCH_AT: u64 = 40;
    pub const PATCHED: u32 = 0x0642_8293; // addi x5, x5, 100
    const V_R_X_U_A: u64 = 0x5b;
    const V_R_W_U_A_D: u64 = 0xd7;
    const V_R_W_X_U_A_D: u64 = 0xdf;

    fn csrr(rd: u32, csr: u32) -> u32 {
        csr << 20 | 2 << 12 | rd << 7 | 0x73
    }
    fn csrw(csr: u32, rs: u32) -> u32 {
        csr << 20 | rs << 15 | 1 << 12 | 0x73
    }
    const ECALL: u32 = 0x73;
    const MRET: u32 = 0x3020_0073;
    const FENCE_I: u32 = 0x0000_100f;
    const NOP: u32 = 0x13;

    /// A process: each round counts in its data page (word 0, +1 by the
    /// instruction at `PATCH_AT`; word 3, rounds), notes the pc of an
    /// `auipc` (word 4), and yields; after `LIMIT` rounds it only yields.
    /// Word 2 counts down to a self-modification: when it reaches 0 the
    /// process stores `x9` over its instruction at `x10` (`PATCH_AT`).
    fn program() -> Vec<u32> {
        vec![
            i_type(16, 6, 3, 8, 0x03),            //  0 ld x8, 16(x6)
            b_type(32, 0, 8, 0),                  //  4 beq x8, x0, run
            i_type(-1, 8, 0, 8, 0x13),            //  8 addi x8, x8, -1
            s_type(16, 8, 6, 3),                  // 12 sd x8, 16(x6)
            b_type(20, 0, 8, 1),                  // 16 bne x8, x0, run
            s_type(0, 9, 10, 2),                  // 20 sw x9, 0(x10): the patch
            FENCE_I,                              // 24
            NOP,                                  // 28
            NOP,                                  // 32
            i_type(0, 6, 3, 5, 0x03),             // 36 run: ld x5, 0(x6)
            i_type(1, 5, 0, 5, 0x13),             // 40 addi x5, x5, 1 (PATCH_AT)
            s_type(0, 5, 6, 3),                   // 44 sd x5, 0(x6)
            7 << 7 | 0x17,                        // 48 auipc x7, 0
            s_type(32, 7, 6, 3),                  // 52 sd x7, 32(x6)
            i_type(24, 6, 3, 11, 0x03),           // 56 ld x11, 24(x6)
            i_type(1, 11, 0, 11, 0x13),           // 60 addi x11, x11, 1
            s_type(24, 11, 6, 3),                 // 64 sd x11, 24(x6)
            i_type(LIMIT as i32, 0, 0, 13, 0x13), // 68 addi x13, x0, LIMIT
            b_type(12, 13, 11, 5),                // 72 bge x11, x13, done
            ECALL,                                // 76
            j_type(-80, 0),                       // 80 j 0
            ECALL,                                // 84 done: ecall
            j_type(-4, 0),                        // 88 j done
        ]
    }

    /// The kernel: an ecall switches process; any other trap (the store
    /// page fault of a write to the read-only code page) copies the code
    /// page (x28) to x27, points the second process's PTE (at x26) at the
    /// copy, writable (x25), and flushes that page of that address space
    /// only (`sfence.vma x24, x23`), then retries the store.
    fn kernel() -> Vec<u32> {
        vec![
            csrr(31, 0x342),                         //  0 csrr x31, mcause
            i_type(-8, 31, 0, 31, 0x13),             //  4 addi x31, x31, -8
            b_type(52, 0, 31, 0),                    //  8 beq x31, x0, switch
            i_type(512, 0, 0, 21, 0x13),             // 12 addi x21, x0, 512
            i_type(0, 28, 0, 20, 0x13),              // 16 addi x20, x28, 0
            i_type(0, 27, 0, 22, 0x13),              // 20 addi x22, x27, 0
            i_type(0, 20, 3, 31, 0x03),              // 24 copy: ld x31, 0(x20)
            s_type(0, 31, 22, 3),                    // 28 sd x31, 0(x22)
            i_type(8, 20, 0, 20, 0x13),              // 32 addi x20, x20, 8
            i_type(8, 22, 0, 22, 0x13),              // 36 addi x22, x22, 8
            i_type(-1, 21, 0, 21, 0x13),             // 40 addi x21, x21, -1
            b_type(-20, 0, 21, 1),                   // 44 bne x21, x0, copy
            s_type(0, 25, 26, 3),                    // 48 sd x25, 0(x26)
            0x09 << 25 | 23 << 20 | 24 << 15 | 0x73, // 52 sfence.vma x24, x23
            MRET,                                    // 56
            csrr(31, 0x341),                         // 60 switch: csrr x31, mepc
            i_type(4, 31, 0, 31, 0x13),              // 64 addi x31, x31, 4
            csrw(0x341, 19),                         // 68 csrw mepc, x19
            i_type(0, 31, 0, 19, 0x13),              // 72 addi x19, x31, 0
            csrr(31, 0x180),                         // 76 csrr x31, satp
            r_type(0, 29, 31, 4, 31, 0x33),          // 80 xor x31, x31, x29
            csrw(0x180, 31),                         // 84 csrw satp, x31
            MRET,                                    // 88
        ]
    }

    fn satp(p: usize) -> u64 {
        8 << 60 | (p as u64 + 1) << 44 | ROOTS[p] >> 12
    }

    /// The leaf PTE's address of `va` in process `p`'s tables.
    fn leaf(p: usize, va: u64) -> u64 {
        ROOTS[p] + 0x2000 + 8 * ((va >> 12) & 0x1ff)
    }

    /// Process `p` maps its code at `code_va[p]` (read and execute) and
    /// its data page at `DATA_VA`; `countdown[p]` rounds before it patches
    /// its code (0: never). The first process runs first, in U-mode.
    pub fn make(hot: u32, code_va: [u64; 2], countdown: [u64; 2]) -> Run {
        let ram = GuestRam::new(BASE, RAM).unwrap();
        for (i, w) in program().iter().enumerate() {
            ram.write_u32(P_CODE + 4 * i as u64, *w).unwrap();
        }
        for (i, w) in kernel().iter().enumerate() {
            ram.write_u32(HANDLER + 4 * i as u64, *w).unwrap();
        }
        for p in 0..2 {
            let (root, l1, l0) = (ROOTS[p], ROOTS[p] + 0x1000, ROOTS[p] + 0x2000);
            ram.write_u64(root + 8, (l1 >> 12) << 10 | 1).unwrap();
            ram.write_u64(l1, (l0 >> 12) << 10 | 1).unwrap();
            ram.write_u64(leaf(p, code_va[p]), (P_CODE >> 12) << 10 | V_R_X_U_A).unwrap();
            ram.write_u64(leaf(p, DATA_VA), (P_DATA[p] >> 12) << 10 | V_R_W_U_A_D).unwrap();
            ram.write_u64(P_DATA[p] + 16, countdown[p]).unwrap();
        }
        let mut hart = Hart::new(0);
        hart.set_jit(hot);
        hart.s.satp = satp(0);
        hart.s.prv = PrivilegeMode::User;
        hart.s.mtvec = HANDLER;
        hart.s.pc = code_va[0];
        let x = &mut hart.s.x;
        x[6] = DATA_VA;
        x[9] = PATCHED as u64;
        x[10] = code_va[1] + PATCH_AT;
        x[23] = 2;
        x[24] = code_va[1];
        x[25] = (P_COPY >> 12) << 10 | V_R_W_X_U_A_D;
        x[26] = leaf(1, code_va[1]);
        x[27] = P_COPY;
        x[28] = P_CODE;
        x[29] = satp(0) ^ satp(1);
        x[19] = code_va[1];
        let mut hart = Hart::from_state(hart.s.clone());
        hart.set_jit(hot);
        Run { hart, ram, bus: Device::default(), slices: Vec::new() }
    }

    /// Word `i` of process `p`'s data page.
    pub fn word(r: &Run, p: usize, i: u64) -> u64 {
        r.ram.read_u64(P_DATA[p] + 8 * i).unwrap()
    }
}

/// Two processes run one physical code page mapped at different virtual
/// addresses, switching address spaces at every turn (a satp write, no
/// flush): each must count in its own data page, which both map at the
/// same virtual address, and see its own pc, whatever was translated and
/// linked while the other ran.
#[test]
fn two_processes_share_code_pages_at_different_virtual_addresses() {
    use processes::*;
    let code_va = [CODE_VA, CODE_VA + 0x5000];
    for seed in 1..=4u64 {
        let slices = || random_slices(seed * 131 + 1, 40, 3000);
        let interp = interpreted_then_translated(seed, 40_000, slices, |hot| make(hot, code_va, [0, 0]), 100);
        for (p, va) in code_va.into_iter().enumerate() {
            assert_eq!(word(&interp, p, 3), LIMIT, "seed {seed}: process {p}'s rounds");
            assert_eq!(word(&interp, p, 0), LIMIT, "seed {seed}: process {p}'s count (in the other's page?)");
            assert_eq!(word(&interp, p, 4), va + 48, "seed {seed}: process {p}'s auipc saw another pc");
        }
    }
}

/// A forked child writes its code page, shared read-only with its parent:
/// the kernel copies the page, maps the copy writable in the child's
/// address space only and flushes that page of that ASID
/// (`sfence.vma va, asid`); the child patches an instruction of its copy
/// and runs it (`fence.i`), while the parent goes on running the original
/// at the same virtual address, from translations made before the fork.
#[test]
fn a_code_page_written_after_fork_is_the_childs_alone() {
    use processes::*;
    const COUNTDOWN: u64 = 100;
    for seed in 1..=4u64 {
        let slices = || random_slices(seed * 733 + 5, 40, 3000);
        let interp =
            interpreted_then_translated(seed, 60_000, slices, |hot| make(hot, [CODE_VA; 2], [0, COUNTDOWN]), 100);
        assert_eq!(word(&interp, 0, 3), LIMIT, "seed {seed}: the parent's rounds");
        assert_eq!(word(&interp, 1, 3), LIMIT, "seed {seed}: the child's rounds");
        assert_eq!(word(&interp, 0, 0), LIMIT, "seed {seed}: the parent ran the child's patched code");
        // Rounds 1 to COUNTDOWN - 1 add 1; the one that patches and the
        // rest add 100.
        let child = COUNTDOWN - 1 + 100 * (LIMIT - COUNTDOWN + 1);
        assert_eq!(word(&interp, 1, 0), child, "seed {seed}: the child did not run its patched code throughout");
        assert_eq!(interp.ram.read_u32(P_CODE + PATCH_AT).unwrap(), i_type(1, 5, 0, 5, 0x13), "the parent's page");
        assert_eq!(interp.ram.read_u32(P_COPY + PATCH_AT).unwrap(), PATCHED, "the child's copy");
    }
}
