//! The board: which device answers at which physical address, how device
//! interrupt lines reach the harts, and the bus each hart sees.

use crate::clock::VirtualClock;
use crate::layout::*;
use crate::machine::DiskConfig;
use ftvm_cpu::Bus;
use ftvm_devices::clint::Clint;
use ftvm_devices::plic::Plic;
use ftvm_devices::syscon::{self, Syscon};
use ftvm_devices::uart::Uart;
use ftvm_devices::virtio::blk::BlkDevice;
use ftvm_devices::virtio::VirtioMmio;
use ftvm_devices::{DeviceCtx, IrqLines, MmioDevice};
use ftvm_memory::GuestRam;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerRequest {
    Off(u32),
    Reset,
}

pub struct Board {
    clint: Clint,
    plic: Plic,
    uart: Uart,
    syscon: Syscon,
    /// Populated virtio slots, in slot order from slot 0.
    virtio: Vec<VirtioMmio>,
    /// Locks on the disk images, held while the machine lives.
    _disk_locks: Vec<std::fs::File>,
    irq: IrqLines,
}

impl Board {
    pub fn new(harts: usize, disks: &[DiskConfig]) -> Result<Board, String> {
        if disks.len() > VIRTIO_SLOTS {
            return Err(format!("at most {VIRTIO_SLOTS} disks are supported"));
        }
        let mut virtio = Vec::new();
        let mut locks = Vec::new();
        for (i, d) in disks.iter().enumerate() {
            locks.push(lock_disk(&d.path, d.readonly)?);
            let blk = BlkDevice::open(&d.path, d.readonly, &format!("ftvm-disk{i}"))
                .map_err(|e| format!("cannot open disk {}: {e}", d.path.display()))?;
            virtio.push(VirtioMmio::new(Box::new(blk), virtio_slot(i).1));
        }
        Ok(Board {
            clint: Clint::new(harts),
            plic: Plic::new(harts),
            uart: Uart::new(UART_IRQ),
            syscon: Syscon::new(),
            virtio,
            _disk_locks: locks,
            irq: IrqLines::default(),
        })
    }

    /// (base, PLIC source) of every populated virtio slot.
    pub fn virtio_windows(&self) -> Vec<(u64, u32)> {
        (0..self.virtio.len()).map(virtio_slot).collect()
    }

    /// The mip bits the platform drives for `hart` at timer value `mtime`.
    pub fn irq_bits(&mut self, hart: usize, mtime: u64) -> u64 {
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

    pub fn next_timer_deadline(&self) -> Option<u64> {
        self.clint.next_deadline()
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

    pub fn console_room(&self) -> usize {
        self.uart.rx_space()
    }

    pub fn take_console_output(&mut self) -> Vec<u8> {
        self.uart.take_output()
    }

    /// Every device's state, in a fixed order.
    pub fn snapshot_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let fixed = [self.clint.snapshot(), self.plic.snapshot(), self.uart.snapshot(), self.syscon.snapshot()];
        for part in fixed.into_iter().chain(self.virtio.iter().map(|v| v.snapshot())) {
            out.extend_from_slice(&(part.len() as u64).to_le_bytes());
            out.extend_from_slice(&part);
        }
        out.extend_from_slice(&self.irq.0.to_le_bytes());
        out
    }
}

/// Two VMs writing one image would corrupt it, so a writable disk is
/// locked exclusively and a read-only one shared, for as long as the
/// machine lives (flock: released by the kernel even if ftvm is killed).
fn lock_disk(path: &std::path::Path, readonly: bool) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open disk {}: {e}", path.display()))?;
    let op = if readonly { libc::LOCK_SH } else { libc::LOCK_EX } | libc::LOCK_NB;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
        return Err(format!("disk {} is in use by another VM", path.display()));
    }
    Ok(f)
}

/// The bus as one hart sees it during one slice.
pub struct HartBus<'a> {
    board: &'a mut Board,
    clock: &'a VirtualClock,
    slice_start: u64,
}

impl<'a> HartBus<'a> {
    pub fn new(board: &'a mut Board, clock: &'a VirtualClock, slice_start: u64) -> HartBus<'a> {
        HartBus { board, clock, slice_start }
    }
}

fn within(addr: u64, base: u64, size: u64) -> Option<u64> {
    addr.checked_sub(base).filter(|&off| off < size)
}

impl Bus for HartBus<'_> {
    fn read(&mut self, ram: &mut GuestRam, paddr: u64, size: u8, progress: u64) -> Option<u64> {
        let b = &mut *self.board;
        let mut ctx = DeviceCtx { ram, irq: &mut b.irq };
        if let Some(off) = within(paddr, CLINT_BASE, CLINT_SIZE) {
            return Some(b.clint.read(off, size, self.clock.ticks_at(self.slice_start + progress)));
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

    fn write(&mut self, ram: &mut GuestRam, paddr: u64, size: u8, value: u64, _progress: u64) -> bool {
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
        self.clock.ticks_at(self.slice_start + progress)
    }
}
