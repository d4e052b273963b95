//! Byte encoding of machine state, in the same tagged little-endian form
//! the devices use: hart state (also hashed for determinism checks) and
//! the whole machine (what a snapshot file holds, before compression).

use crate::machine::DeviceSpec;
use ftvm_cpu::{Extensions, HartState, PrivilegeMode};
use ftvm_devices::snapshot::{SnapReader, SnapWriter, SnapshotError};
use ftvm_memory::{GuestRam, PAGE_SIZE};

/// Why saved machine state cannot be decoded: a device's blob is bad
/// ([`SnapshotError`]), or the machine's own parts are. The messages share
/// the devices' "bad device snapshot" prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Device(#[from] SnapshotError),
    /// `what`: "machine" or "hart".
    #[error("bad device snapshot: {what} state version {found}, expected {expected}")]
    Version { what: &'static str, found: u32, expected: u32 },
    #[error("bad device snapshot: {0} virtio devices")]
    DeviceCount(u32),
    #[error("bad device snapshot: bad MAC")]
    Mac,
    #[error("bad device snapshot: unknown device kind {0}")]
    DeviceKind(u8),
    #[error("bad device snapshot: {0} harts")]
    HartCount(u32),
    #[error("bad device snapshot: RAM of {size:#x} bytes at {base:#x}")]
    Ram { base: u64, size: u64 },
    #[error(transparent)]
    RamAlloc(#[from] ftvm_memory::RamAllocError),
    #[error("bad device snapshot: RAM page map has the wrong size")]
    PageMap,
    #[error("bad device snapshot: RAM page data does not match the page map")]
    PageData,
    #[error("bad device snapshot: invalid privilege level {0}")]
    Privilege(u8),
    #[error("bad device snapshot: a hart with extensions this ftvm does not implement ({0:#x})")]
    Extensions(u32),
    #[error("bad device snapshot: board state version {0}")]
    BoardVersion(u32),
    #[error("bad device snapshot: board state has {saved} virtio devices, machine has {actual}")]
    BoardDevices { saved: usize, actual: usize },
}

pub type StateResult<T> = Result<T, StateError>;

const MACHINE_TAG: &[u8; 4] = b"MACH";
const MACHINE_VERSION: u32 = 1;

/// The pieces of a machine, borrowed for encoding.
pub(crate) struct MachineParts<'a> {
    pub devices: &'a [DeviceSpec],
    pub ram: &'a GuestRam,
    pub harts: Vec<Vec<u8>>,
    pub board: Vec<u8>,
    pub icount: u64,
    pub clock: (u64, u64, u64),
    pub current: u64,
    pub quantum_left: u64,
}

/// The machine without its RAM: what a checkpoint carries beside the
/// pages that changed.
const STATE_TAG: &[u8; 4] = b"MSTA";
const STATE_VERSION: u32 = 1;

pub(crate) fn encode_machine(m: &MachineParts) -> Vec<u8> {
    let mut w = SnapWriter::new(MACHINE_TAG, MACHINE_VERSION);
    write_state(&mut w, m);
    // RAM: a bitmap of the pages that are not all zero, then those pages.
    // A guest uses a fraction of its RAM; zero pages cost one bit.
    let bytes = m.ram.as_slice();
    let pages = bytes.len() / PAGE_SIZE as usize;
    let mut map = vec![0u8; pages.div_ceil(8)];
    let mut data = Vec::new();
    for (i, page) in bytes.chunks_exact(PAGE_SIZE as usize).enumerate() {
        if page.iter().any(|&b| b != 0) {
            map[i / 8] |= 1 << (i % 8);
            data.extend_from_slice(page);
        }
    }
    w.bytes(&map);
    w.bytes(&data);
    w.finish()
}

/// Everything of [`encode_machine`] but the RAM's contents (its place and
/// size are kept, to check the RAM it is restored with).
pub(crate) fn encode_state(m: &MachineParts) -> Vec<u8> {
    let mut w = SnapWriter::new(STATE_TAG, STATE_VERSION);
    write_state(&mut w, m);
    w.finish()
}

fn write_state(w: &mut SnapWriter, m: &MachineParts) {
    w.u32(m.devices.len() as u32);
    for d in m.devices {
        match d {
            DeviceSpec::Disk { size, readonly } => {
                w.u8(0);
                w.u64(*size);
                w.bool(*readonly);
            }
            DeviceSpec::Net { mac } => {
                w.u8(1);
                w.bytes(mac);
            }
            DeviceSpec::Rng => w.u8(2),
        }
    }
    w.u32(m.harts.len() as u32);
    for h in &m.harts {
        w.bytes(h);
    }
    w.bytes(&m.board);
    for v in [m.icount, m.clock.0, m.clock.1, m.clock.2, m.current, m.quantum_left] {
        w.u64(v);
    }
    w.u64(m.ram.base());
    w.u64(m.ram.size());
}

/// The machine's state without RAM contents, decoded and checked.
pub(crate) struct DecodedState {
    pub devices: Vec<DeviceSpec>,
    pub harts: Vec<Vec<u8>>,
    pub board: Vec<u8>,
    pub icount: u64,
    pub clock: (u64, u64, u64),
    pub current: u64,
    pub quantum_left: u64,
    pub ram_base: u64,
    pub ram_size: u64,
}

fn read_state(r: &mut SnapReader) -> StateResult<DecodedState> {
    let n = r.u32()?;
    if n as usize > crate::layout::VIRTIO_SLOTS {
        return Err(StateError::DeviceCount(n));
    }
    let mut devices = Vec::new();
    for _ in 0..n {
        devices.push(match r.u8()? {
            0 => DeviceSpec::Disk { size: r.u64()?, readonly: r.bool()? },
            1 => {
                let mac: [u8; 6] = r.bytes()?.try_into().map_err(|_| StateError::Mac)?;
                DeviceSpec::Net { mac }
            }
            2 => DeviceSpec::Rng,
            k => return Err(StateError::DeviceKind(k)),
        });
    }
    let nh = r.u32()?;
    if nh > 8 {
        return Err(StateError::HartCount(nh));
    }
    let mut harts = Vec::new();
    for _ in 0..nh {
        harts.push(r.bytes()?.to_vec());
    }
    let board = r.bytes()?.to_vec();
    let mut v = [0u64; 6];
    for x in v.iter_mut() {
        *x = r.u64()?;
    }
    let base = r.u64()?;
    let size = r.u64()?;
    if base != crate::layout::RAM_BASE || !(16 << 20..=64 << 30).contains(&size) || !size.is_multiple_of(PAGE_SIZE) {
        return Err(StateError::Ram { base, size });
    }
    Ok(DecodedState {
        devices,
        harts,
        board,
        icount: v[0],
        clock: (v[1], v[2], v[3]),
        current: v[4],
        quantum_left: v[5],
        ram_base: base,
        ram_size: size,
    })
}

pub(crate) fn decode_state(buf: &[u8]) -> StateResult<DecodedState> {
    let (mut r, version) = SnapReader::new(buf, STATE_TAG)?;
    if version != STATE_VERSION {
        return Err(StateError::Version { what: "machine", found: version, expected: STATE_VERSION });
    }
    let d = read_state(&mut r)?;
    r.end()?;
    Ok(d)
}

/// The state of a whole machine up to its RAM map: what it declares.
fn machine_head(buf: &[u8]) -> StateResult<(SnapReader<'_>, DecodedState)> {
    let (mut r, version) = SnapReader::new(buf, MACHINE_TAG)?;
    if version != MACHINE_VERSION {
        return Err(StateError::Version { what: "machine", found: version, expected: MACHINE_VERSION });
    }
    let d = read_state(&mut r)?;
    Ok((r, d))
}

/// The RAM size a whole machine's state declares, read without allocating it.
pub(crate) fn machine_ram(buf: &[u8]) -> StateResult<u64> {
    Ok(machine_head(buf)?.1.ram_size)
}

pub(crate) fn decode_machine(buf: &[u8]) -> StateResult<(DecodedState, GuestRam)> {
    let (mut r, d) = machine_head(buf)?;
    let map = r.bytes()?;
    let data = r.bytes()?;
    r.end()?;
    let pages = (d.ram_size / PAGE_SIZE) as usize;
    if map.len() != pages.div_ceil(8) {
        return Err(StateError::PageMap);
    }
    let used: usize = map.iter().map(|b| b.count_ones() as usize).sum();
    if data.len() != used * PAGE_SIZE as usize {
        return Err(StateError::PageData);
    }
    let mut ram = GuestRam::new(d.ram_base, d.ram_size)?;
    let mem = ram.as_mut_slice_untracked();
    let mut chunks = data.chunks_exact(PAGE_SIZE as usize);
    for i in 0..pages {
        if map[i / 8] & (1 << (i % 8)) != 0 {
            let page = chunks.next().expect("counted above");
            mem[i * PAGE_SIZE as usize..(i + 1) * PAGE_SIZE as usize].copy_from_slice(page);
        }
    }
    Ok((d, ram))
}

const HART_TAG: &[u8; 4] = b"HART";
/// Version 2 appends the optional extensions, stimecmp and the cycle
/// counter's offset to version 1. A hart whose new state is what version
/// 1 implied (no extensions, no stimecmp set, mcycle = minstret) is
/// written as version 1, byte for byte as before: these bytes are hashed
/// into the state digests and start-state hashes of logs, so a machine
/// replaying an older build's log hashes as that build did.
const HART_VERSION: u32 = 2;
const HART_VERSION_1: u32 = 1;
/// What a version-1 hart's stimecmp is (a fresh hart's).
const STIMECMP_RESET: u64 = u64::MAX;

pub fn hart_bytes(s: &HartState) -> Vec<u8> {
    let v1 = s.ext == Extensions::NONE && s.stimecmp == STIMECMP_RESET && s.cycle_offset == 0;
    let mut w = SnapWriter::new(HART_TAG, if v1 { HART_VERSION_1 } else { HART_VERSION });
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
        s.mstatus,
        s.medeleg,
        s.mideleg,
        s.mie,
        s.mip,
        s.irq_lines,
        s.mtvec,
        s.mcounteren,
        s.mcountinhibit,
        s.mscratch,
        s.mepc,
        s.mcause,
        s.mtval,
        s.menvcfg,
        s.stvec,
        s.scounteren,
        s.sscratch,
        s.sepc,
        s.scause,
        s.stval,
        s.satp,
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
    if !v1 {
        w.u64(s.ext.bits() as u64);
        w.u64(s.stimecmp);
        w.u64(s.cycle_offset);
    }
    w.finish()
}

pub fn hart_from_bytes(buf: &[u8]) -> StateResult<HartState> {
    let (mut r, version) = SnapReader::new(buf, HART_TAG)?;
    if version != HART_VERSION && version != HART_VERSION_1 {
        return Err(StateError::Version { what: "hart", found: version, expected: HART_VERSION });
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
        p => return Err(StateError::Privilege(p)),
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
    let (ext, stimecmp, cycle_offset) = if version == HART_VERSION_1 {
        (Extensions::NONE, STIMECMP_RESET, 0)
    } else {
        let bits = r.u64()?;
        let ext = u32::try_from(bits).ok().and_then(Extensions::from_bits);
        (ext.ok_or(StateError::Extensions(bits as u32))?, r.u64()?, r.u64()?)
    };
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
        reserved_value: 0,
        parallel: false,
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
        ext,
        stimecmp,
        cycle_offset,
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
        h.s.stimecmp = 77;
        h.s.menvcfg = ftvm_cpu::csr::MENVCFG_STCE;
        h.s.cycle_offset = 5;
        let b = hart_bytes(&h.s);
        assert_eq!(hart_from_bytes(&b).unwrap(), h.s);
        assert!(hart_from_bytes(&b[..b.len() - 1]).is_err());
    }

    /// A hart of the old extension set is written in version 1, as an
    /// older build wrote it (same bytes, so same hashes), and version 1
    /// reads back as that set.
    #[test]
    fn an_old_hart_keeps_version_1() {
        let mut h = ftvm_cpu::Hart::new(1);
        h.s.ext = Extensions::NONE;
        h.s.x[3] = 9;
        let b = hart_bytes(&h.s);
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 1, "{:x?}", &b[..8]);
        assert_eq!(hart_from_bytes(&b).unwrap(), h.s);
        let mut new = h.s.clone();
        new.ext = Extensions::ALL;
        let b2 = hart_bytes(&new);
        assert_eq!(b2.len(), b.len() + 24);
        assert_eq!(hart_from_bytes(&b2).unwrap(), new);
        // An extension this build does not know: refused, not dropped.
        let mut bad = b2.clone();
        let at = b.len();
        bad[at..at + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
        assert_eq!(hart_from_bytes(&bad), Err(StateError::Extensions(1 << 20)));
    }
}
