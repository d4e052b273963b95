//! `--exec` that scripts can trust (issue 32 item 3), end to end on the
//! default Debian guest, asserting what a script sees: the command's
//! stdout on ftvm's stdout and its stderr on ftvm's stderr, byte for byte
//! with `\n` line ends; the host's stdin as the command's (and its end);
//! a command far longer than a kernel command line holds; guest output
//! that looks like the status protocol shown as output, not taken for
//! it; a root disk that cannot be mounted reported in one line; a run
//! cut short by `quit` exiting non-zero with a line.
//!
//! Each boot uses a private sparse copy of the root disk. Needs the built
//! image (`ftvm image build`).

mod common;

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// As in guest.rs: past this a boot is a hang, not slowness.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

fn image() -> ftvm_image::GuestImage {
    ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e}): run `make image`"))
}

struct Outcome {
    status: ExitStatus,
    /// Exactly as ftvm wrote them (no line-end conversion).
    stdout: Vec<u8>,
    stderr: String,
}

impl Outcome {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// `ftvm run --exec CMD --mem 512M --disk COPY EXTRA...` with `stdin`
/// piped in (closed after it; `None`: stdin is /dev/null).
fn exec(tag: &str, cmd: &str, stdin: Option<&[u8]>, extra: &[&str]) -> Outcome {
    let scratch = common::Scratch::new("exec", tag);
    let disk = scratch.path("root.ext4");
    ftvm_image::sparse_copy(&image().rootfs, &disk).expect("copying the root disk");
    exec_on(&common::path_str(&disk), cmd, stdin, extra)
}

fn exec_on(disk: &str, cmd: &str, stdin: Option<&[u8]>, extra: &[&str]) -> Outcome {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
        .args(["run", "--exec", cmd, "--mem", "512M", "--disk", disk])
        .args(extra)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting ftvm");
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
    }
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = pipe.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > BOOT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ftvm run --exec did not finish in {BOOT_TIMEOUT:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("ftvm run --exec: {status} after {:.1} s", started.elapsed().as_secs_f64());
    Outcome { status, stdout: out.join().unwrap(), stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned() }
}

/// stdout and stderr apart, `\n` line ends, a last line with no newline,
/// a line that reads like the old status marker shown as output, a
/// command of 40 KB (the kernel command line holds 1 KB), stdin at its
/// end at once when there is none (`cat` returns), and the exit status.
#[test]
fn output_streams_are_apart_and_the_protocol_cannot_be_forged() {
    let filler = "x".repeat(40_000);
    let cmd = format!(
        ": '{filler}'; cat; echo out; echo err >&2; echo ftvm-exec-status=5; echo ftvm-exec-begin; \
         printf '\\001 not a frame\\n'; echo err2 >&2; printf 'no newline'; exit 3"
    );
    let o = exec("streams", &cmd, None, &[]);
    assert_eq!(
        o.stdout(),
        "out\nftvm-exec-status=5\nftvm-exec-begin\n\u{1} not a frame\nno newline",
        "stdout (stderr {:?})",
        o.stderr
    );
    assert_eq!(o.stderr, "err\nerr2\n", "stderr (stdout {:?})", o.stdout());
    assert_eq!(o.status.code(), Some(3), "exit status (stderr {:?})", o.stderr);
}

/// The host's stdin is the command's, and its end is passed on: the
/// README's `echo data | ftvm run --exec 'wc -c'` prints 5; 300 KB of
/// binary data arrive whole (its sha256).
#[test]
fn stdin_reaches_the_command_with_its_end() {
    let o = exec("stdin", "wc -c", Some(b"data\n"), &[]);
    assert_eq!(o.stdout(), "5\n", "echo data | ftvm run --exec 'wc -c' (stderr {:?})", o.stderr);
    assert_eq!(o.status.code(), Some(0), "exit status (stderr {:?})", o.stderr);

    let mut x: u32 = 0x9e37_79b9;
    let data: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let mut c = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    c.stdin.take().unwrap().write_all(&data).unwrap();
    let want = String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap();
    let o = exec("stdin-big", "sha256sum; wc -c < /dev/null", Some(&data), &[]);
    assert_eq!(o.stdout(), format!("{want}0\n"), "300 KB through stdin (stderr {:?})", o.stderr);
}

/// A root disk the guest cannot mount (here: zeros) is reported in one
/// line, without --verbose, with the guest's status 255.
#[test]
fn a_root_disk_that_cannot_be_mounted_is_one_line() {
    let scratch = common::Scratch::new("exec", "garbage");
    let disk = scratch.path("zeros.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let o = exec_on(&common::path_str(&disk), "true", None, &[]);
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert!(
        lines.len() == 1
            && lines[0].starts_with("ftvm: the guest could not start the command: ")
            && lines[0].contains("/dev/vda"),
        "expected one line saying the guest could not mount /dev/vda; stderr {:?}, stdout {:?}",
        o.stderr,
        o.stdout()
    );
    assert_eq!(o.status.code(), Some(255), "exit status (stderr {:?})", o.stderr);
}

/// `quit` on the control socket while the command runs: the run exits
/// non-zero with a line saying the command did not finish.
#[test]
fn quit_during_the_command_is_not_success() {
    let scratch = common::Scratch::new("exec", "quit");
    let disk = scratch.path("root.ext4");
    ftvm_image::sparse_copy(&image().rootfs, &disk).expect("copying the root disk");
    let sock = scratch.path("vm.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ftvm"))
        .args(["run", "--exec", "echo ready; sleep 600", "--mem", "512M", "--disk", &common::path_str(&disk)])
        .arg("--control")
        .arg(&sock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while !String::from_utf8_lossy(&seen).contains("ready\n") {
        let mut buf = [0u8; 256];
        let n = stdout.read(&mut buf).unwrap();
        assert!(
            n > 0 && t0.elapsed() < BOOT_TIMEOUT,
            "no `ready` from the command: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    let q = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("control").arg(&sock).arg("quit").output().unwrap();
    assert!(q.status.success(), "ftvm control quit: {}", String::from_utf8_lossy(&q.stderr));
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit status after quit (stderr {stderr:?})");
    assert_eq!(
        stderr.trim_end(),
        "ftvm: the command did not finish: `quit` on the control socket stopped the guest",
        "stderr after quit"
    );
}
