//! Zicbom and Zicboz to the CMO specification (and the Sail model where
//! the text leaves a reading open): `cbo.zero` zeroes the naturally
//! aligned 64-byte block holding its address, as a store (translation, A
//! and D bits, store faults, dirty pages); `cbo.clean`, `cbo.flush` and
//! `cbo.inval` change nothing in RAM but fault as the spec says (a load's
//! translation, reported as store faults); faults report the address the
//! instruction was given; menvcfg and senvcfg enable each group below
//! M-mode; a hart without the extension, and the reserved encodings, trap
//! as illegal. And a `cbo.zero` over the running block's own code is
//! seen by what follows it.

mod common;

use common::NoDevices;
use ftvm_cpu::{csr, Extensions, Hart, PrivilegeMode, CBO_BLOCK_BYTES};
use ftvm_memory::GuestRam;

const BASE: u64 = 0x8000_0000;
const HANDLER: u64 = BASE + 0x800;
/// Data the tests zero: a page of RAM after the code and the handler.
const DATA: u64 = BASE + 0x2000;
/// The page tables' root (Sv39), when a test turns paging on.
const ROOT: u64 = BASE + 0x4000;

/// The cache-block operations by their funct12, with rs1 = x11.
const INVAL: u32 = 0;
const CLEAN: u32 = 1;
const FLUSH: u32 = 2;
const ZERO: u32 = 4;
fn cbo(op: u32, rs1: u32) -> u32 {
    op << 20 | rs1 << 15 | 2 << 12 | 0x0f
}
const ADDI_X10: u32 = 0x0015_0513; // addi x10, x10, 1

fn hart_running(prog: &[u32], ext: Extensions) -> (Hart, GuestRam) {
    let ram = GuestRam::new(BASE, 1 << 16).unwrap();
    for (k, w) in prog.iter().enumerate() {
        ram.write_u32(BASE + 4 * k as u64, *w).unwrap();
    }
    // The handler spins (`j .`): a run that traps stays there.
    ram.write_u32(HANDLER, 0x0000_006f).unwrap();
    let mut hart = Hart::new(0);
    hart.s.ext = ext;
    hart.set_jit(0);
    hart.s.pc = BASE;
    hart.s.mtvec = HANDLER;
    (hart, ram)
}

/// Runs until `n` instructions retired or a trap reached the handler.
fn run(hart: &mut Hart, ram: &GuestRam, n: u64) {
    let mut done = 0;
    while done < n && hart.s.pc != HANDLER {
        done += hart.run(ram, &mut NoDevices, n - done).0;
    }
}

fn fill(ram: &GuestRam, at: u64, len: usize, byte: u8) {
    ram.write(at, &vec![byte; len]).unwrap();
}

fn bytes(ram: &GuestRam, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0; len];
    ram.read(at, &mut b).unwrap();
    b
}

#[test]
fn the_block_is_64_bytes() {
    // What the device tree tells the guest and what these tests assume.
    assert_eq!(CBO_BLOCK_BYTES, 64);
}

#[test]
fn cbo_zero_zeroes_the_aligned_block_holding_its_address_and_nothing_else() {
    // Two in a row: the first through the slow path (the page is not in
    // the store TLB yet), the second through the fast path.
    let prog = [cbo(ZERO, 11), cbo(ZERO, 12), ADDI_X10];
    let (mut hart, ram) = hart_running(&prog, Extensions::ALL);
    fill(&ram, DATA, 0x1000, 0xa5);
    hart.s.x[11] = DATA + 0x40 + 0x25;
    hart.s.x[12] = DATA + 0xfff;
    run(&mut hart, &ram, 3);
    assert_eq!(hart.s.pc, BASE + 12, "no trap");
    assert_eq!(hart.s.instret, 3);
    assert_eq!(hart.s.x[10], 1);
    assert_eq!(bytes(&ram, DATA, 0x40), vec![0xa5; 0x40], "the block before");
    assert_eq!(bytes(&ram, DATA + 0x40, 0x40), vec![0; 0x40], "rs1's block");
    assert_eq!(bytes(&ram, DATA + 0x80, 0x1000 - 0x80 - 0x40), vec![0xa5; 0x1000 - 0x80 - 0x40]);
    assert_eq!(bytes(&ram, DATA + 0xfc0, 0x40), vec![0; 0x40], "the page's last block");
    assert_eq!(hart.s.x[11], DATA + 0x65, "rs1 is not written");
}

#[test]
fn cbo_zero_marks_its_page_dirty_as_a_store_does() {
    let prog = [cbo(ZERO, 11), cbo(ZERO, 11)];
    let (mut hart, mut ram) = hart_running(&prog, Extensions::ALL);
    hart.s.x[11] = DATA + 0x100;
    ram.take_dirty();
    run(&mut hart, &ram, 1);
    assert_eq!(ram.take_dirty(), vec![DATA >> 12], "through the slow path");
    // As the board does after taking the dirty pages: the next store to
    // the page must come through the slow path and mark it again.
    hart.flush_store_tlb();
    run(&mut hart, &ram, 1);
    assert_eq!(ram.take_dirty(), vec![DATA >> 12], "again after the store TLB was flushed");
}

/// The outcome of one cache-block instruction: `None` if it retired,
/// else the trap's (mcause, mtval).
fn outcome(hart: &mut Hart, ram: &GuestRam) -> Option<(u64, u64)> {
    let pc = hart.s.pc;
    run(hart, ram, 1);
    if hart.s.pc == HANDLER {
        return Some((hart.s.mcause, hart.s.mtval));
    }
    assert_eq!(hart.s.pc, pc + 4);
    None
}

/// Runs `insn` at privilege `prv` with menvcfg and senvcfg as given
/// (paging off, so U- and S-mode reach RAM directly): whether it was
/// illegal.
fn illegal(ext: Extensions, prv: PrivilegeMode, menvcfg: u64, senvcfg: u64, insn: u32) -> bool {
    let (mut hart, ram) = hart_running(&[insn], ext);
    hart.s.x[11] = DATA;
    hart.s.menvcfg = menvcfg;
    hart.s.senvcfg = senvcfg;
    hart.s.prv = prv;
    match outcome(&mut hart, &ram) {
        None => false,
        Some((2, tval)) => {
            assert_eq!(tval, insn as u64, "illegal: mtval holds the instruction");
            true
        }
        Some(t) => panic!("{insn:#010x}: trap {t:?}"),
    }
}

#[test]
fn the_enables_of_menvcfg_and_senvcfg_gate_each_group_below_m_mode() {
    use PrivilegeMode::*;
    const CBIE_FLUSH: u64 = csr::ENVCFG_CBIE_FLUSH;
    const CBIE_INVAL: u64 = csr::ENVCFG_CBIE;
    for (op, on) in [
        (ZERO, csr::ENVCFG_CBZE),
        (CLEAN, csr::ENVCFG_CBCFE),
        (FLUSH, csr::ENVCFG_CBCFE),
        (INVAL, CBIE_FLUSH),
        (INVAL, CBIE_INVAL),
    ] {
        let insn = cbo(op, 11);
        let all = Extensions::ALL;
        // Every other group's enable on: the instruction's own is what
        // counts.
        let group = if op == INVAL { CBIE_INVAL } else { on };
        let others = (csr::ENVCFG_CBZE | csr::ENVCFG_CBCFE | CBIE_INVAL) & !group;
        assert!(!illegal(all, Machine, 0, 0, insn), "{op}: M-mode needs no enable");
        assert!(illegal(all, Supervisor, others, on, insn), "{op}: S-mode without menvcfg's");
        assert!(!illegal(all, Supervisor, on, 0, insn), "{op}: S-mode ignores senvcfg");
        assert!(illegal(all, User, others, on, insn), "{op}: U-mode without menvcfg's");
        assert!(illegal(all, User, on, others, insn), "{op}: U-mode without senvcfg's");
        assert!(!illegal(all, User, on, on, insn), "{op}: U-mode with both");
        // Each extension brings its own instructions only.
        let without = if op == ZERO { Extensions::ZICBOM } else { Extensions::ZICBOZ };
        assert!(illegal(without, Machine, 0, 0, insn), "{op}: without its extension");
        assert!(illegal(Extensions::NONE, Machine, 0, 0, insn), "{op}: without either");
        // rd other than x0 is reserved.
        assert!(illegal(all, Machine, 0, 0, insn | 5 << 7), "{op}: rd = x5");
    }
    // funct12 values of no operation (3 is reserved; 5 and 6 are none).
    for f12 in [3, 5, 6, 0x80] {
        assert!(illegal(Extensions::ALL, PrivilegeMode::Machine, 0, 0, cbo(f12, 11)), "funct12 {f12}");
    }
}

/// A hart with the extensions in the given mode, M's menvcfg enabling
/// every cache-block operation.
fn enabled_hart(prog: &[u32], prv: PrivilegeMode) -> (Hart, GuestRam) {
    let (mut hart, ram) = hart_running(prog, Extensions::ALL);
    hart.s.menvcfg = csr::ENVCFG_CBZE | csr::ENVCFG_CBCFE | csr::ENVCFG_CBIE;
    hart.s.prv = prv;
    (hart, ram)
}

#[test]
fn menvcfg_and_senvcfg_hold_the_enables_of_the_extensions_the_hart_has() {
    const CB: u64 = csr::ENVCFG_CBZE | csr::ENVCFG_CBCFE | csr::ENVCFG_CBIE;
    // csrw menvcfg, x5; csrr x6, menvcfg; csrw senvcfg, x5; csrr x7, senvcfg
    let csrw = |c: u16| (c as u32) << 20 | 5 << 15 | 1 << 12 | 0x73;
    let csrr = |rd: u32, c: u16| (c as u32) << 20 | 2 << 12 | rd << 7 | 0x73;
    let prog = [csrw(csr::MENVCFG), csrr(6, csr::MENVCFG), csrw(csr::SENVCFG), csrr(7, csr::SENVCFG)];
    for (ext, cb) in [
        (Extensions::ALL, CB),
        (Extensions::ZICBOZ, csr::ENVCFG_CBZE),
        (Extensions::ZICBOM, csr::ENVCFG_CBCFE | csr::ENVCFG_CBIE),
        (Extensions::NONE, 0),
    ] {
        let (mut hart, ram) = hart_running(&prog, ext);
        hart.s.x[5] = u64::MAX;
        run(&mut hart, &ram, 4);
        let stce = if ext.has(Extensions::SSTC) { csr::MENVCFG_STCE } else { 0 };
        assert_eq!(hart.s.x[6], stce | cb, "menvcfg, {ext:?}");
        assert_eq!(hart.s.x[7], cb, "senvcfg, {ext:?}");
    }
    // CBIE's reserved value 10 keeps the field as it was.
    for (before, after) in [(0, 0), (csr::ENVCFG_CBIE_FLUSH, csr::ENVCFG_CBIE_FLUSH), (3 << 4, 3 << 4)] {
        let (mut hart, ram) = hart_running(&prog, Extensions::ALL);
        hart.s.menvcfg = before;
        hart.s.senvcfg = before;
        hart.s.x[5] = 2 << 4;
        run(&mut hart, &ram, 4);
        assert_eq!((hart.s.x[6] & csr::ENVCFG_CBIE, hart.s.x[7]), (after, after), "CBIE {before:#x}");
    }
}

#[test]
fn management_operations_leave_ram_alone_and_cbo_zero_outside_ram_is_an_access_fault() {
    for op in [CLEAN, FLUSH, INVAL] {
        let (mut hart, ram) = enabled_hart(&[cbo(op, 11), cbo(op, 12)], PrivilegeMode::Machine);
        fill(&ram, DATA, 0x1000, 0xa5);
        hart.s.x[11] = DATA + 0x13;
        // Outside RAM: nothing to check a physical address against.
        hart.s.x[12] = 0x1000_0000;
        assert_eq!(outcome(&mut hart, &ram), None, "{op}");
        assert_eq!(outcome(&mut hart, &ram), None, "{op} outside RAM");
        assert_eq!(bytes(&ram, DATA, 0x1000), vec![0xa5; 0x1000]);
    }
    let (mut hart, ram) = enabled_hart(&[cbo(ZERO, 11)], PrivilegeMode::Machine);
    hart.s.x[11] = 0x1000_0013;
    assert_eq!(outcome(&mut hart, &ram), Some((7, 0x1000_0013)), "store access fault at rs1");
}

const PTE_V: u64 = 1;
const PTE_R: u64 = 2;
const PTE_W: u64 = 4;
const PTE_X: u64 = 8;
const PTE_A: u64 = 1 << 6;
const PTE_D: u64 = 1 << 7;
/// Sv39 gigapages: virtual GiB `i` maps RAM's GiB (0x8000_0000) with
/// these flags, or nothing if 0.
fn paging(hart: &mut Hart, ram: &GuestRam, pages: &[(u64, u64)]) {
    for &(i, flags) in pages {
        ram.write_u64(ROOT + 8 * i, (BASE >> 12) << 10 | flags).unwrap();
    }
    hart.s.satp = 8 << 60 | ROOT >> 12;
}
const GIB: u64 = 1 << 30;

#[test]
fn through_paging_faults_are_store_faults_at_rs1_and_cbo_zero_sets_a_and_d() {
    use PrivilegeMode::Supervisor;
    // Code runs at virtual 0 (GiB 0: RAM, executable); GiB 1 is writable
    // with A and D clear; GiB 2 is read-only with A clear; GiB 3 is
    // unmapped.
    let map = [(0, PTE_V | PTE_R | PTE_X | PTE_A), (1, PTE_V | PTE_R | PTE_W), (2, PTE_V | PTE_R)];
    let off = DATA - BASE + 0x29;
    for op in [ZERO, CLEAN, FLUSH, INVAL] {
        let (mut hart, ram) = enabled_hart(&[cbo(op, 11), cbo(op, 12), cbo(op, 13), cbo(op, 14)], Supervisor);
        paging(&mut hart, &ram, &map);
        fill(&ram, DATA, 0x1000, 0xa5);
        hart.s.pc = 0;
        hart.s.x[11] = GIB + off;
        hart.s.x[12] = 2 * GIB + off;
        hart.s.x[13] = 3 * GIB + off;
        hart.s.x[14] = 1 << 40; // not sign-extended from bit 38
        assert_eq!(outcome(&mut hart, &ram), None, "{op}: writable page");
        let pte = ram.read_u64(ROOT + 8).unwrap();
        if op == ZERO {
            assert_eq!(pte & (PTE_A | PTE_D), PTE_A | PTE_D, "a store sets A and D");
            assert_eq!(bytes(&ram, DATA, 0x40), vec![0; 0x40]);
        } else {
            assert_eq!(pte & (PTE_A | PTE_D), PTE_A, "a load's translation sets A");
            assert_eq!(bytes(&ram, DATA, 0x40), vec![0xa5; 0x40]);
        }
        let read_only = outcome(&mut hart, &ram);
        if op == ZERO {
            assert_eq!(read_only, Some((15, 2 * GIB + off)), "cbo.zero needs write permission");
            hart.s.prv = Supervisor;
            hart.s.pc = 8;
        } else {
            assert_eq!(read_only, None, "{op}: a load may access the block");
            assert_eq!(ram.read_u64(ROOT + 16).unwrap() & (PTE_A | PTE_D), PTE_A);
        }
        assert_eq!(outcome(&mut hart, &ram), Some((15, 3 * GIB + off)), "{op}: unmapped");
        hart.s.prv = Supervisor;
        hart.s.pc = 12;
        assert_eq!(outcome(&mut hart, &ram), Some((15, 1 << 40)), "{op}: not canonical");
        assert_eq!(bytes(&ram, DATA + 0x40, 0xfc0), vec![0xa5; 0xfc0]);
    }
}

#[test]
fn cbo_zero_over_the_running_block_cuts_it_short() {
    // A store first brings the code's page into the store TLB (its slow
    // path ends the block). Then a loop zeroes blocks of that page from
    // 0x700 down, each through the fast path (translated, with the JIT,
    // from the loop's first entry), the last one the loop's own block:
    // the addi after the cbo.zero is then zeros, which must be fetched
    // again (an illegal instruction) rather than run as decoded.
    let prog = [
        0x7e07_3c23, // sd x0, 0x7f8(x14)
        cbo(ZERO, 11),
        ADDI_X10,
        0x00c5_85b3, // add x11, x11, x12
        0xfed5_1ae3, // bne x10, x13, -12
    ];
    for jit in [0, 1] {
        // M-mode with CBZE set: translated code zeroes the blocks itself
        // (it leaves M-mode without CBZE to the interpreter).
        let (mut hart, ram) = enabled_hart(&prog, PrivilegeMode::Machine);
        hart.set_jit(jit);
        hart.s.x[11] = BASE + 0x700;
        hart.s.x[12] = (-0x100i64) as u64;
        hart.s.x[13] = 100;
        hart.s.x[14] = BASE;
        run(&mut hart, &ram, 100);
        assert_eq!(hart.s.pc, HANDLER, "jit {jit}");
        assert_eq!((hart.s.mcause, hart.s.mtval, hart.s.mepc), (2, 0, BASE + 8), "jit {jit}");
        assert_eq!(hart.s.x[10], 7, "jit {jit}: the zeroed addi did not run an eighth time");
        if jit == 1 {
            assert!(hart.jit_stats().calls > 0, "the loop ran translated");
        }
    }
}
