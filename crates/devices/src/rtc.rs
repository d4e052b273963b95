//! The Goldfish real-time clock (`google,goldfish-rtc`, as on QEMU virt),
//! which Linux's rtc-goldfish driver reads at boot to set the guest's date.
//! It owns the guest's wall clock and its one alarm.
//!
//! It does not own time and never reads the host's clock: the wall time it
//! shows is `base` (ns since the Unix epoch at which `mtime` read zero, a
//! value the host chooses once and which is saved with the device) plus the
//! virtual time `mtime` says has passed. The machine passes `mtime` in, as
//! it does to the CLINT, so a replay or a backup reads exactly what the
//! primary read.
//!
//! Registers (32 bits each; times in ns since the Unix epoch):
//! TIME_LOW reads the time's low half and latches its high half for
//! TIME_HIGH; writing either half sets that half of the time. ALARM_HIGH
//! holds the high half of the next alarm; writing ALARM_LOW completes it
//! and arms it. IRQ_ENABLED masks the interrupt, CLEAR_ALARM disarms,
//! ALARM_STATUS says whether an alarm is armed, CLEAR_INTERRUPT lowers the
//! line after an alarm fired.

use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};
use crate::IrqLines;

pub const TIME_LOW: u64 = 0x00;
pub const TIME_HIGH: u64 = 0x04;
pub const ALARM_LOW: u64 = 0x08;
pub const ALARM_HIGH: u64 = 0x0c;
pub const IRQ_ENABLED: u64 = 0x10;
pub const CLEAR_ALARM: u64 = 0x14;
pub const ALARM_STATUS: u64 = 0x18;
pub const CLEAR_INTERRUPT: u64 = 0x1c;

const NS_PER_SEC: u128 = 1_000_000_000;

pub struct Rtc {
    irq: u32,
    timer_hz: u64,
    /// Wall time (ns since the epoch) at `mtime` zero. Wrapping arithmetic:
    /// a guest may set any time, and a time before power-on's must not
    /// panic.
    base: u64,
    /// The time's high half as of the last TIME_LOW read.
    time_high: u32,
    /// The alarm, as the guest last wrote it.
    alarm: u64,
    armed: bool,
    irq_enabled: bool,
    /// An alarm fired and the guest has not cleared it yet.
    pending: bool,
}

impl Rtc {
    /// An RTC on PLIC source `irq`, for a timer of `timer_hz` ticks per
    /// second, showing `base` ns since the epoch when `mtime` reads zero.
    pub fn new(irq: u32, timer_hz: u64, base: u64) -> Self {
        Rtc {
            irq,
            timer_hz: timer_hz.max(1),
            base,
            time_high: 0,
            alarm: 0,
            armed: false,
            irq_enabled: false,
            pending: false,
        }
    }

    pub fn irq(&self) -> u32 {
        self.irq
    }

    /// Wall time at `mtime` zero.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The host's setting of the clock (at creation, or when it restores
    /// a snapshot and decides the guest's clock should read its own).
    pub fn set_base(&mut self, base: u64) {
        self.base = base;
    }

    fn elapsed_ns(&self, mtime: u64) -> u64 {
        (mtime as u128 * NS_PER_SEC / self.timer_hz as u128) as u64
    }

    /// The wall time the guest reads at `mtime`.
    pub fn now(&self, mtime: u64) -> u64 {
        self.base.wrapping_add(self.elapsed_ns(mtime))
    }

    /// Sets the base so that the clock reads `now` at `mtime`.
    pub fn set_now(&mut self, mtime: u64, now: u64) {
        self.base = now.wrapping_sub(self.elapsed_ns(mtime));
    }

    /// Unknown offsets and sizes other than 4 read as zero. (Linux reads
    /// the registers with 32-bit accesses only.)
    pub fn read(&mut self, offset: u64, size: u8, mtime: u64) -> u64 {
        if size != 4 {
            return 0;
        }
        match offset {
            TIME_LOW => {
                let now = self.now(mtime);
                self.time_high = (now >> 32) as u32;
                now & 0xffff_ffff
            }
            TIME_HIGH => self.time_high as u64,
            ALARM_LOW => self.alarm & 0xffff_ffff,
            ALARM_HIGH => self.alarm >> 32,
            IRQ_ENABLED => self.irq_enabled as u64,
            ALARM_STATUS => self.armed as u64,
            _ => 0,
        }
    }

    /// A write at `mtime`; the interrupt line goes to `lines`.
    pub fn write(&mut self, offset: u64, size: u8, value: u64, mtime: u64, lines: &mut IrqLines) {
        if size != 4 {
            return;
        }
        let v = value & 0xffff_ffff;
        match offset {
            // Setting a half of the time keeps the other half of the time
            // as it reads now: Linux writes the high half, then the low.
            TIME_LOW => {
                let now = self.now(mtime);
                self.set_now(mtime, (now & !0xffff_ffff) | v);
            }
            TIME_HIGH => {
                let now = self.now(mtime);
                self.set_now(mtime, (now & 0xffff_ffff) | (v << 32));
            }
            ALARM_HIGH => self.alarm = (self.alarm & 0xffff_ffff) | (v << 32),
            ALARM_LOW => {
                self.alarm = (self.alarm & !0xffff_ffff) | v;
                self.armed = true;
            }
            IRQ_ENABLED => self.irq_enabled = v & 1 != 0,
            CLEAR_ALARM => self.armed = false,
            CLEAR_INTERRUPT => self.pending = false,
            _ => return,
        }
        // An alarm set in the past fires at once.
        self.update(mtime, lines);
    }

    /// Fires the alarm if `mtime` has reached it, and drives the line. The
    /// machine calls this wherever it re-evaluates interrupts, and ends
    /// slices at [`Rtc::deadline`], so the alarm fires at the same
    /// instruction however a run is split.
    pub fn update(&mut self, mtime: u64, lines: &mut IrqLines) {
        if self.armed && self.now(mtime) >= self.alarm {
            self.armed = false;
            self.pending = true;
        }
        lines.set(self.irq, self.pending && self.irq_enabled);
    }

    /// The first `mtime` at which the armed alarm fires, if one is armed.
    pub fn deadline(&self) -> Option<u64> {
        if !self.armed {
            return None;
        }
        // An alarm before `base` (a time before power-on) is already due.
        let need = self.alarm.saturating_sub(self.base) as u128;
        let ticks = (need * self.timer_hz as u128).div_ceil(NS_PER_SEC);
        Some(ticks.min(u64::MAX as u128) as u64)
    }

    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = SnapWriter::new(b"GRTC", 1);
        w.u32(self.irq);
        w.u64(self.timer_hz);
        w.u64(self.base);
        w.u32(self.time_high);
        w.u64(self.alarm);
        w.bool(self.armed);
        w.bool(self.irq_enabled);
        w.bool(self.pending);
        w.finish()
    }

    /// Fails (leaving the device untouched) if the blob is malformed or
    /// was saved from an RTC on another line or with another timer rate.
    pub fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"GRTC")?;
        if version != 1 {
            return Err(SnapshotError::Version { device: "RTC", version });
        }
        let irq = r.u32()?;
        let hz = r.u64()?;
        if (irq, hz) != (self.irq, self.timer_hz) {
            return Err(SnapshotError::RtcWiring { saved_irq: irq, saved_hz: hz, irq: self.irq, hz: self.timer_hz });
        }
        let base = r.u64()?;
        let time_high = r.u32()?;
        let alarm = r.u64()?;
        let armed = r.bool()?;
        let irq_enabled = r.bool()?;
        let pending = r.bool()?;
        r.end()?;
        *self = Rtc { irq, timer_hz: hz, base, time_high, alarm, armed, irq_enabled, pending };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HZ: u64 = 10_000_000;
    /// 2025-01-01T00:00:00Z.
    const BOOT: u64 = 1_735_689_600 * 1_000_000_000;

    fn read64(r: &mut Rtc, mtime: u64) -> u64 {
        let lo = r.read(TIME_LOW, 4, mtime);
        let hi = r.read(TIME_HIGH, 4, mtime);
        (hi << 32) | lo
    }

    #[test]
    fn time_is_base_plus_virtual_time_and_low_latches_high() {
        let mut r = Rtc::new(11, HZ, BOOT);
        assert_eq!(read64(&mut r, 0), BOOT);
        // 1.5 s of virtual time at 10 MHz.
        assert_eq!(read64(&mut r, 15_000_000), BOOT + 1_500_000_000);
        // TIME_HIGH answers from the last TIME_LOW read, even if the high
        // half has moved on since (the driver reads low, then high).
        let base = 0x1_ffff_ff00;
        let mut r = Rtc::new(11, HZ, base);
        assert_eq!(r.read(TIME_LOW, 4, 0), 0xffff_ff00);
        assert_eq!(r.read(TIME_HIGH, 4, 10), 1);
        assert_eq!(r.read(TIME_LOW, 4, 1), 0xffff_ff64);
        // 10 us later the low half has wrapped: TIME_HIGH still says 1
        // until TIME_LOW is read again.
        assert_eq!(r.read(TIME_HIGH, 4, 100), 1);
        assert_eq!(r.read(TIME_LOW, 4, 100), 10_000 - 0x100);
        assert_eq!(r.read(TIME_HIGH, 4, 100), 2);
        // Other sizes and offsets read as zero.
        assert_eq!(r.read(TIME_LOW, 8, 100), 0);
        assert_eq!(r.read(0x20, 4, 100), 0);
        assert_eq!(r.read(0xfff, 4, 100), 0);
    }

    #[test]
    fn the_guest_sets_the_time_as_linux_does() {
        let mut r = Rtc::new(11, HZ, BOOT);
        let mut lines = IrqLines::default();
        let want: u64 = 1_800_000_000 * 1_000_000_000;
        r.write(TIME_HIGH, 4, want >> 32, 1000, &mut lines);
        r.write(TIME_LOW, 4, want & 0xffff_ffff, 1000, &mut lines);
        assert_eq!(read64(&mut r, 1000), want);
        assert_eq!(read64(&mut r, 1000 + HZ), want + 1_000_000_000);
        // A time before power-on's does not panic, and reads back.
        r.write(TIME_HIGH, 4, 0, 2 * HZ, &mut lines);
        r.write(TIME_LOW, 4, 5, 2 * HZ, &mut lines);
        assert_eq!(read64(&mut r, 2 * HZ), 5);
        // Only 32-bit writes count.
        r.write(TIME_LOW, 8, 0, 2 * HZ, &mut lines);
        assert_eq!(read64(&mut r, 2 * HZ), 5);
    }

    #[test]
    fn alarms_fire_when_virtual_time_reaches_them() {
        let mut r = Rtc::new(11, HZ, BOOT);
        let mut lines = IrqLines::default();
        let at = BOOT + 2_000_000_050;
        r.write(ALARM_HIGH, 4, at >> 32, 0, &mut lines);
        r.write(ALARM_LOW, 4, at & 0xffff_ffff, 0, &mut lines);
        r.write(IRQ_ENABLED, 4, 1, 0, &mut lines);
        assert_eq!(r.read(ALARM_STATUS, 4, 0), 1);
        assert_eq!((r.read(ALARM_HIGH, 4, 0) << 32) | r.read(ALARM_LOW, 4, 0), at);
        assert_eq!(r.read(IRQ_ENABLED, 4, 0), 1);
        // 2 s and 50 ns is 20 000 000.5 ticks: the first tick at or past it.
        assert_eq!(r.deadline(), Some(20_000_001));
        r.update(20_000_000, &mut lines);
        assert!(!lines.get(11));
        r.update(20_000_001, &mut lines);
        assert!(lines.get(11));
        assert_eq!(r.read(ALARM_STATUS, 4, 20_000_001), 0);
        assert_eq!(r.deadline(), None);
        // The line stays up until the guest clears the interrupt.
        r.update(30_000_000, &mut lines);
        assert!(lines.get(11));
        r.write(CLEAR_INTERRUPT, 4, 1, 30_000_000, &mut lines);
        assert!(!lines.get(11));
        // Masked, an alarm fires but does not raise the line; unmasking
        // raises it.
        r.write(IRQ_ENABLED, 4, 0, 30_000_000, &mut lines);
        r.write(ALARM_HIGH, 4, 0, 30_000_000, &mut lines);
        r.write(ALARM_LOW, 4, 1, 30_000_000, &mut lines); // long past
        assert_eq!(r.deadline(), None);
        assert!(!lines.get(11));
        r.write(IRQ_ENABLED, 4, 1, 30_000_000, &mut lines);
        assert!(lines.get(11));
        r.write(CLEAR_INTERRUPT, 4, 1, 30_000_000, &mut lines);
        // A cleared alarm never fires.
        let later = BOOT + 10_000_000_000;
        r.write(ALARM_HIGH, 4, later >> 32, 30_000_000, &mut lines);
        r.write(ALARM_LOW, 4, later & 0xffff_ffff, 30_000_000, &mut lines);
        assert_eq!(r.deadline(), Some(100_000_000));
        r.write(CLEAR_ALARM, 4, 1, 30_000_000, &mut lines);
        assert_eq!(r.read(ALARM_STATUS, 4, 30_000_000), 0);
        r.update(u64::MAX, &mut lines);
        assert!(!lines.get(11));
    }

    #[test]
    fn snapshot_roundtrip() {
        let mut r = Rtc::new(11, HZ, BOOT);
        let mut lines = IrqLines::default();
        r.read(TIME_LOW, 4, 12345);
        r.write(IRQ_ENABLED, 4, 1, 12345, &mut lines);
        r.write(ALARM_HIGH, 4, (BOOT + 7) >> 32, 12345, &mut lines);
        r.write(ALARM_LOW, 4, (BOOT + HZ * 100) & 0xffff_ffff, 12345, &mut lines);
        let blob = r.snapshot();
        let mut s = Rtc::new(11, HZ, 0);
        s.restore(&blob).unwrap();
        assert_eq!(s.snapshot(), blob);
        assert_eq!(s.base(), BOOT);
        assert_eq!(s.deadline(), r.deadline());
        assert_eq!(s.read(TIME_HIGH, 4, 0), r.read(TIME_HIGH, 4, 0));
        assert!(Rtc::new(12, HZ, 0).restore(&blob).is_err());
        assert!(Rtc::new(11, HZ / 2, 0).restore(&blob).is_err());
        let mut t = Rtc::new(11, HZ, 3);
        assert!(t.restore(&blob[..blob.len() - 1]).is_err());
        assert_eq!(t.base(), 3, "a failed restore changed the device");
    }
}
