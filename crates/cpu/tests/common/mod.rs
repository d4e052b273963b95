//! What the hart tests share: a bus with no devices behind it (every
//! access outside RAM fails, and time stands at zero).

use ftvm_cpu::Bus;
use ftvm_memory::GuestRam;

pub struct NoDevices;

impl Bus for NoDevices {
    fn read(&mut self, _: &GuestRam, _: u64, _: u8, _: u64) -> Option<u64> {
        None
    }
    fn write(&mut self, _: &GuestRam, _: u64, _: u8, _: u64, _: u64) -> bool {
        false
    }
    fn time(&mut self, _: u64) -> u64 {
        0
    }
}
