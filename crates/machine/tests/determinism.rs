//! Determinism of the real guest: boots the default Debian image (OpenSBI,
//! kernel, initramfs, a temporary copy of the ext4 root as the disk) with no
//! outside input to a fixed instruction count in two fresh machines, one
//! driven by a single `run_until` call and one stopping at many uneven
//! places, and checks that the state hashes and console output are
//! identical: the run is a function of the start state alone, and does not
//! depend on where the caller stops. With one hart and with two. Time
//! follows the deterministic "fast time" policy: whenever every hart is
//! idle the clock jumps to the next timer deadline.
//!
//! A negative control shows the comparison can fail: one byte typed on the
//! console changes the final state and guest RAM, and the state digest
//! replay relies on names the parts that differ: the hart if its registers
//! differ, and RAM pages whose contents really differ.
//!
//! Needs the built image (`make image`); fails without it.
//! `FTVM_DETERMINISM_INSNS` overrides the instruction count (for bisecting).

mod common;

use common::{image, Disk, TempDisk};
use ftvm_cpu::PrivilegeMode;
use ftvm_devices::virtio::blk::execute;
use ftvm_machine::{
    DeviceSpec, Event, IoCompletion, IoRequest, Machine, MachineConfig, RunExit, StateDigest, DEFAULT_GUEST_IPS,
};
use std::path::Path;
use std::time::Instant;

/// Steps (over all harts) each run executes. Measured on this image with one
/// hart: the kernel turns paging on at 7 million, takes its first timer
/// interrupt at 167 million, starts /init at 1.51 billion, and takes the
/// first external interrupt (virtio disk) at 1.90 billion; the shell is
/// reached at about 4.1 billion. 2.2 billion covers timer interrupts, user
/// mode and the first disk reads. (The boot does not idle before the shell,
/// so `ClockAdvance` is not exercised at this count.)
const DEFAULT_N: u64 = 2_200_000_000;
const RAM: u64 = 256 << 20;
const CMDLINE: &str = "console=ttyS0 root=/dev/vda rw quiet";

/// Step sizes for the run that stops often; cycled. Small ones split
/// quanta (10 000 steps) and timer deadlines at odd places.
const UNEVEN_STEPS: &[u64] = &[1, 7_919, 1_000_003, 123, 4_999_999, 65_536, 10_001, 2_718_281, 3, 999_983, 17, 350_377];

fn target() -> u64 {
    match std::env::var("FTVM_DETERMINISM_INSNS") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("FTVM_DETERMINISM_INSNS={v} is not a number")),
        Err(_) => DEFAULT_N,
    }
}

fn serve_io(m: &mut Machine, disk: &mut Disk) {
    for (slot, req) in m.take_io_requests() {
        match req {
            IoRequest::Disk { tag, op } => {
                let result = execute(&op, disk);
                m.inject(Event::Io { slot, completion: IoCompletion::Disk { tag, result } });
            }
            other => panic!("unexpected request {other:?}"),
        }
    }
}

/// A fresh machine booting the default guest with `harts` harts.
fn boot(harts: usize, tag: &str) -> (Machine, TempDisk) {
    let img = image();
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    let disk = TempDisk::copy_of(&img.rootfs, &format!("determinism-{harts}-{tag}"));
    let cfg = MachineConfig {
        harts,
        ram_size: RAM,
        firmware: Some(read(&img.firmware)),
        kernel: read(&img.kernel),
        initrd: Some(read(&img.initrd)),
        cmdline: CMDLINE.to_string(),
        devices: vec![DeviceSpec::Disk { size: disk.size(), readonly: false }],
        guest_ips: DEFAULT_GUEST_IPS,
        rtc_base_ns: 0,
        extensions: ftvm_machine::Extensions::ALL,
        seed: None,
    };
    let mut m = Machine::new(&cfg).unwrap_or_else(|e| panic!("building the machine: {e}"));
    // For the state digest at the end.
    m.set_dirty_tracking(true);
    (m, disk)
}

/// One run's result. The machine is kept for diagnosing a mismatch.
struct Outcome {
    machine: Machine,
    _disk: TempDisk,
    hash: [u8; 32],
    /// The digest at the end, covering every page written since boot.
    digest: StateDigest,
    console: Vec<u8>,
}

/// Run to `until` with the fast-time policy, collecting console output.
fn advance(m: &mut Machine, disk: &mut Disk, until: u64, console: &mut Vec<u8>) {
    loop {
        let exit = m.run_until(until);
        console.extend(m.take_console_output());
        match exit {
            RunExit::Reached => return,
            RunExit::Io => serve_io(m, disk),
            RunExit::Idle { wake_at: Some(t) } => {
                m.inject(Event::ClockAdvance(t));
            }
            other => panic!(
                "the guest stopped early at instruction {} ({other:?}); console so far:\n{}",
                m.icount(),
                String::from_utf8_lossy(console)
            ),
        }
    }
}

/// Boot a fresh machine and run it to `n`, stopping at each of `stops`
/// (increasing, below `n`) on the way, injecting `input` when reaching its
/// instruction count.
fn run(harts: usize, tag: &str, n: u64, stops: &[u64], input: Option<(u64, Event)>) -> Outcome {
    let started = Instant::now();
    let (mut machine, disk) = boot(harts, tag);
    let mut io = disk.open();
    let mut console = Vec::new();
    let mut stops: Vec<u64> = stops.iter().copied().chain(input.iter().map(|(at, _)| *at)).collect();
    stops.sort_unstable();
    for stop in stops.into_iter().filter(|&s| s < n) {
        advance(&mut machine, &mut io, stop, &mut console);
        if let Some((at, ev)) = &input {
            if *at == stop && machine.icount() == stop {
                machine.inject(ev.clone());
            }
        }
    }
    advance(&mut machine, &mut io, n, &mut console);
    assert_eq!(machine.icount(), n, "run_until overshot the target");
    let hash = machine.state_hash();
    let digest = machine.state_digest();
    eprintln!("{harts} hart(s), {tag}: {n} instructions in {:.1} s", started.elapsed().as_secs_f64());
    Outcome { machine, _disk: disk, hash, digest, console }
}

/// Stop points at uneven distances from the start up to `n`.
fn uneven_stops(n: u64) -> Vec<u64> {
    let mut stops = Vec::new();
    let mut at = 0;
    for step in UNEVEN_STEPS.iter().cycle() {
        at += step;
        if at >= n {
            break;
        }
        stops.push(at);
    }
    stops
}

fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where two machines differ, for the failure message.
fn differences(a: &Machine, b: &Machine) -> String {
    let mut out = Vec::new();
    if a.icount() != b.icount() {
        out.push(format!("icount {} vs {}", a.icount(), b.icount()));
    }
    if a.clock().to_parts() != b.clock().to_parts() {
        out.push(format!(
            "clock (base icount, base ticks, rate) {:?} vs {:?}",
            a.clock().to_parts(),
            b.clock().to_parts()
        ));
    }
    for (i, (x, y)) in a.harts().iter().zip(b.harts()).enumerate() {
        if x.s != y.s {
            out.push(format!(
                "hart {i}: pc {:#x} vs {:#x}, instret {} vs {}, prv {:?} vs {:?}, wfi {} vs {}",
                x.s.pc, y.s.pc, x.s.instret, y.s.instret, x.s.prv, y.s.prv, x.s.wfi, y.s.wfi
            ));
        }
    }
    let (ra, rb) = (a.ram().as_slice(), b.ram().as_slice());
    let pages: Vec<usize> =
        (0..ra.len() / 4096).filter(|p| ra[p * 4096..(p + 1) * 4096] != rb[p * 4096..(p + 1) * 4096]).collect();
    if !pages.is_empty() {
        let first: Vec<String> =
            pages.iter().take(8).map(|p| format!("{:#x}", a.ram().base() + (*p as u64) * 4096)).collect();
        out.push(format!("{} RAM pages differ, first at {}", pages.len(), first.join(", ")));
    }
    if out.is_empty() {
        out.push("harts, RAM, clock and icount agree: the difference is in device state".into());
    }
    out.join("\n  ")
}

fn assert_same(what: &str, a: &Outcome, b: &Outcome) {
    assert!(
        a.hash == b.hash,
        "{what}: state hashes differ at instruction {}: {} vs {}\n  {}",
        a.machine.icount(),
        hex(&a.hash),
        hex(&b.hash),
        differences(&a.machine, &b.machine)
    );
    assert!(
        a.console == b.console,
        "{what}: console output differs:\n--- first\n{}\n--- second\n{}",
        String::from_utf8_lossy(&a.console),
        String::from_utf8_lossy(&b.console)
    );
}

/// The run got somewhere: firmware printed its banner and hart 0 runs the
/// kernel with paging on.
fn assert_in_kernel(o: &Outcome) {
    let console = String::from_utf8_lossy(&o.console);
    assert!(console.contains("OpenSBI"), "no OpenSBI banner on the console:\n{console}");
    let h0 = &o.machine.harts()[0].s;
    assert!(
        h0.prv != PrivilegeMode::Machine && h0.satp != 0,
        "at instruction {} hart 0 is not in the kernel with paging on (prv {:?}, satp {:#x}, pc {:#x})",
        o.machine.icount(),
        h0.prv,
        h0.satp,
        h0.pc
    );
}

/// A fresh boot run to N in one call and another stopping at uneven
/// places must end in the same state. (If they differ, a third boot tells
/// whether fresh boots diverge or stopping points matter.)
fn check_determinism(harts: usize) -> Outcome {
    let n = target();
    let first = run(harts, "one call", n, &[], None);
    assert_in_kernel(&first);
    let stepped = run(harts, "uneven steps", n, &uneven_stops(n), None);
    if first.hash != stepped.hash || first.console != stepped.console {
        let again = run(harts, "one call again", n, &[], None);
        if again.hash == first.hash && again.console == first.console {
            assert_same(
                &format!("{harts} hart(s): the state depends on where run_until stops; one call vs uneven steps"),
                &first,
                &stepped,
            );
        }
        assert_same(&format!("{harts} hart(s): two fresh boots run to {n} in one call diverge"), &first, &again);
    }
    first
}

/// Where the negative control types its byte: after /init has started
/// (1.52 billion, measured) and opened the console. Input that arrives
/// earlier sits in the UART until the 8250 driver clears the FIFO when the
/// port is opened, and leaves no trace.
const CONTROL_INPUT_AT: u64 = 1_600_000_000;

#[test]
fn one_hart_boot_is_deterministic() {
    let reference = check_determinism(1);
    // Negative control: the same boot with one byte typed on the console
    // must end in a different state, with the guest having seen it (RAM
    // differs), or the comparisons above prove nothing.
    let n = target();
    let at = if n > CONTROL_INPUT_AT + 10_000_000 { CONTROL_INPUT_AT } else { n / 2 };
    let typed = run(1, "typed", n, &[], Some((at, Event::ConsoleInput(b"x".to_vec()))));
    assert_ne!(
        hex(&reference.hash),
        hex(&typed.hash),
        "one byte of console input at instruction {at} left no trace in the state at {n}"
    );
    if at == CONTROL_INPUT_AT {
        assert!(
            reference.machine.ram().as_slice() != typed.machine.ram().as_slice(),
            "one byte of console input at instruction {at} changed the state at {n} but not guest RAM"
        );
    }
    check_digest_report(&typed, &reference);
}

/// What replay would report for these two machines names what really
/// differs: the hart exactly when its registers differ, and only RAM pages
/// whose contents differ.
fn check_digest_report(run: &Outcome, recorded: &Outcome) {
    let (a, b) = (&run.machine, &recorded.machine);
    let report = run.digest.differences(&recorded.digest, &a.digest_part_names()).join(", ");
    eprintln!("digest report: {report}");
    assert!(!report.is_empty(), "two different machines have equal digests");
    assert_eq!(
        a.harts()[0].s != b.harts()[0].s,
        report.contains("hart 0 registers"),
        "the report on hart 0 is wrong: {report}"
    );
    let listed = report.split("the contents of RAM pages ").nth(1).unwrap_or_else(|| panic!("no RAM pages: {report}"));
    let listed = listed.split(';').next().unwrap();
    let pages: Vec<u64> =
        listed.split(", ").filter_map(|p| p.strip_prefix("0x").and_then(|h| u64::from_str_radix(h, 16).ok())).collect();
    assert!(!pages.is_empty(), "no page addresses in: {report}");
    for addr in pages {
        let (x, y) = (a.ram().slice(addr, 4096).unwrap(), b.ram().slice(addr, 4096).unwrap());
        assert!(x != y, "the report names RAM page {addr:#x}, which is the same in both: {report}");
    }
}

#[test]
fn two_hart_boot_is_deterministic() {
    check_determinism(2);
}
