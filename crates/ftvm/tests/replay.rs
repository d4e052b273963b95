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
