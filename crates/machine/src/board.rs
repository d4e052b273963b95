//! The board: which device answers at which physical address, how device
//! interrupt lines reach the harts, and the bus each hart sees.

use crate::clock::VirtualClock;
use crate::layout::*;
use crate::machine::DeviceSpec;
use crate::snapshot::{StateError, StateResult};
use ftvm_cpu::Bus;
use ftvm_devices::clint::Clint;
use ftvm_devices::plic::Plic;
use ftvm_devices::rtc::Rtc;
use ftvm_devices::snapshot::{SnapReader, SnapWriter};
use ftvm_devices::syscon::{self, Syscon};
use ftvm_devices::uart::Uart;
use ftvm_devices::virtio::blk::BlkDevice;
use ftvm_devices::virtio::net::NetDevice;
use ftvm_devices::virtio::rng::RngDevice;
use ftvm_devices::virtio::{VirtioDevice, VirtioMmio};
use ftvm_devices::{DeviceCtx, IoCompletion, IoRequest, IrqLines, MmioDevice};
use ftvm_memory::GuestRam;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerRequest {
    Off(u32),
    Reset,
}

/// Why a board cannot be built with the devices asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoardError {
    #[error("at most {VIRTIO_SLOTS} virtio devices (disks, NICs, rng) are supported")]
    TooManyDevices,
    /// `disk` counts disks only, from 0.
    #[error("disk {disk} is smaller than one 512-byte sector")]
    DiskTooSmall { disk: usize },
}

pub struct Board {
    clint: Clint,
    plic: Plic,
    uart: Uart,
    syscon: Syscon,
    rtc: Rtc,
    /// Populated virtio slots, in slot order from slot 0.
    virtio: Vec<VirtioMmio>,
    irq: IrqLines,
}

impl Board {
    /// `rtc_base`: the wall time (ns since the Unix epoch) the RTC shows
    /// when `mtime` reads zero.
    pub fn new(harts: usize, devices: &[DeviceSpec], rtc_base: u64) -> Result<Board, BoardError> {
        if devices.len() > VIRTIO_SLOTS {
            return Err(BoardError::TooManyDevices);
        }
        let mut virtio = Vec::new();
        let mut disks = 0;
        for (slot, d) in devices.iter().enumerate() {
            let dev: Box<dyn VirtioDevice> = match d {
                DeviceSpec::Disk { size, readonly } => {
                    if *size < 512 {
                        return Err(BoardError::DiskTooSmall { disk: disks });
                    }
                    disks += 1;
                    Box::new(BlkDevice::new(*size, *readonly, &format!("ftvm-disk{}", disks - 1)))
                }
                DeviceSpec::Net { mac } => Box::new(NetDevice::new(*mac)),
                DeviceSpec::Rng => Box::new(RngDevice::new()),
            };
            virtio.push(VirtioMmio::new(dev, virtio_slot(slot).1));
        }
        Ok(Board {
            clint: Clint::new(harts),
            plic: Plic::new(harts),
            uart: Uart::new(UART_IRQ),
            syscon: Syscon::new(),
            rtc: Rtc::new(RTC_IRQ, TIMEBASE_HZ, rtc_base),
            virtio,
            irq: IrqLines::default(),
        })
    }

    /// Whether any device has requests for the host.
    pub fn has_io_requests(&self) -> bool {
        self.virtio.iter().any(|v| v.has_requests())
    }

    /// Requests for the host, by slot, in slot order.
    pub fn take_io_requests(&mut self) -> Vec<(usize, IoRequest)> {
        let mut out = Vec::new();
        for (slot, v) in self.virtio.iter_mut().enumerate() {
            out.extend(v.take_requests().into_iter().map(|r| (slot, r)));
        }
        out
    }

    /// Requests the devices still wait for, by slot.
    pub fn io_in_flight(&self) -> Vec<(usize, IoRequest)> {
        let mut out = Vec::new();
        for (slot, v) in self.virtio.iter().enumerate() {
            out.extend(v.in_flight().into_iter().map(|r| (slot, r)));
        }
        out
    }

    pub fn io_in_flight_count(&self) -> usize {
        self.virtio.iter().map(|v| v.in_flight_count()).sum()
    }

    pub fn complete_io(&mut self, slot: usize, c: IoCompletion, ram: &GuestRam) -> bool {
        match self.virtio.get_mut(slot) {
            Some(v) => v.complete(c, ram, &mut self.irq),
            None => false,
        }
    }

    pub fn input_ready(&self, slot: usize, ram: &GuestRam) -> bool {
        self.virtio.get(slot).is_some_and(|v| v.input_ready(ram))
    }

    /// (base, PLIC source) of every populated virtio slot.
    pub fn virtio_windows(&self) -> Vec<(u64, u32)> {
        (0..self.virtio.len()).map(virtio_slot).collect()
    }

    /// The mip bits the platform drives for `hart` at timer value `mtime`.
    pub fn irq_bits(&mut self, hart: usize, mtime: u64) -> u64 {
        self.rtc.update(mtime, &mut self.irq);
        self.plic.update(self.irq);
        let mut bits = 0;
        if self.clint.msip(hart) {
            bits |= 1 << 3;
        }
        if self.clint.mtip(hart, mtime) {
            bits |= 1 << 7;
        }
        if self.plic.meip(hart) {
            bits |= 1 << 11;
        }
        if self.plic.seip(hart) {
            bits |= 1 << 9;
        }
        bits
    }

    /// The earliest `mtime` at which a hart's timer or the RTC's alarm
    /// fires: an idle machine wakes there.
    pub fn next_timer_deadline(&self) -> Option<u64> {
        [self.clint.next_deadline(), self.rtc.deadline()].into_iter().flatten().min()
    }

    /// As [`Board::next_timer_deadline`], the earliest still ahead of
    /// `now`: slices end there, so an alarm, like a timer, is seen at the
    /// same instruction however a run is split.
    pub fn next_timer_deadline_after(&self, now: u64) -> Option<u64> {
        let rtc = self.rtc.deadline().filter(|&t| t > now);
        [self.clint.next_deadline_after(now), rtc].into_iter().flatten().min()
    }

    /// The RTC's wall time (ns since the Unix epoch) at `mtime` zero.
    pub fn rtc_base(&self) -> u64 {
        self.rtc.base()
    }

    pub fn set_rtc_base(&mut self, base: u64) {
        self.rtc.set_base(base);
    }

    /// The wall time the RTC shows at `mtime`.
    pub fn rtc_now(&self, mtime: u64) -> u64 {
        self.rtc.now(mtime)
    }

    /// Sets the RTC so that it shows `now` at `mtime`.
    pub fn set_rtc_now(&mut self, mtime: u64, now: u64) {
        self.rtc.set_now(mtime, now);
    }

    pub fn power_request(&self) -> Option<PowerRequest> {
        self.syscon.request().map(|r| match r {
            syscon::PowerRequest::Poweroff => PowerRequest::Off(0),
            syscon::PowerRequest::Fail(code) => PowerRequest::Off(code as u32),
            syscon::PowerRequest::Reboot => PowerRequest::Reset,
        })
    }

    /// Queue console input; returns how many bytes the UART took.
    pub fn console_input(&mut self, bytes: &[u8]) -> usize {
        let taken = self.uart.push_input(bytes);
        self.irq.set(self.uart.irq(), self.uart.irq_level());
        taken
    }

    /// A break on the console line; false if bytes wait to be read first.
    pub fn console_break(&mut self) -> bool {
        let taken = self.uart.push_break();
        self.irq.set(self.uart.irq(), self.uart.irq_level());
        taken
    }

    pub fn console_room(&self) -> usize {
        self.uart.rx_space()
    }

    pub fn take_console_output(&mut self) -> Vec<u8> {
        self.uart.take_output()
    }

    /// Each device's state under a name a person can read, then the
    /// interrupt lines: the parts a replay mismatch is reported by.
    pub fn named_parts(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = vec![
            ("CLINT".to_string(), self.clint.snapshot()),
            ("PLIC".to_string(), self.plic.snapshot()),
            ("UART".to_string(), self.uart.snapshot()),
            ("syscon".to_string(), self.syscon.snapshot()),
            ("RTC".to_string(), self.rtc.snapshot()),
        ];
        for (slot, v) in self.virtio.iter().enumerate() {
            let kind = match v.device_type() {
                1 => "virtio-net",
                2 => "virtio-blk",
                4 => "virtio-rng",
                _ => "virtio",
            };
            out.push((format!("{kind} (slot {slot})"), v.snapshot()));
        }
        out.push(("device interrupt lines".to_string(), self.irq.0.to_le_bytes().to_vec()));
        out
    }

    /// Every device's state, in a fixed order.
    pub fn snapshot_bytes(&self) -> Vec<u8> {
        // Version 2 added the RTC.
        let mut w = SnapWriter::new(b"BORD", 2);
        let parts = [
            self.clint.snapshot(),
            self.plic.snapshot(),
            self.uart.snapshot(),
            self.syscon.snapshot(),
            self.rtc.snapshot(),
        ];
        for part in parts {
            w.bytes(&part);
        }
        w.u32(self.virtio.len() as u32);
        for v in &self.virtio {
            w.bytes(&v.snapshot());
        }
        w.u64(self.irq.0);
        w.finish()
    }

    /// Restores what [`Board::snapshot_bytes`] saved into a board built with
    /// the same harts and devices. On error the board is half restored and
    /// must be thrown away.
    pub fn restore_bytes(&mut self, blob: &[u8]) -> StateResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"BORD")?;
        if version != 2 {
            return Err(StateError::BoardVersion(version));
        }
        self.clint.restore(r.bytes()?)?;
        self.plic.restore(r.bytes()?)?;
        self.uart.restore(r.bytes()?)?;
        self.syscon.restore(r.bytes()?)?;
        self.rtc.restore(r.bytes()?)?;
        let n = r.u32()? as usize;
        if n != self.virtio.len() {
            return Err(StateError::BoardDevices { saved: n, actual: self.virtio.len() });
        }
        for v in &mut self.virtio {
            v.restore(r.bytes()?)?;
        }
        self.irq = IrqLines(r.u64()?);
        Ok(r.end()?)
    }
}

/// The bus as one hart sees it during one slice.
pub struct HartBus<'a> {
    board: &'a mut Board,
    clock: &'a VirtualClock,
    slice_start: u64,
    /// Harts on their own threads: the latest time any of them read,
    /// which no later read goes below (see [`HartBus::time_floor`]).
    floor: Option<&'a AtomicU64>,
}

impl<'a> HartBus<'a> {
    pub fn new(board: &'a mut Board, clock: &'a VirtualClock, slice_start: u64) -> HartBus<'a> {
        HartBus { board, clock, slice_start, floor: None }
    }

    /// For a hart beside others on their own threads, whose slices started
    /// at instruction counts that do not say in what order their reads
    /// come: a hart's time is the machine's count when its slice began
    /// plus its own progress, which can be behind what another hart read
    /// a moment before. Every read here moves `floor` up to what it
    /// returns and returns at least `floor`, so time never goes back from
    /// one hart to another (Linux's timekeeping takes a step back for a
    /// jump of centuries ahead).
    pub fn time_floor(mut self, floor: &'a AtomicU64) -> HartBus<'a> {
        self.floor = Some(floor);
        self
    }

    /// The platform timer at step `progress` of the slice.
    fn now(&self, progress: u64) -> u64 {
        let t = self.clock.ticks_at(self.slice_start + progress);
        match self.floor {
            None => t,
            Some(floor) => time_at_least(floor, t),
        }
    }
}

/// `t`, or the latest time read on `floor` if that is later; moves
/// `floor` up to what it returns (see [`HartBus::time_floor`]).
pub(crate) fn time_at_least(floor: &AtomicU64, t: u64) -> u64 {
    floor.fetch_max(t, Ordering::SeqCst).max(t)
}

fn within(addr: u64, base: u64, size: u64) -> Option<u64> {
    addr.checked_sub(base).filter(|&off| off < size)
}

impl Bus for HartBus<'_> {
    fn read(&mut self, ram: &GuestRam, paddr: u64, size: u8, progress: u64) -> Option<u64> {
        let now = self.now(progress);
        let b = &mut *self.board;
        let mut ctx = DeviceCtx { ram, irq: &mut b.irq };
        if let Some(off) = within(paddr, CLINT_BASE, CLINT_SIZE) {
            return Some(b.clint.read(off, size, now));
        }
        if let Some(off) = within(paddr, PLIC_BASE, PLIC_SIZE) {
            b.plic.update(*ctx.irq);
            return Some(b.plic.read(off, size, &mut ctx));
        }
        if let Some(off) = within(paddr, UART_BASE, UART_SIZE) {
            return Some(b.uart.read(off, size, &mut ctx));
        }
        if let Some(off) = within(paddr, SYSCON_BASE, SYSCON_SIZE) {
            return Some(b.syscon.read(off, size, &mut ctx));
        }
        if let Some(off) = within(paddr, RTC_BASE, RTC_SIZE) {
            return Some(b.rtc.read(off, size, now));
        }
        if let Some(off) = within(paddr, VIRTIO_BASE, VIRTIO_STRIDE * VIRTIO_SLOTS as u64) {
            let slot = (off / VIRTIO_STRIDE) as usize;
            // An empty slot reads as device id 0 ("nothing here").
            return Some(match b.virtio.get_mut(slot) {
                Some(dev) => dev.read(off % VIRTIO_STRIDE, size, &mut ctx),
                None => 0,
            });
        }
        None
    }

    fn write(&mut self, ram: &GuestRam, paddr: u64, size: u8, value: u64, progress: u64) -> bool {
        let now = self.now(progress);
        let b = &mut *self.board;
        let mut ctx = DeviceCtx { ram, irq: &mut b.irq };
        if let Some(off) = within(paddr, CLINT_BASE, CLINT_SIZE) {
            b.clint.write(off, size, value);
        } else if let Some(off) = within(paddr, PLIC_BASE, PLIC_SIZE) {
            b.plic.update(*ctx.irq);
            b.plic.write(off, size, value, &mut ctx);
        } else if let Some(off) = within(paddr, UART_BASE, UART_SIZE) {
            b.uart.write(off, size, value, &mut ctx);
        } else if let Some(off) = within(paddr, SYSCON_BASE, SYSCON_SIZE) {
            b.syscon.write(off, size, value, &mut ctx);
        } else if let Some(off) = within(paddr, RTC_BASE, RTC_SIZE) {
            b.rtc.write(off, size, value, now, ctx.irq);
        } else if let Some(off) = within(paddr, VIRTIO_BASE, VIRTIO_STRIDE * VIRTIO_SLOTS as u64) {
            // Writes to empty slots are ignored.
            if let Some(dev) = b.virtio.get_mut((off / VIRTIO_STRIDE) as usize) {
                dev.write(off % VIRTIO_STRIDE, size, value, &mut ctx);
            }
        } else {
            return false;
        }
        true
    }

    fn time(&mut self, progress: u64) -> u64 {
        self.now(progress)
    }
}
