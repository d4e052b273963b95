//! `ftvm record` and `ftvm replay` on the default guest: a recorded boot
//! that reads entropy, writes to its disk and prints, replayed with no host
//! I/O: the same console output, every state check matching, the same exit
//! status. A log cut in the middle replays to its last go-live point and
//! says where it stopped.
//!
//! Needs the built image.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(900);

struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let d = std::env::temp_dir().join(format!("ftvm-replay-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ftvm(args: &[&str]) -> common::Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    c.args(args);
    let run = common::run_with_timeout(c, TIMEOUT);
    assert!(run.status.is_some(), "ftvm {args:?} did not finish in {TIMEOUT:?}: {}", run.stderr);
    run
}

#[test]
fn a_recorded_boot_replays_exactly_and_a_cut_log_stops_at_a_go_live_point() {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let s = Scratch::new();
    let disk = s.0.join("root.ext4");
    ftvm_image::sparse_copy(&img.rootfs, &disk).unwrap();
    let log = s.0.join("boot.log");
    let (disk_s, log_s) = (disk.to_str().unwrap(), log.to_str().unwrap());
    // Entropy and a disk write: inputs a replay can only get from the log.
    let cmd = "head -c 64 /dev/urandom | sha256sum; echo from-the-guest > /root/rr; sync; cat /root/rr; exit 3";
    let rec = ftvm(&["record", "--log", log_s, "--disk", disk_s, "--exec", cmd]);
    assert_eq!(rec.status.unwrap().code(), Some(3), "record: {}", rec.stderr);
    let recorded: Vec<String> = rec.stdout.replace("\r\n", "\n").lines().map(String::from).collect();
    assert_eq!(recorded.len(), 2, "record output: {:?}", rec.stdout);
    assert_eq!(recorded[1], "from-the-guest");
    assert!(rec.stderr.contains("ftvm: recorded"), "{}", rec.stderr);

    // The disk is not touched by a replay: break it to prove it.
    std::fs::write(&disk, b"not a filesystem").unwrap();
    let rep = ftvm(&["replay", "--log", log_s, "--show-console"]);
    assert_eq!(rep.status.unwrap().code(), Some(3), "replay: {}", rep.stderr);
    let console = rep.stdout.replace("\r\n", "\n");
    for line in &recorded {
        assert!(console.lines().any(|l| l == line), "replay console lacks {line:?}:\n{console}");
    }
    assert!(
        rep.stderr.contains("state checks matched") && rep.stderr.contains("powered off with status 3"),
        "{}",
        rep.stderr
    );
    let checks: u64 =
        rep.stderr.split(", ").find_map(|p| p.strip_suffix(" state checks matched")?.parse().ok()).unwrap();
    assert!(checks > 100, "only {checks} state checks in a whole boot");

    // Half a log: the valid prefix replays, the error names the place.
    let bytes = std::fs::read(&log).unwrap();
    let cut = s.0.join("cut.log");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let rep = ftvm(&["replay", "--log", cut.to_str().unwrap()]);
    assert_eq!(rep.status.unwrap().code(), Some(1));
    let err = rep.stderr.trim();
    assert!(err.starts_with("ftvm: log ") && err.contains("truncated") && err.contains("at byte"), "{err}");
    assert!(err.contains("replayed the valid part to instruction"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A recording stopped mid-run (the recorder quits through the control
/// socket, as a primary that dies would stop), replayed with `--then-run`:
/// the replay reaches the end of the log and the VM goes on live from
/// there, on the recorded disk, and finishes the command it was running.
#[test]
fn replay_then_run_goes_live_where_the_log_ends() {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let s = Scratch(std::env::temp_dir().join(format!("ftvm-replay-live-{}", std::process::id())));
    std::fs::create_dir_all(&s.0).unwrap();
    let disk = s.0.join("root.ext4");
    ftvm_image::sparse_copy(&img.rootfs, &disk).unwrap();
    let (log, sock) = (s.0.join("run.log"), s.0.join("vm.sock"));
    // The guest works for a while in user mode so the quit lands mid-command.
    let cmd = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo counted $i; exit 4";
    let mut rec = Command::new(env!("CARGO_BIN_EXE_ftvm"))
        .args(["record", "--log", log.to_str().unwrap(), "--disk", disk.to_str().unwrap()])
        .args(["--control", sock.to_str().unwrap(), "--exec", cmd])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let control = |c: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_ftvm")).arg("control").arg(&sock).arg(c).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // Past the boot (about 4.1 G instructions), inside the loop.
    let started = std::time::Instant::now();
    loop {
        assert!(rec.try_wait().unwrap().is_none(), "the recorded VM ended before it was stopped");
        assert!(started.elapsed() < TIMEOUT, "the recorded VM never got far enough");
        let status = control("status");
        let icount: u64 = status.split("icount=").nth(1).and_then(|v| v.split(' ').next()?.parse().ok()).unwrap_or(0);
        if icount > 4_400_000_000 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(control("quit"), "ok quitting");
    let out = rec.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    let live = ftvm(&["replay", "--log", log.to_str().unwrap(), "--then-run"]);
    let stdout = live.stdout.replace("\r\n", "\n");
    assert!(live.stderr.contains("state checks matched"), "{}", live.stderr);
    assert!(stdout.lines().any(|l| l == "counted 200000"), "the live VM did not finish the command:\n{stdout}");
    assert_eq!(live.status.unwrap().code(), Some(4), "{}", live.stderr);
}
