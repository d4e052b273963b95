//! A machine that carries on beside a replica restored from its state
//! (a primary protected while it runs: lockstep and epoch) must run as
//! the replica does. Cached translations are part of that: a guest may
//! change a PTE without `sfence.vma` (Linux clears accessed bits so), and
//! then a hart that still holds the old translation sets no accessed bit
//! where a hart walking the tables (the restored one, which holds none)
//! does. `Machine::begin_as_restored` drops them.

use ftvm_machine::{Machine, MachineConfig};

const SATP: u32 = 0x180;
const MSTATUS: u32 = 0x300;

fn i_type(op: u32, f3: u32, rd: u32, rs1: u32, imm: i32) -> u32 {
    ((imm as u32) & 0xfff) << 20 | rs1 << 15 | f3 << 12 | rd << 7 | op
}
fn addi(rd: u32, rs1: u32, imm: i32) -> u32 {
    i_type(0x13, 0, rd, rs1, imm)
}
fn slli(rd: u32, rs1: u32, sh: i32) -> u32 {
    i_type(0x13, 1, rd, rs1, sh)
}
fn srli(rd: u32, rs1: u32, sh: i32) -> u32 {
    i_type(0x13, 5, rd, rs1, sh)
}
fn ld(rd: u32, rs1: u32, imm: i32) -> u32 {
    i_type(0x03, 3, rd, rs1, imm)
}
fn sd(rs2: u32, rs1: u32, imm: i32) -> u32 {
    let imm = imm as u32;
    (imm >> 5 & 0x7f) << 25 | rs2 << 20 | rs1 << 15 | 3 << 12 | (imm & 0x1f) << 7 | 0x23
}
fn lui(rd: u32, upper: u32) -> u32 {
    upper << 12 | rd << 7 | 0x37
}
fn add(rd: u32, rs1: u32, rs2: u32) -> u32 {
    rs2 << 20 | rs1 << 15 | rd << 7 | 0x33
}
fn or(rd: u32, rs1: u32, rs2: u32) -> u32 {
    rs2 << 20 | rs1 << 15 | 6 << 12 | rd << 7 | 0x33
}
fn csrrw(csr: u32, rs1: u32) -> u32 {
    csr << 20 | rs1 << 15 | 1 << 12 | 0x73
}
fn csrrs(csr: u32, rs1: u32) -> u32 {
    csr << 20 | rs1 << 15 | 2 << 12 | 0x73
}
fn csrrc(csr: u32, rs1: u32) -> u32 {
    csr << 20 | rs1 << 15 | 3 << 12 | 0x73
}

const PTE_A: u64 = 1 << 6;

/// M-mode, loads and stores translated as S (MPRV) through one 1 GiB
/// page mapping RAM where it is, its PTE with A clear: load a word (the
/// walk sets A, the load TLB keeps the translation), clear A again with a
/// plain store (no sfence.vma), and stop there (the instruction count
/// returned); then load the word again and read the PTE into x13 (MPRV
/// off).
fn machine() -> (Machine, u64) {
    let prog = [
        addi(5, 0, 1),
        slli(5, 5, 31), // x5 = 0x8000_0000, RAM's base
        lui(6, 0x100),
        add(6, 6, 5), // x6 = the root table, 1 MiB into RAM
        lui(7, 0x20000),
        addi(7, 7, 0x0f), // x7 = a leaf PTE for 0x8000_0000: V R W X, A and D clear
        sd(7, 6, 16),     // root[2]: the 1 GiB at 0x8000_0000
        addi(8, 0, 8),
        slli(8, 8, 60),
        srli(9, 6, 12),
        or(8, 8, 9),
        csrrw(SATP, 8), // Sv39
        lui(10, 0x21),
        addi(10, 10, -0x800), // MPRV | MPP = S
        csrrs(MSTATUS, 10),
        lui(11, 0x200),
        add(11, 11, 5), // x11 = a word 2 MiB into RAM
        ld(12, 11, 0),  // walks: A set, the translation cached
        sd(7, 6, 16),   // A cleared, nothing flushed
        // <- the replica is restored from here
        ld(12, 11, 0),
        csrrc(MSTATUS, 10), // MPRV off: the PTE read untranslated (a walk for it would set A)
        ld(13, 6, 16),
        0x0000_006f, // j .
    ];
    let cfg = MachineConfig::bare_metal(prog.iter().flat_map(|w| w.to_le_bytes()).collect(), 16 << 20);
    (Machine::new(&cfg).unwrap(), prog.len() as u64 - 4)
}

#[test]
fn a_machine_begun_as_restored_runs_as_its_restored_replica() {
    let (mut primary, transferred_at) = machine();
    primary.run_until(transferred_at);
    assert_eq!(primary.icount(), transferred_at);
    let mut backup = Machine::restore(&primary.snapshot().unwrap()).unwrap();
    primary.begin_as_restored();
    for m in [&mut primary, &mut backup] {
        m.run_until(transferred_at + 10);
    }
    let pte = |m: &Machine| m.harts()[0].s.x[13];
    assert_eq!(pte(&backup) & PTE_A, PTE_A, "the restored replica walked the tables: A set again");
    assert_eq!(pte(&primary), pte(&backup), "the PTE as each replica left it");
    assert_eq!(primary.state_hash(), backup.state_hash());
}
