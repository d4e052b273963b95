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

/// A frame seen on an interface: when, whether the host sent it (toward
/// the VM, for a TAP) or received it (from the VM), and its bytes.
pub struct Frame {
    pub at: Instant,
    pub from_host: bool,
    pub bytes: Vec<u8>,
}

/// Frames seen on one interface of a namespace, both ways, from a raw
/// packet socket (what tcpdump does, without needing tcpdump).
pub struct Capture {
    frames: std::sync::Arc<std::sync::Mutex<Vec<Frame>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Capture {
    pub fn start(ns: &Netns, interface: &str) -> Capture {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{mpsc, Arc, Mutex};
        let frames: Arc<Mutex<Vec<Frame>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (path, name) = (format!("/run/netns/{}", ns.name), std::ffi::CString::new(interface).unwrap());
        let (ready_tx, ready) = mpsc::channel();
        let thread = {
            let (frames, stop) = (frames.clone(), stop.clone());
            std::thread::spawn(move || {
                let ns = std::fs::File::open(&path).expect("the namespace");
                // SAFETY: plain libc calls on descriptors this thread owns;
                // setns changes only this thread's network namespace, and
                // recvfrom writes within the buffers it is given.
                unsafe {
                    assert_eq!(libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET), 0, "setns");
                    let all = (libc::ETH_P_ALL as u16).to_be();
                    let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, all as i32);
                    assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
                    let mut sll: libc::sockaddr_ll = std::mem::zeroed();
                    sll.sll_family = libc::AF_PACKET as u16;
                    sll.sll_protocol = all;
                    sll.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
                    assert!(sll.sll_ifindex > 0, "no interface {name:?}");
                    let len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
                    assert_eq!(libc::bind(fd, &sll as *const _ as *const libc::sockaddr, len), 0, "bind");
                    let tv = libc::timeval { tv_sec: 0, tv_usec: 50_000 };
                    let tvp = &tv as *const _ as *const libc::c_void;
                    libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, tvp, std::mem::size_of_val(&tv) as u32);
                    ready_tx.send(()).unwrap();
                    let mut buf = vec![0u8; 65536];
                    while !stop.load(Ordering::Relaxed) {
                        let mut from: libc::sockaddr_ll = std::mem::zeroed();
                        let mut flen = len;
                        let n = libc::recvfrom(
                            fd,
                            buf.as_mut_ptr() as *mut libc::c_void,
                            buf.len(),
                            0,
                            &mut from as *mut _ as *mut libc::sockaddr,
                            &mut flen,
                        );
                        if n > 0 {
                            let from_host = from.sll_pkttype == libc::PACKET_OUTGOING;
                            let frame = Frame { at: Instant::now(), from_host, bytes: buf[..n as usize].to_vec() };
                            frames.lock().unwrap().push(frame);
                        }
                    }
                    libc::close(fd);
                }
            })
        };
        ready.recv_timeout(Duration::from_secs(10)).expect("the capture did not start");
        Capture { frames, stop, thread: Some(thread) }
    }

    /// Stops capturing; the frames seen, in order.
    pub fn finish(mut self) -> Vec<Frame> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("the capture thread");
        std::mem::take(&mut *self.frames.lock().unwrap())
    }
}
