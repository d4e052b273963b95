//! Whether this host can still reach the outside: the check a side makes
//! after declaring its peer failed and before it contends at the arbiter,
//! so that the side that can still serve clients is the one that wins.
//!
//! Silence from the peer does not say which side lost its network. A
//! primary whose switch port went down hears nothing from its backup,
//! exactly as a backup whose primary crashed; if it raced its backup to
//! the arbiter on silence alone, it could win and leave the VM on a host
//! no client reaches. vSphere HA answers this with *isolation addresses*
//! (by default the host's gateway): a host that cannot reach any of them
//! knows it is the isolated one. Here such a side *defers*: it does not
//! contend at once, watches the arbiter, and goes on probing. If the other
//! side claims the generation meanwhile, it has lost (and halts); if the
//! outside comes back, or the other side never claims within the deferral
//! (both hosts cut off, or the other dead too), it contends as before.
//!
//! The probe is one ICMP echo to every address at once, answered by the
//! first reply. Written here rather than taken from a crate: it is one
//! datagram out and one in with a deadline, where the ICMP crates bring
//! an async runtime (surge-ping) or a packet library (pnet). A raw socket
//! needs CAP_NET_RAW, which a host that opens TAPs already has; without
//! it the kernel's unprivileged ping socket is tried, and if neither can
//! be opened the check is skipped (said once): the side contends as it
//! did before isolation addresses existed.

use std::fs;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// How long one probe waits for a reply. A reply on a LAN takes well under
/// a millisecond; a host that answers none within this is taken for
/// unreachable. Only the isolated side waits it out.
pub const PROBE_WAIT: Duration = Duration::from_millis(200);
/// How long an isolated side waits for the other to claim the arbiter
/// before it contends itself. The other side declares the failure within
/// a few heartbeats of this side (both watch the same silence), and its
/// own probe answers in a round trip.
pub const DEFAULT_DEFER: Duration = Duration::from_secs(3);

/// This host's isolation addresses and what a side does when it reaches
/// none of them.
#[derive(Debug, Clone)]
pub struct Isolation {
    addresses: Vec<Ipv4Addr>,
    defer: Duration,
}

/// What one probe of the outside found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outside {
    /// This address answered first.
    Reached(Ipv4Addr),
    /// None answered within the wait.
    Unreached,
    /// The probe could not be made (no addresses, no socket): why.
    NotChecked(String),
}

impl Isolation {
    /// Probes `addresses`; with none given, the host's default gateways.
    pub fn new(addresses: Vec<Ipv4Addr>, defer: Duration) -> Isolation {
        let addresses = if addresses.is_empty() { default_gateways() } else { addresses };
        Isolation { addresses, defer }
    }

    /// The addresses probed.
    pub fn addresses(&self) -> &[Ipv4Addr] {
        &self.addresses
    }

    /// How long an isolated side waits for the other to claim.
    pub fn defer(&self) -> Duration {
        self.defer
    }

    /// One probe: an echo request to every address, the first reply wins.
    pub fn probe(&self, wait: Duration) -> Outside {
        if self.addresses.is_empty() {
            return Outside::NotChecked("no isolation address (none given and no default gateway)".into());
        }
        match icmp::echo_any(&self.addresses, wait) {
            Ok(Some(a)) => Outside::Reached(a),
            Ok(None) => Outside::Unreached,
            Err(e) => Outside::NotChecked(format!("cannot probe the isolation addresses: {e}")),
        }
    }
}

/// The gateways of the default routes in `/proc/net/route` (this network
/// namespace's), in table order.
pub fn default_gateways() -> Vec<Ipv4Addr> {
    fs::read_to_string("/proc/net/route").map(|t| parse_default_gateways(&t)).unwrap_or_default()
}

/// `/proc/net/route`'s text to its default routes' gateways: destination
/// and mask 0, the gateway flag (0x2) set; addresses in host byte order
/// as hex of the kernel's network-order word.
fn parse_default_gateways(table: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, dest, gw, flags, _, _, _, mask, ..] = f[..] else { continue };
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        let (Some(dest), Some(gw), Some(flags), Some(mask)) = (hex(dest), hex(gw), hex(flags), hex(mask)) else {
            continue;
        };
        if dest == 0 && mask == 0 && flags & 0x2 != 0 && gw != 0 {
            let a = Ipv4Addr::from(u32::from_be(gw));
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

/// Sleeps in steps of at most `step` until `until`, or until `stop` says so.
pub(crate) fn wait_until(until: Instant, step: Duration, mut stop: impl FnMut() -> bool) -> bool {
    loop {
        if stop() {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        std::thread::sleep(step.min(until - now));
    }
}

mod icmp {
    //! ICMP echo over a raw socket (or the kernel's ping socket).

    use std::io;
    use std::net::Ipv4Addr;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::{Duration, Instant};

    const ECHO_REQUEST: u8 = 8;
    const ECHO_REPLY: u8 = 0;

    /// Sends one echo request to each of `to` and waits up to `wait` for
    /// the first reply: the address that answered, or None.
    pub fn echo_any(to: &[Ipv4Addr], wait: Duration) -> io::Result<Option<Ipv4Addr>> {
        let (sock, raw) = open()?;
        // The identifier tells our replies from other pings' on a raw
        // socket (which sees every ICMP datagram of the host); a ping
        // socket's is the kernel's, and it delivers only ours.
        let mut id_bytes = [0u8; 2];
        getrandom::fill(&mut id_bytes).map_err(|e| io::Error::other(e.to_string()))?;
        let id = u16::from_ne_bytes(id_bytes);
        for (seq, addr) in to.iter().enumerate() {
            let packet = request(id, seq as u16);
            send(&sock, &packet, *addr)?;
        }
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 1500];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !readable(&sock, left)? {
                return Ok(None);
            }
            let (n, from) = recv(&sock, &mut buf)?;
            let icmp = if raw {
                // A raw socket hands over the IP header too.
                let Some(&vihl) = buf.first() else { continue };
                let ihl = usize::from(vihl & 0x0f) * 4;
                if n < ihl + 8 {
                    continue;
                }
                &buf[ihl..n]
            } else {
                &buf[..n]
            };
            if icmp.len() < 8 || icmp[0] != ECHO_REPLY {
                continue;
            }
            let reply_id = u16::from_be_bytes([icmp[4], icmp[5]]);
            if (raw && reply_id != id) || !to.contains(&from) {
                continue;
            }
            return Ok(Some(from));
        }
    }

    /// An echo request: type, code, checksum, identifier, sequence, and a
    /// few bytes of payload.
    fn request(id: u16, seq: u16) -> Vec<u8> {
        let mut p = vec![ECHO_REQUEST, 0, 0, 0];
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(b"ftvm-isolation");
        let sum = checksum(&p);
        p[2..4].copy_from_slice(&sum.to_be_bytes());
        p
    }

    /// The Internet checksum (RFC 1071).
    pub(super) fn checksum(data: &[u8]) -> u16 {
        let mut sum = 0u32;
        for pair in data.chunks(2) {
            let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            sum += u32::from(word);
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// A raw ICMP socket (true), else a ping socket (false).
    fn open() -> io::Result<(OwnedFd, bool)> {
        for (kind, raw) in [(libc::SOCK_RAW, true), (libc::SOCK_DGRAM, false)] {
            // SAFETY: socket takes no pointers; a non-negative result is a
            // new descriptor that we alone own from here on.
            let fd = unsafe { libc::socket(libc::AF_INET, kind | libc::SOCK_CLOEXEC, libc::IPPROTO_ICMP) };
            if fd >= 0 {
                // SAFETY: fd was just returned by socket and is owned by no one else.
                return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, raw));
            }
        }
        Err(io::Error::last_os_error())
    }

    fn sockaddr(a: Ipv4Addr) -> libc::sockaddr_in {
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from(a).to_be() },
            sin_zero: [0; 8],
        }
    }

    fn send(sock: &OwnedFd, packet: &[u8], to: Ipv4Addr) -> io::Result<()> {
        let sa = sockaddr(to);
        // SAFETY: the buffer and the address are valid for the lengths
        // given, for the duration of the call.
        let r = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            // An address with no route is as unreachable as a silent one.
            if matches!(e.raw_os_error(), Some(libc::ENETUNREACH | libc::EHOSTUNREACH)) {
                return Ok(());
            }
            return Err(e);
        }
        Ok(())
    }

    fn readable(sock: &OwnedFd, wait: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one pollfd, valid for the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
        }
        Ok(r > 0)
    }

    fn recv(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Ipv4Addr)> {
        let mut sa = sockaddr(Ipv4Addr::UNSPECIFIED);
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: the buffer and the address structure are valid for the
        // lengths given; the kernel writes at most those.
        let n = unsafe {
            libc::recvfrom(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut sa as *mut libc::sockaddr_in).cast(),
                &mut len,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((n as usize, Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr))))
    }
}

/// Runs `f` on a thread of its own in a new, empty network namespace (no
/// routes, loopback down): a host cut off from everything. Needs root.
#[cfg(test)]
pub(crate) fn cut_off<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare takes no pointers; it moves only this thread
        // into a new network namespace.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET) failed (the tests run as root): {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_gateways_come_from_the_default_routes_only() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                     eth0\t0000A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n\
                     eth1\t00000000\t00000000\t0001\t0\t0\t200\t00000000\t0\t0\t0\n\
                     eth1\t00000000\t0101A8C0\t0003\t0\t0\t300\t00000000\t0\t0\t0\n\
                     garbage line\n";
        assert_eq!(parse_default_gateways(table), vec![Ipv4Addr::new(192, 168, 0, 1), Ipv4Addr::new(192, 168, 1, 1)]);
        assert!(parse_default_gateways("").is_empty());
    }

    #[test]
    fn the_checksum_is_the_internet_checksum() {
        // RFC 1071's worked example: 0x0001 0xf203 0xf4f5 0xf6f7 sums to
        // 0xddf2, whose complement is 0x220d.
        assert_eq!(icmp::checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0x220d);
        // An odd length is padded with a zero byte.
        assert_eq!(icmp::checksum(&[0xff]), !0xff00);
    }

    #[test]
    fn loopback_answers_and_an_unused_address_does_not() {
        let iso = Isolation::new(vec![Ipv4Addr::LOCALHOST], DEFAULT_DEFER);
        match iso.probe(Duration::from_secs(2)) {
            Outside::Reached(a) => assert_eq!(a, Ipv4Addr::LOCALHOST),
            // Only where neither socket may be opened (not as root).
            // SAFETY: geteuid takes nothing and cannot fail.
            Outside::NotChecked(why) if unsafe { libc::geteuid() } != 0 => eprintln!("not checked here: {why}"),
            Outside::NotChecked(why) => panic!("root could not probe: {why}"),
            Outside::Unreached => panic!("loopback did not answer an echo request"),
        }
        // From a host cut off from everything, loopback included, nothing answers.
        let (got, took) = cut_off(|| {
            let t0 = Instant::now();
            let got = Isolation::new(vec![Ipv4Addr::LOCALHOST], DEFAULT_DEFER).probe(Duration::from_millis(100));
            (got, t0.elapsed())
        });
        assert_eq!(got, Outside::Unreached);
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}
