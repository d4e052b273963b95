//! Harts on their own host threads (`Machine::set_parallel`): what the
//! guest must still be able to count on when two harts really run at the
//! same time, atomics above all.

use ftvm_machine::layout::RAM_BASE;
use ftvm_machine::{Machine, MachineConfig, RunExit};

const T0: u32 = 5;
const T1: u32 = 6;
const T2: u32 = 7;
const T3: u32 = 28;
const T4: u32 = 29;
const T5: u32 = 30;
const T6: u32 = 31;

fn addi(rd: u32, rs1: u32, imm: i32) -> u32 {
    ((imm as u32) & 0xfff) << 20 | rs1 << 15 | rd << 7 | 0x13
}
fn lui(rd: u32, upper: u32) -> u32 {
    upper << 12 | rd << 7 | 0x37
}
fn auipc(rd: u32, upper: u32) -> u32 {
    upper << 12 | rd << 7 | 0x17
}
/// An AMO, LR or SC on a doubleword: `funct5`, rd, rs1 (the address), rs2.
fn amo_d(funct5: u32, rd: u32, rs1: u32, rs2: u32) -> u32 {
    funct5 << 27 | rs2 << 20 | rs1 << 15 | 3 << 12 | rd << 7 | 0x2f
}
fn bne(rs1: u32, rs2: u32, offset: i32) -> u32 {
    let i = offset as u32;
    (i >> 12 & 1) << 31
        | (i >> 5 & 0x3f) << 25
        | rs2 << 20
        | rs1 << 15
        | 1 << 12
        | (i >> 1 & 0xf) << 8
        | (i >> 11 & 1) << 7
        | 0x63
}
fn jal_zero(offset: i32) -> u32 {
    let i = offset as u32;
    (i >> 20 & 1) << 31 | (i >> 1 & 0x3ff) << 21 | (i >> 11 & 1) << 20 | (i >> 12 & 0xff) << 12 | 0x6f
}
const WFI: u32 = 0x1050_0073;

/// Rounds each hart makes.
const ROUNDS: u64 = 256 << 12;

/// Every hart, from RAM's base: `ROUNDS` times, an `amoadd.d` of 1 to the
/// word at base+0x1000 and an LR/SC loop adding 1 to the word at +0x1008;
/// then an `amoadd.d` of 1 to the word at +0x1010, and WFI for ever.
fn program() -> Vec<u8> {
    let code = [
        auipc(T0, 1),
        addi(T4, T0, 8),
        addi(T6, T0, 16),
        lui(T1, (ROUNDS >> 12) as u32),
        addi(T2, 0, 1),
        // loop: (20)
        amo_d(0b00000, 0, T0, T2),
        // retry: (24)
        amo_d(0b00010, T3, T4, 0),
        addi(T3, T3, 1),
        amo_d(0b00011, T5, T4, T3),
        bne(T5, 0, -12),
        addi(T1, T1, -1),
        bne(T1, 0, -24),
        amo_d(0b00000, 0, T6, T2),
        WFI,
        jal_zero(-4),
    ];
    code.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A machine of two harts running `program` on threads of their own.
fn two_parallel_harts() -> Machine {
    let mut cfg = MachineConfig::bare_metal(program(), 32 << 20);
    cfg.harts = 2;
    let mut m = Machine::new(&cfg).unwrap();
    m.set_parallel(true);
    m
}

fn counters(m: &Machine) -> [u64; 3] {
    [0, 8, 16].map(|o| m.ram().read_u64(RAM_BASE + 0x1000 + o).unwrap())
}

/// Two harts on their own threads adding to the same words with AMOs and
/// with LR/SC loops lose no addition: the host's atomics make each whole.
#[test]
fn parallel_harts_lose_no_atomic_addition() {
    let mut m = two_parallel_harts();
    assert!(m.parallel());
    let mut exit = RunExit::Reached;
    // A run stops at its target (or a slice past it), as the host loop's.
    while counters(&m)[2] < 2 {
        exit = m.run_until(m.icount() + 200_000);
    }
    assert_eq!(counters(&m), [2 * ROUNDS, 2 * ROUNDS, 2]);
    // Both wait for an interrupt that nothing will send.
    while exit != (RunExit::Idle { wake_at: None }) {
        exit = m.run_until(m.icount() + 200_000);
    }
    assert!(m.harts().iter().all(|h| h.is_idle()));
}

/// Switched back, the machine runs deterministically from where it is:
/// two machines in the same state run alike.
#[test]
fn a_machine_switched_back_from_parallel_runs_deterministically() {
    let mut m = two_parallel_harts();
    m.run_until(300_000);
    m.set_parallel(false);
    let mut r = Machine::restore(&m.snapshot().unwrap()).unwrap();
    m.begin_as_restored();
    for target in [m.icount() + 12_345, m.icount() + 400_000] {
        m.run_until(target);
        r.run_until(target);
        assert_eq!(m.state_hash(), r.state_hash());
    }
}

/// Each hart, from RAM's base: `t1 += 1` for ever.
fn counting() -> Vec<u8> {
    [addi(T1, T1, 1), jal_zero(-4)].iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A hart whose thread starts late (woken after the caller's, or starved
/// of a core on a loaded host) still runs its part: the caller's hart does
/// not run the whole machine's runs meanwhile, getting ever further ahead
/// in guest time. Without the bound the second hart of a guest ran nothing
/// for a whole second of guest time on a loaded host, and Linux gave up on
/// it ("CPU1: failed to come online"); here, without it, the second hart
/// ran 12.5 % of the rounds (and none of 400,000 with runs of 4,000).
#[test]
fn a_hart_whose_thread_starts_late_is_not_left_behind() {
    let mut cfg = MachineConfig::bare_metal(counting(), 32 << 20);
    cfg.harts = 2;
    let mut m = Machine::new(&cfg).unwrap();
    m.set_parallel(true);
    // Short runs, as a host loop near its pacing bound makes them: each
    // shorter than the time a sleeping thread takes to be woken. In all
    // far more host time than the lead a hart may take (10 ms).
    while m.icount() < 200_000_000 {
        m.run_until(m.icount() + 20_000);
    }
    let counts = m.harts().iter().map(|h| h.s.x[T1 as usize]).collect::<Vec<_>>();
    let total: u64 = counts.iter().sum();
    assert_eq!(total * 2, m.icount(), "two instructions a round");
    for (i, &c) in counts.iter().enumerate() {
        assert!(c * 100 >= total * 35, "hart {i} ran {c} of {total} rounds: {counts:?}");
    }
}
