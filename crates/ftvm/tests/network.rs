//! End to end over a real network: the default guest on a TAP in a network
//! namespace made by the test, redis-server inside, Debian's redis-cli on
//! the host side. Writes 1000 keys, snapshots the running VM through its
//! control socket, kills it, restores the snapshot, and reads every key
//! back, over new connections and over a TCP connection opened before the
//! snapshot (a guest restored within its peers' timeouts keeps its
//! connections). Also checks that restore-then-snapshot gives the same
//! file, byte for byte.
//!
//! Needs root (namespaces, TAP), redis-tools and the built image.

mod common;

use common::net::*;
use common::Scratch;
use std::process::Command;
use std::time::{Duration, Instant};

const KEYS: usize = 1000;

#[test]
fn redis_over_tap_survives_snapshot_kill_and_restore() {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let ns = Netns::new("n");
    let scratch = Scratch::new("network-test", "redis");
    let disk = scratch.path("root.ext4");
    ftvm_image::sparse_copy(&img.rootfs, &disk).unwrap();
    let socket = scratch.path("control.sock");
    let snap = scratch.path("vm.snap");
    let append = format!("console=ttyS0 root=/dev/vda rw quiet ftvm.ip={GUEST_IP}/24");
    let (disk_s, socket_s, snap_s) = (disk.to_str().unwrap(), socket.to_str().unwrap(), snap.to_str().unwrap());

    let mut vm = Vm::start(
        &ns,
        &[
            "run",
            "--disk",
            disk_s,
            "--net",
            "tap=t0",
            "--control",
            socket_s,
            "--append",
            &append,
            "--exec",
            "redis-server /etc/redis/redis.conf",
        ],
        scratch.path("first.log"),
    );
    wait_for_redis(&ns, &mut vm);

    let mut old = ns.connect(&format!("{GUEST_IP}:6379")).expect("connecting to redis in the guest");
    assert_eq!(resp(&mut old, &["SET", "conn-key", "before-snapshot"]), "+OK\r\n");
    let sets: String = (0..KEYS).map(|i| format!("SET key{i} value-{i}\n")).collect();
    let piped = redis_cli(&ns, &["--pipe"], Some(&sets));
    assert!(piped.contains(&format!("errors: 0, replies: {KEYS}")), "redis-cli --pipe: {piped}");

    // Paused, nothing more reaches the disk, so the disk stays what the
    // snapshot expects.
    assert_eq!(control(&socket, "pause"), "ok paused");
    let reply = control(&socket, &format!("snapshot {snap_s}"));
    assert!(reply.starts_with("ok snapshot"), "snapshot: {reply}; VM output:\n{}", vm.log());
    eprintln!("{reply}; {} bytes", std::fs::metadata(&snap).unwrap().len());
    drop(vm); // SIGKILL: nothing after the snapshot survives but the disk.

    // Restored paused, the machine has not run an instruction: a snapshot
    // of it is the same file.
    let mut vm =
        Vm::start(&ns, &["run", "--restore", snap_s, "--control", socket_s, "--paused"], scratch.path("second.log"));
    wait_for_socket(&socket, &mut vm);
    let again = scratch.path("again.snap");
    let reply = control(&socket, &format!("snapshot {}", again.display()));
    assert!(reply.starts_with("ok snapshot"), "second snapshot: {reply}");
    assert!(std::fs::read(&snap).unwrap() == std::fs::read(&again).unwrap(), "restore then snapshot changed the file");
    // The restored VM stands where the first one was paused, and says so
    // in its typed status too (ftvm control --json: the socket's JSON).
    let json = Command::new(ftvm()).args(["control", "--json"]).arg(&socket).arg("status").output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status --json is one JSON object");
    let status = &status["ok"];
    assert_eq!(status["reply"], "status", "{status}");
    assert_eq!(status["state"], "paused", "{status}");
    assert!(status["icount"].as_u64().is_some_and(|i| i > 0) && status["pair"].is_null(), "{status}");
    assert_eq!(control(&socket, "resume"), "ok running");

    let keys: Vec<String> = (0..KEYS).map(|i| format!("key{i}")).collect();
    let mut args = vec!["--raw", "MGET"];
    args.extend(keys.iter().map(|k| k.as_str()));
    let values = redis_cli(&ns, &args, None);
    let expected: String = (0..KEYS).map(|i| format!("value-{i}\n")).collect();
    assert!(values == expected, "keys after restore differ; got {} lines: {:.300}", values.lines().count(), values);

    // The connection from before the snapshot still works both ways.
    assert_eq!(resp(&mut old, &["GET", "conn-key"]), "$15\r\nbefore-snapshot\r\n");
    assert_eq!(resp(&mut old, &["SET", "conn-key", "after-restore"]), "+OK\r\n");
    assert_eq!(redis_cli(&ns, &["GET", "conn-key"], None).trim(), "after-restore");

    assert_eq!(control(&socket, "quit"), "ok quitting");
    let started = Instant::now();
    while vm.child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(30), "ftvm did not quit");
        std::thread::sleep(Duration::from_millis(50));
    }

    // One flipped bit anywhere in a real snapshot is caught before any of
    // it is used.
    let mut bytes = std::fs::read(&snap).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    let corrupt = scratch.path("corrupt.snap");
    std::fs::write(&corrupt, &bytes).unwrap();
    let mut c = ns.command(ftvm());
    c.args(["run", "--restore", corrupt.to_str().unwrap()]);
    let run = common::run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(run.status.and_then(|s| s.code()), Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("checksum mismatch"), "{}", run.stderr);
}

/// Issue 69: QEMU on a persistent TAP turns on the TAP's checksum and
/// segmentation offloads for its guest, and they outlive it; ftvm then
/// opened the TAP, its guest answered ping but no TCP. The same TAP here:
/// QEMU boots the image on it (its guest's virtio-net takes the offloads
/// at probe) and powers off, then ftvm runs redis on it and the host
/// talks to it over TCP. Needs qemu-system-riscv64 besides.
#[test]
fn tcp_reaches_the_guest_on_a_tap_qemu_used_before() {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let ns = Netns::new("q");
    let scratch = Scratch::new("network-test", "after-qemu");
    let disk = scratch.path("root.ext4");
    ftvm_image::sparse_copy(&img.rootfs, &disk).unwrap();
    let append = format!("console=ttyS0 root=/dev/vda rw quiet ftvm.ip={GUEST_IP}/24");
    let mut qemu = ns.command("qemu-system-riscv64");
    let drive = format!("file={},format=raw,if=none,id=d0", disk.display());
    qemu.args(["-M", "virt", "-m", "1G", "-smp", "1", "-nographic"])
        .arg("-bios")
        .arg(&img.firmware)
        .arg("-kernel")
        .arg(&img.kernel)
        .arg("-initrd")
        .arg(&img.initrd)
        .args(["-append", &format!("{append} ftvm.exec=dHJ1ZQ==")]) // base64 of "true"
        .args(["-drive", &drive, "-device", "virtio-blk-device,drive=d0"])
        .args(["-netdev", "tap,id=n0,ifname=t0,script=no,downscript=no", "-device", "virtio-net-device,netdev=n0"]);
    let run = common::run_with_timeout(qemu, Duration::from_secs(300));
    assert!(
        run.stdout.contains("ftvm-exec-status=0") && run.status.is_some_and(|s| s.success()),
        "QEMU did not boot the image on the TAP (qemu-system-riscv64, Debian's qemu-system-misc, is needed): {}{}",
        run.stdout,
        run.stderr
    );

    let disk_s = disk.to_str().unwrap();
    let args = [
        "run",
        "--disk",
        disk_s,
        "--net",
        "tap=t0",
        "--append",
        &append,
        "--exec",
        "redis-server /etc/redis/redis.conf",
    ];
    let mut vm = Vm::start(&ns, &args, scratch.path("ftvm.log"));
    wait_for_redis(&ns, &mut vm);
    // A reply larger than a segment: the way back crosses the TAP too.
    let big = "x".repeat(100_000);
    assert_eq!(redis_cli(&ns, &["SET", "big", &big], None).trim(), "OK");
    assert_eq!(redis_cli(&ns, &["--raw", "GET", "big"], None).trim_end(), big);
}

#[test]
fn bad_snapshots_are_refused_with_a_reason() {
    let scratch = Scratch::new("network-test", "bad");
    let cases: [(&str, &[u8], &str); 3] = [
        ("empty.snap", b"", "not an ftvm snapshot"),
        ("text.snap", b"hello, world", "not an ftvm snapshot"),
        ("future.snap", b"FTVMSNAP\x63\x00\x00\x00rest", "snapshot format 99"),
    ];
    for (name, content, why) in cases {
        let path = scratch.path(name);
        std::fs::write(&path, content).unwrap();
        let mut c = Command::new(ftvm());
        c.args(["run", "--restore", path.to_str().unwrap()]);
        let run = common::run_with_timeout(c, Duration::from_secs(30));
        assert_eq!(run.status.and_then(|s| s.code()), Some(1), "{name}: {} {}", run.stdout, run.stderr);
        assert!(run.stderr.starts_with("ftvm: ") && run.stderr.contains(why), "{name}: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{name}: {}", run.stderr);
    }
    let missing = scratch.path("missing.snap");
    let mut c = Command::new(ftvm());
    c.args(["run", "--restore", missing.to_str().unwrap(), "--kernel", "/x"]);
    let run = common::run_with_timeout(c, Duration::from_secs(30));
    assert!(run.stderr.contains("--kernel cannot be combined with --restore"), "{}", run.stderr);
}
