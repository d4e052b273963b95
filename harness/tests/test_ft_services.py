"""A Debian server under fault tolerance (issue 63): the web image
(PostgreSQL, nginx and openssh-server, as apt configures them, started by
systemd; built as crates/ftvm/tests/services.rs builds it) runs as a
protected pair on the site's two hosts, one pair per mode (lockstep,
checkpoint). From the client, `pgbench -c 4 -j 2 -T 60` runs while the
primary is killed: pgbench ends with no error (no client aborted on a lost
connection), `pgbench_history` on the new primary holds every transaction
pgbench counted, and the services run there. `ftvm console` types a
command on the primary's console and sees its output, and, after the
failover, on the new primary's (the backup's own control socket: in a
deployment each host's `--control` path, the same on both).

The image's pg_hba.conf trusts 10.200.0.0/24 (services.rs's network): the
guest gets 10.200.0.100 on the site's switch, and the client a second
address in that network, 10.200.0.50.
"""

import random
import re
import subprocess
import threading
import time

import ftsite
from ftsite import (BOOT_TIMEOUT, PRIMARY_HOST_IP, Proc, Site, TrialFailed, event, status)

GUEST = "10.200.0.100"
CLIENT = "10.200.0.50"
APPEND = f"console=ttyS0 root=/dev/vda rw ftvm.ip={GUEST}/24"
# The numbers.
CLIENTS = 4
SECONDS = 60
PROMPT = "root@ftvm-guest:~# "
SERVICES = ["postgresql@17-main", "postgresql", "nginx", "ssh"]


def web_pair(ftvm, tag, scratch, mode):
    """The web image as a pair on a site of its own, in `mode`; the
    client's second address. Returns (site, primary, backup, root's key)."""
    image, key = ftsite.web_image(ftvm)
    site = Site(tag)
    site.run("client", ["ip", "addr", "add", f"{CLIENT}/24", "dev", "eth0"])
    shared = scratch / "shared"
    shared.mkdir()
    primary_extra = ["--image", ftsite.WEB_IMAGE, "--mem", "1G", "--mode", mode]
    backup_extra = []
    if mode == "checkpoint":
        # Each host its own copy of the image's root disk (Remus §2.5).
        mine, theirs = (str(ftsite.sparse_copy(image / "rootfs.ext4", scratch / f"{side}-disk.img"))
                        for side in ("primary", "backup"))
        primary_extra += ["--disk", mine]
        backup_extra += ["--disk", theirs]
    b = ftsite.start_backup(site, ftvm, scratch, shared, ftsite.TIMEOUT_MS, extra=backup_extra,
                            min_timeout_ms=ftsite.TEST_MIN_TIMEOUT_MS)
    p = ftsite.start_primary(site, ftvm, scratch, shared, None, ftsite.TIMEOUT_MS, extra=primary_extra,
                             min_timeout_ms=ftsite.TEST_MIN_TIMEOUT_MS, append=APPEND)
    return site, p, b, key


def client(site, argv, timeout=60):
    """A command from the client: (exit status, stdout and stderr)."""
    r = site.run("client", argv, check=False, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def psql(site, sql, timeout=30):
    return client(site, ["psql", "-h", GUEST, "-U", "postgres", "-tAc", sql], timeout)


def ssh(site, key, command):
    return client(site, ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                         "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                         f"root@{GUEST}", command])


def wait_until(what, limit, vms, check):
    """Polls check() -> (ok, text) until ok, the VMs still running."""
    started = time.monotonic()
    while True:
        for vm in vms:
            vm.assert_running()
        ok, text = check()
        if ok:
            print(f"{what}: after {time.monotonic() - started:.1f} s")
            return text
        if time.monotonic() - started > limit:
            raise TrialFailed(f"{what}: not within {limit} s (last: {text})")
        time.sleep(1)


class Console:
    """`ftvm console SOCK` with a pipe for its keyboard: what it shows is
    collected on a thread."""

    def __init__(self, ftvm, sock):
        self.proc = subprocess.Popen([ftvm, "console", str(sock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.shown = b""
        self.err = b""
        self._lock = threading.Lock()
        self._readers = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                         for s, n in ((self.proc.stdout, "shown"), (self.proc.stderr, "err"))]
        for r in self._readers:
            r.start()

    def _read(self, pipe, name):
        while chunk := pipe.read1(4096):
            with self._lock:
                setattr(self, name, getattr(self, name) + chunk)

    def type(self, keys):
        self.proc.stdin.write(keys)
        self.proc.stdin.flush()

    def expect(self, needle, timeout=60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if needle.encode() in self.shown:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise TrialFailed(f"the console did not show {needle!r} within {timeout} s (ftvm console: "
                          f"{self.proc.poll()}, {self.err.decode(errors='replace')!r}); it showed: "
                          f"{self.shown[-2000:].decode(errors='replace')!r}")

    def detach(self):
        """Ctrl-]; the client's exit status."""
        self.type(b"\x1d")
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def console_command(ftvm, sock, tag, prompt, shown=None):
    """Attaches to the console at `sock`, types a command, sees its
    output, detaches. With `prompt`, waits first for the shell's prompt
    (in the output replayed on attaching, or after): keys typed before
    root's autologin are flushed by the login. With `shown`, that must be
    in the output replayed on attaching."""
    c = Console(ftvm, sock)
    try:
        if prompt:
            c.expect(PROMPT, timeout=BOOT_TIMEOUT)
        if shown:
            c.expect(shown, timeout=10)
        # The shell's echo shows the command as typed; only its output
        # has the sum.
        c.type(f"echo {tag}-$((6 * 7)) $(hostname)\n".encode())
        c.expect(f"{tag}-42 ")
    finally:
        rc = c.detach()
    assert rc == 0, f"ftvm console {sock} ended with {rc}: {c.err.decode(errors='replace')}"
    assert b"attached to" in c.err, c.err


PROGRESS = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps")


def pgbench_failover(ftvm, tag, scratch, mode):
    """The web image as a pair in `mode`; the console typed on; pgbench
    under a kill of the primary; what the new primary holds and runs; its
    console. Prints the figures: tps before and after, the pause."""
    started = time.monotonic()
    site, primary, backup, key = web_pair(ftvm, tag, scratch, mode)

    def answers():
        rc, out = psql(site, "select 1")
        return rc == 0, out

    wait_until("psql answers", BOOT_TIMEOUT, [primary, backup], answers)
    print(f"booted, postgres answers: {time.monotonic() - started:.1f} s after the start")

    # The console of the protected primary; the backup's control socket
    # refuses one until its VM runs there.
    console_command(ftvm, primary.sock, "before", prompt=True)
    c = Console(ftvm, backup.sock)
    rc = c.proc.wait(timeout=30)
    assert rc != 0 and b"a backup shows no console until it goes live" in c.err, (rc, c.err)

    rc, out = client(site, ["pgbench", "-h", GUEST, "-U", "postgres", "-i", "postgres"], timeout=600)
    assert rc == 0, f"pgbench -i: {out}"
    st = status(backup.sock)
    assert st.get("role") == "backup" and str(st.get("primary")).startswith(f"{PRIMARY_HOST_IP}:"), st["_raw"]

    bench = Proc("pgbench", site, "client",
                 ["pgbench", "-h", GUEST, "-U", "postgres", "-c", str(CLIENTS), "-j", "2", "-T", str(SECONDS),
                  "-P", "1", "-l", "--log-prefix", str(scratch / "pgbench-log"), "postgres"],
                 scratch / "pgbench.out")
    ran = time.monotonic()
    time.sleep(15 + random.uniform(0, 15))
    killed = primary.kill9()
    killed_wall = time.time() - (time.monotonic() - killed)
    live = event(backup, "going-live", timeout=30)
    print(f"primary killed {killed - ran:.1f} s into the run; the backup went live {live.t - killed:.3f} s later: "
          f"{live.text}")
    rc = bench.wait(SECONDS + 120)
    out = bench.output()
    print(out)
    assert rc == 0, f"pgbench ended with {rc}:\n{out}"
    assert "abort" not in out.lower() and "error" not in out.lower(), f"pgbench:\n{out}"
    m = re.search(r"number of transactions actually processed: (\d+)", out)
    assert m, out
    processed = int(m.group(1))
    failed = re.search(r"number of failed transactions: (\d+)", out)
    assert failed is None or int(failed.group(1)) == 0, out

    # The new primary: every transaction pgbench counted, the services.
    backup.assert_running()
    st = status(backup.sock)
    assert st.get("unprotected") is True, st["_raw"]
    rc, count = psql(site, "select count(*) from pgbench_history")
    assert rc == 0, count
    assert int(count.strip()) == processed, \
        f"pgbench counted {processed} transactions, pgbench_history holds {count.strip()}"
    _, state = ssh(site, key, "systemctl is-system-running; systemctl --failed --no-legend")
    print(f"the new primary's systemd: {state.strip()}")
    rc, active = ssh(site, key, f"systemctl is-active {' '.join(SERVICES)}")
    assert rc == 0 and active.split() == ["active"] * len(SERVICES), f"services on the new primary: {active}"
    rc, page = client(site, ["curl", "-sS", "--max-time", "10", f"http://{GUEST}/"])
    assert rc == 0 and "Welcome to nginx" in page, f"nginx on the new primary: {page}"

    # The new primary's console, by its own control socket. In lockstep
    # it shows first what the console showed before the failover (the
    # backup's replay of it); a checkpoint-mode backup never ran the guest.
    console_command(ftvm, backup.sock, "after", prompt=False, shown="before-42 " if mode == "lockstep" else None)

    # Throughput before and after the kill (pgbench's progress, a line a
    # second), and the pause the clients saw: the longest transaction in
    # flight at the kill (pgbench's log, a line a transaction: its
    # latency and when it ended).
    at_kill = killed - bench.started
    points = [(float(t), float(tps)) for t, tps in PROGRESS.findall(out)]
    before = [tps for t, tps in points if 1 < t < at_kill - 1]
    after = [tps for t, tps in points if t > at_kill + 5]
    logged = []
    for f in scratch.glob("pgbench-log.*"):
        for line in f.read_text().splitlines():
            fields = line.split()
            latency, end = int(fields[2]) / 1e6, int(fields[4]) + int(fields[5]) / 1e6
            logged.append((end - latency, end, latency))
    assert len(logged) == processed, f"pgbench logged {len(logged)} transactions and counted {processed}"
    spanning = [lat for begun, end, lat in logged if begun <= killed_wall <= end]
    usual = sorted(lat for _, _, lat in logged)[len(logged) // 2]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    print(f"{mode}: {processed} transactions, all in pgbench_history; {mean(before):.1f} tps before the kill, "
          f"{mean(after):.1f} after; the longest transaction across the kill took "
          f"{max(spanning, default=0) * 1000:.0f} ms ({len(spanning)} in flight; median of all "
          f"{usual * 1000:.0f} ms); the test took {time.monotonic() - started:.0f} s")


def test_lockstep_pgbench_runs_through_a_failover_with_every_transaction_and_the_console_follows(ftvm, scratch):
    pgbench_failover(ftvm, "pgl", scratch, "lockstep")


def test_checkpoint_pgbench_runs_through_a_failover_with_every_transaction_and_the_console_follows(ftvm, scratch):
    pgbench_failover(ftvm, "pgc", scratch, "checkpoint")
