//! Bad input to `ftvm run`: each case must end with one clear line on
//! stderr starting with `ftvm:`, a non-zero exit status (2 for command-line
//! usage errors, 1 for everything else), nothing on stdout, and never a
//! panic.
//!
//! None of these needs the guest image except the case that checks what
//! happens when it is missing: files are given explicitly, with
//! `--bios none` where a kernel is needed.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Errors are reported before anything runs; this is generous.
const TIMEOUT: Duration = Duration::from_secs(30);

mod common;

use common::Scratch;
use common::{run_with_timeout, Run as Outcome};

fn ftvm_with(args: &[&str], env: &[(&str, &Path)], timeout: Duration) -> Outcome {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(cmd, timeout)
}

fn ftvm(args: &[&str]) -> Outcome {
    ftvm_with(args, &[], TIMEOUT)
}

/// One `ftvm: ...` line on stderr containing every one of `needles`,
/// nothing on stdout, exit status `code`.
fn assert_error(args: &[&str], code: i32, needles: &[&str]) {
    let o = ftvm(args);
    assert_error_outcome(&o, args, code, needles);
}

fn assert_error_outcome(o: &Outcome, args: &[&str], code: i32, needles: &[&str]) {
    let status =
        o.status.unwrap_or_else(|| panic!("ftvm {args:?} was still running after {TIMEOUT:?}; stderr: {:?}", o.stderr));
    assert!(!o.stderr.contains("panicked"), "ftvm {args:?} panicked:\n{}", o.stderr);
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("ftvm: "),
        "ftvm {args:?}: expected one line `ftvm: ...` on stderr, got:\n{}",
        o.stderr
    );
    for needle in needles {
        assert!(lines[0].contains(needle), "ftvm {args:?}: the error does not mention {needle:?}: {}", lines[0]);
    }
    assert_eq!(o.stdout, "", "ftvm {args:?}: unexpected output on stdout");
    assert_eq!(status.code(), Some(code), "ftvm {args:?}: exit status (stderr: {})", lines[0]);
}

fn scratch(tag: &str) -> Scratch {
    Scratch::new("cli-errors", tag)
}

/// A path in the scratch directory that does not exist.
fn missing(s: &Scratch, name: &str) -> String {
    common::path_str(&s.path(name))
}

/// Reproducible random bytes (xorshift64).
fn garbage(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn missing_kernel() {
    let s = scratch("kernel");
    let k = missing(&s, "Image");
    assert_error(&["run", "--bios", "none", "--kernel", &k], 1, &["kernel", &k, "No such file"]);
}

#[test]
fn missing_firmware() {
    let s = scratch("bios");
    let k = s.file("kernel.bin", &garbage(4096));
    let fw = missing(&s, "fw_dynamic.bin");
    assert_error(&["run", "--bios", &fw, "--kernel", &k], 1, &["firmware", &fw, "No such file"]);
}

#[test]
fn empty_kernel() {
    let s = scratch("empty");
    let k = s.file("empty.bin", b"");
    assert_error(&["run", "--bios", "none", "--kernel", &k], 1, &["kernel", "empty"]);
}

#[test]
fn compressed_kernel_with_firmware() {
    let s = scratch("gzip");
    let fw = s.file("fw.bin", &[0x73, 0x00, 0x50, 0x10]); // wfi
    let mut gz = vec![0x1f, 0x8b, 0x08, 0x00];
    gz.extend(garbage(4096));
    let k = s.file("Image.gz", &gz);
    assert_error(&["run", "--bios", &fw, "--kernel", &k], 1, &["gzip", "uncompressed"]);
}

/// Random bytes as a bare-metal kernel. A flat binary has no header, but
/// it must start with code: with this seed the first instruction is
/// illegal, so the loader refuses the file with one line (it used to run
/// it, the hart looping on instruction access faults at mtvec 0). Random
/// bytes that happen to look like code would run as real hardware would,
/// and ftvm keeps running. What must never happen: a panic, an exit with
/// status 0, or more than one line on stderr.
#[test]
fn random_bytes_as_kernel_do_not_crash_ftvm() {
    let s = scratch("garbage");
    let k = s.file("garbage.bin", &garbage(64 << 10));
    let args = ["run", "--bios", "none", "--kernel", &k, "--mem", "64M"];
    let o = ftvm_with(&args, &[], Duration::from_secs(5));
    assert!(!o.stderr.contains("panicked"), "ftvm {args:?} panicked:\n{}", o.stderr);
    if let Some(status) = o.status {
        assert!(!status.success(), "ftvm {args:?} exited successfully running random bytes");
        let lines: Vec<&str> = o.stderr.lines().collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("ftvm: "),
            "ftvm {args:?} exited ({status}) without one `ftvm: ...` line on stderr:\n{}",
            o.stderr
        );
    } else {
        assert_eq!(o.stderr, "", "ftvm {args:?} printed on stderr while running");
    }
}

/// The first 64 bytes of a RISC-V Linux Image with an EFI stub, as
/// Debian's is: "MZ", the Image header ("RSC\x05" at 0x38) and the offset
/// of the PE header at 0x3c; then a PE header whose one section's data
/// ends at `data_end` (the file is whole when it is that long).
fn efi_image(data_end: u32, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len.max(0x100)];
    b[..2].copy_from_slice(b"MZ");
    b[2..4].copy_from_slice(&[0x6f, 0x10]); // the rest of a jump, as in Debian's Image
    b[16..24].copy_from_slice(&(4u64 << 20).to_le_bytes()); // image_size
    b[0x30..0x38].copy_from_slice(b"RISCV\0\0\0");
    b[0x38..0x3c].copy_from_slice(b"RSC\x05");
    b[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
    b[0x40..0x44].copy_from_slice(b"PE\0\0");
    b[0x46..0x48].copy_from_slice(&1u16.to_le_bytes()); // one section
    b[0x54..0x56].copy_from_slice(&0u16.to_le_bytes()); // no optional header
    let sec = 0x40 + 24;
    b[sec..sec + 5].copy_from_slice(b".text");
    b[sec + 16..sec + 20].copy_from_slice(&(data_end - 0x100).to_le_bytes()); // SizeOfRawData
    b[sec + 20..sec + 24].copy_from_slice(&0x100u32.to_le_bytes()); // PointerToRawData
    b.truncate(len);
    b
}

/// Firmware that is no program (random bytes, or nothing at all) is
/// refused before anything runs; it used to run and hang silently.
#[test]
fn garbage_or_empty_firmware() {
    let s = scratch("bad-bios");
    let k = s.file("Image", &efi_image(0x1000, 0x1000));
    let fw = s.file("garbage.bin", &garbage(64 << 10));
    assert_error(&["run", "--bios", &fw, "--kernel", &k, "--mem", "64M"], 1, &["firmware", "not a RISC-V program"]);
    let fw = s.file("empty.bin", b"");
    assert_error(&["run", "--bios", &fw, "--kernel", &k, "--mem", "64M"], 1, &["firmware", "empty"]);
    let fw = s.file("fw.elf", &common::riscv_elf(4, &[0x13, 0, 0, 0]));
    assert_error(&["run", "--bios", &fw, "--kernel", &k, "--mem", "64M"], 1, &["firmware", "ELF", "flat binary"]);
}

/// Random bytes as the kernel the firmware starts: refused, not run.
#[test]
fn garbage_kernel_with_firmware() {
    let s = scratch("bad-kernel");
    let fw = s.file("fw.bin", &[0x73, 0x00, 0x50, 0x10]); // wfi
    let k = s.file("garbage", &garbage(64 << 10));
    assert_error(&["run", "--bios", &fw, "--kernel", &k, "--mem", "64M"], 1, &["kernel", "not a RISC-V program"]);
}

/// A Linux Image cut short (its PE header says where its data ends) is
/// refused; the whole file is taken.
#[test]
fn truncated_kernel_image() {
    let s = scratch("cut-image");
    let fw = s.file("fw.bin", &[0x73, 0x00, 0x50, 0x10]); // wfi
    let k = s.file("Image", &efi_image(0x2000, 0x1800));
    assert_error(&["run", "--bios", &fw, "--kernel", &k, "--mem", "64M"], 1, &["kernel Image", "truncated", "6144"]);
    let whole = s.file("Image.whole", &efi_image(0x2000, 0x2000));
    let spin = s.file("spin.bin", &[0x6f, 0x00, 0x00, 0x00]); // j .
    let o = ftvm_with(&["run", "--bios", &spin, "--kernel", &whole, "--mem", "64M"], &[], Duration::from_secs(3));
    assert!(o.status.is_none() && o.stderr.is_empty(), "a whole Image was not started: {:?} {}", o.status, o.stderr);
}

/// A flat binary that ends inside its first instruction.
#[test]
fn flat_binary_cut_inside_an_instruction() {
    let s = scratch("cut-flat");
    let k = s.file("cut.bin", &[0x13, 0x05]); // half of `addi`
    assert_error(&["run", "--bios", "none", "--kernel", &k], 1, &["kernel", "ends inside an instruction"]);
}

#[test]
fn elf_with_truncated_segment() {
    let s = scratch("elf-segment");
    let k = s.file("short.elf", &common::riscv_elf(4096, &[0x13, 0, 0, 0])); // 4 of 4096 bytes
    assert_error(&["run", "--bios", "none", "--kernel", &k], 1, &["ELF", "truncated"]);
}

#[test]
fn elf_cut_inside_its_program_headers() {
    let s = scratch("elf-headers");
    let k = s.file("cut.elf", &common::riscv_elf(4, &[0x13, 0, 0, 0])[..80]);
    assert_error(&["run", "--bios", "none", "--kernel", &k], 1, &["ELF", "truncated"]);
}

/// Cut inside the 64-byte ELF header itself. (The loader reports this as
/// "not 64-bit little-endian", which is misleading; see the report.)
#[test]
fn elf_cut_inside_its_header() {
    let s = scratch("elf-header");
    let k = s.file("cut.elf", &common::riscv_elf(4, &[0x13, 0, 0, 0])[..40]);
    assert_error(&["run", "--bios", "none", "--kernel", &k], 1, &["ELF"]);
}

#[test]
fn elf_for_another_machine() {
    let s = scratch("elf-x86");
    let mut e = common::riscv_elf(4, &[0x13, 0, 0, 0]);
    e[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    let k = s.file("x86.elf", &e);
    assert_error(&["run", "--bios", "none", "--kernel", &k], 1, &["ELF", "RISC-V"]);
}

#[test]
fn missing_initrd() {
    let s = scratch("initrd");
    let k = s.file("kernel.bin", &garbage(4096));
    let i = missing(&s, "initrd.img");
    assert_error(&["run", "--bios", "none", "--kernel", &k, "--initrd", &i], 1, &["initrd", &i, "No such file"]);
}

#[test]
fn missing_disk() {
    let s = scratch("disk");
    let k = s.file("kernel.bin", &garbage(4096));
    let d = missing(&s, "disk.img");
    assert_error(&["run", "--bios", "none", "--kernel", &k, "--disk", &d], 1, &["disk", &d, "No such file"]);
}

#[test]
fn disk_option_typo() {
    let s = scratch("disk-typo");
    let k = s.file("kernel.bin", &garbage(4096));
    let d = s.file("x.img", &[0u8; 4096]);
    let arg = format!("{d},bogus");
    assert_error(&["run", "--bios", "none", "--kernel", &k, "--disk", &arg], 1, &["disk option", "'bogus'"]);
}

#[test]
fn unknown_option() {
    assert_error(&["run", "--bogus"], 2, &["'--bogus'"]);
}

#[test]
fn unknown_command() {
    assert_error(&["frobnicate"], 2, &["'frobnicate'"]);
}

#[test]
fn missing_command() {
    assert_error(&[], 2, &["command"]);
    assert_error(&["image"], 2, &["command", "image"]);
}

#[test]
fn memory_too_small() {
    assert_error(&["run", "--mem", "1M"], 1, &["--mem 1M", "16M"]);
    assert_error(&["run", "--mem", "1500K"], 1, &["--mem 1500K", "16M"]);
}

#[test]
fn memory_too_large() {
    assert_error(&["run", "--mem", "100G"], 1, &["--mem 100G", "64G"]);
    assert_error(&["run", "--mem", "99999999999G"], 1, &["99999999999G"]);
}

/// More guest RAM than the host has (RAM and swap): one line saying so,
/// where the allocator used to abort the process with a backtrace.
#[test]
fn memory_beyond_the_host() {
    let s = scratch("huge-ram");
    let k = s.file("kernel.bin", &garbage(4096));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib = |key: &str| -> u64 {
        let line = meminfo.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let host = (kib("MemTotal:") + kib("SwapTotal:")) << 10;
    assert!(
        host < 60 << 30,
        "this test needs a host with less than 60 GiB of RAM and swap, to ask for more than it has"
    );
    assert_error(
        &["run", "--mem", "60G", "--bios", "none", "--kernel", &k],
        1,
        &["--mem 60G", "more than this host has"],
    );
}

#[test]
fn memory_not_a_size() {
    assert_error(&["run", "--mem", "lots"], 1, &["invalid memory size", "'lots'"]);
}

#[test]
fn cpu_counts_out_of_range() {
    assert_error(&["run", "--cpus", "0"], 1, &["--cpus", "between 1 and 8", "not 0"]);
    assert_error(&["run", "--cpus", "99"], 1, &["--cpus", "between 1 and 8", "not 99"]);
    assert_error(&["run", "--cpus", "-1"], 2, &["--cpus", "'-1'"]);
}

/// Without the image, a plain `ftvm run` says how to get it.
#[test]
fn missing_guest_image() {
    let s = scratch("no-image");
    let o = ftvm_with(&["run", "--exec", "true"], &[("FTVM_CACHE_DIR", &s.dir)], TIMEOUT);
    assert_error_outcome(&o, &["run", "--exec", "true"], 1, &["image", "ftvm image build"]);
}

/// Linux keeps only the first 1023 bytes of its command line; a longer
/// `--append` would be cut short, so ftvm refuses it up front. (An
/// `--exec` command no longer goes on the command line: tests/exec.rs
/// runs one of 40 KB.)
#[test]
fn append_too_long_for_the_kernel_command_line() {
    let s = scratch("long-append");
    let k = s.file("kernel.bin", &garbage(4096));
    let append = format!("console=ttyS0 x={}", "a".repeat(1100));
    assert_error(
        &["run", "--bios", "none", "--kernel", &k, "--append", &append, "--exec", "true"],
        1,
        &["command line", "1023"],
    );
}

/// The time limits of `--exec` need `--exec`, and a limit of 0 s would
/// stop every command.
#[test]
fn exec_time_limits_need_exec() {
    assert_error(&["run", "--exec-timeout", "5"], 2, &["--exec"]);
    assert_error(&["run", "--boot-timeout", "5"], 2, &["--exec"]);
    assert_error(&["run", "--exec", "true", "--exec-timeout", "0"], 2, &["--exec-timeout", "'0'"]);
}

/// A writable disk another VM holds (here: this test, with the same
/// `flock` ftvm takes) is refused rather than shared.
#[test]
fn disk_in_use_by_another_vm() {
    use std::os::fd::AsRawFd;
    let s = scratch("disk-lock");
    let k = s.file("kernel.bin", &garbage(4096));
    let d = s.file("disk.img", &[0u8; 4096]);
    let held = std::fs::File::open(&d).unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    assert_error(&["run", "--bios", "none", "--kernel", &k, "--disk", &d], 1, &["disk", &d, "in use"]);
}

#[test]
fn bad_network_options() {
    let s = scratch("net");
    let k = s.file("kernel.bin", &[0x73, 0x00, 0x50, 0x10]);
    let run = |net: &str, needles: &[&str]| {
        assert_error(&["run", "--bios", "none", "--kernel", &k, "--net", net], 1, needles);
    };
    run("bridge=br0", &["names no TAP"]);
    run("tap=t0,speed=10G", &["invalid --net option", "speed=10G"]);
    run("tap=t0,mac=52:54:00:zz:00:01", &["invalid MAC address"]);
    run("tap=t0,mac=01:00:5e:00:00:01", &["multicast"]);
    run("tap=a-name-that-is-far-too-long", &["longer than 15 bytes"]);
}

#[test]
fn too_many_devices() {
    let s = scratch("slots");
    let k = s.file("kernel.bin", &[0x73, 0x00, 0x50, 0x10]);
    let d = s.file("d.img", &[0u8; 4096]);
    let mut args = vec!["run", "--bios", "none", "--kernel", &k];
    for _ in 0..8 {
        args.extend(["--disk", d.as_str()]);
    }
    // Eight disks and the rng: one more than the board's slots.
    assert_error(&args, 1, &["9 virtio devices", "8 slots"]);
}

#[test]
fn snapshot_and_control_errors() {
    let s = scratch("snap");
    let snap = missing(&s, "vm.snap");
    assert_error(&["run", "--restore", &snap], 1, &["cannot read snapshot", &snap, "No such file"]);
    let sock = missing(&s, "vm.sock");
    assert_error(&["control", &sock, "status"], 1, &["cannot connect to control socket", &sock]);
    assert_error(&["run", "--paused"], 2, &["--control"]);
    let k = s.file("kernel.bin", &[0x73, 0x00, 0x50, 0x10]);
    let snap = s.file("some.snap", b"FTVMSNAP");
    assert_error(&["run", "--restore", &snap, "--kernel", &k], 1, &["--kernel cannot be combined with --restore"]);
}

/// A TCP port of 127.0.0.1 that nothing listens on (bound, then freed).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The entries of a directory, sorted by name.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// HOST:PORT takes a host name (its IPv4 address): a primary whose
/// backup is `localhost:PORT`, with nothing listening there, fails to
/// connect to 127.0.0.1, not to parse its option. Malformed values are
/// one line and status 2.
#[test]
fn host_port_options_take_host_names() {
    let s = scratch("host-port");
    let shared = s.path("shared");
    std::fs::create_dir(&shared).unwrap();
    let shared = common::path_str(&shared);
    let k = s.file("wfi.bin", &[0x73, 0x00, 0x50, 0x10]);
    let port = free_port();
    let backup = format!("localhost:{port}");
    let args = [
        "ft",
        "primary",
        "--backup",
        &backup,
        "--shared",
        &shared,
        "--no-isolation-check",
        "--connect-wait",
        "2",
        "--bios",
        "none",
        "--kernel",
        &k,
    ];
    let o = ftvm(&args);
    assert!(!o.stderr.contains("invalid"), "ftvm {args:?}: {}", o.stderr);
    let last = o.stderr.lines().last().unwrap_or_default();
    assert!(last.contains(&format!("cannot reach the backup at 127.0.0.1:{port}")), "ftvm {args:?}: {}", o.stderr);
    assert_eq!(o.status.and_then(|s| s.code()), Some(1), "ftvm {args:?}: {}", o.stderr);
    for bad in ["localhost", "localhost:port", ":7700", "no-such-host.invalid:7700"] {
        assert_error(&["ft", "primary", "--backup", bad, "--shared", &shared], 2, &["--backup", bad]);
    }
    assert_error(&["ft", "backup", "--listen", "localhost", "--shared", &shared], 2, &["--listen", "HOST:PORT"]);
}

/// Port 0 would mean a port picked at random: refused.
#[test]
fn port_zero_is_refused() {
    let s = scratch("port-zero");
    let shared = common::path_str(&s.dir);
    assert_error(&["ft", "backup", "--listen", "127.0.0.1:0", "--shared", &shared], 2, &["--listen", "port 0"]);
    assert_error(&["ft", "backup", "--listen", "localhost:0", "--shared", &shared], 2, &["--listen", "port 0"]);
    assert_error(&["ft", "primary", "--backup", "127.0.0.1:0", "--shared", &shared], 2, &["--backup", "port 0"]);
    let listen = format!("127.0.0.1:{}", free_port());
    assert_error(
        &["ft", "backup", "--listen", &listen, "--heartbeat-port", "0", "--shared", &shared],
        2,
        &["--heartbeat-port", "'0'"],
    );
}

/// An option of one mode given with another is refused, naming the
/// option and the mode it needs (it used to be ignored).
#[test]
fn mode_options_need_their_mode() {
    let s = scratch("mode-options");
    let shared = common::path_str(&s.dir);
    let primary = |extra: &[&str], needles: &[&str]| {
        let mut args = vec!["ft", "primary", "--backup", "127.0.0.1:9", "--shared", &shared];
        args.extend(extra);
        assert_error(&args, 2, needles);
    };
    primary(&["--epoch-length", "1000"], &["--epoch-length", "--mode epoch"]);
    primary(&["--mode", "checkpoint", "--epoch-protocol", "original"], &["--epoch-protocol", "--mode epoch"]);
    primary(&["--interval", "10"], &["--interval", "--mode checkpoint"]);
    primary(&["--mode", "epoch", "--no-idle-checkpoints"], &["--no-idle-checkpoints", "--mode checkpoint"]);
    // The control socket's `protect` is refused by the client, before it
    // reaches any VM.
    let sock = missing(&s, "vm.sock");
    assert_error(
        &["control", &sock, "protect", "--backup", "127.0.0.1:9", "--shared", &shared, "--interval", "10"],
        1,
        &["--interval", "--mode checkpoint"],
    );
    assert_eq!(entries(&s.dir), Vec::<String>::new(), "a refused option made files");
}

/// A primary that cannot start (no backup listening) leaves nothing it
/// made in the shared directory (its generation's record, the default
/// disk made from the guest image), and keeps what was there. Needs the
/// guest image.
#[test]
fn a_failed_primary_leaves_nothing_behind() {
    let s = scratch("leftovers");
    let shared = s.path("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("keep.txt"), "mine").unwrap();
    std::fs::write(shared.join("gen-3.pair"), "an older pair\n").unwrap();
    let key = missing(&s, "pair.key");
    let made = ftvm(&["ft", "keygen", &key]);
    assert_eq!(made.status.and_then(|s| s.code()), Some(0), "keygen: {}", made.stderr);
    let before = entries(&shared);
    let shared_arg = common::path_str(&shared);
    let backup = format!("127.0.0.1:{}", free_port());
    let args = [
        "ft",
        "primary",
        "--backup",
        &backup,
        "--shared",
        &shared_arg,
        "--pair-key",
        &key,
        "--no-isolation-check",
        "--connect-wait",
        "2",
        "--exec",
        "true",
    ];
    let o = ftvm(&args);
    assert_eq!(o.status.and_then(|s| s.code()), Some(1), "ftvm {args:?}: {}", o.stderr);
    assert!(o.stderr.contains("cannot reach the backup"), "ftvm {args:?}: {}", o.stderr);
    assert!(o.stderr.contains("(generation 4)"), "the older record was not counted: {}", o.stderr);
    assert_eq!(entries(&shared), before, "the failed primary left files behind (stderr: {})", o.stderr);
    // A disk that was there before is the user's: it stays.
    std::fs::write(shared.join("disk.img"), vec![0u8; 1 << 20]).unwrap();
    let o = ftvm(&args);
    assert_eq!(o.status.and_then(|s| s.code()), Some(1), "ftvm {args:?}: {}", o.stderr);
    let mut with_disk = before.clone();
    with_disk.push("disk.img".into());
    with_disk.sort();
    assert_eq!(entries(&shared), with_disk, "stderr: {}", o.stderr);
}

/// A backup waiting for its primary answers `status` on its control
/// socket, saying so; other requests get the backup's refusal.
#[test]
fn a_waiting_backup_answers_status() {
    let s = scratch("waiting-backup");
    let shared = s.path("shared");
    std::fs::create_dir(&shared).unwrap();
    let sock = s.path("backup.sock");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
        .args(["ft", "backup", "--listen", &listen, "--no-isolation-check", "--shared"])
        .arg(&shared)
        .arg("--control")
        .arg(&sock)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let control = |words: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("control").arg(&sock).args(words).output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let t0 = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        if t0.elapsed() > TIMEOUT {
            let _ = child.kill();
            panic!("the waiting backup (pid {pid}) never opened its control socket");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = control(&["status"]);
    let json = control(&["--json", "status"]);
    let pause = control(&["pause"]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, (Some(0), format!("ok waiting for a primary on {listen}"), String::new()));
    let v: serde_json::Value = serde_json::from_str(&json.1).unwrap();
    assert_eq!(v["ok"]["state"]["waiting"]["listen"], listen.as_str(), "{}", json.1);
    assert_eq!(pause.0, Some(1), "{pause:?}");
    assert!(pause.1.contains("only status is answered"), "{pause:?}");
}

/// `--image` is a named image (`ftvm run --image NAME`); the backup's
/// option for a file its primary's VM may start from is `--start-file`.
/// The old spelling is refused with a line that names the new one, before
/// anything listens.
#[test]
fn backup_image_is_refused_for_start_file() {
    let s = scratch("start-file");
    let shared = common::path_str(&s.dir);
    let listen = format!("127.0.0.1:{}", free_port());
    let file = s.path("vm.snap");
    std::fs::write(&file, b"x").unwrap();
    let file = common::path_str(&file);
    assert_error(
        &["ft", "backup", "--listen", &listen, "--shared", &shared, "--image", &file],
        2,
        &["--image is a named image", "--start-file FILE"],
    );
    let help = ftvm(&["ft", "backup", "--help"]);
    assert!(help.stdout.contains("--start-file <FILE>"), "{}", help.stdout);
    assert!(!help.stdout.contains("--image"), "the old spelling is hidden:\n{}", help.stdout);
}

/// `ftvm --help` gives every command a line of its own saying what it
/// does: a doc comment that slips to the next command (as `control`'s
/// once did, onto `list`) leaves one command blank and the other wrong.
#[test]
fn every_command_in_the_help_says_what_it_does() {
    let help = ftvm(&["--help"]);
    let commands: Vec<&str> = help
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert!(commands.len() >= 10, "no command list in:\n{}", help.stdout);
    for line in &commands {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap();
        assert!(words.next().is_some(), "`{name}` has no description in `ftvm --help`:\n{}", help.stdout);
    }
    let list = commands.iter().find(|l| l.trim_start().starts_with("list ")).expect("a list command");
    assert!(!list.contains("Send a command"), "`list` carries another command's description: {list}");
    let control = ftvm(&["control", "--help"]);
    assert!(control.stdout.starts_with("Send a command to a running VM's control socket"), "{}", control.stdout);
}
