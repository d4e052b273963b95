//! mip.SEIP is the OR of a software-writable bit and the interrupt
//! controller's line; a read-modify-write of mip must not copy the line
//! into the software bit (privileged spec, "Machine Interrupt Registers").
//! Firmware does exactly that when it sets STIP while a device interrupt
//! is pending, and a latched SEIP means an endless interrupt storm.

mod common;

use common::NoDevices;
use ftvm_cpu::Hart;
use ftvm_memory::GuestRam;

const SEIP: u64 = 1 << 9;
const STIP: u64 = 1 << 5;

#[test]
fn setting_stip_does_not_latch_the_external_line() {
    let base = 0x8000_0000;
    let ram = GuestRam::new(base, 1 << 20).unwrap();
    // li t0, 0x20; csrs mip, t0; csrr t1, mip
    let prog: [u32; 3] = [0x0200_0293, 0x3442_a073, 0x3440_2373];
    for (i, w) in prog.iter().enumerate() {
        ram.write_u32(base + 4 * i as u64, *w).unwrap();
    }
    let mut hart = Hart::new(0);
    hart.s.pc = base;
    hart.set_irq_lines(SEIP);
    hart.run(&ram, &mut NoDevices, 3);
    assert_eq!(hart.s.x[6] & (SEIP | STIP), SEIP | STIP, "reads show both the line and STIP");
    assert_eq!(hart.s.mip & SEIP, 0, "the line was latched into the software SEIP bit");
    hart.set_irq_lines(0);
    assert_eq!(hart.s.mip, STIP);
}
