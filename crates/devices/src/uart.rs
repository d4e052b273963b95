//! The console: a 16550A UART as Linux's 8250 driver and OpenSBI's uart8250
//! driver expect it, with byte-wide registers at stride 1.
//!
//! We do not use rust-vmm's vm-superio `Serial` because its interrupt model
//! is edge-only: it calls `Trigger::trigger()` when an interrupt is raised
//! but never reports the line going low, and reading IIR clears every
//! interrupt identification, including "data ready" while bytes remain
//! (a level-triggered PLIC source would drop with data still pending). Here
//! the line is a pure function of register state, recomputed after every
//! access, which is what the PLIC's level gateway needs.
//!
//! Transmission is instantaneous: THR is always empty, so THRE and TEMT are
//! always set and a THR-empty interrupt is pending again right after each
//! write. Received bytes wait in a buffer larger than the 16-byte FIFO (the
//! host injects input in bursts at instruction boundaries); the data-ready
//! interrupt is raised whenever any byte is waiting, i.e. with a receive
//! trigger level of one, so no character-timeout timer (which would need a
//! notion of time) is needed.

use std::collections::VecDeque;

use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};
use crate::{DeviceCtx, MmioDevice};

const RBR_THR: u64 = 0;
const IER: u64 = 1;
const IIR_FCR: u64 = 2;
const LCR: u64 = 3;
const MCR: u64 = 4;
const LSR: u64 = 5;
const MSR: u64 = 6;
const SCR: u64 = 7;

const IER_RDI: u8 = 0x01;
const IER_THRI: u8 = 0x02;
const IER_RLSI: u8 = 0x04;
const IER_MSI: u8 = 0x08;

const IIR_NO_INT: u8 = 0x01;
const IIR_MSI: u8 = 0x00;
const IIR_THRI: u8 = 0x02;
const IIR_RDI: u8 = 0x04;
const IIR_RLSI: u8 = 0x06;
const IIR_FIFOS: u8 = 0xc0;

const FCR_ENABLE: u8 = 0x01;
const FCR_CLEAR_RX: u8 = 0x02;

const LCR_DLAB: u8 = 0x80;

const MCR_DTR: u8 = 0x01;
const MCR_RTS: u8 = 0x02;
const MCR_OUT1: u8 = 0x04;
const MCR_OUT2: u8 = 0x08;
const MCR_LOOP: u8 = 0x10;

const LSR_DR: u8 = 0x01;
const LSR_OE: u8 = 0x02;
const LSR_BI: u8 = 0x10;
const LSR_THRE: u8 = 0x20;
const LSR_TEMT: u8 = 0x40;

const MSR_DCTS: u8 = 0x01;
const MSR_DDSR: u8 = 0x02;
const MSR_TERI: u8 = 0x04;
const MSR_DDCD: u8 = 0x08;
const MSR_CTS: u8 = 0x10;
const MSR_DSR: u8 = 0x20;
const MSR_RI: u8 = 0x40;
const MSR_DCD: u8 = 0x80;
const MSR_DELTAS: u8 = MSR_DCTS | MSR_DDSR | MSR_TERI | MSR_DDCD;

/// Bytes of host input the UART holds before refusing more. The host side
/// keeps anything beyond this and offers it again later.
pub const RX_CAPACITY: usize = 4096;

pub struct Uart {
    irq: u32,
    ier: u8,
    lcr: u8,
    mcr: u8,
    fcr: u8,
    scr: u8,
    dll: u8,
    dlm: u8,
    /// Overrun flag (set by loopback into a full buffer), cleared by LSR read.
    lsr_errors: u8,
    /// Modem-status change bits, cleared by MSR read.
    msr_deltas: u8,
    thr_pending: bool,
    rx: VecDeque<u8>,
    /// The first byte of `rx` is a break (a zero byte received with the
    /// line held low: LSR.BI), which Linux takes as the start of a magic
    /// SysRq on its serial console.
    rx_break: bool,
    out: Vec<u8>,
}

impl Uart {
    /// `irq` is the PLIC source the device drives (10 on this board).
    pub fn new(irq: u32) -> Self {
        Uart {
            irq,
            ier: 0,
            lcr: 0,
            mcr: 0,
            fcr: 0,
            scr: 0,
            dll: 0,
            dlm: 0,
            lsr_errors: 0,
            msr_deltas: 0,
            thr_pending: false,
            rx: VecDeque::new(),
            rx_break: false,
            out: Vec::new(),
        }
    }

    pub fn irq(&self) -> u32 {
        self.irq
    }

    /// Bytes the guest transmitted since the last call.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Queues host input for the guest; returns how many bytes were taken
    /// (fewer than offered when the buffer is full). Call only at an
    /// instruction boundary, then drive the line with [`Uart::irq_level`].
    pub fn push_input(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(RX_CAPACITY - self.rx.len());
        self.rx.extend(&bytes[..n]);
        n
    }

    /// Receives a break: a zero byte flagged in LSR (BI) while it is the
    /// next to be read. Taken only with nothing else waiting to be read
    /// (returns false otherwise), so at most one byte carries the flag.
    pub fn push_break(&mut self) -> bool {
        if !self.rx.is_empty() {
            return false;
        }
        self.rx.push_back(0);
        self.rx_break = true;
        true
    }

    pub fn rx_space(&self) -> usize {
        RX_CAPACITY - self.rx.len()
    }

    fn loopback(&self) -> bool {
        self.mcr & MCR_LOOP != 0
    }

    fn lsr(&self) -> u8 {
        let mut v = LSR_THRE | LSR_TEMT | self.lsr_errors;
        if !self.rx.is_empty() {
            v |= LSR_DR;
            if self.rx_break {
                v |= LSR_BI;
            }
        }
        v
    }

    fn msr_lines(&self) -> u8 {
        if self.loopback() {
            let m = self.mcr;
            let mut v = 0;
            if m & MCR_DTR != 0 {
                v |= MSR_DSR;
            }
            if m & MCR_RTS != 0 {
                v |= MSR_CTS;
            }
            if m & MCR_OUT1 != 0 {
                v |= MSR_RI;
            }
            if m & MCR_OUT2 != 0 {
                v |= MSR_DCD;
            }
            v
        } else {
            // A console cable that is always connected and ready.
            MSR_DCD | MSR_DSR | MSR_CTS
        }
    }

    /// The highest-priority interrupt condition that is both pending and
    /// enabled, as the IIR identification code.
    fn pending_interrupt(&self) -> Option<u8> {
        if self.ier & IER_RLSI != 0 && self.lsr_errors != 0 {
            Some(IIR_RLSI)
        } else if self.ier & IER_RDI != 0 && !self.rx.is_empty() {
            Some(IIR_RDI)
        } else if self.ier & IER_THRI != 0 && self.thr_pending {
            Some(IIR_THRI)
        } else if self.ier & IER_MSI != 0 && self.msr_deltas != 0 {
            Some(IIR_MSI)
        } else {
            None
        }
    }

    /// The level of the interrupt output. The machine sets its line after
    /// [`Uart::push_input`]; MMIO accesses update it themselves.
    pub fn irq_level(&self) -> bool {
        self.pending_interrupt().is_some()
    }

    fn set_mcr(&mut self, v: u8) {
        let before = self.msr_lines();
        self.mcr = v & 0x1f;
        let after = self.msr_lines();
        let changed = before ^ after;
        let mut d = 0;
        if changed & MSR_CTS != 0 {
            d |= MSR_DCTS;
        }
        if changed & MSR_DSR != 0 {
            d |= MSR_DDSR;
        }
        if changed & MSR_DCD != 0 {
            d |= MSR_DDCD;
        }
        // TERI flags the trailing edge of RI only.
        if before & MSR_RI != 0 && after & MSR_RI == 0 {
            d |= MSR_TERI;
        }
        self.msr_deltas |= d;
    }

    pub fn read_reg(&mut self, offset: u64) -> u8 {
        let dlab = self.lcr & LCR_DLAB != 0;
        match offset {
            RBR_THR if dlab => self.dll,
            RBR_THR => {
                self.rx_break = false;
                self.rx.pop_front().unwrap_or(0)
            }
            IER if dlab => self.dlm,
            IER => self.ier,
            IIR_FCR => {
                let id = self.pending_interrupt();
                // Reading IIR acknowledges a THR-empty interrupt it reports.
                if id == Some(IIR_THRI) {
                    self.thr_pending = false;
                }
                let fifo = if self.fcr & FCR_ENABLE != 0 { IIR_FIFOS } else { 0 };
                fifo | id.unwrap_or(IIR_NO_INT)
            }
            LCR => self.lcr,
            MCR => self.mcr,
            LSR => {
                let v = self.lsr();
                self.lsr_errors = 0;
                v
            }
            MSR => {
                let v = self.msr_lines() | self.msr_deltas;
                self.msr_deltas = 0;
                v
            }
            SCR => self.scr,
            _ => 0,
        }
    }

    pub fn write_reg(&mut self, offset: u64, v: u8) {
        let dlab = self.lcr & LCR_DLAB != 0;
        match offset {
            RBR_THR if dlab => self.dll = v,
            RBR_THR => {
                if self.loopback() {
                    if self.rx.len() < RX_CAPACITY {
                        self.rx.push_back(v);
                    } else {
                        self.lsr_errors |= LSR_OE;
                    }
                } else {
                    self.out.push(v);
                }
                // The byte left at once, so THR is empty again.
                self.thr_pending = true;
            }
            IER if dlab => self.dlm = v,
            IER => {
                let old = self.ier;
                self.ier = v & 0x0f;
                // Enabling THRE with THR empty raises it (the 8250 driver
                // probes for this and relies on it to restart output).
                if old & IER_THRI == 0 && self.ier & IER_THRI != 0 {
                    self.thr_pending = true;
                }
            }
            IIR_FCR => {
                if v & FCR_CLEAR_RX != 0 {
                    self.rx.clear();
                    self.rx_break = false;
                }
                // Transmit FIFO clear has nothing to do: THR is always empty.
                self.fcr = v & 0xc9;
            }
            LCR => self.lcr = v,
            MCR => self.set_mcr(v),
            // LSR and MSR are read-only; writes are factory-test only.
            LSR | MSR => {}
            SCR => self.scr = v,
            _ => {}
        }
    }

    /// Pending output is not part of the snapshot: drain it first.
    pub fn snapshot(&self) -> Vec<u8> {
        // Version 2 adds the break flag; a UART without a break pending is
        // saved as before, so snapshots (and checkpoints) stay the same.
        let mut w = SnapWriter::new(b"UART", if self.rx_break { 2 } else { 1 });
        w.u32(self.irq);
        for b in
            [self.ier, self.lcr, self.mcr, self.fcr, self.scr, self.dll, self.dlm, self.lsr_errors, self.msr_deltas]
        {
            w.u8(b);
        }
        w.bool(self.thr_pending);
        let rx: Vec<u8> = self.rx.iter().copied().collect();
        w.bytes(&rx);
        if self.rx_break {
            w.bool(true);
        }
        w.finish()
    }

    pub fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"UART")?;
        // Version 1 had no break flag.
        if version != 1 && version != 2 {
            return Err(SnapshotError::Version { device: "UART", version });
        }
        let irq = r.u32()?;
        if irq != self.irq {
            return Err(SnapshotError::UartIrq { saved: irq, actual: self.irq });
        }
        let mut regs = [0u8; 9];
        for b in &mut regs {
            *b = r.u8()?;
        }
        let thr_pending = r.bool()?;
        let rx = r.bytes()?;
        if rx.len() > RX_CAPACITY {
            return Err(SnapshotError::UartBuffer);
        }
        let rx_break = if version >= 2 { r.bool()? } else { false };
        r.end()?;
        let [ier, lcr, mcr, fcr, scr, dll, dlm, lsr_errors, msr_deltas] = regs;
        self.ier = ier & 0x0f;
        self.lcr = lcr;
        self.mcr = mcr & 0x1f;
        self.fcr = fcr & 0xc9;
        self.scr = scr;
        self.dll = dll;
        self.dlm = dlm;
        self.lsr_errors = lsr_errors & LSR_OE;
        self.msr_deltas = msr_deltas & MSR_DELTAS;
        self.thr_pending = thr_pending;
        self.rx_break = rx_break && !rx.is_empty();
        self.rx = rx.iter().copied().collect();
        Ok(())
    }
}

/// Any access size works and uses the low byte, offsets past the eight
/// registers read zero; the line is updated after every access.
impl MmioDevice for Uart {
    fn read(&mut self, offset: u64, _size: u8, ctx: &mut DeviceCtx) -> u64 {
        let v = self.read_reg(offset);
        ctx.irq.set(self.irq, self.irq_level());
        v as u64
    }

    fn write(&mut self, offset: u64, _size: u8, value: u64, ctx: &mut DeviceCtx) {
        self.write_reg(offset, value as u8);
        ctx.irq.set(self.irq, self.irq_level());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IrqLines;
    use ftvm_memory::GuestRam;

    struct Rig {
        ram: GuestRam,
        irq: IrqLines,
        u: Uart,
    }

    impl Rig {
        fn new() -> Self {
            Rig { ram: GuestRam::new(0x8000_0000, 4096).unwrap(), irq: IrqLines::default(), u: Uart::new(10) }
        }
        fn r(&mut self, off: u64) -> u8 {
            let mut ctx = DeviceCtx { ram: &mut self.ram, irq: &mut self.irq };
            self.u.read(off, 1, &mut ctx) as u8
        }
        fn w(&mut self, off: u64, v: u8) {
            let mut ctx = DeviceCtx { ram: &mut self.ram, irq: &mut self.irq };
            self.u.write(off, 1, v as u64, &mut ctx)
        }
        fn line(&self) -> bool {
            self.irq.get(10)
        }
    }

    #[test]
    fn output_goes_to_buffer_with_thre_always_set() {
        let mut r = Rig::new();
        for &b in b"hello\n" {
            assert_ne!(r.r(LSR) & LSR_THRE, 0);
            r.w(RBR_THR, b);
        }
        assert_eq!(r.r(LSR) & (LSR_THRE | LSR_TEMT), LSR_THRE | LSR_TEMT);
        assert_eq!(r.u.take_output(), b"hello\n");
        assert!(r.u.take_output().is_empty());
        assert!(!r.line(), "no interrupts enabled");
    }

    #[test]
    fn divisor_latch_and_scratch() {
        let mut r = Rig::new();
        r.w(LCR, 0x83);
        r.w(0, 0x0c);
        r.w(1, 0x00);
        assert_eq!(r.r(0), 0x0c);
        assert_eq!(r.r(1), 0x00);
        r.w(LCR, 0x03);
        assert_eq!(r.r(LCR), 0x03);
        assert!(r.u.take_output().is_empty(), "divisor writes are not output");
        r.w(SCR, 0x5a);
        assert_eq!(r.r(SCR), 0x5a);
        r.w(IER, 0xff);
        assert_eq!(r.r(IER), 0x0f);
    }

    #[test]
    fn input_raises_level_until_drained() {
        let mut r = Rig::new();
        r.w(IIR_FCR, FCR_ENABLE | FCR_CLEAR_RX);
        r.w(IER, IER_RDI);
        assert!(!r.line());
        assert_eq!(r.u.push_input(b"ab"), 2);
        assert!(r.u.irq_level());
        r.irq.set(10, r.u.irq_level());
        assert!(r.line());
        // IIR read does not clear data-ready while bytes remain.
        assert_eq!(r.r(IIR_FCR), IIR_FIFOS | IIR_RDI);
        assert_eq!(r.r(IIR_FCR), IIR_FIFOS | IIR_RDI);
        assert!(r.line());
        assert_eq!(r.r(LSR) & LSR_DR, LSR_DR);
        assert_eq!(r.r(RBR_THR), b'a');
        assert!(r.line());
        assert_eq!(r.r(RBR_THR), b'b');
        assert!(!r.line());
        assert_eq!(r.r(LSR) & LSR_DR, 0);
        assert_eq!(r.r(IIR_FCR), IIR_FIFOS | IIR_NO_INT);
        // Masking the interrupt lowers the line even with data pending.
        r.u.push_input(b"c");
        r.w(IER, 0);
        assert!(!r.line());
        r.w(IER, IER_RDI);
        assert!(r.line());
        // FIFO reset discards input.
        r.w(IIR_FCR, FCR_ENABLE | FCR_CLEAR_RX);
        assert!(!r.line());
    }

    #[test]
    fn input_beyond_capacity_is_refused() {
        let mut u = Uart::new(10);
        let big = vec![b'x'; RX_CAPACITY + 10];
        assert_eq!(u.push_input(&big), RX_CAPACITY);
        assert_eq!(u.push_input(b"y"), 0);
        assert_eq!(u.rx_space(), 0);
    }

    #[test]
    fn thre_interrupt_like_the_8250_driver_expects() {
        let mut r = Rig::new();
        r.w(IIR_FCR, FCR_ENABLE);
        // The driver's THRE probe: enable, read IIR, disable, enable, read.
        r.w(IER, IER_THRI);
        assert!(r.line());
        assert_eq!(r.r(IIR_FCR), IIR_FIFOS | IIR_THRI);
        assert!(!r.line(), "IIR read acknowledges THRE");
        assert_eq!(r.r(IIR_FCR), IIR_FIFOS | IIR_NO_INT);
        r.w(IER, 0);
        r.w(IER, IER_THRI);
        assert_eq!(r.r(IIR_FCR) & IIR_NO_INT, 0, "re-enabling THRI re-raises it");
        // Writing a byte makes THR empty again: interrupt pending.
        r.w(RBR_THR, b'x');
        assert!(r.line());
        // The driver stops TX by clearing THRI.
        r.w(IER, 0);
        assert!(!r.line());
        // RX has priority over THRE in IIR.
        r.w(IER, IER_THRI | IER_RDI);
        r.u.push_input(b"z");
        assert_eq!(r.r(IIR_FCR), IIR_FIFOS | IIR_RDI);
        r.r(RBR_THR);
        assert_eq!(r.r(IIR_FCR), IIR_FIFOS | IIR_THRI);
    }

    #[test]
    fn loopback_and_modem_status_for_autoconfig() {
        let mut r = Rig::new();
        r.w(MCR, MCR_LOOP | 0x0a);
        assert_eq!(r.r(MSR) & 0xf0, MSR_DCD | MSR_CTS);
        r.w(MCR, MCR_LOOP | 0x05);
        assert_eq!(r.r(MSR) & 0xf0, MSR_RI | MSR_DSR);
        r.w(RBR_THR, 0x42);
        assert!(r.u.take_output().is_empty());
        assert_eq!(r.r(RBR_THR), 0x42);
        r.w(MCR, MCR_OUT2 | MCR_RTS | MCR_DTR);
        assert_eq!(r.r(MCR), MCR_OUT2 | MCR_RTS | MCR_DTR);
        assert_eq!(r.r(MSR) & 0xf0, MSR_DCD | MSR_DSR | MSR_CTS);
        // Deltas were reported once and then cleared.
        assert_eq!(r.r(MSR) & MSR_DELTAS, 0);
    }

    #[test]
    fn junk_accesses_do_not_panic() {
        let mut r = Rig::new();
        let mut ctx = DeviceCtx { ram: &mut r.ram, irq: &mut r.irq };
        for off in [8u64, 0xff, 0x100, u64::MAX] {
            for size in [1u8, 2, 4, 8, 0, 200] {
                r.u.write(off, size, u64::MAX, &mut ctx);
                assert_eq!(r.u.read(off, size, &mut ctx), 0);
            }
        }
    }

    #[test]
    fn snapshot_roundtrip() {
        let mut u = Uart::new(10);
        u.write_reg(LCR, 0x83);
        u.write_reg(0, 1);
        u.write_reg(LCR, 0x03);
        u.write_reg(IER, IER_RDI | IER_THRI);
        u.push_input(b"pending");
        let blob = u.snapshot();
        let mut v = Uart::new(10);
        v.restore(&blob).unwrap();
        assert_eq!(v.snapshot(), blob);
        assert_eq!(v.read_reg(RBR_THR), b'p');
        assert!(Uart::new(11).restore(&blob).is_err());
        assert!(v.restore(&blob[..blob.len() - 2]).is_err());
    }

    #[test]
    fn a_break_is_a_zero_byte_flagged_in_lsr_until_read() {
        let mut u = Uart::new(10);
        u.push_input(b"x");
        assert!(!u.push_break(), "a break waits for the bytes before it to be read");
        assert_eq!(u.read_reg(RBR_THR), b'x');
        assert!(u.push_break());
        assert_eq!(u.push_input(b"o"), 1);
        assert_eq!(u.read_reg(LSR) & (LSR_DR | LSR_BI), LSR_DR | LSR_BI);
        let blob = u.snapshot();
        let mut v = Uart::new(10);
        v.restore(&blob).unwrap();
        assert_eq!(v.snapshot(), blob);
        for w in [&mut u, &mut v] {
            assert_eq!(w.read_reg(RBR_THR), 0);
            assert_eq!(w.read_reg(LSR) & (LSR_DR | LSR_BI), LSR_DR);
            assert_eq!(w.read_reg(RBR_THR), b'o');
        }
        // Without a break pending the UART saves as version 1 did.
        assert_eq!(blob[4..8], 2u32.to_le_bytes());
        assert_eq!(u.snapshot()[4..8], 1u32.to_le_bytes());
    }
}
