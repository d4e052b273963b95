//! Sstc on the board: STIP follows `time >= stimecmp` once M-mode sets
//! menvcfg.STCE, an idle machine wakes at stimecmp (not never, not at
//! once), and a busy one sees the interrupt at the same instruction
//! however its run is split, as for the CLINT's mtimecmp.

use ftvm_machine::{Event, Machine, MachineConfig, RunExit};

const STIMECMP: u32 = 0x14d;
const MENVCFG: u32 = 0x30a;
const MIE: u32 = 0x304;
const MIP: u32 = 0x344;

fn csrw(csr: u32, rs1: u32) -> u32 {
    csr << 20 | rs1 << 15 | 1 << 12 | 0x73
}
fn csrr(rd: u32, csr: u32) -> u32 {
    csr << 20 | 2 << 12 | rd << 7 | 0x73
}
fn addi(rd: u32, rs1: u32, imm: i32) -> u32 {
    ((imm as u32) & 0xfff) << 20 | rs1 << 15 | rd << 7 | 0x13
}
fn slli(rd: u32, rs1: u32, sh: u32) -> u32 {
    sh << 20 | rs1 << 15 | 1 << 12 | rd << 7 | 0x13
}

/// M-mode: STCE on, stimecmp = `at`, STIE enabled (MIE off, so the
/// interrupt only wakes WFI), WFI, read mip into x7, spin. Or, with
/// `spin`, no WFI: count in x8 until STIP shows in mip.
fn machine(at: i32, spin: bool) -> Machine {
    let mut prog = vec![
        addi(5, 0, -1),
        slli(5, 5, 63),
        csrw(MENVCFG, 5),
        addi(5, 0, at),
        csrw(STIMECMP, 5),
        addi(5, 0, 0x20),
        csrw(MIE, 5),
    ];
    if spin {
        // loop: addi x8, x8, 1; csrr x7, mip; andi x6, x7, 0x20; beq x6, x0, loop
        prog.extend([addi(8, 8, 1), csrr(7, MIP), 7 << 15 | 7 << 12 | 6 << 7 | 0x13 | 0x20 << 20, 0xfe030ae3]);
    } else {
        prog.extend([0x1050_0073, csrr(7, MIP)]);
    }
    prog.push(0x0000_006f);
    let cfg = MachineConfig::bare_metal(prog.iter().flat_map(|w| w.to_le_bytes()).collect(), 16 << 20);
    Machine::new(&cfg).unwrap()
}

#[test]
fn an_idle_hart_wakes_at_stimecmp() {
    let mut m = machine(1000, false);
    assert_eq!(m.run_until(1_000_000), RunExit::Idle { wake_at: Some(1000) });
    assert_eq!(m.harts()[0].s.x[7], 0);
    m.inject(Event::ClockAdvance(1000));
    let icount = m.icount();
    m.run_until(icount + 10);
    assert_eq!(m.harts()[0].s.x[7] & 0x20, 0x20, "STIP after the wake");
}

#[test]
fn a_busy_hart_sees_stip_at_the_same_instruction_however_split() {
    let whole = {
        let mut m = machine(200, true);
        m.run_until(1_000_000);
        m.harts()[0].s.x[8]
    };
    assert!(whole > 1, "the loop ran {whole} times");
    for step in [1, 7, 100] {
        let mut m = machine(200, true);
        let mut at = 0;
        while at < 1_000_000 {
            at += step;
            m.run_until(at);
            if m.harts()[0].s.pc % 0x1000 == 4 * 11 {
                break;
            }
        }
        assert!(at < 1_000_000, "never got past the loop");
        m.run_until(at + 1000);
        assert_eq!(m.harts()[0].s.x[8], whole, "in runs of {step}");
    }
}
