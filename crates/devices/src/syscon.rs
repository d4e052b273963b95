//! The SiFive test device ("finisher"): the guest powers off, reboots or
//! fails with an exit code by writing one 32-bit word. The device only
//! records the request; the machine polls it after the access and decides
//! what stopping means.

use crate::snapshot::{SnapReader, SnapResult, SnapWriter, SnapshotError};
use crate::{DeviceCtx, MmioDevice};

const FINISHER_FAIL: u32 = 0x3333;
const FINISHER_PASS: u32 = 0x5555;
const FINISHER_RESET: u32 = 0x7777;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerRequest {
    /// Clean poweroff (exit status 0).
    Poweroff,
    /// Failure with the code in the word's upper half.
    Fail(u16),
    Reboot,
}

#[derive(Default)]
pub struct Syscon {
    request: Option<PowerRequest>,
}

impl Syscon {
    pub fn new() -> Self {
        Syscon::default()
    }

    /// The pending request, if the guest made one; clears it.
    pub fn take_request(&mut self) -> Option<PowerRequest> {
        self.request.take()
    }

    pub fn request(&self) -> Option<PowerRequest> {
        self.request
    }

    /// Only 32-bit (or 64-bit, low word used) writes at offset 0 count;
    /// unknown codes are ignored like on the real device.
    pub fn write_reg(&mut self, offset: u64, size: u8, value: u64) {
        if offset != 0 || !(size == 4 || size == 8) {
            return;
        }
        let v = value as u32;
        let req = match v & 0xffff {
            FINISHER_FAIL => PowerRequest::Fail((v >> 16) as u16),
            FINISHER_PASS => PowerRequest::Poweroff,
            FINISHER_RESET => PowerRequest::Reboot,
            _ => return,
        };
        self.request = Some(req);
    }

    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = SnapWriter::new(b"SYSC", 1);
        match self.request {
            None => w.u8(0),
            Some(PowerRequest::Poweroff) => w.u8(1),
            Some(PowerRequest::Reboot) => w.u8(2),
            Some(PowerRequest::Fail(c)) => {
                w.u8(3);
                w.u16(c);
            }
        }
        w.finish()
    }

    pub fn restore(&mut self, blob: &[u8]) -> SnapResult<()> {
        let (mut r, version) = SnapReader::new(blob, b"SYSC")?;
        if version != 1 {
            return Err(SnapshotError::Version { device: "syscon", version });
        }
        let req = match r.u8()? {
            0 => None,
            1 => Some(PowerRequest::Poweroff),
            2 => Some(PowerRequest::Reboot),
            3 => Some(PowerRequest::Fail(r.u16()?)),
            t => return Err(SnapshotError::SysconRequest(t)),
        };
        r.end()?;
        self.request = req;
        Ok(())
    }
}

impl MmioDevice for Syscon {
    fn read(&mut self, _offset: u64, _size: u8, _ctx: &mut DeviceCtx) -> u64 {
        0
    }

    fn write(&mut self, offset: u64, size: u8, value: u64, _ctx: &mut DeviceCtx) {
        self.write_reg(offset, size, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests() {
        let mut s = Syscon::new();
        s.write_reg(0, 4, 0x5555);
        assert_eq!(s.take_request(), Some(PowerRequest::Poweroff));
        assert_eq!(s.take_request(), None);
        s.write_reg(0, 4, (42 << 16) | 0x3333);
        assert_eq!(s.take_request(), Some(PowerRequest::Fail(42)));
        s.write_reg(0, 4, 0x7777);
        assert_eq!(s.request(), Some(PowerRequest::Reboot));
        let blob = s.snapshot();
        let mut t = Syscon::new();
        t.restore(&blob).unwrap();
        assert_eq!(t.take_request(), Some(PowerRequest::Reboot));
        assert!(t.restore(&blob[..blob.len() - 1]).is_err());
    }

    #[test]
    fn junk_is_ignored() {
        let mut s = Syscon::new();
        s.write_reg(4, 4, 0x5555);
        s.write_reg(0, 1, 0x55);
        s.write_reg(0, 2, 0x5555);
        s.write_reg(0, 4, 0x1234);
        s.write_reg(u64::MAX, 8, 0x5555);
        assert_eq!(s.take_request(), None);
    }
}
