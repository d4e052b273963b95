"""One whole failover trial (protected redis, a writer awaiting each key
over one connection, fail the primary, check every acknowledged key over
the same connection), used by bench/failover and the demo."""

import bisect
import os
import random
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConnectionLost, TrialFailed
from .observe import control, event
from .host import rootfs, sparse_copy
from .proc import TIMEOUT_MS, disk_options, start_backup, start_primary
from .resp import BOOT_TIMEOUT, REDIS_FT, Resp, RespError, wait_for_redis
from .site import BACKUP_HOST_IP, CHANNEL_PORT, CLIENT_IP, GUEST_IP, PRIMARY_HOST_IP, REDIS_PORT, SPARE_HOST_IP, Site

# How far before a failure the client's longest wait is looked for, beside
# the longest after it (the trial writes for 2 s after it by default).
TAIL_WINDOW = 2.0


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
    declared: float = None  # failure to the backup's declaring it
    failed_at: float = None  # when the primary was failed (time.monotonic())
    longest_wait: float = None  # the longest any one SET waited for its reply
    typical_wait: float = None  # the median wait of the SETs answered before the failure
    spanning_wait: float = None  # the longest wait of a SET sent before the new primary went live, answered after the failure
    tail_before: float = None  # the longest wait of a SET answered in the TAIL_WINDOW s before the failure
    tail_after: float = None  # the longest wait of a SET sent after the new primary went live
    acked: int = 0
    acked_before: int = 0
    dbsize: int = None
    missing: int = None  # acknowledged keys absent after the failover
    wrong: int = None  # acknowledged keys with another value
    dropped: bool = False  # the client's connection broke
    primary_exit: int = None  # a handover: the old primary's exit status
    handed_over_ms: int = None  # a handover: guest stopped to the backup's claim, as the primary saw it
    protect_pause: float = None  # then protected onto the spare: the longest wait of a SET across it
    protect_answer: str = ""  # the new primary's answer to `protect`
    error: str = None
    backup_line: str = ""
    logs: dict = field(default_factory=dict)
    wire: list = field(default_factory=list)  # with `wire`: the client's TCP segments around the failover
    # The client's waits answered after the failure, longest first: (sent, answered) from the failure, in s.
    slowest: list = field(default_factory=list)

    @property
    def lost(self):
        if self.missing is None:
            return None
        return self.missing + self.wrong

    @property
    def ok(self):
        return self.error is None and not self.dropped and self.lost == 0


@dataclass
class ProtectedRedis:
    """A protected redis on its own site, a client connected to it."""
    site: Site
    primary: object
    backup: object
    conn: object
    shared: Path
    primary_extra: list
    backup_extra: list


def protected_redis(ftvm, work, tag, mode_args=(), min_timeout_ms=None):
    """A fresh site and shared storage under `work`, a backup, then a
    primary running redis (appendonly, fsync always) with `mode_args`
    (each host its own disk copy in checkpoint mode) and the heartbeat
    timeout's floor `min_timeout_ms` (None: ftvm's default); returns once
    redis answers and the primary says it is protected."""
    site = Site(tag)
    shared = Path(work) / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    primary_extra, backup_extra = disk_options(ftvm, work, list(mode_args))
    backup = start_backup(site, ftvm, work, shared, TIMEOUT_MS, extra=backup_extra, min_timeout_ms=min_timeout_ms)
    primary = start_primary(site, ftvm, work, shared, REDIS_FT, TIMEOUT_MS, extra=primary_extra,
                            min_timeout_ms=min_timeout_ms)
    conn = wait_for_redis(site, [primary, backup], BOOT_TIMEOUT)
    event(primary, "protected", timeout=10, watch=[backup])
    return ProtectedRedis(site, primary, backup, conn, shared, primary_extra, backup_extra)


def fail_primary(site, primary, kind):
    """Fails the primary host; returns the moment of the failure.
    kill:  kill -9 of the primary's ftvm: the kernel closes its sockets, so
           the backup sees the logging channel close.
    crash: the host vanishes without a FIN: its switch port goes down
           first, then the process is killed, so the backup can only tell
           by the silence (the --timeout).
    handover: not a failure: SIGTERM to the primary's ftvm, as a host
           being shut down sends it; the primary hands the VM over.
    handover-command: `handover` on the primary's control socket; its
           answer lands in primary.handover_answer once it comes."""
    if kind == "handover":
        t = time.monotonic()
        os.kill(primary.pid, signal.SIGTERM)
        return t
    if kind == "handover-command":
        primary.handover_answer = None

        def ask():
            primary.handover_answer = control(primary.sock, "handover", timeout=60)

        t = time.monotonic()
        threading.Thread(target=ask, daemon=True).start()
        return t
    if kind == "kill":
        return primary.kill9()
    if kind == "crash":
        t = time.monotonic()
        site.port_down("primary")
        primary.kill9()
        return t
    raise ValueError(kind)


def shutdown_and_fsck(site, conn, vm, disk):
    """Shuts the guest's redis down, which ends the guest, over a fresh
    connection (`conn` is closed); `vm`'s ftvm must exit 0, and its copy
    of the disk at `disk` pass `e2fsck -fn`."""
    conn.close()
    conn = Resp(site.connect(GUEST_IP, REDIS_PORT, timeout=10), reply_timeout=30)
    try:
        conn.command("SHUTDOWN")  # the reply is the connection closing
    except (ConnectionLost, RespError):
        pass
    assert vm.wait(60) == 0, vm.output()
    fsck = subprocess.run(["e2fsck", "-fn", str(disk)], capture_output=True)
    assert fsck.returncode == 0, fsck.stdout.decode(errors="replace") + fsck.stderr.decode(errors="replace")


def aof_writes(image):
    """How many SETs redis's append-only files hold in the disk image at
    `image` (the VM gone): what the guest would find mounting it again."""
    def debugfs(req):
        out = subprocess.run(["debugfs", "-R", req, str(image)], capture_output=True)
        return out.stdout.decode("utf-8", "replace")

    d = "/var/lib/redis/appendonlydir"
    listing = debugfs(f"ls -l {d}")
    return sum(debugfs(f"cat {d}/{f}").count("\r\nSET\r\n") for f in listing.split() if f.endswith(".aof"))


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


def stop_and_check(writer, conn, settle=1.0):
    """Lets `writer` run `settle` s more, stops it, and asserts what its
    client saw: the connection held, and every acknowledged key reads back
    over it (DBSIZE is their count)."""
    time.sleep(settle)
    writer.stop()
    assert writer.error is None, f"the client's connection failed: {writer.error}"
    assert conn.command("DBSIZE") == writer.acked
    assert check_keys(conn, writer.acked) == (0, 0)


def tcp_timeline(frames, failed, end, port=REDIS_PORT, before=0.05):
    """The TCP segments to or from `port` among captured `frames` (on the
    client's interface) from `before` s ahead of `failed` to `end` (wall
    clock), one line each: the time from the failure, the direction, the
    sequence and acknowledgement numbers relative to the first seen each
    way, the payload's length and the flags."""
    lines, base = [], {}
    for f in frames:
        d = f.data
        if len(d) < 34 or d[12:14] != b"\x08\x00" or d[23] != 6:
            continue
        ihl = (d[14] & 0x0F) * 4
        tcp = d[14 + ihl:]
        if len(tcp) < 20:
            continue
        sport, dport, seq, ack = struct.unpack("!HHII", tcp[:12])
        if port not in (sport, dport):
            continue
        to_server = dport == port
        ours = base.setdefault(to_server, seq)
        theirs = base.get(not to_server)
        if not failed - before <= f.at <= end:
            continue
        flags = "".join(c for c, bit in zip("FSRPAU", (1, 2, 4, 8, 16, 32)) if tcp[13] & bit)
        total = struct.unpack("!H", d[16:18])[0]
        length = total - ihl - (tcp[12] >> 4) * 4
        who = "client -> guest" if to_server else "guest -> client"
        lines.append(f"{f.at - failed:+8.3f} s {who} seq {(seq - ours) % 2**32} "
                     f"ack {'?' if theirs is None else (ack - theirs) % 2**32} len {length} {flags}")
    return lines


def failover_trial(ftvm, work, tag, kind, delay, *, timeout_ms=TIMEOUT_MS, cores=(0, 1), writes_after=2.0,
                   boot_timeout=BOOT_TIMEOUT, say=lambda msg: None, primary_extra=(), then_protect=False,
                   watch=None, wire=False):
    """One failover trial (or handover: `kind`, see fail_primary) on a fresh site with fresh shared storage:
    protected redis (appendonly, fsync always) on the primary host, a
    client writing keys over one connection, after `delay` s the primary
    failed (`kind`: kill or crash), then `writes_after` more seconds of
    writes on the new primary and a check over the same connection that
    DBSIZE equals the keys acknowledged and every acknowledged key reads
    back. `say(msg)` narrates. With `then_protect`, the new primary is
    protected onto a third host (the spare) once it serves, before those
    writes: the handover and the protection together move the primary.
    `watch(primary, backup)`, if given, is called about once a second
    while the client writes before the failure. With `wire`, the client's
    eth0 is captured and the result's `wire` lists its TCP segments from
    just before the failure to the first acknowledgement after it (see
    tcp_timeline). Returns a TrialResult; failures of the run itself land in its
    `error`."""
    work = Path(work)
    shared = work / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    r = TrialResult(kind=kind, delay=delay)
    site = backup = primary = writer = spare = None
    try:
        site = Site(tag, spare=then_protect)
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
        event(primary, "protected", timeout=10, watch=[backup])
        say(f"redis answered after {r.boot:.0f} s; the VM is protected; the client writes keys "
            f"one at a time over one TCP connection")
        writer = KeyWriter(conn)
        capture = site.capture("client", "eth0") if wire else None
        writer.start()
        until = time.monotonic() + delay
        while time.monotonic() < until:
            time.sleep(max(0.0, min(1.0, until - time.monotonic())))
            if watch is not None and time.monotonic() < until:
                watch(primary, backup)
        for p in (primary, backup):
            if not p.alive():
                raise TrialFailed(f"{p.name} exited (status {p.proc.returncode}) before the failure:\n{p.tail()}")
        if writer.error:
            raise TrialFailed(f"the client failed before the failure: {writer.error}")
        failed_at = r.failed_at = fail_primary(site, primary, kind)
        r.acked_before = writer.acked
        say(f"{writer.acked} keys acknowledged; primary " + {
            "kill": "killed (kill -9)",
            "crash": "host crashed (switch port down, then kill -9)",
            "handover": "sent SIGTERM (a host going down for maintenance): it hands the VM over",
            "handover-command": "asked to hand the VM over (handover on its control socket)",
        }[kind])
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
        if capture is not None:
            # Both clocks read now: the capture stamps frames with the
            # wall clock, the trial keeps the monotonic one.
            wall = time.time() - time.monotonic()
            end = (first if first is not None else time.monotonic()) + 0.01
            r.wire = tcp_timeline(capture.finish(), failed_at + wall, end + wall)
        live = event(backup, "going-live")
        if live is None and backup.alive():
            live = event(backup, "going-live", timeout=10)
        declared = event(backup, "declared-failed")
        if declared is not None:
            r.declared = declared.t - failed_at
        if live is not None:
            r.go_live = live.t - failed_at
            r.backup_line = live.text
        if r.failover is not None:
            say(f"the backup went live {r.go_live:.3f} s after the failure; the client's next key was "
                f"acknowledged {r.failover:.2f} s after it" if r.go_live is not None else
                f"the client's next key was acknowledged {r.failover:.2f} s after the failure")
        if kind.startswith("handover"):
            # The old primary exits once the backup has the VM.
            r.primary_exit = primary.wait(30)
            done = event(primary, "handed-over")
            if done is not None:
                r.handed_over_ms = done.fields.get("millis")
        protected_at = answered_at = None
        if then_protect:
            spare_extra = []
            if "checkpoint" in primary_extra:
                spare_extra = ["--disk", str(sparse_copy(rootfs(ftvm), work / "spare-disk.img"))]
            spare = start_backup(site, ftvm, work, shared, timeout_ms, extra=spare_extra, role="spare")
            time.sleep(1.0)
            mode = [a for a in primary_extra if a in ("--mode", "epoch", "checkpoint")]
            protected_at = time.monotonic()
            r.protect_answer = control(backup.sock, " ".join(
                ["protect", "--backup", f"{SPARE_HOST_IP}:{CHANNEL_PORT}", "--shared", str(shared),
                 "--timeout", str(timeout_ms), *mode]), timeout=300)
            answered_at = time.monotonic()
            if not r.protect_answer.startswith("ok protected"):
                raise TrialFailed(f"protecting the new primary failed: {r.protect_answer}")
            say(f"the new primary is protected onto the spare host: {r.protect_answer}")
        time.sleep(writes_after)
        writer.stop()
        r.acked = writer.acked
        r.longest_wait = max((a - s for s, a in writer.times), default=None)
        # The requests the failure could have delayed: answered after it,
        # sent before the new primary went live (or, that unknown, before
        # the first one it answered).
        live_at = failed_at + (r.go_live if r.go_live is not None else r.failover or 0.0)
        r.spanning_wait = max((a - s for s, a in writer.times if a >= failed_at and s <= live_at), default=None)
        r.tail_before = max((a - s for s, a in writer.times if failed_at - TAIL_WINDOW <= a < failed_at),
                            default=None)
        r.tail_after = max((a - s for s, a in writer.times if live_at < s
                            and (protected_at is None or a < protected_at)), default=None)
        r.slowest = sorted(((s - failed_at, a - failed_at) for s, a in writer.times if a >= failed_at),
                           key=lambda w: w[0] - w[1])[:5]
        if protected_at is not None:
            r.protect_pause = max((a - s for s, a in writer.times if a >= protected_at and s <= answered_at),
                                  default=None)
        before = sorted(a - s for s, a in writer.times if a < failed_at)
        r.typical_wait = before[len(before) // 2] if before else None
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
        for p in (primary, backup, spare):
            if p is not None:
                p.stop()
        if site is not None:
            site.close()
    return r


def random_delays(n, lo=2.0, hi=6.0, seed=None):
    rng = random.Random(seed)
    return [round(rng.uniform(lo, hi), 2) for _ in range(n)]
