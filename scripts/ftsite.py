"""ftsite: the two-host site that ftvm's fault-tolerance benchmarks and demo
run on, and the pieces they share.

The site (as in crates/ftvm/tests/ft.rs): a switch namespace holding a
bridge, two host namespaces (primary host 10.201.0.1, backup host
10.201.0.2) and a client namespace (10.201.0.50). Each host's eth0 is a
veth to a port of the switch; on a host, eth0 and the VM's TAP `t0` are
enslaved to the bridge `br0`, which carries the host's address, so the
guest (10.201.0.100, given with `ftvm.ip=`) sits on the switch's network
like any machine. The client's eth0 carries its address directly.

    switch ns:   swbr ── pa (to primary host) ── pb (to backup host) ── pc (to client)
    host ns:     br0 = {eth0, t0}, 10.201.0.{1,2}/24
    client ns:   eth0 10.201.0.50/24

Every name carries a tag and this process's id, so sites never collide
with each other or with the tests'. Everything made here (namespaces,
processes, temporary files, registered undo steps) is undone by
`cleanup()`, which `session()` runs on normal exit, errors, Ctrl-C,
SIGTERM and SIGHUP.

What is here:
  * `check_host`, `private_ftvm`: the one-line refusals (not root, missing
    tool, missing binary) and a private copy of the ftvm binary, so a
    rebuild during a benchmark changes nothing.
  * `Site`: builds and tears down the site; `connect()` opens a TCP
    connection from inside the client namespace; `port_down()` pulls a
    host's switch port (a host that vanishes without a FIN).
  * `Proc`: an ftvm process in a host namespace (pinned to a core if
    asked), every output line timestamped as it arrives.
  * `start_backup`, `start_primary`, `start_plain`: `ftvm ft backup`,
    `ftvm ft primary`, and a non-FT `ftvm run` on the primary host's TAP.
  * `control`, `status`: the VM's control socket (one line each way).
  * `Resp`: a small RESP (redis) client over one TCP socket.
  * `failover_trial`: one whole failover trial (protected redis, a
    writer awaiting each key over one connection, fail the primary, check
    every acknowledged key over the same connection), used by
    bench/failover and scripts/ft-demo.
"""

import bisect
import contextlib
import ctypes
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

GUEST_IP = "10.201.0.100"
PRIMARY_HOST_IP = "10.201.0.1"
BACKUP_HOST_IP = "10.201.0.2"
CLIENT_IP = "10.201.0.50"
CHANNEL_PORT = 7700
REDIS_PORT = 6379
APPEND = f"console=ttyS0 root=/dev/vda rw quiet ftvm.ip={GUEST_IP}/24"
# redis as the FT tests run it: every write fsynced to the (shared) disk
# before it is acknowledged, so an acknowledged key is an output the
# backup must be consistent with.
REDIS_FT = "redis-server /etc/redis/redis.conf --protected-mode no --appendonly yes --appendfsync always"
# The CPU job of bench/vs-qemu, between console markers timed on the host.
JOB_START = "ftvm-bench-job-start"
JOB_END = "ftvm-bench-job-end"
CPU_JOB = "dd if=/dev/zero bs=1M count=64 2>/dev/null | sha256sum"
CPU_JOB_CMD = f"echo {JOB_START}; {CPU_JOB}; echo {JOB_END}"

BOOT_TIMEOUT = 600


class SetupError(Exception):
    """Bad input or a host that cannot run this: reported in one line."""


class TrialFailed(Exception):
    """A run that did not go as it must (a VM died, nothing answered...)."""


class ConnectionLost(Exception):
    """The client's TCP connection closed, reset or stopped answering."""


class Terminated(BaseException):
    """SIGTERM/SIGHUP: unwinds like Ctrl-C so the cleanup runs."""


# ---------------------------------------------------------------- cleanup

_UNDO = []  # callables, run last-in first-out by cleanup()


def on_cleanup(fn):
    """Registers an undo step; returns it, so it can be run early with
    `undo_now(fn)`."""
    _UNDO.append(fn)
    return fn


def undo_now(fn):
    if fn in _UNDO:
        _UNDO.remove(fn)
        fn()


def cleanup():
    while _UNDO:
        fn = _UNDO.pop()
        try:
            fn()
        except Exception as e:  # cleanup goes on whatever one step does
            print(f"ftsite: cleanup step failed: {e}", file=sys.stderr)


@contextlib.contextmanager
def session(prog):
    """Runs the body with SIGTERM/SIGHUP turned into exceptions, and
    cleans up whatever the site made however the body ends. Ctrl-C exits
    130, SIGTERM/SIGHUP 143, a SetupError 2 with its one-line message."""

    def on_signal(signum, _frame):
        raise Terminated(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # respect nohup
        signal.signal(signal.SIGHUP, on_signal)
    code = None
    try:
        yield
    except SetupError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted; cleaning up", file=sys.stderr)
        code = 130
    except Terminated as e:
        print(f"\n{prog}: {e}; cleaning up", file=sys.stderr)
        code = 143
    finally:
        # a second Ctrl-C must not cut the cleanup short
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        cleanup()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if code is not None:
        sys.exit(code)


# ------------------------------------------------------------- host checks

HOST_TOOLS = {
    "ip": "iproute2",
    "taskset": "util-linux",
    "redis-cli": "redis-tools",
    "redis-benchmark": "redis-tools",
    "iperf3": "iperf3",
}


def check_host(tools=("ip", "taskset"), cores=1):
    """Raises SetupError unless this runs as root with `tools` on PATH and
    at least `cores` CPUs."""
    if os.geteuid() != 0:
        raise SetupError("needs root: it creates network namespaces, bridges and TAP devices")
    for tool in tools:
        if not shutil.which(tool):
            pkg = HOST_TOOLS.get(tool, tool)
            raise SetupError(f"{tool} not found on the host: install Debian's {pkg} "
                             f"(apt-get install {pkg}, or scripts/install-deps.sh)")
    if (os.cpu_count() or 1) < cores:
        raise SetupError(f"needs at least {cores} cores (this host has {os.cpu_count()})")


def default_ftvm():
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    return str(Path(target) / "release" / "ftvm")


@dataclass
class Binary:
    path: str  # the private copy to run
    source: str  # where it was copied from
    sha256: str
    built: str  # the source file's modification time
    repo_commit: str  # the repository's HEAD when copied (the binary may be older)


def private_ftvm(path):
    """Copies the ftvm binary to a private temporary directory (removed at
    cleanup): the other engineer's rebuilds must not swap it mid-run."""
    src = Path(path)
    if not (src.is_file() and os.access(src, os.X_OK)):
        raise SetupError(f"ftvm binary not found at {src}: build it with `cargo build --release -p ftvm` "
                         f"or pass --ftvm PATH")
    work = tempfile.mkdtemp(prefix="ftvm-bench-bin-")
    on_cleanup(lambda: shutil.rmtree(work, ignore_errors=True))
    dst = Path(work) / "ftvm"
    shutil.copy2(src, dst)
    digest = hashlib.sha256(dst.read_bytes()).hexdigest()[:12]
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(src.stat().st_mtime))
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True)
    return Binary(str(dst), str(src), digest, built, head.stdout.strip() or "unknown")


def image_dir(ftvm):
    """The guest image's directory (`ftvm image path`), checked to hold a
    root filesystem."""
    r = subprocess.run([ftvm, "image", "path"], capture_output=True, text=True, timeout=60)
    d = Path(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
    if d is None or not (d / "rootfs.ext4").is_file():
        raise SetupError("no guest image: build it with `ftvm image build` (or `make image`)")
    return d


def work_dir(prefix):
    """A scratch directory removed at cleanup."""
    d = tempfile.mkdtemp(prefix=prefix)
    on_cleanup(lambda: shutil.rmtree(d, ignore_errors=True))
    return Path(d)


def load_script(relpath):
    """Imports one of the repository's extension-less Python scripts (e.g.
    "bench/redis") as a module, to share its functions rather than copy
    them."""
    import importlib.machinery
    import importlib.util

    path = str(REPO / relpath)
    name = relpath.replace("/", "_").replace("-", "_")
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


# -------------------------------------------------------------- namespaces


def sh(argv, check=True, timeout=60):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise TrialFailed(f"`{' '.join(argv)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r


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


class Site:
    """The switch, two hosts and a client as network namespaces."""

    HOSTS = {"primary": ("pa", PRIMARY_HOST_IP), "backup": ("pb", BACKUP_HOST_IP)}

    def __init__(self, tag):
        base = f"ftvm-{tag}-{os.getpid()}"
        self.ns = {role: f"{base}-{short}" for role, short in
                   (("switch", "sw"), ("primary", "pa"), ("backup", "pb"), ("client", "cl"))}
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

    def port_down(self, role):
        """Takes a host's switch port down: the host is cut off both ways
        at once and nothing it sends afterwards (a FIN, a heartbeat)
        leaves it."""
        sh(["ip", "-n", self.ns["switch"], "link", "set", self.HOSTS[role][0], "down"])

    def connect(self, ip, port, timeout=5.0):
        """A TCP connection opened from inside the client namespace."""

        def dial():
            s = socket.create_connection((ip, port), timeout=timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s

        return in_netns(self.ns["client"], dial)

    def close(self):
        for name in reversed(self.made):
            r = sh(["ip", "netns", "del", name], check=False)
            if r.returncode != 0:
                print(f"ftsite: warning: cannot delete network namespace {name}: {r.stderr.strip()}",
                      file=sys.stderr)
        self.made = []
        if self._undo in _UNDO:
            _UNDO.remove(self._undo)


# --------------------------------------------------------------- processes


class Proc:
    """A process (an ftvm) in a site namespace, in a session of its own,
    pinned to `core` with taskset if given. Its stdout and stderr (for a
    primary with --exec: the guest console and ftvm's messages) go to
    `log_path` line by line, each line stamped with time.monotonic() on
    arrival; `on_line(t, line)` is called for each from the reader thread."""

    def __init__(self, name, site, role, argv, log_path, core=None, on_line=None):
        self.name = name
        self.log_path = Path(log_path)
        self.lines = []  # (monotonic time, line)
        self.on_line = on_line
        self.killed_at = None
        cmd = site.argv(role, *(["taskset", "-c", str(core)] if core is not None else []), *argv)
        # `ip netns exec` and taskset exec the program: the pid is ftvm's,
        # so kill -9 hits ftvm itself.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid
        self._undo = on_cleanup(self.stop)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        with open(self.log_path, "w") as log:
            buf = b""
            while True:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                now = time.monotonic()
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    line = raw.decode("utf-8", "replace").rstrip("\r")
                    self.lines.append((now, line))
                    log.write(line + "\n")
                    log.flush()
                    if self.on_line:
                        self.on_line(now, line)
            if buf:
                line = buf.decode("utf-8", "replace")
                self.lines.append((time.monotonic(), line))
                log.write(line + "\n")

    def alive(self):
        return self.proc.poll() is None

    def line_time(self, needle):
        """When the first line containing `needle` arrived, or None."""
        for t, line in list(self.lines):
            if needle in line:
                return t
        return None

    def line(self, needle):
        for _, line in list(self.lines):
            if needle in line:
                return line
        return None

    def tail(self, n=12):
        return "\n".join(f"      | {line}" for _, line in list(self.lines)[-n:])

    def wait_for(self, needle, timeout, watch=()):
        """Waits for a line containing `needle`; TrialFailed if it does not
        come within `timeout` s or this process (or one in `watch`) ends."""
        end = time.monotonic() + timeout
        while True:
            t = self.line_time(needle)
            if t is not None:
                return t
            for p in (self, *watch):
                if not p.alive() and not (p is self and self._reader.is_alive()):
                    raise TrialFailed(f"{p.name} exited (status {p.proc.returncode}) while waiting for "
                                      f"'{needle}' from {self.name}:\n{p.tail()}")
            if time.monotonic() > end:
                raise TrialFailed(f"no '{needle}' from {self.name} within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.02)

    def wait(self, timeout):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TrialFailed(f"{self.name} did not exit within {timeout:.0f} s:\n{self.tail()}") from None
        self._reader.join(timeout=5)
        return rc

    def kill9(self):
        """kill -9 of the process itself (the kernel closes its sockets);
        returns the moment it was sent."""
        self.killed_at = time.monotonic()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        return self.killed_at

    def stop(self):
        if self.proc.poll() is None:
            for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._reader.join(timeout=5)
        if self._undo in _UNDO:
            _UNDO.remove(self._undo)


def start_backup(site, ftvm, work, shared, timeout_ms=500, core=None, extra=()):
    """`ftvm ft backup` on the backup host, listening for the channel;
    makes the shared directory if it is not there."""
    Path(shared).mkdir(parents=True, exist_ok=True)
    sock = str(Path(work) / "backup.sock")
    argv = [ftvm, "ft", "backup", "--listen", f"{BACKUP_HOST_IP}:{CHANNEL_PORT}", "--shared", str(shared),
            "--timeout", str(timeout_ms), "--control", sock, *extra]
    p = Proc("backup", site, "backup", argv, Path(work) / "backup.out", core=core)
    p.sock = sock
    p.wait_for("backup waiting for the primary", 30)
    return p


def guest_start(exec_cmd, restore):
    """How a VM starts: by booting to run `exec_cmd`, or, with `restore`
    (snapshot, disk), where a snapshot left off, on `disk`."""
    if restore is None:
        return ["--append", APPEND, "--exec", exec_cmd]
    snapshot, disk = restore
    return ["--restore", str(snapshot), "--disk", str(disk)]


def start_primary(site, ftvm, work, shared, exec_cmd, timeout_ms=500, core=None, extra=(), on_line=None,
                  restore=None):
    """`ftvm ft primary` on the primary host's TAP, running `exec_cmd` in
    the guest (or restored: see guest_start); its stdout is the guest
    console."""
    sock = str(Path(work) / "primary.sock")
    argv = [ftvm, "ft", "primary", "--backup", f"{BACKUP_HOST_IP}:{CHANNEL_PORT}", "--shared", str(shared),
            "--timeout", str(timeout_ms), "--net", "tap=t0", "--control", sock, *extra,
            *guest_start(exec_cmd, restore)]
    p = Proc("primary", site, "primary", argv, Path(work) / "primary.out", core=core, on_line=on_line)
    p.sock = sock
    return p


def disk_options(ftvm, work, primary_extra):
    """(primary options, backup options) for a pair started with
    `primary_extra`: in checkpoint mode each host gets its own fresh copy
    of the guest's root disk (Remus §2.5); otherwise the primary's disk is
    the default one on the shared storage."""
    if "checkpoint" not in primary_extra:
        return list(primary_extra), []
    copies = []
    for side in ("primary", "backup"):
        disk = Path(work) / f"{side}-disk.img"
        sh(["cp", "--sparse=always", str(image_dir(ftvm) / "rootfs.ext4"), str(disk)], timeout=300)
        copies.append(str(disk))
    return [*primary_extra, "--disk", copies[0]], ["--disk", copies[1]]


def start_plain(site, ftvm, work, exec_cmd, core=None, extra=(), on_line=None, restore=None):
    """A non-FT `ftvm run` with the primary's options, on the primary
    host's TAP, on a fresh sparse copy of the guest's root disk (or
    restored: see guest_start)."""
    sock = str(Path(work) / "plain.sock")
    if restore is None:
        disk = Path(work) / "plain-disk.img"
        sh(["cp", "--sparse=always", str(image_dir(ftvm) / "rootfs.ext4"), str(disk)], timeout=300)
        start = ["--disk", str(disk), *guest_start(exec_cmd, None)]
    else:
        start = guest_start(exec_cmd, restore)
    argv = [ftvm, "run", "--net", "tap=t0", "--control", sock, *extra, *start]
    p = Proc("ftvm run", site, "primary", argv, Path(work) / "plain.out", core=core, on_line=on_line)
    p.sock = sock
    return p


# ------------------------------------------------------------ control socket


def control(sock, command, timeout=5.0):
    """One command on a VM's control socket; its one-line reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall(command.encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply.decode("utf-8", "replace").strip()


def status(sock, timeout=5.0):
    """The status line's key=value fields, numbers parsed where they are
    numbers with a unit (lag=12ms -> 12.0, cpu_share=97% -> 97.0,
    log=0.012Mbit/s -> 0.012); `_line` holds the whole line."""
    line = control(sock, "status", timeout)
    if not line.startswith("ok"):
        raise TrialFailed(f"status on {sock}: {line}")
    fields = {"_line": line}
    for word in line.split():
        if "=" not in word:
            continue
        key, value = word.split("=", 1)
        num = value
        for unit in ("Mbit/s", "ms", "%"):
            if num.endswith(unit):
                num = num[: -len(unit)]
                break
        try:
            fields[key] = float(num)
        except ValueError:
            fields[key] = value
    return fields


def try_status(sock):
    try:
        return status(sock, timeout=2.0)
    except (OSError, TrialFailed):
        return None


# -------------------------------------------------------------------- RESP


class RespError(Exception):
    """redis answered with an error reply."""


class Resp:
    """A RESP client over one TCP socket: one command, one awaited reply."""

    def __init__(self, sock, reply_timeout=60.0):
        self.sock = sock
        self.sock.settimeout(reply_timeout)
        self.buf = b""

    def command(self, *args):
        req = [f"*{len(args)}\r\n".encode()]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            req.append(b"$%d\r\n%s\r\n" % (len(a), a))
        try:
            self.sock.sendall(b"".join(req))
            return self._reply()
        except (OSError, socket.timeout) as e:
            raise ConnectionLost(f"{type(e).__name__}: {e}") from None

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionLost("the server closed the connection")
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode("utf-8", "replace")

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data.decode("utf-8", "replace")

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == "+":
            return rest
        if kind == "-":
            raise RespError(rest)
        if kind == ":":
            return int(rest)
        if kind == "$":
            return None if int(rest) < 0 else self._exact(int(rest))
        if kind == "*":
            return None if int(rest) < 0 else [self._reply() for _ in range(int(rest))]
        raise ConnectionLost(f"not a RESP reply: {line!r}")

    def close(self):
        self.sock.close()


def wait_for_redis(site, procs, timeout=BOOT_TIMEOUT):
    """Connects from the client to the guest's redis once it answers PING;
    TrialFailed if a process in `procs` dies or `timeout` s pass."""
    t0 = time.monotonic()
    last = "nothing"
    while time.monotonic() - t0 < timeout:
        for p in procs:
            if not p.alive():
                raise TrialFailed(f"{p.name} exited (status {p.proc.returncode}) before redis answered:\n{p.tail()}")
        try:
            conn = Resp(site.connect(GUEST_IP, REDIS_PORT, timeout=2.0), reply_timeout=10.0)
            if conn.command("PING") == "PONG":
                conn.sock.settimeout(60.0)
                return conn
            conn.close()
        except (OSError, ConnectionLost, RespError) as e:
            last = str(e)
        time.sleep(0.5)
    raise TrialFailed(f"redis did not answer within {timeout:.0f} s (last: {last})")


def wait_for_port(site, ip, port, procs, timeout=BOOT_TIMEOUT):
    """Waits until a TCP port in the guest accepts a connection (which is
    closed again)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for p in procs:
            if not p.alive():
                raise TrialFailed(f"{p.name} exited (status {p.proc.returncode}) before port {port} "
                                  f"opened:\n{p.tail()}")
        try:
            site.connect(ip, port, timeout=2.0).close()
            return time.monotonic() - t0
        except OSError:
            time.sleep(0.5)
    raise TrialFailed(f"{ip}:{port} did not accept a connection within {timeout:.0f} s")


# --------------------------------------------------------- failover trial


class KeyWriter(threading.Thread):
    """Writes key0, key1, ... one SET at a time over one connection, each
    reply awaited; records when each was sent and acknowledged."""

    def __init__(self, conn):
        super().__init__(daemon=True)
        self.conn = conn
        self.acked = 0
        self.times = []  # (sent, acknowledged) per acknowledged key
        self.error = None
        self.halt = threading.Event()

    @staticmethod
    def value(i):
        return f"value-{i}"

    def run(self):
        i = 0
        while not self.halt.is_set():
            sent = time.monotonic()
            try:
                reply = self.conn.command("SET", f"key{i}", self.value(i))
            except (ConnectionLost, RespError) as e:
                self.error = e
                return
            if reply != "OK":
                self.error = RespError(f"SET key{i} answered {reply!r}")
                return
            self.times.append((sent, time.monotonic()))
            i += 1
            self.acked = i

    def first_ack_sent_after(self, t):
        """When the first key sent at or after `t` was acknowledged, or None."""
        times = self.times[:]  # the writer appends; sent times only grow
        i = bisect.bisect_left(times, t, key=lambda st: st[0])
        return times[i][1] if i < len(times) else None

    def stop(self):
        self.halt.set()
        self.join(timeout=120)


@dataclass
class TrialResult:
    kind: str
    delay: float  # seconds of writing before the failure
    boot: float = None  # start of the VMs to redis's first PONG
    failover: float = None  # failure to the first acknowledged key sent after it
    go_live: float = None  # failure to the backup's "going live" line
    longest_wait: float = None  # the longest any one SET waited for its reply
    acked: int = 0
    acked_before: int = 0
    dbsize: int = None
    missing: int = None  # acknowledged keys absent after the failover
    wrong: int = None  # acknowledged keys with another value
    dropped: bool = False  # the client's connection broke
    error: str = None
    backup_line: str = ""
    logs: dict = field(default_factory=dict)

    @property
    def lost(self):
        if self.missing is None:
            return None
        return self.missing + self.wrong

    @property
    def ok(self):
        return self.error is None and not self.dropped and self.lost == 0


def fail_primary(site, primary, kind):
    """Fails the primary host; returns the moment of the failure.
    kill:  kill -9 of the primary's ftvm: the kernel closes its sockets, so
           the backup sees the logging channel close.
    crash: the host vanishes without a FIN: its switch port goes down
           first, then the process is killed, so the backup can only tell
           by the silence (the --timeout)."""
    if kind == "kill":
        return primary.kill9()
    if kind == "crash":
        t = time.monotonic()
        site.port_down("primary")
        primary.kill9()
        return t
    raise ValueError(kind)


def check_keys(conn, count, chunk=500):
    """Reads every key written (MGET in chunks, over the same connection):
    (missing, wrong)."""
    missing = wrong = 0
    for lo in range(0, count, chunk):
        keys = [f"key{i}" for i in range(lo, min(count, lo + chunk))]
        for i, v in zip(range(lo, lo + len(keys)), conn.command("MGET", *keys)):
            if v is None:
                missing += 1
            elif v != KeyWriter.value(i):
                wrong += 1
    return missing, wrong


def failover_trial(ftvm, work, tag, kind, delay, *, timeout_ms=500, cores=(0, 1), writes_after=2.0,
                   boot_timeout=BOOT_TIMEOUT, say=lambda msg: None, primary_extra=()):
    """One failover trial on a fresh site with fresh shared storage:
    protected redis (appendonly, fsync always) on the primary host, a
    client writing keys over one connection, after `delay` s the primary
    failed (`kind`: kill or crash), then `writes_after` more seconds of
    writes on the new primary and a check over the same connection that
    DBSIZE equals the keys acknowledged and every acknowledged key reads
    back. `say(msg)` narrates. Returns a TrialResult; failures of the run
    itself land in its `error`."""
    work = Path(work)
    shared = work / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    r = TrialResult(kind=kind, delay=delay)
    site = backup = primary = writer = None
    try:
        site = Site(tag)
        say(f"site up: primary host {PRIMARY_HOST_IP}, backup host {BACKUP_HOST_IP}, client {CLIENT_IP} "
            f"on one switch")
        t_start = time.monotonic()
        primary_extra, backup_extra = disk_options(ftvm, work, primary_extra)
        backup = start_backup(site, ftvm, work, shared, timeout_ms, core=cores[1] if cores else None,
                              extra=backup_extra)
        primary = start_primary(site, ftvm, work, shared, REDIS_FT, timeout_ms, core=cores[0] if cores else None,
                                extra=primary_extra)
        r.logs = {"primary": str(primary.log_path), "backup": str(backup.log_path)}
        follows = ("commits its checkpoints" if "checkpoint" in primary_extra
                   else "replays it epoch by epoch" if "epoch" in primary_extra else "replays it in lockstep")
        say(f"booting the guest {GUEST_IP} on the primary host; the backup {follows}")
        conn = wait_for_redis(site, [primary, backup], boot_timeout)
        r.boot = time.monotonic() - t_start
        primary.wait_for("ftvm: protected", 10, watch=[backup])
        say(f"redis answered after {r.boot:.0f} s; the VM is protected; the client writes keys "
            f"one at a time over one TCP connection")
        writer = KeyWriter(conn)
        writer.start()
        time.sleep(delay)
        for p in (primary, backup):
            if not p.alive():
                raise TrialFailed(f"{p.name} exited (status {p.proc.returncode}) before the failure:\n{p.tail()}")
        if writer.error:
            raise TrialFailed(f"the client failed before the failure: {writer.error}")
        failed_at = fail_primary(site, primary, kind)
        r.acked_before = writer.acked
        say(f"{writer.acked} keys acknowledged; primary "
            + ("killed (kill -9)" if kind == "kill" else "host crashed (switch port down, then kill -9)"))
        # The failover ends when a key sent after the failure is acknowledged.
        deadline = failed_at + 60
        while writer.first_ack_sent_after(failed_at) is None:
            if writer.error or not writer.is_alive():
                break
            if not backup.alive():
                raise TrialFailed(f"the backup exited (status {backup.proc.returncode}):\n{backup.tail()}")
            if time.monotonic() > deadline:
                raise TrialFailed(f"no write acknowledged within 60 s of the failure:\n{backup.tail()}")
            time.sleep(0.01)
        first = writer.first_ack_sent_after(failed_at)
        if first is not None:
            r.failover = first - failed_at
        live_at = backup.line_time("going live")
        if live_at is None and backup.alive():
            live_at = backup.wait_for("going live", 10)
        if live_at is not None:
            r.go_live = live_at - failed_at
            r.backup_line = backup.line("going live").removeprefix("ftvm: ")
        if r.failover is not None:
            say(f"the backup went live {r.go_live:.2f} s after the failure; the client's next key was "
                f"acknowledged {r.failover:.2f} s after it" if r.go_live is not None else
                f"the client's next key was acknowledged {r.failover:.2f} s after the failure")
        time.sleep(writes_after)
        writer.stop()
        r.acked = writer.acked
        r.longest_wait = max((a - s for s, a in writer.times), default=None)
        if writer.error is not None:
            r.dropped = isinstance(writer.error, ConnectionLost)
            raise TrialFailed(f"the client's connection failed: {writer.error}")
        if not backup.alive():
            raise TrialFailed(f"the new primary exited (status {backup.proc.returncode}):\n{backup.tail()}")
        try:
            r.dbsize = conn.command("DBSIZE")
            r.missing, r.wrong = check_keys(conn, r.acked)
        except ConnectionLost as e:
            r.dropped = True
            raise TrialFailed(f"the client's connection broke while checking the keys: {e}") from None
        say(f"over the same connection: DBSIZE {r.dbsize}, {r.acked} keys acknowledged, "
            f"{r.acked - r.missing - r.wrong} of them read back intact")
        if r.dbsize != r.acked:
            raise TrialFailed(f"DBSIZE {r.dbsize} but {r.acked} keys were acknowledged")
        conn.close()
    except (TrialFailed, ConnectionLost, RespError, OSError) as e:
        r.error = str(e)
        if writer is not None and writer.is_alive():
            writer.stop()
    finally:
        for p in (primary, backup):
            if p is not None:
                p.stop()
        if site is not None:
            site.close()
    return r


def random_delays(n, lo=2.0, hi=6.0, seed=None):
    rng = random.Random(seed)
    return [round(rng.uniform(lo, hi), 2) for _ in range(n)]
