"""The two-host site: a switch, a primary host, a backup host and a
client, each a network namespace.

A switch namespace holds a bridge; the two host namespaces (primary host
10.201.0.1, backup host 10.201.0.2) and a client namespace (10.201.0.50)
each have an eth0 that is a veth to a port of the switch. On a host, eth0
and the VM's TAP `t0` are enslaved to the bridge `br0`, which carries the
host's address, so the guest (10.201.0.100, given with `ftvm.ip=`) sits on
the switch's network like any machine. The client's eth0 carries its
address directly. A site made with `spare=True` has a third host, the
spare (10.201.0.3, port `ps`), for a backup to move to.

    switch ns:   swbr ── pa (to primary host) ── pb (to backup host) ── pc (to client)
    host ns:     br0 = {eth0, t0}, 10.201.0.{1,2}/24
    client ns:   eth0 10.201.0.50/24

Namespaces are named ftvm-TAG-PIDXXXX-{sw,pa,pb,cl} (XXXX random: pids
repeat across pid namespaces, network namespace names do not): sites of
different processes (benches, pytest workers) never collide, and one
process may not open two sites with one tag at once. Every other name lives inside the
site's namespaces, so nothing appears in the host's root namespace.
"""

import ctypes
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .cleanup import Background, forget, on_cleanup
from .host import sh

GUEST_IP = "10.201.0.100"
PRIMARY_HOST_IP = "10.201.0.1"
BACKUP_HOST_IP = "10.201.0.2"
SPARE_HOST_IP = "10.201.0.3"
CLIENT_IP = "10.201.0.50"
CHANNEL_PORT = 7700
REDIS_PORT = 6379

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def in_netns(ns_name, fn):
    """Runs fn() on a fresh thread that has entered the named network
    namespace; a socket made there stays in that namespace, so any thread
    may use it afterwards."""
    out = {}

    def body():
        try:
            with open(f"/run/netns/{ns_name}") as f:
                if _libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns_name}): {os.strerror(err)}")
            out["value"] = fn()
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


_OPEN_TAGS = set()  # tags of this process's open sites
_TAGS_LOCK = threading.Lock()


class Site:
    """The switch, two hosts and a client as network namespaces; removed
    by close() (registered for cleanup)."""

    HOSTS = {"primary": ("pa", PRIMARY_HOST_IP), "backup": ("pb", BACKUP_HOST_IP), "spare": ("ps", SPARE_HOST_IP)}

    def __init__(self, tag, spare=False):
        with _TAGS_LOCK:
            # The tag names the namespaces (with the process id): two sites
            # with one tag would collide.
            assert tag not in _OPEN_TAGS, f"two open sites tagged {tag!r}: give each its own"
            _OPEN_TAGS.add(tag)
        self.tag = tag
        base = f"ftvm-{tag}-{os.getpid()}{os.urandom(2).hex()}"
        roles = [("switch", "sw"), ("primary", "pa"), ("backup", "pb"), ("client", "cl")]
        self.ns = {role: f"{base}-{short}" for role, short in roles + ([("spare", "ps")] if spare else [])}
        self.made = []
        self._undo = on_cleanup(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        for name in self.ns.values():
            sh(["ip", "netns", "add", name])
            self.made.append(name)
            sh(["ip", "-n", name, "link", "set", "lo", "up"])
            # The site's bridges are switches: frames crossing them do not
            # go through the host's iptables, which a host with
            # br_netfilter otherwise calls for every bridged frame (three
            # bridges on the way between the hosts; libvirt's hosts turn
            # it off likewise). Per namespace since Linux 5.3; an older
            # kernel, or none of br_netfilter, leaves the default.
            for table in ("iptables", "ip6tables", "arptables"):
                key = Path("/proc/sys/net/bridge") / f"bridge-nf-call-{table}"
                subprocess.run(["ip", "netns", "exec", name, "sh", "-c", f"[ ! -e {key} ] || echo 0 > {key}"],
                               check=False, capture_output=True)
        sw = self.ns["switch"]
        sh(["ip", "-n", sw, "link", "add", "swbr", "type", "bridge"])
        sh(["ip", "-n", sw, "link", "set", "swbr", "up"])
        ports = [("primary", "pa", PRIMARY_HOST_IP), ("backup", "pb", BACKUP_HOST_IP), ("client", "pc", CLIENT_IP)]
        if "spare" in self.ns:
            ports.append(("spare", "ps", SPARE_HOST_IP))
        for role, port, addr in ports:
            ns = self.ns[role]
            # Made inside the switch namespace with its peer sent straight
            # to the host: no name ever appears in the root namespace.
            sh(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            sh(["ip", "-n", sw, "link", "set", port, "master", "swbr"])
            sh(["ip", "-n", sw, "link", "set", port, "up"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            if role == "client":
                sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
                continue
            # The host's address sits on its bridge, which also takes the
            # VM's TAP: the guest is on the switch's network.
            sh(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "master", "br0"])
            sh(["ip", "-n", ns, "tuntap", "add", "t0", "mode", "tap"])
            sh(["ip", "-n", ns, "link", "set", "t0", "master", "br0"])
            sh(["ip", "-n", ns, "link", "set", "t0", "up"])
            sh(["ip", "-n", ns, "link", "set", "br0", "up"])
            sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "br0"])

    def argv(self, role, *cmd):
        """A command line that runs `cmd` inside a namespace of the site."""
        return ["ip", "netns", "exec", self.ns[role], *cmd]

    def run(self, role, argv, check=True, timeout=60):
        """Runs a host tool inside a namespace of the site (see sh)."""
        return sh(self.argv(role, *argv), check=check, timeout=timeout)

    def port_down(self, role):
        """Takes a host's switch port down: the host is cut off both ways
        at once and nothing it sends afterwards (a FIN, a heartbeat)
        leaves it. With "backup": the hosts can no longer reach each
        other while both run."""
        sh(["ip", "-n", self.ns["switch"], "link", "set", self.HOSTS[role][0], "down"])

    def port_up(self, role):
        """Brings a host's switch port back up (see port_down)."""
        sh(["ip", "-n", self.ns["switch"], "link", "set", self.HOSTS[role][0], "up"])

    def connect(self, ip, port, timeout=5.0):
        """A TCP connection opened from inside the client namespace."""

        def dial():
            s = socket.create_connection((ip, port), timeout=timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s

        return in_netns(self.ns["client"], dial)

    def capture(self, role, interface):
        """Starts capturing the frames on an interface of a namespace of
        the site (see Capture)."""
        return Capture(self.ns[role], interface)

    def close(self):
        for name in reversed(self.made):
            # Whatever still runs in it dies first: a VM an agent started
            # (its own process group, so not stopped with the agent's
            # Proc), one started while the others were being stopped. A
            # namespace whose name is deleted lives on around them, and
            # they with it, unseen.
            for _ in range(50):
                pids = [p for p in sh(["ip", "netns", "pids", name], check=False).stdout.split()
                        if p != str(os.getpid())]
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                time.sleep(0.1)
            r = sh(["ip", "netns", "del", name], check=False)
            if r.returncode != 0:
                print(f"ftsite: warning: cannot delete network namespace {name}: {r.stderr.strip()}",
                      file=sys.stderr)
        self.made = []
        forget(self._undo)
        with _TAGS_LOCK:
            _OPEN_TAGS.discard(self.tag)


@dataclass
class Frame:
    """A frame seen on an interface: when (the kernel's receive stamp,
    seconds), whether the host sent it (toward the VM, for a TAP) or
    received it (from the VM), and its bytes."""
    at: float
    from_host: bool
    data: bytes


ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


class Capture(Background):
    """Frames seen on one interface of a namespace, both ways, from a raw
    packet socket (what tcpdump does, without needing tcpdump), each
    stamped by the kernel as it passed."""

    def __init__(self, ns_name, interface):
        def open_socket():
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((interface, ETH_P_ALL))
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            s.settimeout(0.05)
            return s

        self.sock = in_netns(ns_name, open_socket)
        self.frames = []
        self.start_watching()

    def _run(self):
        while not self.halt.is_set():
            try:
                data, anc, _flags, addr = self.sock.recvmsg(65536, socket.CMSG_SPACE(16))
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                return
            at = None
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= 16:
                    sec, nsec = struct.unpack("qq", value[:16])
                    at = sec + nsec / 1e9
            if at is None:
                at = time.time()
            self.frames.append(Frame(at, addr[2] == socket.PACKET_OUTGOING, data))

    def finish(self):
        """Stops capturing; the frames seen, in order."""
        if self.stop_watching():
            self.sock.close()
        return self.frames
