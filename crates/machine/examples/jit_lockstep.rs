//! Boots the same machine twice side by side, one interpreting only
//! (`FTVM_JIT=0`) and one translating (`FTVM_JIT` as given, default
//! `hot=1`: every block at its first entry), compares the harts every
//! `STEP` instructions, and on the first difference finds the first
//! instruction count at which they differ and prints both harts.
//!
//!   cargo run --release -p ftvm-machine --example jit_lockstep -- \
//!       FIRMWARE KERNEL [INITRD] [INSTRUCTIONS]
//!
//! No disk, no network: the boot goes as far as it can without them,
//! which is far enough to run most of the kernel's code.

use ftvm_machine::{Event, Machine, MachineConfig, RunExit};

const STEP: u64 = 100_000;

fn machine(cfg: &MachineConfig, jit: &str) -> Machine {
    // Harts read it when they are made.
    std::env::set_var("FTVM_JIT", jit);
    Machine::new(cfg).expect("machine")
}

/// Runs to `target`, waking idle harts as the live loop would.
fn run_to(m: &mut Machine, target: u64) -> bool {
    loop {
        match m.run_until(target) {
            RunExit::Reached => return true,
            RunExit::Idle { wake_at: Some(t) } => {
                m.inject(Event::ClockAdvance(t));
            }
            RunExit::Io => {
                m.take_io_requests();
            }
            other => {
                eprintln!("stopped at {}: {other:?}", m.icount());
                return false;
            }
        }
    }
}

fn same(a: &Machine, b: &Machine) -> bool {
    a.harts().iter().zip(b.harts()).all(|(x, y)| x.s == y.s)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let read = |p: &str| std::fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let jit = std::env::var("FTVM_JIT").unwrap_or_else(|_| "hot=1".into());
    let cfg = MachineConfig {
        harts: 1,
        ram_size: 512 << 20,
        firmware: Some(read(&args[1])),
        kernel: read(&args[2]),
        initrd: args.get(3).map(|p| read(p)),
        cmdline: "console=ttyS0 earlycon=sbi".into(),
        devices: Vec::new(),
        guest_ips: 100_000_000,
        rtc_base_ns: 0,
        extensions: ftvm_machine::Extensions::ALL,
        seed: None,
    };
    let limit: u64 = args.get(4).map(|s| s.parse().unwrap()).unwrap_or(2_000_000_000);
    let mut a = machine(&cfg, "0");
    let mut b = machine(&cfg, &jit);
    let mut good = 0;
    while good < limit {
        let next = good + STEP;
        let (ra, rb) = (run_to(&mut a, next), run_to(&mut b, next));
        if !same(&a, &b) || ra != rb {
            break;
        }
        if !ra {
            println!("both stopped alike at {}", a.icount());
            return;
        }
        good = next;
        if good % 50_000_000 == 0 {
            eprintln!("{good} instructions alike; pc {:#x}", a.harts()[0].s.pc);
        }
    }
    if good >= limit {
        println!("{limit} instructions alike");
        return;
    }
    // The first count at which a fresh run of each differs.
    let (mut lo, mut hi) = (good, good + STEP);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let mut a = machine(&cfg, "0");
        let mut b = machine(&cfg, &jit);
        run_to(&mut a, mid);
        run_to(&mut b, mid);
        if same(&a, &b) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let mut a = machine(&cfg, "0");
    let mut b = machine(&cfg, &jit);
    run_to(&mut a, hi);
    run_to(&mut b, hi);
    println!("first difference at instruction {hi} (alike at {lo})");
    let (x, y) = (&a.harts()[0].s, &b.harts()[0].s);
    println!("pc {:#x} / {:#x}  prv {:?} / {:?}", x.pc, y.pc, x.prv, y.prv);
    for r in 0..32 {
        if x.x[r] != y.x[r] {
            println!("x{r}: interpreted {:#x}, translated {:#x}", x.x[r], y.x[r]);
        }
    }
    println!("interpreted: {x:x?}");
    println!("translated:  {y:x?}");
    let mut c = machine(&cfg, "0");
    run_to(&mut c, lo);
    println!("at {lo}: pc {:#x} {:x?}", c.harts()[0].s.pc, c.harts()[0].s.x);
}
