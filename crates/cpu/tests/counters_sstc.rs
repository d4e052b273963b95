//! The counters and Sstc's CSRs to the letter of the privileged spec:
//! a write to minstret or mcycle is the value the counter holds after
//! the writing instruction (it replaces that instruction's increment),
//! and the two count apart; stimecmp exists only with Sstc, and below
//! M-mode only with menvcfg.STCE (and in S-mode mcounteren.TM).

mod common;

use common::NoDevices;
use ftvm_cpu::{csr, Extensions, Hart, PrivilegeMode};
use ftvm_memory::GuestRam;

const BASE: u64 = 0x8000_0000;
const HANDLER: u64 = BASE + 0x800;

fn csrr(rd: u32, c: u16) -> u32 {
    (c as u32) << 20 | 2 << 12 | rd << 7 | 0x73
}
fn csrw(c: u16, rs1: u32) -> u32 {
    (c as u32) << 20 | rs1 << 15 | 1 << 12 | 0x73
}

fn hart_running(prog: &[u32]) -> (Hart, GuestRam) {
    let ram = GuestRam::new(BASE, 1 << 16).unwrap();
    for (k, w) in prog.iter().enumerate() {
        ram.write_u32(BASE + 4 * k as u64, *w).unwrap();
    }
    let mut hart = Hart::new(0);
    hart.s.pc = BASE;
    hart.s.mtvec = HANDLER;
    (hart, ram)
}

#[test]
fn a_counter_write_replaces_the_increment_and_the_other_runs_on() {
    let prog = [
        csrr(5, csr::MCYCLE),
        csrw(csr::MINSTRET, 6),
        csrr(7, csr::MINSTRET),
        csrr(8, csr::MCYCLE),
        csrw(csr::MCYCLE, 9),
        csrr(10, csr::MCYCLE),
        csrr(11, csr::MINSTRET),
        csrr(12, csr::CYCLE),
        csrr(13, csr::INSTRET),
    ];
    let (mut hart, ram) = hart_running(&prog);
    hart.s.x[6] = 1000;
    hart.s.x[9] = 500;
    let (steps, _) = hart.run(&ram, &mut NoDevices, prog.len() as u64);
    assert_eq!(steps, prog.len() as u64);
    assert_eq!(hart.s.x[5], 0);
    assert_eq!(hart.s.x[7], 1000, "minstret right after the write to it");
    assert_eq!(hart.s.x[8], 3, "mcycle runs on through a write to minstret");
    assert_eq!(hart.s.x[10], 500, "mcycle right after the write to it");
    assert_eq!(hart.s.x[11], 1004, "minstret runs on through a write to mcycle");
    assert_eq!(hart.s.x[12], 502);
    assert_eq!(hart.s.x[13], 1006);
}

/// Runs `insn` at privilege `prv` with the given menvcfg and mcounteren
/// on a hart with `ext`; whether it trapped (illegal instruction).
fn traps(ext: Extensions, prv: PrivilegeMode, menvcfg: u64, mcounteren: u64, insn: u32) -> bool {
    let (mut hart, ram) = hart_running(&[insn]);
    hart.s.ext = ext;
    hart.s.menvcfg = menvcfg;
    hart.s.mcounteren = mcounteren;
    hart.s.prv = prv;
    hart.run(&ram, &mut NoDevices, 1);
    if hart.s.pc == HANDLER {
        assert_eq!(hart.s.mcause, 2);
        return true;
    }
    false
}

#[test]
fn stimecmp_access_follows_sstc_stce_and_tm() {
    use PrivilegeMode::*;
    const STCE: u64 = csr::MENVCFG_STCE;
    const TM: u64 = 1 << 1;
    for insn in [csrr(5, csr::STIMECMP), csrw(csr::STIMECMP, 5)] {
        assert!(traps(Extensions::NONE, Machine, 0, 0, insn), "no Sstc, no stimecmp");
        assert!(!traps(Extensions::ALL, Machine, 0, 0, insn));
        assert!(traps(Extensions::ALL, Supervisor, 0, TM, insn), "S-mode without STCE");
        assert!(traps(Extensions::ALL, Supervisor, STCE, 0, insn), "S-mode without TM");
        assert!(!traps(Extensions::ALL, Supervisor, STCE, TM, insn));
        assert!(traps(Extensions::ALL, User, STCE, TM, insn), "never from U-mode");
    }
}

#[test]
fn menvcfg_holds_stce_only_with_sstc_and_stip_then_is_the_timers() {
    // csrw menvcfg, x5; csrr x6, menvcfg; csrw mip, x7; csrr x8, mip
    let prog = [csrw(csr::MENVCFG, 5), csrr(6, csr::MENVCFG), csrw(csr::MIP, 7), csrr(8, csr::MIP)];
    for (ext, stce) in [(Extensions::ALL, csr::MENVCFG_STCE), (Extensions::NONE, 0)] {
        let (mut hart, ram) = hart_running(&prog);
        hart.s.ext = ext;
        hart.s.x[5] = u64::MAX;
        hart.s.x[7] = csr::MIP_STIP;
        let mut done = 0;
        while done < prog.len() as u64 {
            done += hart.run(&ram, &mut NoDevices, prog.len() as u64 - done).0;
        }
        // Of the other bits, only the cache-block enables (tests/cbo.rs).
        let cb = csr::ENVCFG_CBZE | csr::ENVCFG_CBCFE | csr::ENVCFG_CBIE;
        assert_eq!(hart.s.x[6] & !cb, stce, "{ext:?}");
        assert_eq!(hart.sstc_enabled(), stce != 0);
        // With STCE, software cannot set STIP: only the platform's line.
        assert_eq!(hart.s.x[8] & csr::MIP_STIP, if stce != 0 { 0 } else { csr::MIP_STIP }, "{ext:?}");
        assert_eq!(hart.stimecmp_deadline(), (stce != 0).then_some(u64::MAX));
    }
}
