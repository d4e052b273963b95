//! `ftvm record` and `ftvm replay` on the default guest: a recorded boot
//! that reads entropy, writes to its disk and prints, and a recorded redis
//! server that the host drives over a TAP while it writes every command to
//! its disk, each replayed with no host I/O: the same console output,
//! every state check matching (the last at the final state), the same exit
//! status. A log cut in the middle replays to its last go-live point and
//! says where it stopped. A log whose kernel file changed is refused.
//!
//! Needs the built image; the redis test also needs root (a network
//! namespace and a TAP) and redis-tools.

mod common;

use common::net::{redis_cli, wait_for_redis, Netns, Vm, GUEST_IP};
use common::{path_str, Scratch};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(900);

fn ftvm(args: &[&str]) -> common::Run {
    ftvm_translating(None, args)
}

/// `ftvm` with `FTVM_JIT` set to `jit` (None: unset, the default).
fn ftvm_translating(jit: Option<&str>, args: &[&str]) -> common::Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    c.args(args);
    match jit {
        Some(j) => c.env("FTVM_JIT", j),
        None => c.env_remove("FTVM_JIT"),
    };
    let run = common::run_with_timeout(c, TIMEOUT);
    assert!(run.status.is_some(), "ftvm {args:?} did not finish in {TIMEOUT:?}: {}", run.stderr);
    run
}

#[test]
fn a_recorded_boot_replays_exactly_and_a_cut_log_stops_at_a_go_live_point() {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let s = Scratch::new("replay-test", "boot");
    let disk = s.path("root.ext4");
    ftvm_image::sparse_copy(&img.rootfs, &disk).unwrap();
    // A kernel of our own, to change after the recording.
    let kernel = s.path("Image");
    std::fs::copy(&img.kernel, &kernel).unwrap();
    let log = s.path("boot.log");
    let (disk_s, log_s, kernel_s) = (path_str(&disk), path_str(&log), path_str(&kernel));
    let (disk_s, log_s, kernel_s) = (disk_s.as_str(), log_s.as_str(), kernel_s.as_str());
    // Entropy and a disk write: inputs a replay can only get from the log.
    let cmd = "head -c 64 /dev/urandom | sha256sum; echo from-the-guest > /root/rr; sync; cat /root/rr; exit 3";
    let initrd = path_str(&img.initrd);
    let rec = ftvm(&[
        "record",
        "--log",
        log_s,
        "--kernel",
        kernel_s,
        "--initrd",
        &initrd,
        "--append",
        "console=ttyS0 root=/dev/vda rw",
        "--disk",
        disk_s,
        "--exec",
        cmd,
    ]);
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
    assert_every_state_check_matched(&rec.stderr, &rep.stderr);

    assert_cut_log_stops_at_a_go_live_point(&log, &s);

    // Another kernel under the recorded path: the log is refused, and says why.
    std::fs::copy(&img.initrd, &kernel).unwrap();
    let rep = ftvm(&["replay", "--log", log_s]);
    assert_eq!(rep.status.unwrap().code(), Some(1), "{}", rep.stderr);
    let err = rep.stderr.trim();
    assert!(err.contains(&format!("the kernel {kernel_s} is not the one recorded")), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// The translation tier changes nothing a log holds: a boot recorded with
/// translation (the default) replays with the interpreter alone
/// (`FTVM_JIT=0`), and one recorded interpreted replays translated, each
/// matching every state check and the exit status. A translation that
/// counted instructions differently, or computed anything differently,
/// would put the replay's state checks out of step.
#[test]
fn a_log_replays_with_translation_or_without_whichever_it_was_recorded_with() {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let s = Scratch::new("replay-test", "jit");
    let (kernel, initrd) = (path_str(&img.kernel), path_str(&img.initrd));
    let cmd = "head -c 64 /dev/urandom | sha256sum; seq 1 20000 | sha256sum; exit 5";
    for (recorded_with, replayed_with) in [(None, Some("0")), (Some("0"), None)] {
        let disk = s.path(&format!("root-{}.ext4", recorded_with.unwrap_or("default")));
        ftvm_image::sparse_copy(&img.rootfs, &disk).unwrap();
        let log = s.path(&format!("{}.log", recorded_with.unwrap_or("default")));
        let (disk_s, log_s) = (path_str(&disk), path_str(&log));
        let rec = ftvm_translating(
            recorded_with,
            &[
                "record",
                "--log",
                &log_s,
                "--kernel",
                &kernel,
                "--initrd",
                &initrd,
                "--append",
                "console=ttyS0 root=/dev/vda rw",
                "--disk",
                &disk_s,
                "--exec",
                cmd,
            ],
        );
        let what = format!("recorded with FTVM_JIT {recorded_with:?}, replayed with {replayed_with:?}");
        assert_eq!(rec.status.unwrap().code(), Some(5), "{what}: record: {}", rec.stderr);
        let rep = ftvm_translating(replayed_with, &["replay", "--log", &log_s, "--show-console"]);
        assert_eq!(rep.status.unwrap().code(), Some(5), "{what}: replay: {}", rep.stderr);
        let console = rep.stdout.replace("\r\n", "\n");
        for line in rec.stdout.replace("\r\n", "\n").lines() {
            assert!(console.lines().any(|l| l == line), "{what}: the replay's console lacks {line:?}:\n{console}");
        }
        assert_every_state_check_matched(&rec.stderr, &rep.stderr);
    }
}

/// The replay matched every state check the recording logged, and there
/// were enough to mean something: one every 0.1 s of guest time, which
/// follows the wall clock, so how many depends on the host's speed; a
/// boot makes dozens.
fn assert_every_state_check_matched(record_stderr: &str, replay_stderr: &str) {
    let recorded = number_before(record_stderr, " state checks, in ");
    let matched = number_before(replay_stderr, " state checks matched");
    assert_eq!(matched, recorded, "record: {record_stderr}\nreplay: {replay_stderr}");
    assert!(recorded >= 20, "too few state checks recorded: {record_stderr}");
}

/// The number just before `suffix` in `text` ("..., N<suffix>").
fn number_before(text: &str, suffix: &str) -> u64 {
    text.split(suffix)
        .next()
        .filter(|head| head.len() < text.len())
        .and_then(|head| head.rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count before {suffix:?} in: {text}"))
}

/// A log cut in the middle: the valid prefix replays up to its last
/// go-live point, and the one-line error names the byte and that point.
fn assert_cut_log_stops_at_a_go_live_point(log: &Path, s: &Scratch) {
    let bytes = std::fs::read(log).unwrap();
    let cut = s.path("cut.log");
    std::fs::write(&cut, &bytes[..bytes.len() * 3 / 5]).unwrap();
    let rep = ftvm(&["replay", "--log", &path_str(&cut)]);
    assert_eq!(rep.status.unwrap().code(), Some(1), "{}", rep.stderr);
    let err = rep.stderr.trim();
    assert!(err.starts_with("ftvm: log ") && err.contains("truncated") && err.contains("at byte"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let number_after = |key: &str| -> u64 {
        let rest = err.split(key).nth(1).unwrap_or_else(|| panic!("no '{key}' in: {err}"));
        rest.chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap()
    };
    let go_live = number_after("last go-live point: instruction ");
    assert!(go_live > 0, "{err}");
    assert_eq!(number_after("replayed the valid part to instruction "), go_live, "{err}");
}

/// redis-server with every write appended and fsynced to its disk, driven
/// from the host over a TAP, then shut down by a client: the guest powers
/// off and the recording ends. The replay regenerates the same console
/// output and matches every state check; a cut copy of the log stops at
/// its last go-live point.
#[test]
fn redis_traffic_over_tap_and_disk_writes_replay_exactly() {
    const KEYS: usize = 300;
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let ns = Netns::new("rr");
    let s = Scratch::new("replay-test", "redis");
    let disk = s.path("root.ext4");
    ftvm_image::sparse_copy(&img.rootfs, &disk).unwrap();
    let log = s.path("redis.log");
    let append = format!("console=ttyS0 root=/dev/vda rw quiet ftvm.ip={GUEST_IP}/24");
    let mut vm = Vm::start(
        &ns,
        &[
            "record",
            "--log",
            &path_str(&log),
            "--disk",
            &path_str(&disk),
            "--net",
            "tap=t0",
            "--append",
            &append,
            "--exec",
            "redis-server /etc/redis/redis.conf --appendonly yes --appendfsync always; echo redis-exit=$?",
        ],
        s.path("record.out"),
    );
    wait_for_redis(&ns, &mut vm);
    let sets: String = (0..KEYS).map(|i| format!("SET key{i} value-{i}\n")).collect();
    let piped = redis_cli(&ns, &["--pipe"], Some(&sets));
    assert!(piped.contains(&format!("errors: 0, replies: {KEYS}")), "redis-cli --pipe: {piped}");
    for i in (0..KEYS).step_by(37) {
        assert_eq!(redis_cli(&ns, &["GET", &format!("key{i}")], None).trim(), format!("value-{i}"));
    }
    // redis-server exits, so does the exec command, and the guest powers off.
    redis_cli(&ns, &["SHUTDOWN"], None);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(st) = vm.child.try_wait().unwrap() {
            break st;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the guest did not power off:\n{}", vm.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    let recorded = vm.log().replace("\r\n", "\n");
    assert_eq!(status.code(), Some(0), "record:\n{recorded}");
    assert!(recorded.contains("redis-exit=0") && recorded.contains("ftvm: recorded"), "{recorded}");
    // Every SET reached the disk before redis answered it.
    let aof = Command::new("debugfs")
        .args(["-R", "cat /var/lib/redis/appendonlydir/appendonly.aof.1.incr.aof"])
        .arg(&disk)
        .output()
        .expect("debugfs (e2fsprogs)");
    let aof = String::from_utf8_lossy(&aof.stdout);
    assert!(aof.contains(&format!("key{}", KEYS - 1)), "the append-only file lacks the last key:\n{aof:.500}");

    // The disk is not touched by a replay and there is no network: it runs
    // outside the namespace, on a broken disk.
    std::fs::write(&disk, b"not a filesystem").unwrap();
    let rep = ftvm(&["replay", "--log", &path_str(&log), "--show-console"]);
    assert_eq!(rep.status.unwrap().code(), Some(0), "replay: {}", rep.stderr);
    assert!(rep.stderr.contains("powered off with status 0"), "{}", rep.stderr);
    assert_every_state_check_matched(&recorded, &rep.stderr);
    let console = rep.stdout.replace("\r\n", "\n");
    // redis's own log lines (with their pids and times) and the exit line.
    let lines: Vec<&str> = recorded.lines().filter(|l| !l.starts_with("ftvm: ")).collect();
    assert!(lines.iter().any(|l| l.contains("Ready to accept connections")), "{recorded}");
    for line in lines {
        assert!(console.lines().any(|l| l == line), "the replay's console lacks {line:?}:\n{console}");
    }

    assert_cut_log_stops_at_a_go_live_point(&log, &s);
}

/// A recording stopped mid-run (the recorder quits through the control
/// socket, as a primary that dies would stop), replayed with `--then-run`:
/// the replay reaches the end of the log and the VM goes on live from
/// there, on the recorded disk, and finishes the command it was running.
#[test]
fn replay_then_run_goes_live_where_the_log_ends() {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let s = Scratch::new("replay-test", "live");
    let disk = s.path("root.ext4");
    ftvm_image::sparse_copy(&img.rootfs, &disk).unwrap();
    let (log, sock) = (s.path("run.log"), s.path("vm.sock"));
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
    // Its command was cut short: not a success (the log is whole).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.ends_with("ftvm: the command did not finish: `quit` on the control socket stopped the guest\n"),
        "{stderr}"
    );

    let live = ftvm(&["replay", "--log", log.to_str().unwrap(), "--then-run"]);
    let stdout = live.stdout.replace("\r\n", "\n");
    assert!(live.stderr.contains("state checks matched"), "{}", live.stderr);
    assert!(stdout.lines().any(|l| l == "counted 200000"), "the live VM did not finish the command:\n{stdout}");
    assert_eq!(live.status.unwrap().code(), Some(4), "{}", live.stderr);
}
