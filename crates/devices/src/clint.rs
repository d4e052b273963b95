//! The CLINT (SiFive core-local interruptor, the ACLINT MSWI + MTIMER pair at
//! QEMU virt's layout): per-hart software-interrupt bits and timer compare
//! registers. It does not own time: the machine derives `mtime` from the
//! instruction count and passes it in, which keeps the device a pure
//! function of guest accesses and keeps time policy in one place.

use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};

pub const MSIP_BASE: u64 = 0x0;
pub const MTIMECMP_BASE: u64 = 0x4000;
pub const MTIME: u64 = 0xbff8;
/// Harts the register layout has room for (msip words below 0x4000,
/// mtimecmp words below 0xbff8).
pub const MAX_HARTS: usize = 4095;

pub struct Clint {
    msip: Vec<bool>,
    mtimecmp: Vec<u64>,
}

impl Clint {
    /// `harts` is clamped to [`MAX_HARTS`]. `mtimecmp` starts at its
    /// maximum so a fresh machine has no timer deadline until firmware sets
    /// one.
    pub fn new(harts: usize) -> Self {
        let n = harts.clamp(1, MAX_HARTS);
        Clint { msip: vec![false; n], mtimecmp: vec![u64::MAX; n] }
    }

    pub fn harts(&self) -> usize {
        self.msip.len()
    }

    pub fn read(&self, offset: u64, size: u8, mtime: u64) -> u64 {
        match (offset, size) {
            (o, 4) if o < MTIMECMP_BASE && o % 4 == 0 => self.msip.get((o / 4) as usize).map_or(0, |&b| b as u64),
            (o, _) if (MTIMECMP_BASE..MTIME).contains(&o) => {
                let rel = o - MTIMECMP_BASE;
                match self.mtimecmp.get((rel / 8) as usize) {
                    Some(&cmp) => read_part(cmp, rel % 8, size),
                    None => 0,
                }
            }
            (o, _) if (MTIME..MTIME + 8).contains(&o) => read_part(mtime, o - MTIME, size),
            _ => 0,
        }
    }

    /// Writes to `mtime` are ignored: guest time is the machine's to keep.
    pub fn write(&mut self, offset: u64, size: u8, value: u64) {
        match (offset, size) {
            (o, 4) if o < MTIMECMP_BASE && o % 4 == 0 => {
                if let Some(b) = self.msip.get_mut((o / 4) as usize) {
                    *b = value & 1 != 0;
                }
            }
            (o, _) if (MTIMECMP_BASE..MTIME).contains(&o) => {
                let rel = o - MTIMECMP_BASE;
                if let Some(cmp) = self.mtimecmp.get_mut((rel / 8) as usize) {
                    *cmp = write_part(*cmp, rel % 8, size, value);
                }
            }
            _ => {}
        }
    }

    pub fn msip(&self, hart: usize) -> bool {
        self.msip.get(hart).copied().unwrap_or(false)
    }

    pub fn mtip(&self, hart: usize, mtime: u64) -> bool {
        self.mtimecmp.get(hart).is_some_and(|&cmp| mtime >= cmp)
    }

    pub fn mtimecmp(&self, hart: usize) -> Option<u64> {
        self.mtimecmp.get(hart).copied()
    }

    /// The earliest `mtime` at which some hart's timer fires, so an idle
    /// machine can skip ahead to it. `None` when no timer is armed.
    pub fn next_deadline(&self) -> Option<u64> {
        self.mtimecmp.iter().copied().min().filter(|&t| t != u64::MAX)
    }

    /// The earliest deadline still ahead of `now`. A hart whose timer has
    /// already fired but has not run yet must not hide another hart's
    /// deadline: the machine ends slices at this one.
    pub fn next_deadline_after(&self, now: u64) -> Option<u64> {
        self.mtimecmp.iter().copied().filter(|&t| t > now && t != u64::MAX).min()
    }

    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = SnapWriter::new(b"CLNT", 1);
        w.u32(self.msip.len() as u32);
        for (&m, &c) in self.msip.iter().zip(&self.mtimecmp) {
            w.bool(m);
            w.u64(c);
        }
        w.finish()
    }

    /// Fails (leaving the device untouched) if the blob is malformed or was
    /// taken from a machine with a different number of harts.
    pub fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"CLNT")?;
        if version != 1 {
            return Err(SnapshotError::Version { device: "CLINT", version });
        }
        let n = r.u32()? as usize;
        if n != self.msip.len() {
            return Err(SnapshotError::ClintHarts { saved: n, actual: self.msip.len() });
        }
        let mut msip = Vec::with_capacity(n);
        let mut cmp = Vec::with_capacity(n);
        for _ in 0..n {
            msip.push(r.bool()?);
            cmp.push(r.u64()?);
        }
        r.end()?;
        self.msip = msip;
        self.mtimecmp = cmp;
        Ok(())
    }
}

/// A naturally aligned 1/2/4/8-byte window into a 64-bit register; anything
/// else reads as zero.
fn read_part(reg: u64, byte: u64, size: u8) -> u64 {
    match size {
        1 | 2 | 4 | 8 if byte.is_multiple_of(size as u64) && byte + size as u64 <= 8 => {
            let v = reg >> (byte * 8);
            if size == 8 {
                v
            } else {
                v & ((1u64 << (size as u64 * 8)) - 1)
            }
        }
        _ => 0,
    }
}

fn write_part(reg: u64, byte: u64, size: u8, value: u64) -> u64 {
    match size {
        8 if byte == 0 => value,
        1 | 2 | 4 if byte.is_multiple_of(size as u64) && byte + size as u64 <= 8 => {
            let mask = ((1u64 << (size as u64 * 8)) - 1) << (byte * 8);
            (reg & !mask) | ((value << (byte * 8)) & mask)
        }
        _ => reg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msip_per_hart() {
        let mut c = Clint::new(2);
        c.write(4, 4, 1);
        assert!(!c.msip(0));
        assert!(c.msip(1));
        assert_eq!(c.read(4, 4, 0), 1);
        c.write(4, 4, 0xfffffffe);
        assert!(!c.msip(1));
        // Out of range hart and odd sizes are ignored.
        c.write(8, 4, 1);
        c.write(0, 1, 1);
        assert!(!c.msip(0));
        assert!(!c.msip(7));
        assert_eq!(c.read(8, 4, 0), 0);
    }

    #[test]
    fn a_fired_timer_does_not_hide_a_later_deadline() {
        let mut c = Clint::new(3);
        c.write(0x4000, 8, 100); // hart 0: fired at 100
        c.write(0x4008, 8, 500); // hart 1: ahead
        assert_eq!(c.next_deadline(), Some(100));
        assert_eq!(c.next_deadline_after(200), Some(500));
        assert_eq!(c.next_deadline_after(500), None);
        assert_eq!(c.next_deadline_after(99), Some(100));
    }

    #[test]
    fn mtimecmp_32_and_64_bit_and_deadlines() {
        let mut c = Clint::new(2);
        assert_eq!(c.next_deadline(), None);
        assert!(!c.mtip(0, u64::MAX - 1));
        // 64-bit write to hart 1.
        c.write(MTIMECMP_BASE + 8, 8, 5000);
        assert_eq!(c.read(MTIMECMP_BASE + 8, 8, 0), 5000);
        assert_eq!(c.next_deadline(), Some(5000));
        // 32-bit halves to hart 0, the way RV32 software and some firmware
        // write it: high first to all ones, then low, then high.
        c.write(MTIMECMP_BASE + 4, 4, 0xffff_ffff);
        c.write(MTIMECMP_BASE, 4, 0x1234);
        c.write(MTIMECMP_BASE + 4, 4, 0);
        assert_eq!(c.read(MTIMECMP_BASE, 8, 0), 0x1234);
        assert_eq!(c.read(MTIMECMP_BASE + 4, 4, 0), 0);
        assert_eq!(c.read(MTIMECMP_BASE, 4, 0), 0x1234);
        assert_eq!(c.next_deadline(), Some(0x1234));
        assert!(!c.mtip(0, 0x1233));
        assert!(c.mtip(0, 0x1234));
        assert!(!c.mtip(1, 0x1234));
        assert!(c.mtip(1, 5000));
        assert!(!c.mtip(9, u64::MAX));
        // Disarming moves the deadline to the other hart.
        c.write(MTIMECMP_BASE, 8, u64::MAX);
        assert_eq!(c.next_deadline(), Some(5000));
    }

    #[test]
    fn mtime_reads_what_the_machine_says_and_ignores_writes() {
        let mut c = Clint::new(1);
        let t = 0x1_2345_6789;
        assert_eq!(c.read(MTIME, 8, t), t);
        assert_eq!(c.read(MTIME, 4, t), 0x2345_6789);
        assert_eq!(c.read(MTIME + 4, 4, t), 1);
        assert_eq!(c.read(MTIME + 2, 4, t), 0);
        c.write(MTIME, 8, 0);
        assert_eq!(c.read(MTIME, 8, t), t);
        assert_eq!(c.read(0xffff_ffff, 8, t), 0);
    }

    #[test]
    fn snapshot_roundtrip() {
        let mut c = Clint::new(3);
        c.write(8, 4, 1);
        c.write(MTIMECMP_BASE + 16, 8, 77);
        let blob = c.snapshot();
        let mut d = Clint::new(3);
        d.restore(&blob).unwrap();
        assert_eq!(d.snapshot(), blob);
        assert!(d.msip(2));
        assert_eq!(d.next_deadline(), Some(77));
        assert!(Clint::new(2).restore(&blob).is_err());
        assert!(d.restore(&blob[..blob.len() - 1]).is_err());
    }
}
