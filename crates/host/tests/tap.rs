//! TAP interfaces, tested in a network namespace of their own so the
//! host's interfaces are never touched.
//!
//! `tap_in_its_own_network_namespace` makes a namespace with `ip netns
//! add` and runs this test binary again inside it through `ip netns exec`
//! (which also mounts a /sys showing that namespace), asking for the
//! ignored test `tap_checks_inside_the_namespace`, which does the real
//! work. Needs root, /dev/net/tun and iproute2; without them the test
//! fails with a message saying what is missing.

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use ftvm_host::tap::{Tap, TapError};

const NETNS_ENV: &str = "FTVM_HOST_TEST_NETNS";
const INNER: &str = "tap_checks_inside_the_namespace";

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn tap_in_its_own_network_namespace() {
    assert!(
        Path::new("/dev/net/tun").exists(),
        "/dev/net/tun is missing: the TAP tests need the tun driver (modprobe tun)"
    );
    let ns = format!("ftvm-host-test-{}", std::process::id());
    let add = Command::new("ip")
        .args(["netns", "add", &ns])
        .output()
        .unwrap_or_else(|e| panic!("the TAP tests need iproute2's `ip` command: {e}"));
    assert!(
        add.status.success(),
        "cannot create network namespace {ns} (the TAP tests need root): {}",
        String::from_utf8_lossy(&add.stderr).trim()
    );
    let _ns = Netns(ns.clone());

    // Output goes to a file, not a pipe, so a chatty child cannot block
    // while we wait for it with a deadline.
    let log_path = std::env::temp_dir().join(format!("{ns}.log"));
    let log = File::create(&log_path).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(&exe)
        .args(["--exact", INNER, "--ignored", "--nocapture", "--test-threads=1"])
        .env(NETNS_ENV, &ns)
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the TAP checks did not finish in 120 s:\n{}", fs::read_to_string(&log_path).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = fs::read_to_string(&log_path).unwrap_or_default();
    let _ = fs::remove_file(&log_path);
    println!("{output}");
    assert!(status.success(), "the TAP checks in namespace {ns} failed:\n{output}");
    // A filter that matched nothing would also succeed.
    assert!(output.contains("1 passed"), "the TAP checks did not run:\n{output}");
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

fn ip_out(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sys(dev: &str, file: &str) -> String {
    fs::read_to_string(format!("/sys/class/net/{dev}/{file}")).unwrap().trim().to_string()
}

fn exists(dev: &str) -> bool {
    Path::new(&format!("/sys/class/net/{dev}")).exists()
}

fn ifindex(dev: &str) -> u32 {
    let c = std::ffi::CString::new(dev).unwrap();
    // SAFETY: `c` is a NUL-terminated name that outlives the call.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

fn mac_of(dev: &str) -> [u8; 6] {
    let s = sys(dev, "address");
    let v: Vec<u8> = s.split(':').map(|p| u8::from_str_radix(p, 16).unwrap()).collect();
    v.try_into().unwrap()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const HOST_IP: [u8; 4] = [10, 9, 0, 1];
const PEER_IP: [u8; 4] = [10, 9, 0, 2];

fn arp_reply(to_mac: [u8; 6]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&to_mac);
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&[0x08, 0x06]); // ARP
    f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 2]); // Ethernet/IPv4, reply
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&PEER_IP);
    f.extend_from_slice(&to_mac);
    f.extend_from_slice(&HOST_IP);
    f.resize(60, 0); // minimum Ethernet frame without FCS
    f
}

/// Waits for a frame `pick` accepts, skipping others (IPv6 chatter),
/// poking the stack with `poke` now and then.
fn expect_frame(rx: &Receiver<(usize, Vec<u8>)>, what: &str, poke: impl Fn(), pick: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let t = Instant::now();
    poke();
    while t.elapsed() < Duration::from_secs(10) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok((slot, f)) => {
                assert_eq!(slot, 5, "frames carry the slot given to spawn_reader");
                if pick(&f) {
                    return f;
                }
            }
            Err(RecvTimeoutError::Timeout) => poke(),
            Err(RecvTimeoutError::Disconnected) => panic!("the reader stopped while waiting for {what}"),
        }
    }
    panic!("no {what} arrived from the TAP");
}

#[test]
#[ignore = "changes network interfaces: run by tap_in_its_own_network_namespace inside a namespace of its own"]
fn tap_checks_inside_the_namespace() {
    let ns = std::env::var(NETNS_ENV)
        .expect("this test runs only inside the network namespace tap_in_its_own_network_namespace makes");
    let here = fs::metadata("/proc/self/ns/net").unwrap();
    let there = fs::metadata(format!("/run/netns/{ns}")).unwrap();
    assert_eq!((here.dev(), here.ino()), (there.dev(), there.ino()), "not inside network namespace {ns}");
    ip(&["link", "set", "lo", "up"]);

    // Creation: the interface appears, up, as a TAP without a packet
    // information prefix or vnet header.
    assert!(!exists("ftvmt0"));
    let tap = Tap::open("ftvmt0").unwrap();
    assert_eq!(tap.name(), "ftvmt0");
    assert!(exists("ftvmt0"));
    assert_eq!(tap.ifindex(), ifindex("ftvmt0"));
    assert_ne!(tap.ifindex(), 0);
    let flags = u32::from_str_radix(sys("ftvmt0", "flags").trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & libc::IFF_UP as u32, libc::IFF_UP as u32, "link is not up");
    assert_eq!(sys("ftvmt0", "tun_flags"), "0x1002", "IFF_TAP | IFF_NO_PI and nothing else");
    let busy = Tap::open("ftvmt0").unwrap_err();
    assert!(matches!(&busy, TapError::InUse { name } if name == "ftvmt0"), "{busy:?}");
    assert_eq!(busy.to_string(), "TAP ftvmt0 is in use by another VM or process");

    // Bridges.
    ip(&["link", "add", "ftvmbr0", "type", "bridge"]);
    ip(&["link", "add", "ftvmbr1", "type", "bridge"]);
    tap.attach_to_bridge("ftvmbr0").unwrap();
    assert_eq!(fs::read_link("/sys/class/net/ftvmt0/master").unwrap().file_name().unwrap(), "ftvmbr0");
    tap.attach_to_bridge("ftvmbr0").expect("attaching again to the same bridge is not an error");
    assert_eq!(
        tap.attach_to_bridge("nosuchbr").unwrap_err().to_string(),
        "cannot attach TAP ftvmt0: bridge nosuchbr does not exist"
    );
    assert_eq!(tap.attach_to_bridge("lo").unwrap_err().to_string(), "cannot attach TAP ftvmt0: lo is not a bridge");
    assert_eq!(
        tap.attach_to_bridge("ftvmbr1").unwrap_err().to_string(),
        "cannot attach TAP ftvmt0 to bridge ftvmbr1: it is already in ftvmbr0"
    );
    assert!(tap.attach_to_bridge("a-very-long-bridge").unwrap_err().to_string().contains("too long"));
    let e = Tap::open("ftvmbr0").unwrap_err().to_string();
    assert!(e.starts_with("cannot open TAP ftvmbr0: "), "{e}");
    drop(tap);
    wait_for("ftvmt0 to go away with its last descriptor", || !exists("ftvmt0"));

    // Frames, both ways.
    let tap = Tap::open("ftvmt1").unwrap();
    ip(&["addr", "add", "10.9.0.1/24", "dev", "ftvmt1"]);
    let tap_mac = mac_of("ftvmt1");
    let (tx, rx) = channel();
    tap.spawn_reader(5, move |slot, frame| {
        let _ = tx.send((slot, frame));
    })
    .unwrap();
    let udp = std::net::UdpSocket::bind("10.9.0.1:0").unwrap();
    let poke = || {
        let _ = udp.send_to(b"hello", "10.9.0.2:9");
    };
    let arp = expect_frame(&rx, "ARP request for 10.9.0.2", poke, |f| {
        f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1] && f[38..42] == PEER_IP
    });
    assert_eq!(arp[0..6], [0xff; 6], "an ARP request is broadcast");
    assert_eq!(arp[6..12], tap_mac);
    assert_eq!(arp[28..32], HOST_IP);

    let rx_before: u64 = sys("ftvmt1", "statistics/rx_packets").parse().unwrap();
    tap.send(&arp_reply(tap_mac)).unwrap();
    wait_for("the sent frame in rx_packets", || {
        sys("ftvmt1", "statistics/rx_packets").parse::<u64>().unwrap() > rx_before
    });
    wait_for("the host to learn 10.9.0.2 from the reply", || {
        ip_out(&["neigh", "show", "10.9.0.2", "dev", "ftvmt1"]).contains("02:00:00:00:00:02")
    });
    // Resolved: the datagram now goes out, addressed to the peer.
    let dgram = expect_frame(&rx, "UDP datagram to 10.9.0.2", poke, |f| {
        f.len() >= 42 && f[12..14] == [0x08, 0x00] && f[23] == 17 && f[30..34] == PEER_IP
    });
    assert_eq!(dgram[0..6], PEER_MAC);
    assert_eq!(&dgram[42..47], b"hello");

    assert!(tap.send(&[]).is_err(), "a frame shorter than an Ethernet header is refused");

    // A down link refuses frames with an error, not a panic.
    ip(&["link", "set", "ftvmt1", "down"]);
    assert!(tap.send(&arp_reply(tap_mac)).is_err(), "sending on a down link should fail");

    // Dropping stops the reader (its sender goes away) and the interface.
    drop(tap);
    let t = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(_) => assert!(t.elapsed() < Duration::from_secs(5), "frames keep coming after drop"),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => panic!("the reader thread is still running after drop"),
        }
    }
    wait_for("ftvmt1 to go away", || !exists("ftvmt1"));

    // A persistent TAP made by an administrator is used, brought up, and
    // left in place.
    ip(&["tuntap", "add", "dev", "ftvmt2", "mode", "tap"]);
    let flags = u32::from_str_radix(sys("ftvmt2", "flags").trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & libc::IFF_UP as u32, 0);
    let tap = Tap::open("ftvmt2").unwrap();
    let flags = u32::from_str_radix(sys("ftvmt2", "flags").trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & libc::IFF_UP as u32, libc::IFF_UP as u32);
    drop(tap);
    assert!(exists("ftvmt2"), "a persistent TAP must outlive us");

    // A pattern name is resolved by the kernel, and name() tells which.
    let tap = Tap::open("ftvmp%d").unwrap();
    assert_eq!(tap.name(), "ftvmp0");
    assert_eq!(tap.ifindex(), ifindex("ftvmp0"));
}
