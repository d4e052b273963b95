//! Byte encoding of hart state, in the same tagged little-endian form the
//! devices use, for state hashes and (later) snapshot files.

use ftvm_cpu::{HartState, PrivilegeMode};
use ftvm_devices::snapshot::{SnapReader, SnapResult, SnapWriter};

const HART_TAG: &[u8; 4] = b"HART";
const HART_VERSION: u32 = 1;

pub fn hart_bytes(s: &HartState) -> Vec<u8> {
    let mut w = SnapWriter::new(HART_TAG, HART_VERSION);
    w.u64(s.id);
    for v in s.x.iter().chain(s.f.iter()) {
        w.u64(*v);
    }
    w.u64(s.pc);
    w.u8(s.prv as u8);
    w.u64(s.instret);
    w.bool(s.wfi);
    w.bool(s.reservation.is_some());
    w.u64(s.reservation.unwrap_or(0));
    for v in [
        s.mstatus, s.medeleg, s.mideleg, s.mie, s.mip, s.irq_lines, s.mtvec, s.mcounteren, s.mcountinhibit, s.mscratch,
        s.mepc, s.mcause, s.mtval, s.menvcfg, s.stvec, s.scounteren, s.sscratch, s.sepc, s.scause, s.stval, s.satp,
        s.senvcfg,
    ] {
        w.u64(v);
    }
    w.u8(s.fflags);
    w.u8(s.frm);
    for v in s.pmpcfg.iter().chain(s.pmpaddr.iter()) {
        w.u64(*v);
    }
    w.u64(s.tselect);
    w.finish()
}

pub fn hart_from_bytes(buf: &[u8]) -> SnapResult<HartState> {
    let (mut r, version) = SnapReader::new(buf, HART_TAG)?;
    if version != HART_VERSION {
        return ftvm_devices::snapshot::err(format!("hart state version {version}, expected {HART_VERSION}"));
    }
    let id = r.u64()?;
    let mut x = [0u64; 32];
    let mut f = [0u64; 32];
    for v in x.iter_mut().chain(f.iter_mut()) {
        *v = r.u64()?;
    }
    let pc = r.u64()?;
    let prv = match r.u8()? {
        0 => PrivilegeMode::User,
        1 => PrivilegeMode::Supervisor,
        3 => PrivilegeMode::Machine,
        p => return ftvm_devices::snapshot::err(format!("invalid privilege level {p}")),
    };
    let instret = r.u64()?;
    let wfi = r.bool()?;
    let has_res = r.bool()?;
    let res = r.u64()?;
    let mut c = [0u64; 22];
    for v in c.iter_mut() {
        *v = r.u64()?;
    }
    let fflags = r.u8()?;
    let frm = r.u8()?;
    let mut pmpcfg = [0u64; 2];
    let mut pmpaddr = [0u64; 16];
    for v in pmpcfg.iter_mut().chain(pmpaddr.iter_mut()) {
        *v = r.u64()?;
    }
    let tselect = r.u64()?;
    r.end()?;
    Ok(HartState {
        id,
        x,
        f,
        pc,
        prv,
        instret,
        wfi,
        reservation: has_res.then_some(res),
        mstatus: c[0],
        medeleg: c[1],
        mideleg: c[2],
        mie: c[3],
        mip: c[4],
        irq_lines: c[5],
        mtvec: c[6],
        mcounteren: c[7],
        mcountinhibit: c[8],
        mscratch: c[9],
        mepc: c[10],
        mcause: c[11],
        mtval: c[12],
        menvcfg: c[13],
        stvec: c[14],
        scounteren: c[15],
        sscratch: c[16],
        sepc: c[17],
        scause: c[18],
        stval: c[19],
        satp: c[20],
        senvcfg: c[21],
        fflags,
        frm,
        pmpcfg,
        pmpaddr,
        tselect,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hart_state_round_trips() {
        let mut h = ftvm_cpu::Hart::new(3);
        h.s.x[5] = 0xdead;
        h.s.f[7] = 0xbeef;
        h.s.satp = 9 << 60 | 1234;
        h.s.reservation = Some(0x40);
        h.s.prv = PrivilegeMode::Supervisor;
        let b = hart_bytes(&h.s);
        assert_eq!(hart_from_bytes(&b).unwrap(), h.s);
        assert!(hart_from_bytes(&b[..b.len() - 1]).is_err());
    }
}
