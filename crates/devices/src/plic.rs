//! The PLIC (SiFive platform-level interrupt controller, as on QEMU virt):
//! gateways for level-triggered sources 1..=[`NUM_SOURCES`], priorities,
//! per-context enables and thresholds, claim/complete. Context 2h is hart
//! h's M-mode, 2h+1 its S-mode.
//!
//! Gateway model: while a source is not claimed its pending bit follows
//! its line (a level that drops before being claimed is no longer
//! pending, so the driver never claims an interrupt whose cause has
//! already gone away); claiming clears pending and masks the source until
//! completion; completion re-samples the line. All state is bitmasks over
//! at most 63 sources because [`IrqLines`] is a `u64`.

use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};
use crate::{DeviceCtx, IrqLines, MmioDevice};

/// Sources 1..=63: every line an [`IrqLines`] can carry (source 0 does not
/// exist). Advertised as `riscv,ndev`.
pub const NUM_SOURCES: u32 = 63;
/// Priorities are 3 bits wide, as QEMU's virt PLIC (1 = lowest, 7 = highest).
pub const MAX_PRIORITY: u32 = 7;

pub const PRIORITY_BASE: u64 = 0x0;
pub const PENDING_BASE: u64 = 0x1000;
pub const ENABLE_BASE: u64 = 0x2000;
pub const ENABLE_STRIDE: u64 = 0x80;
pub const CONTEXT_BASE: u64 = 0x20_0000;
pub const CONTEXT_STRIDE: u64 = 0x1000;

/// Bits that can ever be set: sources 1..=63.
const VALID: u64 = !1;

pub struct Plic {
    priority: [u32; NUM_SOURCES as usize + 1],
    pending: u64,
    /// Claimed and not yet completed.
    claimed: u64,
    /// Last sampled line levels.
    lines: u64,
    enable: Vec<u64>,
    threshold: Vec<u32>,
}

impl Plic {
    pub fn new(harts: usize) -> Self {
        // Context register blocks must fit below the window's end.
        let contexts = (2 * harts.max(1)).min(((crate::layout::PLIC_SIZE - CONTEXT_BASE) / CONTEXT_STRIDE) as usize);
        Plic {
            priority: [0; NUM_SOURCES as usize + 1],
            pending: 0,
            claimed: 0,
            lines: 0,
            enable: vec![0; contexts],
            threshold: vec![0; contexts],
        }
    }

    pub fn contexts(&self) -> usize {
        self.enable.len()
    }

    /// Samples the device interrupt lines (call after anything that may
    /// have changed them, and before reading `meip`/`seip`).
    pub fn update(&mut self, lines: IrqLines) {
        self.lines = lines.0 & VALID;
        // Unclaimed sources mirror their line; claimed ones stay masked.
        self.pending = (self.pending & self.claimed) | (self.lines & !self.claimed);
    }

    /// Machine-external interrupt pending for `hart` (context 2*hart).
    pub fn meip(&self, hart: usize) -> bool {
        self.best(2 * hart).is_some()
    }

    /// Supervisor-external interrupt pending for `hart` (context 2*hart+1).
    pub fn seip(&self, hart: usize) -> bool {
        self.best(2 * hart + 1).is_some()
    }

    /// The source a claim by `ctx` would return: highest priority pending
    /// and enabled above the threshold, lowest id on ties.
    fn best(&self, ctx: usize) -> Option<u32> {
        let en = *self.enable.get(ctx)?;
        let thr = self.threshold[ctx];
        let mut cand = self.pending & en & !self.claimed;
        let mut best: Option<(u32, u32)> = None;
        while cand != 0 {
            let src = cand.trailing_zeros();
            cand &= cand - 1;
            let p = self.priority[src as usize];
            if p > thr && best.is_none_or(|(_, bp)| p > bp) {
                best = Some((src, p));
            }
        }
        best.map(|(s, _)| s)
    }

    fn claim(&mut self, ctx: usize) -> u32 {
        match self.best(ctx) {
            Some(src) => {
                self.pending &= !(1 << src);
                self.claimed |= 1 << src;
                src
            }
            None => 0,
        }
    }

    fn complete(&mut self, ctx: usize, src: u64) {
        // The spec ignores completions for sources the context does not
        // have enabled; Linux works around this when masking, so follow it.
        if src == 0 || src > NUM_SOURCES as u64 {
            return;
        }
        let bit = 1u64 << src;
        if self.enable[ctx] & bit == 0 {
            return;
        }
        self.claimed &= !bit;
        if self.lines & bit != 0 {
            self.pending |= bit;
        }
    }

    /// A register read. Registers are 32 bits wide; other sizes read zero.
    pub fn read_reg(&mut self, offset: u64, size: u8) -> u64 {
        if size != 4 || !offset.is_multiple_of(4) {
            return 0;
        }
        let v: u32 = if offset < PENDING_BASE {
            let src = (offset - PRIORITY_BASE) / 4;
            if src <= NUM_SOURCES as u64 {
                self.priority[src as usize]
            } else {
                0
            }
        } else if offset < ENABLE_BASE {
            word(self.pending, offset - PENDING_BASE)
        } else if offset < CONTEXT_BASE {
            let rel = offset - ENABLE_BASE;
            match self.enable.get((rel / ENABLE_STRIDE) as usize) {
                Some(&en) => word(en, rel % ENABLE_STRIDE),
                None => 0,
            }
        } else {
            let rel = offset - CONTEXT_BASE;
            let ctx = (rel / CONTEXT_STRIDE) as usize;
            if ctx >= self.contexts() {
                return 0;
            }
            match rel % CONTEXT_STRIDE {
                0 => self.threshold[ctx],
                4 => self.claim(ctx),
                _ => 0,
            }
        };
        v as u64
    }

    pub fn write_reg(&mut self, offset: u64, size: u8, value: u64) {
        if size != 4 || !offset.is_multiple_of(4) {
            return;
        }
        let value = value as u32;
        if offset < PENDING_BASE {
            let src = (offset - PRIORITY_BASE) / 4;
            if src >= 1 && src <= NUM_SOURCES as u64 {
                self.priority[src as usize] = value & MAX_PRIORITY;
            }
        } else if offset < ENABLE_BASE {
            // Pending bits are read-only.
        } else if offset < CONTEXT_BASE {
            let rel = offset - ENABLE_BASE;
            if let Some(en) = self.enable.get_mut((rel / ENABLE_STRIDE) as usize) {
                *en = set_word(*en, rel % ENABLE_STRIDE, value) & VALID;
            }
        } else {
            let rel = offset - CONTEXT_BASE;
            let ctx = (rel / CONTEXT_STRIDE) as usize;
            if ctx >= self.contexts() {
                return;
            }
            match rel % CONTEXT_STRIDE {
                0 => self.threshold[ctx] = value & MAX_PRIORITY,
                4 => self.complete(ctx, value as u64),
                _ => {}
            }
        }
    }

    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = SnapWriter::new(b"PLIC", 1);
        for &p in &self.priority[1..] {
            w.u32(p);
        }
        w.u64(self.pending);
        w.u64(self.claimed);
        w.u64(self.lines);
        w.u32(self.enable.len() as u32);
        for (&e, &t) in self.enable.iter().zip(&self.threshold) {
            w.u64(e);
            w.u32(t);
        }
        w.finish()
    }

    pub fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"PLIC")?;
        if version != 1 {
            return Err(SnapshotError::Version { device: "PLIC", version });
        }
        let mut priority = [0u32; NUM_SOURCES as usize + 1];
        for p in &mut priority[1..] {
            *p = r.u32()? & MAX_PRIORITY;
        }
        let pending = r.u64()? & VALID;
        let claimed = r.u64()? & VALID;
        let lines = r.u64()? & VALID;
        let n = r.u32()? as usize;
        if n != self.contexts() {
            return Err(SnapshotError::PlicContexts { saved: n, actual: self.contexts() });
        }
        let mut enable = Vec::with_capacity(n);
        let mut threshold = Vec::with_capacity(n);
        for _ in 0..n {
            enable.push(r.u64()? & VALID);
            threshold.push(r.u32()? & MAX_PRIORITY);
        }
        r.end()?;
        *self = Plic { priority, pending, claimed, lines, enable, threshold };
        Ok(())
    }
}

/// 32-bit word `byte/4` of a 64-bit bitmask (words past the second are 0).
fn word(mask: u64, byte: u64) -> u32 {
    match byte / 4 {
        0 => mask as u32,
        1 => (mask >> 32) as u32,
        _ => 0,
    }
}

fn set_word(mask: u64, byte: u64, v: u32) -> u64 {
    match byte / 4 {
        0 => (mask & !0xffff_ffff) | v as u64,
        1 => (mask & 0xffff_ffff) | ((v as u64) << 32),
        _ => mask,
    }
}

/// MMIO access re-samples the lines first so a claim or completion sees
/// the levels as they are at this instruction.
impl MmioDevice for Plic {
    fn read(&mut self, offset: u64, size: u8, ctx: &mut DeviceCtx) -> u64 {
        self.update(*ctx.irq);
        self.read_reg(offset, size)
    }

    fn write(&mut self, offset: u64, size: u8, value: u64, ctx: &mut DeviceCtx) {
        self.update(*ctx.irq);
        self.write_reg(offset, size, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx_claim(c: usize) -> u64 {
        CONTEXT_BASE + CONTEXT_STRIDE * c as u64 + 4
    }
    fn ctx_thr(c: usize) -> u64 {
        CONTEXT_BASE + CONTEXT_STRIDE * c as u64
    }
    fn enable(p: &mut Plic, c: usize, mask: u64) {
        let b = ENABLE_BASE + ENABLE_STRIDE * c as u64;
        p.write_reg(b, 4, mask & 0xffff_ffff);
        p.write_reg(b + 4, 4, mask >> 32);
    }
    fn lines(bits: &[u32]) -> IrqLines {
        let mut l = IrqLines::default();
        for &b in bits {
            l.set(b, true);
        }
        l
    }

    #[test]
    fn claim_picks_highest_priority_then_lowest_id() {
        let mut p = Plic::new(1);
        for (src, prio) in [(1, 1), (5, 3), (10, 3), (40, 2)] {
            p.write_reg(4 * src, 4, prio);
        }
        enable(&mut p, 1, (1 << 1) | (1 << 5) | (1 << 10) | (1 << 40));
        p.update(lines(&[1, 5, 10, 40]));
        assert!(!p.meip(0), "M context has nothing enabled");
        assert!(p.seip(0));
        assert_eq!(p.read_reg(PENDING_BASE, 4), (1 << 1) | (1 << 5) | (1 << 10));
        assert_eq!(p.read_reg(PENDING_BASE + 4, 4), 1 << 8);
        assert_eq!(p.read_reg(ctx_claim(1), 4), 5);
        assert_eq!(p.read_reg(ctx_claim(1), 4), 10);
        assert_eq!(p.read_reg(ctx_claim(1), 4), 40);
        assert_eq!(p.read_reg(ctx_claim(1), 4), 1);
        assert_eq!(p.read_reg(ctx_claim(1), 4), 0);
        assert!(!p.seip(0));
    }

    #[test]
    fn threshold_masks_lower_priorities() {
        let mut p = Plic::new(2);
        p.write_reg(4 * 3, 4, 2);
        p.write_reg(4 * 4, 4, 5);
        enable(&mut p, 2, (1 << 3) | (1 << 4)); // hart 1, M-mode
        p.write_reg(ctx_thr(2), 4, 5);
        assert_eq!(p.read_reg(ctx_thr(2), 4), 5);
        p.update(lines(&[3, 4]));
        assert!(!p.meip(1), "priority 5 is not above threshold 5");
        p.write_reg(ctx_thr(2), 4, 2);
        assert!(p.meip(1));
        assert!(!p.meip(0) && !p.seip(0) && !p.seip(1));
        assert_eq!(p.read_reg(ctx_claim(2), 4), 4);
        assert!(!p.meip(1), "source 3 has priority 2, not above 2");
        p.write_reg(ctx_thr(2), 4, 0);
        assert_eq!(p.read_reg(ctx_claim(2), 4), 3);
        // Priority 0 never interrupts.
        p.write_reg(4 * 3, 4, 0);
        p.write_reg(ctx_claim(2), 4, 3);
        assert!(!p.meip(1));
    }

    #[test]
    fn level_gateway_claim_complete_cycle() {
        let mut p = Plic::new(1);
        p.write_reg(4 * 10, 4, 1);
        enable(&mut p, 1, 1 << 10);
        p.update(lines(&[10]));
        assert_eq!(p.read_reg(ctx_claim(1), 4), 10);
        // While claimed the line staying high must not re-pend.
        p.update(lines(&[10]));
        assert!(!p.seip(0));
        assert_eq!(p.read_reg(PENDING_BASE, 4), 0);
        // Completion with the line still high pends again.
        p.write_reg(ctx_claim(1), 4, 10);
        assert!(p.seip(0));
        assert_eq!(p.read_reg(ctx_claim(1), 4), 10);
        // Line drops while claimed: completion re-arms without pending.
        p.update(IrqLines::default());
        p.write_reg(ctx_claim(1), 4, 10);
        assert!(!p.seip(0));
        // A level that goes away before being claimed is not pending.
        p.update(lines(&[10]));
        assert!(p.seip(0));
        p.update(IrqLines::default());
        assert!(!p.seip(0));
        assert_eq!(p.read_reg(ctx_claim(1), 4), 0);
    }

    #[test]
    fn completion_of_disabled_source_is_ignored() {
        let mut p = Plic::new(1);
        p.write_reg(4 * 2, 4, 1);
        enable(&mut p, 0, 1 << 2);
        p.update(lines(&[2]));
        assert_eq!(p.read_reg(ctx_claim(0), 4), 2);
        enable(&mut p, 0, 0);
        p.write_reg(ctx_claim(0), 4, 2);
        enable(&mut p, 0, 1 << 2);
        assert!(!p.meip(0), "still claimed");
        p.write_reg(ctx_claim(0), 4, 2);
        assert!(p.meip(0));
    }

    #[test]
    fn mmio_resamples_lines_and_ignores_junk() {
        let mut p = Plic::new(1);
        let mut ram = ftvm_memory::GuestRam::new(0x8000_0000, 4096).unwrap();
        let mut irq = lines(&[7]);
        let mut ctx = DeviceCtx { ram: &mut ram, irq: &mut irq };
        p.write(4 * 7, 4, 1, &mut ctx);
        p.write(ENABLE_BASE, 4, 0xffff_ffff, &mut ctx);
        assert_eq!(p.read(ENABLE_BASE, 4, &mut ctx), 0xffff_fffe, "source 0 is hardwired off");
        assert_eq!(p.read(ctx_claim(0), 4, &mut ctx), 7);
        // Junk: odd sizes, unaligned, unknown contexts, source 0 priority,
        // writes to pending, huge completion ids.
        for off in [0u64, 1, 3, 0x1000, 0x1f_fffc, 0x5f_fffc, ctx_claim(50), u64::MAX - 3] {
            for size in [1u8, 2, 4, 8, 3] {
                p.write(off, size, u64::MAX, &mut ctx);
                p.read(off, size, &mut ctx);
            }
        }
        assert_eq!(p.read(0, 4, &mut ctx), 0);
        p.write(ctx_claim(0), 4, 0xffff_ffff, &mut ctx);
        p.write(ctx_claim(0), 4, 64, &mut ctx);
    }

    #[test]
    fn snapshot_roundtrip() {
        let mut p = Plic::new(2);
        p.write_reg(4 * 9, 4, 6);
        enable(&mut p, 3, 1 << 9);
        p.write_reg(ctx_thr(3), 4, 1);
        p.update(lines(&[9, 33]));
        assert_eq!(p.read_reg(ctx_claim(3), 4), 9);
        let blob = p.snapshot();
        let mut q = Plic::new(2);
        q.restore(&blob).unwrap();
        assert_eq!(q.snapshot(), blob);
        q.write_reg(ctx_claim(3), 4, 9);
        assert!(q.seip(1));
        assert!(Plic::new(1).restore(&blob).is_err());
        assert!(q.restore(&blob[..10]).is_err());
    }
}
