//! Linux TAP interfaces: the host end of a guest's virtio-net.
//!
//! [`Tap`] owns the /dev/net/tun descriptor of one interface (created if
//! it does not exist; its offloads turned off; brought up; optionally put
//! in a bridge), the threads
//! that read frames from it, and the writing of frames to it. Frames carry
//! no packet-information prefix and no virtio-net header: exactly the
//! Ethernet frames of [`IoRequest::NetTx`](ftvm_devices::IoRequest) and
//! [`IoCompletion::NetRx`](ftvm_devices::IoCompletion).
//!
//! Back-pressure is not handled here: the reader hands every frame on as it
//! arrives, and the caller, which knows whether the guest has receive
//! buffers, keeps a bounded queue and drops what does not fit, as a NIC
//! drops when its ring is full.

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::describe;

/// Longest interface name Linux accepts (IFNAMSIZ less the terminator).
pub const IFNAME_MAX: usize = libc::IFNAMSIZ - 1;

/// Read buffer for one frame: the largest IP packet (65535 bytes) plus an
/// Ethernet header, the most a TAP without offloads hands over.
pub const MAX_FRAME: usize = 65550;

/// Not exported by the libc crate for glibc targets; from
/// <linux/sockios.h>.
const SIOCBRADDIF: libc::c_ulong = 0x89a2;

/// An open TAP interface.
///
/// Dropping it stops and joins its reader threads, then closes the
/// descriptor; a TAP this process created then disappears, a persistent
/// one (made with `ip tuntap add`) stays.
pub struct Tap {
    name: String,
    ifindex: u32,
    fd: Arc<OwnedFd>,
    /// An eventfd made readable at drop to wake the reader threads out of
    /// poll(2); it is never read, so it wakes all of them.
    stop: Arc<OwnedFd>,
    readers: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap").field("name", &self.name).field("ifindex", &self.ifindex).finish()
    }
}

/// An interface name the kernel would refuse. `what` says whose name it
/// is ("TAP", "bridge").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IfNameError {
    #[error("{what} name is empty")]
    Empty { what: &'static str },
    #[error("{what} name {name} is too long: {} bytes, at most {IFNAME_MAX}", .name.len())]
    TooLong { what: &'static str, name: String },
    #[error("{what} name {name} is not allowed")]
    Reserved { what: &'static str, name: String },
    #[error("{what} name {name:?} contains '/', ':', a blank or a NUL")]
    BadCharacter { what: &'static str, name: String },
}

/// Why a TAP could not be opened or attached to a bridge.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error(transparent)]
    Name(#[from] IfNameError),
    #[error("cannot open /dev/net/tun for TAP {name}: {}", describe(.source))]
    OpenTun {
        name: String,
        #[source]
        source: io::Error,
    },
    /// Another descriptor has the TAP attached (EBUSY).
    #[error("TAP {name} is in use by another VM or process")]
    InUse { name: String },
    #[error("cannot create TAP {name}: {} (needs CAP_NET_ADMIN)", describe(.source))]
    NotPermitted {
        name: String,
        #[source]
        source: io::Error,
    },
    /// EINVAL: most likely an interface of that name that is not a TAP.
    #[error("cannot open TAP {name}: {} (is {name} an interface that is not a TAP?)", describe(.source))]
    NotATap {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot open TAP {name}: {}", describe(.source))]
    Open {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot turn off the offloads of TAP {name}: {}", describe(.source))]
    Offloads {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("TAP name {name:?} has a NUL")]
    NameHasNul { name: String },
    #[error("cannot find TAP {name} after creating it: {}", describe(.source))]
    NotFound {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot bring up TAP {name}: {}", describe(.source))]
    Up {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot create a stop event for TAP {name}: {}", describe(.source))]
    StopEvent {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot attach TAP {tap} to bridge {bridge}: socket: {}", describe(.source))]
    BridgeSocket {
        tap: String,
        bridge: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot attach TAP {tap}: bridge {bridge} does not exist")]
    NoSuchBridge { tap: String, bridge: String },
    #[error("cannot attach TAP {tap}: {bridge} is not a bridge")]
    NotABridge { tap: String, bridge: String },
    #[error("cannot attach TAP {tap} to bridge {bridge}: it is already in {other}")]
    InOtherBridge { tap: String, bridge: String, other: String },
    #[error("cannot attach TAP {tap} to bridge {bridge}: {}", describe(.source))]
    Attach {
        tap: String,
        bridge: String,
        #[source]
        source: io::Error,
    },
}

/// Checks a name the way the kernel's dev_valid_name() does, so mistakes
/// get a clear message instead of an EINVAL from an ioctl.
fn check_ifname(what: &'static str, name: &str) -> Result<(), IfNameError> {
    if name.is_empty() {
        return Err(IfNameError::Empty { what });
    }
    if name.len() > IFNAME_MAX {
        return Err(IfNameError::TooLong { what, name: name.to_string() });
    }
    if name == "." || name == ".." {
        return Err(IfNameError::Reserved { what, name: name.to_string() });
    }
    if name.chars().any(|c| c == '/' || c == ':' || c == '\0' || c.is_whitespace()) {
        return Err(IfNameError::BadCharacter { what, name: name.to_string() });
    }
    Ok(())
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data (a name and a union of integers,
    // addresses and a pointer); all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    // check_ifname() has bounded the length, so a terminator remains.
    for (dst, &b) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = b as libc::c_char;
    }
    req
}

/// A socket to issue interface ioctls on; any family reaches dev_ioctl.
fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned to us and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// ioctl(2) with an ifreq argument.
fn ioctl_ifreq(fd: &impl AsRawFd, request: libc::c_ulong, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: every request used here reads and/or writes one struct
    // ifreq, and `req` is a valid, exclusively borrowed one.
    if unsafe { libc::ioctl(fd.as_raw_fd(), request as _, req as *mut libc::ifreq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Tap {
    /// Opens the TAP `name`, creating it if there is none, and brings its
    /// link up. Needs CAP_NET_ADMIN, or a persistent TAP owned by the user.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        check_ifname("TAP", name)?;
        let owned = || name.to_string();
        // Non-blocking: the reader waits in poll(2), where it can also see
        // the stop signal, and a transmit never stalls the caller.
        let tun: File = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(|source| TapError::OpenTun { name: owned(), source })?;
        let mut req = ifreq(name);
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        ioctl_ifreq(&tun, libc::TUNSETIFF as libc::c_ulong, &mut req).map_err(|source| {
            match source.raw_os_error() {
                Some(libc::EBUSY) => TapError::InUse { name: owned() },
                Some(libc::EPERM) => TapError::NotPermitted { name: owned(), source },
                Some(libc::EINVAL) => TapError::NotATap { name: owned(), source },
                _ => TapError::Open { name: owned(), source },
            }
        })?;
        // The kernel writes back the name it used (which differs when the
        // caller asked for a pattern such as "tap%d").
        // SAFETY: ifr_name is zero-initialised and the kernel leaves it
        // NUL-terminated within IFNAMSIZ.
        let real = unsafe { CStr::from_ptr(req.ifr_name.as_ptr()) }.to_string_lossy().into_owned();
        // Offloads belong to the interface, not to a descriptor: a
        // persistent TAP keeps those its last user turned on. QEMU turns on
        // checksum and segmentation offloads for a guest that takes them
        // (with a vnet header saying how to finish each frame); without
        // that header the host's stack would hand us TCP and UDP frames
        // with checksums left to do and segments larger than the MTU,
        // which our guest drops: ping worked, TCP did not (issue 69). So
        // every offload is turned off, whatever the TAP had. (The vnet
        // header itself is a TUNSETIFF flag, which the call above cleared.)
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETOFFLOAD as _, 0 as libc::c_ulong) } < 0 {
            return Err(TapError::Offloads { name: real, source: io::Error::last_os_error() });
        }
        let cname = std::ffi::CString::new(real.as_bytes()).map_err(|_| TapError::NameHasNul { name: real.clone() })?;
        // SAFETY: cname is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(TapError::NotFound { name: real, source: io::Error::last_os_error() });
        }
        set_up(&real).map_err(|source| TapError::Up { name: real.clone(), source })?;
        // SAFETY: eventfd(2) with constant flags.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(TapError::StopEvent { name: real, source: io::Error::last_os_error() });
        }
        // SAFETY: efd was just returned to us and is owned by nobody else.
        let stop = unsafe { OwnedFd::from_raw_fd(efd) };
        Ok(Tap {
            name: real,
            ifindex,
            fd: Arc::new(OwnedFd::from(tun)),
            stop: Arc::new(stop),
            readers: Mutex::new(Vec::new()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Adds the TAP to `bridge` as a port. Attaching it again to the bridge
    /// it is already in succeeds.
    pub fn attach_to_bridge(&self, bridge: &str) -> Result<(), TapError> {
        check_ifname("bridge", bridge)?;
        let (tap, bridge) = (self.name.clone(), bridge.to_string());
        let sock = match control_socket() {
            Ok(sock) => sock,
            Err(source) => return Err(TapError::BridgeSocket { tap, bridge, source }),
        };
        let mut req = ifreq(&bridge);
        req.ifr_ifru.ifru_ifindex = self.ifindex as libc::c_int;
        match ioctl_ifreq(&sock, SIOCBRADDIF, &mut req) {
            Ok(()) => Ok(()),
            Err(source) => Err(match source.raw_os_error() {
                Some(libc::ENODEV) => TapError::NoSuchBridge { tap, bridge },
                Some(libc::EOPNOTSUPP) => TapError::NotABridge { tap, bridge },
                Some(libc::EBUSY) => match self.master() {
                    Some(m) if m == bridge => return Ok(()),
                    Some(other) => TapError::InOtherBridge { tap, bridge, other },
                    None => TapError::Attach { tap, bridge, source },
                },
                _ => TapError::Attach { tap, bridge, source },
            }),
        }
    }

    /// Waits, at most `within`, until frames written to the TAP go
    /// somewhere: its carrier is up and, if it is a bridge's port, the
    /// port forwards. Whether it does at the end.
    ///
    /// Why: a TAP opened a moment ago has its carrier come up, and its
    /// bridge port start forwarding, a few milliseconds later (the
    /// kernel's link watch runs after the open returns). A frame written
    /// meanwhile is dropped by the bridge without a word. A backup going
    /// live announces its guest's MAC right after it opens the TAP, and
    /// that announcement is what moves the switches (and the host's own
    /// bridge) off the dead primary's port: lost, the client's frames kept
    /// going to the dead port until the guest happened to send something
    /// (measured in a crash trial: the segment sent again lost, the
    /// client's retransmission 0.21 s after the failure lost, its next at
    /// 0.42 s answered). Read from sysfs, which shows the namespace sysfs
    /// was mounted in: where it cannot say, this does not wait.
    pub fn wait_forwarding(&self, within: Duration) -> bool {
        let dir = format!("/sys/class/net/{}", self.name);
        let read = |file: &str| std::fs::read_to_string(format!("{dir}/{file}")).ok().map(|s| s.trim().to_string());
        // 3: BR_STATE_FORWARDING.
        let ready = || read("carrier").is_none_or(|c| c == "1") && read("brport/state").is_none_or(|s| s == "3");
        let until = std::time::Instant::now() + within;
        while !ready() {
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        true
    }

    /// Reads and drops every frame queued in the TAP now; how many. For a
    /// TAP opened long before anyone reads it (a backup's, opened while it
    /// follows its primary so that it forwards at once when the backup goes
    /// live): what the bridge flooded to it meanwhile is stale, and its
    /// primary already had every copy of it that mattered.
    pub fn discard_queued(&self) -> usize {
        let mut buf = vec![0u8; MAX_FRAME];
        let mut n = 0;
        // Non-blocking (see `open`): the read fails with EAGAIN once the
        // queue is empty; any other error ends it too.
        // SAFETY: the pointer and length describe `buf`.
        while unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } >= 0 {
            n += 1;
        }
        n
    }

    /// The device this TAP is a port of, if any (from sysfs, which shows
    /// the namespace sysfs was mounted in; good enough for an error path).
    fn master(&self) -> Option<String> {
        let link = std::fs::read_link(format!("/sys/class/net/{}/master", self.name)).ok()?;
        Some(link.file_name()?.to_string_lossy().into_owned())
    }

    /// Starts a thread that reads frames and hands each to
    /// `deliver(slot, frame)`, until the Tap is dropped. `deliver` must not
    /// block for long: frames arriving meanwhile queue in the kernel, and
    /// are dropped there once its queue is full.
    pub fn spawn_reader(&self, slot: usize, deliver: impl Fn(usize, Vec<u8>) + Send + 'static) -> io::Result<()> {
        let fd = Arc::clone(&self.fd);
        let stop = Arc::clone(&self.stop);
        let name = self.name.clone();
        let handle = std::thread::Builder::new()
            .name(format!("tap-{}", self.name))
            .spawn(move || read_frames(&name, &fd, &stop, slot, deliver))?;
        self.readers.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
        Ok(())
    }

    /// Writes one frame. Errors (the link is down, the frame is too large,
    /// the kernel is out of buffers) are returned; the caller drops the
    /// frame, as a NIC would.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: the pointer and length describe `frame`.
            let n = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n as usize != frame.len() {
                // A TAP takes a frame whole or not at all; anything else
                // means the frame did not go out as sent.
                return Err(io::Error::new(io::ErrorKind::WriteZero, format!("short write to TAP {}", self.name)));
            }
            return Ok(());
        }
    }
}

fn set_up(name: &str) -> io::Result<()> {
    let sock = control_socket()?;
    let mut req = ifreq(name);
    ioctl_ifreq(&sock, libc::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: SIOCGIFFLAGS filled in the flags member.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    if flags & libc::IFF_UP as libc::c_short != 0 {
        return Ok(());
    }
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    ioctl_ifreq(&sock, libc::SIOCSIFFLAGS, &mut req)
}

fn read_frames(name: &str, fd: &OwnedFd, stop: &OwnedFd, slot: usize, deliver: impl Fn(usize, Vec<u8>)) {
    let mut buf = vec![0u8; MAX_FRAME];
    loop {
        let mut fds = [
            libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `fds` is a valid array of two pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            eprintln!("TAP {name}: poll failed: {}; receive stopped", describe(&e));
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        let rev = fds[0].revents;
        if rev & libc::POLLIN == 0 {
            if rev & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                // The interface was deleted under us: nothing will come.
                eprintln!("TAP {name}: the interface went away; receive stopped");
                return;
            }
            continue;
        }
        // SAFETY: the pointer and length describe `buf`.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => continue,
                _ => {
                    eprintln!("TAP {name}: read failed: {}; receive stopped", describe(&e));
                    return;
                }
            }
        }
        deliver(slot, buf[..n as usize].to_vec());
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from `one` to our eventfd. It cannot fail
        // short of the counter overflowing, which one write cannot do.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        let readers = std::mem::take(self.readers.get_mut().unwrap_or_else(|e| e.into_inner()));
        for r in readers {
            // A reader whose callback panicked has nothing left to stop.
            let _ = r.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_any_syscall() {
        let e = Tap::open("sixteen-bytes-xx").unwrap_err();
        assert_eq!(e.to_string(), "TAP name sixteen-bytes-xx is too long: 16 bytes, at most 15");
        assert!(matches!(e, TapError::Name(IfNameError::TooLong { what: "TAP", .. })), "{e:?}");
        assert_eq!(Tap::open("").unwrap_err().to_string(), "TAP name is empty");
        assert!(Tap::open("a/b").unwrap_err().to_string().contains("contains '/'"), "slash");
        assert!(Tap::open("tap 0").unwrap_err().to_string().contains("a blank"), "blank");
        assert!(Tap::open("..").unwrap_err().to_string().contains("not allowed"));
        assert!(check_ifname("TAP", "fifteen-bytes-x").is_ok());
        assert_eq!(check_ifname("bridge", "").unwrap_err().to_string(), "bridge name is empty");
    }

    #[test]
    fn ifreq_holds_the_name_terminated() {
        let r = ifreq("fifteen-bytes-x");
        assert_eq!(r.ifr_name[14] as u8, b'x');
        assert_eq!(r.ifr_name[15], 0);
    }
}
