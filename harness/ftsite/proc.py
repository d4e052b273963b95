"""ftvm processes in the site's host namespaces.

A `Proc` runs one program (an ftvm) in a namespace of the site, in a
session of its own, pinned to a core if asked. Its stdout (for a VM: the
guest's console) and its stderr (ftvm's own messages) are read on two
threads; every line is stamped with time.monotonic() as it arrives and
written to one log file, stamped with the seconds since the start and
marked `|` for the console and `!` for ftvm's messages.

The console is the guest's: tests and benches look for their own markers
in it (`wait_console`, `console_time`, `console_has`). ftvm's messages are
not read here: a pair's sides keep a journal of typed events
(`--events FILE`, JSON lines), which `observe.event()` reads.

`start_backup`, `start_primary` and `start_plain` start `ftvm ft backup`,
`ftvm ft primary` and a non-FT `ftvm run` on the primary host's TAP with
the options the tests and benches share.
"""

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from .cleanup import forget, on_cleanup
from .errors import TrialFailed
from .host import rootfs, sparse_copy
from .site import BACKUP_HOST_IP, CHANNEL_PORT, GUEST_IP, Site

APPEND = f"console=ttyS0 root=/dev/vda rw quiet ftvm.ip={GUEST_IP}/24"
# The failure-detection timeout the tests and benches run with (ftvm's default).
TIMEOUT_MS = 500
# The floor of the learned heartbeat timeout in the tests (ftvm's default
# is 60 ms, which the benches keep). The tests run two at a time, up to
# four VMs and their pairs' threads on a shared 2-core host whose virtual
# CPUs stall now and then for longer than that: ci69 saw two healthy pairs,
# in two tests at once, each declare its peer failed after 81 ms without a
# heartbeat. No test is about how soon a failure is declared
# (bench/failover and bench/false-alarms are, at the default).
TEST_MIN_TIMEOUT_MS = 250


class Proc:
    """A process in a site namespace (see the module's doc). `on_line(t,
    line)` is called for each console line from the reader thread."""

    def __init__(self, name, site, role, argv, log_path, core=None, on_line=None):
        self.name = name
        self.log_path = Path(log_path)
        self.lines = []  # (monotonic time, line): console and messages as they arrived
        self.console = []  # (monotonic time, line): stdout only
        self.messages = []  # (monotonic time, line): stderr only
        self.on_line = on_line
        self.killed_at = None
        self.sock = None  # its control socket, if it has one
        self.events = None  # its journal of events (`--events`), if it keeps one
        # Each namespace is a host of its own to ftvm (which otherwise
        # takes /etc/machine-id, one for all of them): a pair's sides
        # compare identities to refuse a backup on its primary's host.
        host = ["env", f"FTVM_HOST_ID={site.tag}-{role}"]
        cmd = site.argv(role, *host, *(["taskset", "-c", str(core)] if core is not None else []), *argv)
        self._log = open(self.log_path, "w")
        self._log_lock = threading.Lock()
        self.started = time.monotonic()
        # `ip netns exec` and taskset exec the program: the pid is ftvm's,
        # so kill -9 hits ftvm itself.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.pid = self.proc.pid
        self._undo = on_cleanup(self.stop)
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.console, "|"), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.messages, "!"), daemon=True)]
        for r in self._readers:
            r.start()

    def _take(self, now, line, into, mark):
        into.append((now, line))
        self.lines.append((now, line))
        with self._log_lock:
            if not self._log.closed:
                self._log.write(f"{now - self.started:9.3f} {mark} {line}\n")
                self._log.flush()
        if self.on_line and into is self.console:
            self.on_line(now, line)

    def _read(self, pipe, into, mark):
        buf = b""
        fd = pipe.fileno()
        while True:
            chunk = os.read(fd, 65536)
            now = time.monotonic()
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                self._take(now, raw.decode("utf-8", "replace").rstrip("\r"), into, mark)
        if buf:
            self._take(time.monotonic(), buf.decode("utf-8", "replace"), into, mark)

    def reading(self):
        """Whether output may still arrive."""
        return any(r.is_alive() for r in self._readers)

    def alive(self):
        return self.proc.poll() is None

    def returncode(self):
        return self.proc.poll()

    def assert_running(self):
        """TrialFailed if the process has exited."""
        if not self.alive():
            raise TrialFailed(f"{self.name} exited (status {self.proc.returncode}); its output:\n{self.tail(40)}")

    def tail(self, n=12):
        return "\n".join(f"      | {line}" for _, line in list(self.lines)[-n:])

    def output(self):
        """Everything it printed so far, console and messages, in order."""
        return "\n".join(line for _, line in list(self.lines))

    def console_time(self, needle):
        """When the first console line containing `needle` arrived, or None."""
        for t, line in list(self.console):
            if needle in line:
                return t
        return None

    def console_has(self, needle):
        return self.console_time(needle) is not None

    def _await(self, find, what, timeout, watch=()):
        """Polls find() until it returns something; TrialFailed if it does
        not within `timeout` s, or this process (once its output is all
        read) or one in `watch` ends first."""
        end = time.monotonic() + timeout
        while True:
            found = find()
            if found is not None:
                return found
            for p in (self, *watch):
                if not p.alive() and not (p is self and self.reading()):
                    raise TrialFailed(f"{p.name} exited (status {p.proc.returncode}) while waiting for "
                                      f"{what} from {self.name}:\n{p.tail()}")
            if time.monotonic() > end:
                raise TrialFailed(f"no {what} from {self.name} within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.02)

    def wait_console(self, needle, timeout, watch=()):
        """Waits for a console line containing `needle`; returns when it
        arrived."""
        return self._await(lambda: self.console_time(needle), f"'{needle}' on the console", timeout, watch)

    def wait(self, timeout):
        """Waits for the process to exit and its output to be read; its
        exit status (negative: killed by that signal)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TrialFailed(f"{self.name} did not exit within {timeout:.0f} s:\n{self.tail()}") from None
        for r in self._readers:
            r.join(timeout=5)
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
        for r in self._readers:
            r.join(timeout=5)
        with self._log_lock:
            self._log.close()
        forget(self._undo)


def arbiter_options(shared):
    """The options that name the pair's arbiter: `shared`, a directory
    (made if it is not there), or a list of options as they are (--etcd
    URLS --vm-name NAME ...)."""
    if isinstance(shared, (list, tuple)):
        return list(shared)
    Path(shared).mkdir(parents=True, exist_ok=True)
    return ["--shared", str(shared)]


def timing_options(timeout_ms, min_timeout_ms):
    """--timeout, and --min-timeout unless `min_timeout_ms` is None
    (ftvm's default floor)."""
    return ["--timeout", str(timeout_ms), *(["--min-timeout", str(min_timeout_ms)] if min_timeout_ms else [])]


def start_backup(site, ftvm, work, shared, timeout_ms=TIMEOUT_MS, core=None, extra=(), wait=True, role="backup",
                 min_timeout_ms=None):
    """`ftvm ft backup` on the backup host (or the spare: `role`),
    listening for the channel, its arbiter `shared` (see
    arbiter_options), its timeouts `timeout_ms` and `min_timeout_ms`
    (see timing_options). Returns once it listens (unless `wait` is
    false). Its socket, journal and output are named after `role`."""
    from .observe import event

    sock = str(Path(work) / f"{role}.sock")
    events = _fresh(Path(work) / f"{role}.events")
    ip = Site.HOSTS[role][1]
    # The backup's own TAP for the VM's NIC (a backup takes no host
    # resource's name from its primary), named as the primary's.
    argv = [ftvm, "ft", "backup", "--listen", f"{ip}:{CHANNEL_PORT}", *arbiter_options(shared),
            *timing_options(timeout_ms, min_timeout_ms), "--net", "tap=t0", "--control", sock, "--events", events,
            *extra]
    p = Proc(role, site, role, argv, Path(work) / f"{role}.out", core=core)
    p.sock, p.events = sock, events
    if wait:
        event(p, "listening", timeout=30)
    return p


def guest_start(exec_cmd, restore, append=APPEND):
    """How a VM starts: by booting (with the kernel command line `append`)
    to run `exec_cmd`, or its image's services under systemd if it is
    None, or, with `restore` (snapshot, disk or None), where a snapshot
    left off, on `disk`."""
    if restore is None:
        return ["--append", append, *(["--exec", exec_cmd] if exec_cmd is not None else [])]
    snapshot, disk = restore
    return ["--restore", str(snapshot), *(["--disk", str(disk)] if disk is not None else [])]


def start_primary(site, ftvm, work, shared, exec_cmd, timeout_ms=TIMEOUT_MS, core=None, extra=(), on_line=None,
                  restore=None, net=True, min_timeout_ms=None, append=APPEND):
    """`ftvm ft primary` on the primary host's TAP (unless not `net`),
    its arbiter `shared` (see arbiter_options), its timeouts (see
    timing_options), running `exec_cmd` in the
    guest (or restored, or booted with `append`: see guest_start); its
    stdout is the guest console."""
    sock = str(Path(work) / "primary.sock")
    events = _fresh(Path(work) / "primary.events")
    argv = [ftvm, "ft", "primary", "--backup", f"{BACKUP_HOST_IP}:{CHANNEL_PORT}", *arbiter_options(shared),
            *timing_options(timeout_ms, min_timeout_ms), *(["--net", "tap=t0"] if net else []), "--control", sock,
            "--events", events, *extra, *guest_start(exec_cmd, restore, append)]
    p = Proc("primary", site, "primary", argv, Path(work) / "primary.out", core=core, on_line=on_line)
    p.sock, p.events = sock, events
    return p


def _fresh(path):
    """`path` with nothing at it: a journal of this run's events only."""
    Path(path).unlink(missing_ok=True)
    return str(path)


def disk_options(ftvm, work, primary_extra):
    """(primary options, backup options) for a pair started with
    `primary_extra`: in checkpoint mode each host gets its own fresh copy
    of the guest's root disk (Remus §2.5); otherwise the primary's disk is
    the default one on the shared storage."""
    if "checkpoint" not in primary_extra:
        return list(primary_extra), []
    copies = two_copies(ftvm, work)
    return [*primary_extra, "--disk", copies[0]], ["--disk", copies[1]]


def two_copies(ftvm, work):
    """Two fresh copies of the default guest's root disk in `work`, for
    the primary and the backup: (primary-disk.img, backup-disk.img)."""
    image = rootfs(ftvm)
    return tuple(str(sparse_copy(image, Path(work) / f"{side}-disk.img")) for side in ("primary", "backup"))


def start_plain(site, ftvm, work, exec_cmd, core=None, extra=(), on_line=None, restore=None, disk=None):
    """A non-FT `ftvm run` with the primary's options, on the primary
    host's TAP, on `disk` or a fresh sparse copy of the guest's root disk
    (or restored: see guest_start)."""
    sock = str(Path(work) / "plain.sock")
    if restore is None:
        if disk is None:
            disk = sparse_copy(rootfs(ftvm), Path(work) / "plain-disk.img")
        start = ["--disk", str(disk), *guest_start(exec_cmd, None)]
    else:
        start = guest_start(exec_cmd, restore)
    argv = [ftvm, "run", "--net", "tap=t0", "--control", sock, *extra, *start]
    p = Proc("ftvm run", site, "primary", argv, Path(work) / "plain.out", core=core, on_line=on_line)
    p.sock = sock
    return p
