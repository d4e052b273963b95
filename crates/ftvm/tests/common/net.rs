//! For the tests that put the default guest on a network: a namespace
//! with a TAP made by the test, the VM as a child process, its control
//! socket, and redis clients on the host side of the TAP.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
pub const GUEST_IP: &str = "10.200.0.2";
pub const HOST_IP: &str = "10.200.0.1";

pub fn ftvm() -> &'static str {
    env!("CARGO_BIN_EXE_ftvm")
}

/// A network namespace with a persistent TAP (it outlives the VM that
/// uses it, as a host's TAP would across a restore), deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let ns = Netns::bare(tag);
        ns.ip(&["-n", &ns.name, "tuntap", "add", "t0", "mode", "tap"]);
        ns.ip(&["-n", &ns.name, "addr", "add", &format!("{HOST_IP}/24"), "dev", "t0"]);
        ns.ip(&["-n", &ns.name, "link", "set", "t0", "up"]);
        ns
    }

    /// A namespace with only its loopback up.
    pub fn bare(tag: &str) -> Netns {
        let name = format!("ftvm{tag}{}", std::process::id());
        let ns = Netns { name };
        ns.ip(&["netns", "add", &ns.name]);
        ns.ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    pub fn ip(&self, args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("running ip (iproute2)");
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A command run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// A TCP connection made from inside the namespace. The socket stays in
    /// the namespace it was made in, so any thread may use it afterwards.
    pub fn connect(&self, addr: &str) -> std::io::Result<TcpStream> {
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

/// A running `ftvm run`, killed on drop; its output goes to a log file
/// shown when something fails.
pub struct Vm {
    pub child: Child,
    pub log: PathBuf,
}

impl Vm {
    pub fn start(ns: &Netns, args: &[&str], log: PathBuf) -> Vm {
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

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn assert_running(&mut self) {
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

pub fn control(socket: &Path, command: &str) -> String {
    let out = Command::new(ftvm()).arg("control").arg(socket).args(command.split(' ')).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string() + &String::from_utf8_lossy(&out.stderr)
}

pub fn redis_cli(ns: &Netns, args: &[&str], stdin: Option<&str>) -> String {
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

pub fn wait_for_redis(ns: &Netns, vm: &mut Vm) {
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
pub fn wait_for_socket(socket: &Path, vm: &mut Vm) {
    let started = Instant::now();
    while !control(socket, "status").starts_with("ok") {
        vm.assert_running();
        assert!(started.elapsed() < Duration::from_secs(60), "no control socket; VM output:\n{}", vm.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One RESP command over an open connection; returns the raw reply.
pub fn resp(conn: &mut TcpStream, args: &[&str]) -> String {
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
