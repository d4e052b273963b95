//! Clean stops (issue 32 item 4): SIGTERM or SIGINT on `ftvm run` asks
//! the guest to power off (a magic SysRq on its console: SIGTERM to its
//! processes, sync, remount read-only, power off), and stops it after
//! `--stop-timeout` if it has not; either way the control socket file
//! goes. Exit status: the guest's power-off status (0) if it powered off,
//! 128 + the signal's number if ftvm stopped it or an `--exec` command was
//! cut short. A guest's service gets SIGTERM and what it writes then is on
//! the disk.
//!
//! The guest is the default Debian image (a private sparse copy of its
//! root disk each), running `--exec` with a command that says it is ready
//! and sleeps. Needs the built image (`make image`).

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// As in guest.rs: a boot takes under a minute on a busy 2-core host;
/// past this it is a hang.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
/// From the signal to the end of the run: the guest's power-off (a few
/// seconds), or the grace period given.
const STOP_WAIT: Duration = Duration::from_secs(120);

fn image() -> ftvm_image::GuestImage {
    ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e}): run `make image`"))
}

/// A VM running `cmd` under `--exec`, with a control socket, its output
/// collected as it comes.
struct Vm {
    child: Child,
    sock: PathBuf,
    /// Its root disk (a copy of the image's).
    disk: PathBuf,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    _scratch: common::Scratch,
}

impl Vm {
    fn start(tag: &str, cmd: &str, extra: &[&str]) -> Vm {
        Vm::start_as(tag, &["run"], cmd, extra)
    }

    /// `ftvm COMMAND...` (`run`, or `record --log FILE`).
    fn start_as(tag: &str, command: &[&str], cmd: &str, extra: &[&str]) -> Vm {
        let img = image();
        let scratch = common::Scratch::new("stops", tag);
        let disk = scratch.path("root.ext4");
        ftvm_image::sparse_copy(&img.rootfs, &disk).expect("copying the root disk");
        let sock = scratch.path("vm.sock");
        let mut child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
            .args(command)
            .args(["--exec", cmd, "--mem", "512M", "--disk", &common::path_str(&disk), "--control"])
            .arg(&sock)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let collect = |mut pipe: Box<dyn Read + Send>| {
            let text = Arc::new(Mutex::new(String::new()));
            let into = text.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buf) {
                    into.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]).replace("\r\n", "\n"));
                }
            });
            text
        };
        let stdout = collect(Box::new(child.stdout.take().unwrap()));
        let stderr = collect(Box::new(child.stderr.take().unwrap()));
        Vm { child, sock, disk, stdout, stderr, _scratch: scratch }
    }

    /// Waits until the command has printed `line`.
    fn wait_for(&mut self, line: &str) {
        let t0 = Instant::now();
        while !self.stdout.lock().unwrap().contains(line) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the VM ended ({status}) before printing {line:?}\n{}", self.output());
            }
            assert!(t0.elapsed() < BOOT_TIMEOUT, "no {line:?} after {BOOT_TIMEOUT:?}\n{}", self.output());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(self.sock.exists(), "the control socket is there while the VM runs");
        eprintln!("{line:?} after {:.1} s", t0.elapsed().as_secs_f64());
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's PID.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    /// Waits for the run to end: its status and how long it took.
    fn wait_end(&mut self) -> (ExitStatus, Duration) {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The output threads finish with the pipes.
                std::thread::sleep(Duration::from_millis(200));
                return (status, t0.elapsed());
            }
            assert!(t0.elapsed() < STOP_WAIT, "the VM had not ended {STOP_WAIT:?} after the signal\n{}", self.output());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn output(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout.lock().unwrap(), self.stderr.lock().unwrap())
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The guest asked by `signal` powers off: no socket file left, and (its
/// --exec command cut short) exit status 128 + the signal's number with a
/// line saying so. (Who powers it off varies: the guest's init, once the
/// command ended on its SIGTERM, or SysRq `o` after it.)
fn the_guest_powers_off_on(signal: i32, name: &str) {
    let mut vm = Vm::start(name, "echo ready; sleep 600; echo not stopped", &[]);
    vm.wait_for("ready\n");
    vm.signal(signal);
    let (status, took) = vm.wait_end();
    eprintln!("{name}: the guest powered off {:.2} s after the signal ({status})", took.as_secs_f64());
    let out = vm.output();
    assert_eq!(status.code(), Some(128 + signal), "{name}: exit status\n{out}");
    assert!(
        out.contains(&format!("the command did not finish: {name} stopped the guest (it powered off as asked)")),
        "{name}\n{out}"
    );
    assert!(!out.contains("not stopped"), "{name}\n{out}");
    assert!(out.contains(&format!("ftvm: {name}: asking the guest to power off")), "{name}\n{out}");
    assert!(!vm.sock.exists(), "{name}: the control socket file is gone\n{out}");
}

#[test]
fn sigterm_powers_the_guest_off() {
    the_guest_powers_off_on(libc::SIGTERM, "SIGTERM");
}

#[test]
fn sigint_powers_the_guest_off() {
    the_guest_powers_off_on(libc::SIGINT, "SIGINT");
}

/// A service in the guest gets SIGTERM when ftvm is asked to stop (SysRq
/// `e`, which the image's init allows), and has time to act on it before
/// the filesystems go read-only: what its trap writes is on the disk at
/// the next boot.
#[test]
fn the_guests_services_get_sigterm() {
    let service = "trap 'echo got SIGTERM > /root/service-stopped; sync; exit 0' TERM; \
                   touch /run/service-up; while :; do sleep 1; done";
    let cmd = format!(
        "rm -f /root/service-stopped; setsid sh -c \"{service}\" < /dev/null > /dev/null 2>&1 & \
         while [ ! -e /run/service-up ]; do sleep 0.1; done; echo ready; sleep 600"
    );
    let mut vm = Vm::start("service", &cmd, &[]);
    vm.wait_for("ready\n");
    vm.signal(libc::SIGTERM);
    let (status, took) = vm.wait_end();
    eprintln!("service: the guest powered off {:.2} s after SIGTERM ({status})", took.as_secs_f64());
    let out = vm.output();
    assert_eq!(status.code(), Some(143), "the command was cut short\n{out}");
    let mut again = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    again.args(["run", "--mem", "512M", "--disk", &common::path_str(&vm.disk), "--exec", "cat /root/service-stopped"]);
    let after = common::run_with_timeout(again, BOOT_TIMEOUT);
    assert_eq!(after.status.and_then(|s| s.code()), Some(0), "{}", after.stderr);
    assert_eq!(after.stdout, "got SIGTERM\n", "what the service wrote on its SIGTERM");
}

/// A guest that turned SysRq off ignores the request: ftvm stops it once
/// `--stop-timeout` has run out, with 128 + SIGTERM's number (143).
#[test]
fn a_guest_that_ignores_the_request_is_stopped_after_the_grace_period() {
    let cmd = "echo 0 > /proc/sys/kernel/sysrq; echo ready; sleep 600; echo not stopped";
    let mut vm = Vm::start("ignored", cmd, &["--stop-timeout", "3"]);
    vm.wait_for("ready\n");
    vm.signal(libc::SIGTERM);
    let (status, took) = vm.wait_end();
    eprintln!("SIGTERM ignored: stopped {:.2} s after the signal ({status})", took.as_secs_f64());
    let out = vm.output();
    assert_eq!(status.code(), Some(143), "exit status\n{out}");
    assert!(took >= Duration::from_secs(3), "stopped after {took:?}, before the grace period\n{out}");
    assert!(!out.contains("reboot: Power down"), "the guest did not power off itself\n{out}");
    assert!(
        out.contains("ftvm: the guest did not power off within 3 s of SIGTERM (--stop-timeout); it was stopped"),
        "{out}"
    );
    assert!(!vm.sock.exists(), "the control socket file is gone\n{out}");
}

/// A recording ends on SIGINT as `quit` ends it (it used to die with its
/// log unfinished): exit status 0, the socket gone, and the log replays
/// to its end with every state check matched.
#[test]
fn a_recording_ends_as_quit_on_sigint() {
    let log = std::env::temp_dir().join(format!("ftvm-stops-{}-record.log", std::process::id()));
    let log_s = common::path_str(&log);
    let mut vm = Vm::start_as("record", &["record", "--log", &log_s], "echo ready; sleep 600", &[]);
    vm.wait_for("ready\n");
    vm.signal(libc::SIGINT);
    let (status, took) = vm.wait_end();
    eprintln!("recording: ended {:.2} s after SIGINT ({status})", took.as_secs_f64());
    let out = vm.output();
    assert_eq!(status.code(), Some(0), "exit status\n{out}");
    assert!(out.contains("ftvm: SIGINT: quitting"), "{out}");
    assert!(!vm.sock.exists(), "the control socket file is gone\n{out}");
    let mut replay = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    replay.args(["replay", "--log", &log_s]);
    let rep = common::run_with_timeout(replay, BOOT_TIMEOUT);
    let _ = std::fs::remove_file(&log);
    assert_eq!(rep.status.and_then(|s| s.code()), Some(0), "replay\n{}", rep.stderr);
    assert!(rep.stderr.contains("state checks matched"), "replay\n{}", rep.stderr);
}

/// A second signal stops a guest that has not powered off yet at once,
/// with 128 + that signal's number (130 for SIGINT).
#[test]
fn a_second_signal_stops_the_guest_at_once() {
    let cmd = "echo 0 > /proc/sys/kernel/sysrq; echo ready; sleep 600";
    let mut vm = Vm::start("second", cmd, &[]);
    vm.wait_for("ready\n");
    vm.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_secs(2));
    assert!(vm.child.try_wait().unwrap().is_none(), "the guest ignores the request\n{}", vm.output());
    vm.signal(libc::SIGINT);
    let (status, took) = vm.wait_end();
    let out = vm.output();
    assert_eq!(status.code(), Some(130), "exit status\n{out}");
    assert!(took < Duration::from_secs(10), "stopped {took:?} after the second signal\n{out}");
    assert!(out.contains("ftvm: SIGINT: stopping the guest now (a second signal), exit status 130"), "{out}");
    assert!(!vm.sock.exists(), "the control socket file is gone\n{out}");
}

/// Without the guest image: a hart waiting for interrupts (`wfi`), which
/// no SysRq reaches. Paused, it is stopped at once; running, once
/// `--stop-timeout` has run out; with `--stop-timeout 0` at once. The
/// socket file goes each time.
#[test]
fn a_guest_that_cannot_answer_is_stopped() {
    /// `wfi` then a jump back to it.
    const WFI_LOOP: [u8; 8] = [0x73, 0x00, 0x50, 0x10, 0x6f, 0xf0, 0xdf, 0xff];
    let s = common::Scratch::new("stops", "wfi");
    let kernel = s.file("wfi.bin", &WFI_LOOP);
    let sock = s.path("vm.sock");
    for (extra, signal, status, least) in [
        (&["--paused"][..], libc::SIGTERM, 143, 0),
        (&["--stop-timeout", "1"][..], libc::SIGINT, 130, 1),
        (&["--stop-timeout", "0"][..], libc::SIGTERM, 143, 0),
    ] {
        let child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
            .args(["run", "--bios", "none", "--kernel", &kernel, "--control", &common::path_str(&sock)])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(60), "{extra:?}: the VM's control socket never came");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: kill(2) on our own child's PID.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let t0 = Instant::now();
        let out = child.wait_with_output().unwrap();
        let took = t0.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{extra:?}: exit status\n{stderr}");
        assert!(took >= Duration::from_secs(least), "{extra:?}: stopped after {took:?}\n{stderr}");
        assert!(took < Duration::from_secs(least + 20), "{extra:?}: stopped after {took:?}\n{stderr}");
        assert!(!sock.exists(), "{extra:?}: the control socket file is gone\n{stderr}");
    }
}
