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

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
const GUEST_IP: &str = "10.200.0.2";
const HOST_IP: &str = "10.200.0.1";
const KEYS: usize = 1000;

fn ftvm() -> &'static str {
    env!("CARGO_BIN_EXE_ftvm")
}

/// A network namespace with a persistent TAP (it outlives the VM that
/// uses it, as a host's TAP would across a restore), deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("ftvm{tag}{}", std::process::id());
        let ns = Netns { name };
        ns.ip(&["netns", "add", &ns.name]);
        ns.ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns.ip(&["-n", &ns.name, "tuntap", "add", "t0", "mode", "tap"]);
        ns.ip(&["-n", &ns.name, "addr", "add", &format!("{HOST_IP}/24"), "dev", "t0"]);
        ns.ip(&["-n", &ns.name, "link", "set", "t0", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("running ip (iproute2)");
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A command run inside the namespace.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// A TCP connection made from inside the namespace. The socket stays in
    /// the namespace it was made in, so any thread may use it afterwards.
    fn connect(&self, addr: &str) -> std::io::Result<TcpStream> {
        let path = format!("/run/netns/{}", self.name);
        let addr = addr.to_string();
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path)?;
            // SAFETY: setns on a namespace file we opened; it changes only
            // this thread's network namespace.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            TcpStream::connect_timeout(&addr.parse().expect("socket address"), Duration::from_secs(10))
        })
        .join()
        .expect("connect thread")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A private copy of the root filesystem and scratch files, removed on drop.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ftvm-network-test-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running `ftvm run`, killed on drop; its output goes to a log file
/// shown when something fails.
struct Vm {
    child: Child,
    log: PathBuf,
}

impl Vm {
    fn start(ns: &Netns, args: &[&str], log: PathBuf) -> Vm {
        let out = std::fs::File::create(&log).unwrap();
        let child = ns
            .command(ftvm())
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting ftvm");
        Vm { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        if let Some(st) = self.child.try_wait().unwrap() {
            panic!("ftvm exited ({st}); its output:\n{}", self.log());
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn control(socket: &Path, command: &str) -> String {
    let out = Command::new(ftvm()).arg("control").arg(socket).args(command.split(' ')).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string() + &String::from_utf8_lossy(&out.stderr)
}

fn redis_cli(ns: &Netns, args: &[&str], stdin: Option<&str>) -> String {
    let mut c = ns.command("redis-cli");
    c.args(["-h", GUEST_IP]).args(args);
    let mut child = c
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-cli (Debian package redis-tools) must be installed");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn wait_for_redis(ns: &Netns, vm: &mut Vm) {
    let started = Instant::now();
    loop {
        vm.assert_running();
        if redis_cli(ns, &["ping"], None).trim() == "PONG" {
            eprintln!("redis answered after {:.1} s", started.elapsed().as_secs_f64());
            return;
        }
        assert!(started.elapsed() < BOOT_TIMEOUT, "redis did not answer in {BOOT_TIMEOUT:?}; VM output:\n{}", vm.log());
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until the VM answers on its control socket (a killed VM leaves
/// its socket file behind, so the file alone proves nothing).
fn wait_for_socket(socket: &Path, vm: &mut Vm) {
    let started = Instant::now();
    while !control(socket, "status").starts_with("ok") {
        vm.assert_running();
        assert!(started.elapsed() < Duration::from_secs(60), "no control socket; VM output:\n{}", vm.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One RESP command over an open connection; returns the raw reply.
fn resp(conn: &mut TcpStream, args: &[&str]) -> String {
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req += &format!("${}\r\n{a}\r\n", a.len());
    }
    conn.write_all(req.as_bytes()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 512];
    let n = conn.read(&mut buf).unwrap_or_else(|e| panic!("no reply to {args:?} on the old connection: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn redis_over_tap_survives_snapshot_kill_and_restore() {
    let img = ftvm_image::locate().unwrap_or_else(|e| panic!("the default guest image is not available ({e})"));
    let ns = Netns::new("n");
    let scratch = Scratch::new("redis");
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

#[test]
fn bad_snapshots_are_refused_with_a_reason() {
    let scratch = Scratch::new("bad");
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
