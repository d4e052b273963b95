//! End-to-end tests of `ftvm run --exec` on the default Debian guest: what a
//! user sees on stdout and as the exit status when a command runs inside
//! the guest.
//!
//! Covers a plain command (`uname -m`), file contents through the guest's
//! sha256sum, floating point through busybox awk (results compared digit
//! for digit with the host's IEEE doubles), files written to the ext4 root
//! and read back in a second boot of the same disk, exit status
//! propagation, a two-hart boot, and interactive console input larger than
//! the guest UART's buffer.
//!
//! Boots are shared: one boot runs several commands. Every boot uses a
//! temporary copy of the root filesystem (`--disk COPY`), so the cached
//! image is never modified. Needs the built image (`make image`); the tests
//! fail without it.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A boot takes under a minute today (2 cores, one boot each); past this
/// it is a hang, not slowness.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

/// `printf 'ftvm\n' | sha256sum` on the host.
const SHA256_FTVM_NL: &str = "d1a311a910f8002b0e972f92faf7ad3d168f63069a66b558e2112b8509094be1";
/// `seq 1 100000 | sha256sum` on the host (588 895 bytes).
const SHA256_SEQ_100000: &str = "b2bc7d3f8b652d2ec96865b68ad8f80e22cca174abe1aed7889e242a747d590f";

/// Floating point in busybox awk (no math library: arithmetic only). The
/// expected text is what the host's awk and Python print for the same IEEE
/// double operations; `%.17g` shows every bit of the result.
const AWK_FP: &str = r#"awk 'BEGIN { x = 1/3; s = 0; for (i = 1; i <= 1000; i++) s += 1/i; printf "%.10f %.6e %.17g %.17g %.17g\n", x*3 + 0.1, 2.5e-3 * 4.1e5, 0.1 + 0.2, x, s }'"#;
const AWK_FP_EXPECTED: &str = "1.1000000000 1.025000e+03 0.30000000000000004 0.33333333333333331 7.4854708605503433";

fn image() -> ftvm_image::GuestImage {
    ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e}): run `make image`"))
}

/// A private copy of the root filesystem, removed when dropped. Copied
/// sparsely: the image is 1 GiB, mostly holes.
struct TempDisk(PathBuf);

impl TempDisk {
    fn copy_of(src: &Path, tag: &str) -> TempDisk {
        let dst = std::env::temp_dir().join(format!("ftvm-guest-test-{}-{tag}.ext4", std::process::id()));
        ftvm_image::sparse_copy(src, &dst)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", src.display(), dst.display()));
        TempDisk(dst)
    }

    fn arg(&self) -> String {
        self.0.to_str().expect("temporary path is UTF-8").to_string()
    }
}

impl Drop for TempDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct Outcome {
    status: ExitStatus,
    /// With CR LF (the guest tty's line ends) turned into LF.
    stdout: String,
    stderr: String,
}

/// Run `ftvm run --exec CMD --mem 512M --disk DISK EXTRA...` with
/// `FTVM_VERIFY_CODE=1`, failing the test if it has not finished after
/// `BOOT_TIMEOUT`.
fn exec(cmd: &str, disk: &TempDisk, extra: &[&str]) -> Outcome {
    let started = Instant::now();
    let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    c.args(["run", "--exec", cmd, "--mem", "512M", "--disk", &disk.arg()]).args(extra);
    // Every use of decoded code also compares it with RAM: a write into
    // code that its page's code state missed stops ftvm (a guest as fast
    // as before the code states, which made that compare instead).
    c.env("FTVM_VERIFY_CODE", "1");
    let run = common::run_with_timeout(c, BOOT_TIMEOUT);
    let Some(status) = run.status else {
        panic!(
            "ftvm run --exec {cmd:?} did not finish in {BOOT_TIMEOUT:?}\nstdout:\n{}\nstderr:\n{}",
            run.stdout, run.stderr
        );
    };
    eprintln!("ftvm run --exec {cmd:?} {extra:?}: {status} after {:.1} s", started.elapsed().as_secs_f64());
    Outcome { status, stdout: run.stdout.replace("\r\n", "\n"), stderr: run.stderr }
}

fn assert_outcome(o: &Outcome, what: &str, code: i32, stdout: &str) {
    assert_eq!(o.stdout, stdout, "{what}: unexpected output (exit status {}, stderr {:?})", o.status, o.stderr);
    assert_eq!(o.status.code(), Some(code), "{what}: wrong exit status (stderr {:?})", o.stderr);
    assert_eq!(o.stderr, "", "{what}: ftvm printed on stderr");
}

/// One boot runs a plain command, a checksum, the floating-point check and
/// writes two files to the root; a second boot of the same disk reads them
/// back and exits with status 7.
#[test]
fn commands_run_and_files_persist_across_boots() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "persist");

    let first = [
        "uname -m",
        "printf 'ftvm\\n' > /tmp/x; sha256sum /tmp/x",
        AWK_FP,
        // A file already there would make the second boot's check prove nothing.
        "test -e /root/ftvm-note.txt && echo stale file on the disk",
        "seq 1 100000 > /root/ftvm-seq.txt",
        "echo written by the first boot > /root/ftvm-note.txt",
        "sync",
    ]
    .join("; ");
    let o = exec(&first, &disk, &[]);
    assert_outcome(&o, "first boot", 0, &format!("riscv64\n{SHA256_FTVM_NL}  /tmp/x\n{AWK_FP_EXPECTED}\n"));

    let o = exec("cat /root/ftvm-note.txt; sha256sum /root/ftvm-seq.txt; exit 7", &disk, &[]);
    assert_outcome(
        &o,
        "second boot of the same disk",
        7,
        &format!("written by the first boot\n{SHA256_SEQ_100000}  /root/ftvm-seq.txt\n"),
    );
}

/// A VM's seed (`--hostname`, `--ssh-key`) reaches the guest through the
/// device tree, and its setup applies it (host name, root's keys), at
/// every boot; a key file that holds no public key and a name that is no
/// host name are refused in one line before anything runs.
#[test]
fn the_seed_names_the_vm_gives_root_its_key_and_makes_its_users() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "seed");
    let dir = std::env::temp_dir().join(format!("ftvm-guest-seed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("id.pub");
    let line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPbNnyF1RruL3yS3GBLLD3R5jHzYEKsSJ5mMS9mmYk9z someone@host";
    std::fs::write(&key, format!("{line}\n")).unwrap();
    let key_arg = key.to_str().unwrap();

    let cmd =
        "hostname; grep 127.0.1.1 /etc/hosts; cat /root/.ssh/authorized_keys; stat -c %a /root/.ssh/authorized_keys; \
               id -nG alice; getent passwd alice | cut -d: -f6,7; cat ~alice/.ssh/authorized_keys; \
               stat -c '%U %a' ~alice/.ssh ~alice/.ssh/authorized_keys; id -nG bob";
    let alice = format!("alice:{key_arg}:adm,nosuchgroup");
    let seeded = ["--hostname", "db7", "--ssh-key", key_arg, "--user", &alice, "--user", "bob"];
    let o = exec(cmd, &disk, &seeded);
    assert_outcome(
        &o,
        "seeded boot",
        0,
        &format!(
            "db7\n127.0.1.1\tdb7\n{line}\n600\nalice adm\n/home/alice:/bin/bash\n{line}\nalice 700\nalice 600\nbob\n"
        ),
    );
    // A second boot with the same seed adds nothing twice.
    let again = "cat /root/.ssh/authorized_keys ~alice/.ssh/authorized_keys; grep -c '^alice:' /etc/passwd";
    let o = exec(again, &disk, &seeded);
    assert_outcome(&o, "second seeded boot", 0, &format!("{line}\n{line}\n1\n"));

    std::fs::write(dir.join("id"), "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n").unwrap();
    let o = exec("true", &disk, &["--ssh-key", dir.join("id").to_str().unwrap()]);
    assert_failure(&o, "a private key", 1, "reading --ssh-key: ");
    let o = exec("true", &disk, &["--hostname", "db.example"]);
    assert_failure(&o, "a domain name", 1, "reading --hostname: ");
    let o = exec("true", &disk, &["--user", "Alice"]);
    assert_failure(&o, "a user name with a capital", 1, "reading --user: ");
    let o = exec("true", &disk, &["--user", "root"]);
    assert_failure(&o, "root as a seed user", 1, "reading --user: ");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--exec` runs under the minimal init, unless the command line asks for
/// systemd: then the command runs once basic.target is reached, with
/// systemd answering, and its status is still ftvm's.
#[test]
fn a_command_runs_under_systemd_when_asked() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "systemd");
    let o = exec("cat /proc/1/comm; exit 3", &disk, &[]);
    assert_outcome(&o, "the minimal init", 3, "ftvm-init\n");
    let o = exec(
        "cat /proc/1/comm; systemctl is-system-running; exit 5",
        &disk,
        &["--append", "console=ttyS0 root=/dev/vda rw ftvm.init=/sbin/init"],
    );
    assert_outcome(&o, "under systemd", 5, "systemd\nrunning\n");
}

/// ftvm's run ended with an error: exit status `code` and one line on
/// stderr, `ftvm: ` then `prefix` (and whatever follows it).
fn assert_failure(o: &Outcome, what: &str, code: i32, prefix: &str) {
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with(&format!("ftvm: {prefix}")),
        "{what}: expected one line `ftvm: {prefix}...` on stderr, got {:?} (exit status {}, stdout {:?})",
        o.stderr,
        o.status,
        o.stdout
    );
    assert_eq!(o.status.code(), Some(code), "{what}: wrong exit status (stderr {:?})", o.stderr);
}

/// A kernel panic in the guest ends `--exec` with the panic line (it used
/// to leave ftvm running for ever, silently).
#[test]
fn a_kernel_panic_ends_exec_with_its_line() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "panic");
    let o = exec("echo c > /proc/sysrq-trigger; echo still here", &disk, &[]);
    assert_failure(
        &o,
        "sysrq crash",
        1,
        "the guest kernel panicked: Kernel panic - not syncing: sysrq triggered crash",
    );
    assert!(!o.stdout.contains("still here"), "the command went on after the panic: {:?}", o.stdout);
}

/// A garbage or truncated initrd: the kernel cannot unpack it, finds no
/// root it can mount (the disk's drivers are modules in the initrd) and
/// panics; ftvm ends with its line. (Cut late enough that the initrd's
/// own init runs, the guest reports the missing root disk itself and
/// powers off with status 255 instead.)
#[test]
fn a_bad_initrd_ends_with_the_kernels_panic() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "initrd");
    let dir = std::env::temp_dir();
    let garbage = dir.join(format!("ftvm-guest-test-{}-garbage.initrd", std::process::id()));
    let cut = dir.join(format!("ftvm-guest-test-{}-cut.initrd", std::process::id()));
    let whole = std::fs::read(&img.initrd).expect("reading the image's initrd");
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let noise: Vec<u8> = (0..2 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(&garbage, noise).unwrap();
    std::fs::write(&cut, &whole[..64 << 10]).unwrap();
    let run = |initrd: &Path| {
        let o = exec("true", &disk, &["--initrd", initrd.to_str().unwrap()]);
        let _ = std::fs::remove_file(initrd);
        o
    };
    let o = run(&garbage);
    assert_failure(
        &o,
        "garbage initrd",
        1,
        "the guest kernel panicked: Kernel panic - not syncing: VFS: Unable to mount root fs",
    );
    let o = run(&cut);
    assert_failure(
        &o,
        "truncated initrd",
        1,
        "the guest kernel panicked: Kernel panic - not syncing: VFS: Unable to mount root fs",
    );
}

/// `--exec-timeout`: a command that outlives it is stopped with one line
/// and exit status 124 (what it printed before stays on stdout);
/// `--boot-timeout`: a guest that has not started the command in time
/// (here: 1 s, less than any boot takes) is stopped the same way.
#[test]
fn commands_and_boots_over_their_time_limits_are_stopped() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "timeout");
    let started = Instant::now();
    let o = exec("echo started; sleep 600; echo not stopped", &disk, &["--exec-timeout", "5"]);
    assert_failure(&o, "--exec-timeout 5", 124, "the command did not finish within 5 s (--exec-timeout)");
    assert_eq!(o.stdout, "started\n", "--exec-timeout 5: output");
    assert!(started.elapsed() < Duration::from_secs(300), "the 600 s command was not stopped early");
    let o = exec("echo started", &disk, &["--boot-timeout", "1"]);
    assert_failure(&o, "--boot-timeout 1", 124, "the guest did not start the command within 1 s of booting");
    assert_eq!(o.stdout, "", "--boot-timeout 1: output");
}

/// A guest that asks to reboot (`reboot -f`) boots again from the firmware
/// with the same kernel, initrd, command line and disk: the first boot
/// marks its disk and reboots; the second sees the mark, removes it and
/// powers off. (It used to end ftvm with "reboot is not supported yet".)
/// A recorded VM cannot reboot yet: `ftvm record` ends with a line that
/// says so.
#[test]
fn a_reboot_boots_the_same_guest_again() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "reboot");
    let cmd = "if [ -e /root/ftvm-rebooted ]; then echo second boot; rm /root/ftvm-rebooted; \
               else echo first boot; touch /root/ftvm-rebooted; sync; reboot -f; sleep 60; echo no reboot; fi";
    let o = exec(cmd, &disk, &["--exec-timeout", "300"]);
    assert_eq!(o.status.code(), Some(0), "reboot: exit status (stderr {:?}, stdout {:?})", o.stderr, o.stdout);
    // The command's stderr is ftvm's: Debian's `reboot` (systemctl's)
    // says "Rebooting." there, but `-f` reboots at once, often before the
    // guest's stderr framer has read the line from its pipe (the guest
    // loses it, as a Debian host's terminal would on a serial console);
    // ftvm itself says nothing.
    assert!(o.stderr.is_empty() || o.stderr == "Rebooting.\n", "reboot: stderr {:?}", o.stderr);
    let first = o.stdout.find("first boot\n").unwrap_or_else(|| panic!("no first boot in {:?}", o.stdout));
    let second = o.stdout.find("second boot\n").unwrap_or_else(|| panic!("no second boot in {:?}", o.stdout));
    assert!(first < second && !o.stdout.contains("no reboot"), "reboot: output {:?}", o.stdout);

    let log = std::env::temp_dir().join(format!("ftvm-guest-test-{}-reboot.log", std::process::id()));
    let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    c.args(["record", "--log", log.to_str().unwrap(), "--exec", "reboot -f", "--mem", "512M", "--disk", &disk.arg()]);
    let run = common::run_with_timeout(c, BOOT_TIMEOUT);
    let _ = std::fs::remove_file(&log);
    let status = run.status.expect("ftvm record --exec 'reboot -f' did not finish");
    // The recording's summary line comes first.
    let last = run.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("ftvm: the guest asked to reboot, but a recorded VM cannot reboot yet"),
        "recorded reboot: stderr {:?}",
        run.stderr
    );
    assert_eq!(status.code(), Some(1), "recorded reboot: exit status");
}

/// With `--cpus 2` the guest boots, sees both harts and runs the command.
#[test]
fn two_harts_boot_and_run_a_command() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "smp");
    let o = exec("nproc; grep -c ^processor /proc/cpuinfo; uname -m", &disk, &["--cpus", "2"]);
    assert_outcome(&o, "two-hart boot", 0, "2\n2\nriscv64\n");
}

/// With `--hart-threads multi` the two harts run on host threads of their
/// own: the guest boots, and processes on both harts at once (pipes,
/// wake-ups across harts, TLB shootdowns, fork and exit) compute what
/// they would on one.
#[test]
fn two_harts_on_their_own_threads_boot_and_compute_alike() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "smp-multi");
    let job = "for i in 1 2 3 4; do (dd if=/dev/zero bs=1M count=8 2>/dev/null | sha256sum) & done; wait; nproc";
    let o = exec(job, &disk, &["--cpus", "2", "--hart-threads", "multi"]);
    let line = "2daeb1f36095b44b318410b3f4e8b5d989dcc7bb023d1426c492dab0a3053e74  -\n";
    assert_outcome(&o, "two harts in parallel", 0, &format!("{}2\n", line.repeat(4)));
}

/// Console input longer than the guest UART's receive buffer (4 KiB) must
/// arrive whole: the host holds back what does not fit. Drives the
/// interactive console through a pipe, as a script or a paste would.
#[test]
fn console_input_larger_than_the_uart_buffer_arrives_whole() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "paste");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
        .args(["run", "--mem", "512M", "--disk", &disk.arg()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting ftvm");
    let child_id = child.id();
    let seen = Arc::new(Mutex::new(String::new()));
    let mut stdout = child.stdout.take().unwrap();
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let wait_for = |needle: &str, from: usize, limit: Duration| -> usize {
        let start = Instant::now();
        loop {
            if let Some(i) = seen.lock().unwrap()[from..].find(needle) {
                return from + i + needle.len();
            }
            if start.elapsed() > limit {
                let _ = Command::new("kill").arg(child_id.to_string()).status();
                panic!("no {needle:?} on the console within {limit:?}; got:\n{}", seen.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Input typed before the shell opens the tty is flushed by the guest's
    // serial driver, so wait for the prompt.
    let at = wait_for("root@ftvm-guest:~# ", 0, BOOT_TIMEOUT);
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(b"stty -echo; cat > /tmp/in\n").unwrap();
    let line = format!("{}\n", "a".repeat(99));
    let paste = line.repeat(200);
    stdin.write_all(paste.as_bytes()).unwrap();
    stdin.write_all(b"\x04").unwrap();
    // Lost input would include the final Ctrl-D, leaving cat waiting.
    let at = wait_for("root@ftvm-guest:~# ", at, Duration::from_secs(120));
    stdin.write_all(b"echo bytes=$(wc -c < /tmp/in) sum=$(sha256sum < /tmp/in); poweroff\n").unwrap();
    stdin.flush().unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let out = seen.lock().unwrap()[at..].to_string();
    let expected = format!("bytes={} sum={}", paste.len(), sha256_hex(paste.as_bytes()));
    assert!(out.contains(&expected), "expected {expected:?} after the paste; console after it:\n{out}");
    assert_eq!(status.code(), Some(0), "systemd powered off: ftvm exits 0");
}

/// sha256 of `data` as `echo $(sha256sum)` prints it in the guest: the hash,
/// one space (word splitting), and `-` for standard input.
fn sha256_hex(data: &[u8]) -> String {
    use std::io::Write;
    let mut c = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("host sha256sum");
    c.stdin.take().unwrap().write_all(data).unwrap();
    let out = c.wait_with_output().unwrap();
    format!("{} -", String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap())
}

/// The kernel finds the optional extensions the device tree advertises
/// (through OpenSBI) and lists them on /proc/cpuinfo's isa line: Zba, Zbb,
/// Zbs, Zicond, Sstc, which it then uses for its timer instead of an SBI
/// call per tick, and Zicbom and Zicboz.
#[test]
fn the_guest_kernel_reports_the_new_extensions() {
    let img = image();
    let disk = TempDisk::copy_of(&img.rootfs, "isa");
    let o = exec("grep -m1 '^isa' /proc/cpuinfo", &disk, &[]);
    assert_eq!(o.status.code(), Some(0), "grep isa /proc/cpuinfo: stdout {:?} stderr {:?}", o.stdout, o.stderr);
    let line = o.stdout.trim();
    let isa = line.split(':').nth(1).map(str::trim).unwrap_or_else(|| panic!("no isa line: {line:?}"));
    let parts: Vec<&str> = isa.split('_').collect();
    assert!(parts[0].starts_with("rv64imafdc"), "isa line {isa:?}");
    // zicboz and zicbom are listed only if the device tree gave their
    // block sizes. With zicboz the kernel (CONFIG_RISCV_ISA_ZICBOZ=y in
    // Debian's) clears pages with cbo.zero in S-mode, illegal unless
    // OpenSBI set menvcfg.CBZE: the boot got here through it.
    for ext in ["zicbom", "zicboz", "zicond", "zba", "zbb", "zbs", "sstc"] {
        assert!(parts.contains(&ext), "{ext} missing from the guest's isa line {isa:?}");
    }
}
