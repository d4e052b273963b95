"""Fault tolerance end to end (issues 5, 6 and 7: lockstep, epoch and
checkpoint mode): two hosts and a client as network namespaces on a switch
(ftsite.Site); each host bridges its TAP onto its uplink. The primary runs
the default guest with redis, the backup replays it, and the tests fail
things: kill the primary, kill the backup, cut the link between them.

(Ported test for test from crates/ftvm/tests/ft.rs, with the same checks.)
"""

import os
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest

import ftsite
from ftsite import (BOOT_TIMEOUT, GUEST_IP, PRIMARY_HOST_IP, REDIS_PORT, ConnectionLost, Resp, RespError, Site,
                    control, event, status, wait_for_redis)

# The failure-detection timeout the tests run with (the default).
TIMEOUT_MS = ftsite.TIMEOUT_MS
FLOOR = ftsite.TEST_MIN_TIMEOUT_MS
REDIS = ftsite.REDIS_FT
# How long the output tests make the backup hold each acknowledgement.
ACK_DELAY = 0.4
# An epoch length that is no power of two, so that multiples of it do
# not line up with anything else in the machine.
EPOCH = 40_009


# ------------------------------------------------------------------ helpers


def start_pair(ftvm, site, scratch, exec_cmd, primary=(), backup=()):
    """A backup, then a primary running `exec_cmd` in the guest, on the
    shared storage in the scratch directory."""
    shared = scratch / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    b = ftsite.start_backup(site, ftvm, scratch, shared, TIMEOUT_MS, extra=backup, min_timeout_ms=FLOOR)
    p = ftsite.start_primary(site, ftvm, scratch, shared, exec_cmd, TIMEOUT_MS, extra=primary, min_timeout_ms=FLOOR)
    return p, b


def protected_vm(ftvm, tag, scratch, exec_cmd, primary=(), backup=()):
    """A site, and a primary running `exec_cmd` with its backup started
    first."""
    site = Site(tag)
    p, b = start_pair(ftvm, site, scratch, exec_cmd, primary, backup)
    return site, p, b


def checkpoint_pair(ftvm, tag, scratch, exec_cmd, backup_extra=(), primary_extra=()):
    """A checkpoint-mode pair on its own site, each host with its own copy
    of the disk."""
    site = Site(tag)
    mine, theirs = ftsite.two_copies(ftvm, scratch)
    p, b = start_pair(ftvm, site, scratch, exec_cmd, ["--mode", "checkpoint", "--disk", mine, *primary_extra],
                      ["--disk", theirs, *backup_extra])
    return site, p, b


def write_keys(conn, start, how_long):
    """Writes keys over `conn` for `how_long` s, one at a time, each
    awaited. Returns how many were acknowledged and the longest wait for a
    reply."""
    t0 = time.monotonic()
    longest = 0.0
    i = start
    while time.monotonic() - t0 < how_long:
        asked = time.monotonic()
        try:
            reply = conn.command("SET", f"key{i}", f"value-{i}")
        except ConnectionLost as e:
            pytest.fail(f"the client's connection broke after {i - start} keys: {e}")
        assert reply == "OK"
        longest = max(longest, time.monotonic() - asked)
        i += 1
    return i - start, longest


def random_ms(most):
    """A random delay in seconds, under `most` ms: kills land at different
    moments from run to run."""
    return random.randrange(most) / 1000


def kill_primary_and_check(site, primary, backup, doing="replaying"):
    """Writes keys, kills the primary at a random moment, and checks that
    the backup took over on the same connection with every acknowledged
    key. `doing` is the backup's state before the kill (replaying, or
    following in checkpoint mode). Returns (keys acknowledged, backup)."""
    conn = wait_for_redis(site, [primary, backup], BOOT_TIMEOUT)
    before = 2.0 + random_ms(4000)
    n1, _ = write_keys(conn, 0, before)
    # The backup tells what it is doing while it replays.
    st = status(backup.sock)
    assert st["state"] == doing and st.get("role") == "backup" \
        and str(st.get("primary")).startswith(f"{PRIMARY_HOST_IP}:"), st["_raw"]
    primary.kill9()
    killed = time.monotonic()
    n2, longest = write_keys(conn, n1, 8.0)
    live = event(backup, "going-live", timeout=1)
    backup.assert_running()
    total = n1 + n2
    print(f"{n1} keys before the kill (after {before:.3f} s), {n2} after; longest reply {longest * 1000:.0f} ms; "
          f"backup: {live.text}")
    assert n2 > 0, "no write succeeded after the kill"
    # Every acknowledged key is there, read over the same connection.
    assert conn.command("DBSIZE") == total
    for i in [*range(0, total, 97), n1 - 1, n1, total - 1]:
        assert conn.command("GET", f"key{i}") == f"value-{i}"
    assert time.monotonic() - killed < 60
    st = status(backup.sock)
    assert st.get("unprotected") is True, st["_raw"]
    return total, backup


def kill_backup_and_check(site, primary, backup):
    """Writes keys, kills the backup at a random moment, and checks that
    the primary carried on alone, pausing no longer than the timeout."""
    conn = wait_for_redis(site, [primary, backup], BOOT_TIMEOUT)
    n1, before = write_keys(conn, 0, 2.0 + random_ms(3000))
    backup.kill9()
    # The first reply after the kill is the one that may have waited for
    # acknowledgements that stopped coming.
    asked = time.monotonic()
    assert conn.command("SET", f"key{n1}", f"value-{n1}") == "OK"
    after_kill = time.monotonic() - asked
    n2, after = write_keys(conn, n1 + 1, 5.0)
    n2 += 1
    event(primary, "unprotected", timeout=1)
    print(f"{n1} keys before the kill (longest reply {before * 1000:.0f} ms), {n2} after "
          f"(the first {after_kill * 1000:.0f} ms, longest {after * 1000:.0f} ms)")
    # Outputs waited no longer than the failure timeout, give or take the
    # host's own noise (a loaded host delays replies by itself: the
    # longest one before the kill says by how much).
    assert after_kill <= TIMEOUT_MS / 1000 + before, f"the first reply after the kill took {after_kill:.3f} s"
    assert conn.command("DBSIZE") == n1 + n2
    st = status(primary.sock)
    assert st.get("role") == "primary" and st.get("backup") == "none", st["_raw"]
    primary.assert_running()


def cut_link_and_check(site, primary, backup, following):
    """Once the backup says it follows (`following`: how), cuts the link
    between the hosts and checks that exactly one VM stays live."""
    ev = event(backup, "following", timeout=60)
    assert ev.fields["how"] == following, ev.text
    time.sleep(1.0 + random_ms(4000))
    if not primary.alive() or not backup.alive():
        pytest.fail(f"a side stopped before the cut; primary:\n{primary.output()}\nbackup:\n{backup.output()}")
    site.port_down("backup")
    # Both declare the other failed after the timeout and race to the
    # arbiter; the loser halts.
    t0 = time.monotonic()
    while True:
        p, b = primary.returncode(), backup.returncode()
        if p is not None or b is not None:
            break
        assert time.monotonic() - t0 < 30, f"nobody halted:\n{primary.output()}\n{backup.output()}"
        time.sleep(0.05)
    # The winner keeps running.
    time.sleep(2)
    if p is not None and b is None:
        halted, live, loser, live_event = p, backup, primary, "going-live"
    elif p is None and b is not None:
        halted, live, loser, live_event = b, primary, backup, "unprotected"
    else:
        pytest.fail(f"both stopped:\n{primary.output()}\n{backup.output()}")
    live.assert_running()
    assert event(live, live_event) is not None, live.output()
    assert halted != 0
    loser.wait(10)  # it has exited: all its output read
    lost = event(loser, "halting")
    assert lost is not None, loser.output()
    print(f"{'the backup' if loser is primary else 'the primary'} won; the loser said: {lost.text}")


def outputs_held_and_check(site, primary, backup):
    """With the backup holding each acknowledgement ACK_DELAY, checks on
    the primary's TAP that no reply left sooner than that after its
    request, while the VM ran on and status showed the replies held."""
    delay = ACK_DELAY
    conn = wait_for_redis(site, [primary, backup], BOOT_TIMEOUT)
    capture = site.capture("primary", "t0")
    requests = 8
    held_seen = 0
    for i in range(requests):
        asked = time.monotonic()
        # Mid-wait, the primary's VM runs on (it answers its control
        # socket) and holds the reply.
        sampled = {}

        def sample():
            time.sleep(delay / 2)
            try:
                sampled["status"] = status(primary.sock)
            except Exception as e:  # reported below, on the test's thread
                sampled["error"] = e

        sampler = threading.Thread(target=sample)
        sampler.start()
        token = f"token{i}x"
        try:
            assert conn.command("ECHO", token) == token
        finally:
            sampler.join()
        waited = time.monotonic() - asked
        assert waited >= delay, f"a reply came {waited:.3f} s after its request"
        if "error" in sampled:
            raise sampled["error"]
        st = sampled["status"]
        assert st["state"] == "running", st["_raw"]
        held_seen += st["held"] != 0
        time.sleep(random_ms(200))
    frames = capture.finish()
    # On the wire: each reply left the TAP no sooner than `delay` after
    # its request first arrived there. Both carry the request's token:
    # TCP sends copies of either meanwhile (the client's of the request,
    # the guest's of its reply, both timing out on the held ACKs), so
    # only the first of each counts.
    pairs = 0
    for i in range(requests):
        token = f"token{i}x".encode()
        request = next((f for f in frames if f.from_host and token in f.data), None)
        reply = next((f for f in frames if not f.from_host and token in f.data), None)
        if request is None or reply is None:
            continue
        gap = reply.at - request.at
        assert gap >= delay, f"a reply left the primary's TAP {gap:.4f} s after its request"
        pairs += 1
    resent = sum(1 for f in frames if f.from_host and b"ECHO" in f.data) - pairs
    assert pairs == requests, "requests and replies seen on the TAP"
    assert held_seen >= requests // 2, f"the status showed held outputs only {held_seen} times in {requests}"
    print(f"{pairs} replies, each held at least {delay} s ({resent} requests sent again meanwhile); "
          f"status showed them held {held_seen} times")
    # Without the delay the same replies are quick: the wait above is the
    # Output Rule's, not the guest's.
    primary.assert_running()
    backup.assert_running()


def e2fsck(*args):
    return subprocess.run(["e2fsck", *args], capture_output=True)


# -------------------------------------------------------- lockstep mode


def test_primary_killed_backup_takes_over_on_the_same_connection_with_every_acknowledged_write(ftvm, scratch):
    site, primary, backup = protected_vm(ftvm, "k", scratch, REDIS)
    kill_primary_and_check(site, primary, backup)


def test_the_backups_announcement_reaches_the_network(ftvm, scratch):
    """Issue 31: the RARP a backup sends from its TAP as it goes live is
    what moves the switches off the dead primary's port, so it must leave
    the TAP, which the backup opens only then. Seen on the client's
    interface after the primary is killed (a broadcast reaches every
    port). Before, it was written in the TAP's first milliseconds, while
    its bridge port did not forward yet, and dropped there."""
    site, primary, backup = protected_vm(ftvm, "an", scratch, "sleep 100000")
    ping = ["ping", "-n", "-c", "1", "-W", "5", GUEST_IP]
    deadline = time.monotonic() + BOOT_TIMEOUT
    while site.run("client", ping, check=False, timeout=30).returncode != 0:
        assert time.monotonic() < deadline, f"the guest never answered a ping:\n{primary.output()}"
        primary.assert_running()
    capture = site.capture("client", "eth0")
    primary.kill9()
    live = event(backup, "going-live", timeout=30)
    # The frames after it, and a ping answered from the backup's host.
    # One echo each second until one is answered: the event is written
    # before the announcement is sent, so a first echo may reach the
    # bridge before it and go to the dead primary's port (in CI once).
    retried = ["ping", "-n", "-c", "1", "-i", "1", "-w", "15", GUEST_IP]
    assert site.run("client", retried, check=False, timeout=30).returncode == 0, backup.output()
    frames = capture.finish()
    rarp = [f for f in frames if f.data[12:14] == b"\x80\x35"]
    print(f"{live.text}; {len(frames)} frames on the client's interface, {len(rarp)} RARP")
    assert rarp, f"no RARP announcement reached the client's network: {backup.output()}"
    assert rarp[0].data[6:12] == rarp[0].data[22:28], "the announcement names its own sender's MAC"
    backup.assert_running()


def test_separate_disks_with_backup_reads_take_over_with_every_acknowledged_write(ftvm, scratch):
    # Each host its own copy (§4.1); the backup performs the guest's
    # reads and writes on its copy itself (§4.2), and goes live on it.
    site = Site("d")
    mine, theirs = ftsite.two_copies(ftvm, scratch)
    primary, backup = start_pair(ftvm, site, scratch, REDIS,
                                 ["--disk-sharing", "separate", "--backup-reads", "--disk", mine], ["--disk", theirs])
    total, backup = kill_primary_and_check(site, primary, backup)
    # The backup's own copy holds every acknowledged write: read redis's
    # append-only files out of the image once the VM is gone.
    backup.kill9()
    # On a copy, with the journal replayed (the guest's last fsyncs may
    # be only there): what the guest would see mounting it again.
    image = str(ftsite.sparse_copy(theirs, scratch / "backup-disk-check.img"))
    fsck = e2fsck("-fy", image)
    assert 0 <= fsck.returncode <= 1, f"e2fsck: {fsck.stdout.decode(errors='replace')}"
    sets = ftsite.aof_writes(image)
    assert sets >= total, f"{sets} writes in the backup's disk for {total} acknowledged"
    print(f"the backup's own disk holds {sets} writes for {total} acknowledged keys")


def test_backup_reads_on_the_shared_disk_take_over_with_every_acknowledged_write(ftvm, scratch):
    # The backup reads the disk the primary writes: each write waits for
    # the backup to have read what the guest read there before it.
    site, primary, backup = protected_vm(ftvm, "r", scratch, REDIS, primary=["--backup-reads"])
    kill_primary_and_check(site, primary, backup)


def test_separate_disks_that_differ_are_refused_before_the_vm_starts(ftvm, scratch):
    site = Site("x")
    mine, theirs = ftsite.two_copies(ftvm, scratch)
    # One byte apart.
    with open(theirs, "r+b") as f:
        f.seek(12345)
        f.write(b"x")
    primary, backup = start_pair(ftvm, site, scratch, "true", ["--disk-sharing", "separate", "--disk", mine],
                                 ["--disk", theirs])
    primary_status = primary.wait(60)
    backup_status = backup.wait(10)
    p, b = primary.output(), backup.output()
    assert primary_status != 0 and backup_status != 0, f"primary:\n{p}\nbackup:\n{b}"
    refused = event(primary, "refused-protection")
    assert refused is not None and refused.fields["disk_not_a_copy"], f"primary:\n{p}\nbackup:\n{b}"
    assert event(backup, "refusing-to-follow") is not None, f"backup:\n{b}"
    # The guest never ran.
    assert not primary.console_has("ftvm-exec-begin") and not primary.console_has("Linux version"), p
    print(refused.text)


def test_backup_killed_primary_carries_on_unprotected(ftvm, scratch):
    site, primary, backup = protected_vm(ftvm, "b", scratch, REDIS)
    kill_backup_and_check(site, primary, backup)


def test_cutting_the_link_leaves_exactly_one_vm_live(ftvm, scratch):
    site, primary, backup = protected_vm(ftvm, "c", scratch, "sleep 100000")
    cut_link_and_check(site, primary, backup, "replaying")


def test_powering_the_vm_off_stops_both_sides_and_fails_nothing_over(ftvm, scratch):
    # §3.3: the guest powers itself off (the command ends); the primary's
    # channel closes just as a killed one's would.
    _site, primary, backup = protected_vm(ftvm, "p", scratch, "sleep 3")
    p = primary.wait(BOOT_TIMEOUT)
    assert p == 0, f"the primary exited with {p}:\n{primary.output()}"
    b = backup.wait(30)
    log = backup.output()
    assert b == 0, f"the backup exited with {b}:\n{log}"
    ended = event(backup, "vm-ended")
    assert ended is not None and ended.fields == {"powered_off": True, "status": 0}, log
    for name in ("declared-failed", "arbiter", "going-live"):
        assert event(backup, name) is None, f"the backup took the power-off for a failure ({name}):\n{log}"
    assert event(primary, "declared-failed") is None, primary.output()
    # Nobody claimed the pair's generation: no side went live alone.
    claims = [n for n in os.listdir(scratch / "shared") if n.endswith(".live")]
    assert not claims, claims


def test_outputs_leave_the_primary_only_once_the_backup_acknowledged_their_log(ftvm, scratch):
    # The backup holds every acknowledgement back: a reply the guest
    # makes to a request cannot reach the primary's TAP sooner than that
    # after the request did, since the request is in the log before it.
    ms = str(round(ACK_DELAY * 1000))
    site, primary, backup = protected_vm(ftvm, "o", scratch, REDIS, backup=["--ack-delay", ms])
    outputs_held_and_check(site, primary, backup)


# ----------------------------------------------------------- epoch mode
# Bressoud & Schneider: the same failover, with inputs held to the ends
# of epochs.


def epoch_failover(ftvm, tag, scratch, protocol):
    """Runs the failover test in epoch mode under `protocol`. Before the
    kill, under writes, both sides' status is sampled: the primary counts
    epochs and delivers inputs only at their ends; the backup never stands
    past the end of the epoch that began at the last end it received.
    After it, the backup's own check found every input of the log at an
    epoch end."""
    primary_args = ["--mode", "epoch", "--epoch-length", str(EPOCH), "--epoch-protocol", protocol]
    site, primary, backup = protected_vm(ftvm, tag, scratch, REDIS, primary=primary_args)
    conn = wait_for_redis(site, [primary, backup], BOOT_TIMEOUT)
    primary_samples, backup_samples = [], []
    # At least 3 s and 200 writes: each write is an input (its request's
    # frame) and the original protocol, which waits for the backup at
    # every epoch end, may manage only a few dozen a second on a busy host.
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < 3 or i < 200:
        assert conn.command("SET", f"warmup{i}", "x") == "OK"
        if i % 20 == 0:
            primary_samples.append(status(primary.sock))
            backup_samples.append(status(backup.sock))
        i += 1
    primary_samples.append(status(primary.sock))
    backup_samples.append(status(backup.sock))
    print(f"{i} writes in {time.monotonic() - t0:.1f} s")
    assert conn.command("FLUSHALL") == "OK"
    conn.close()

    def same_mode(st):
        return st.get("mode") == "epoch" and st.get("epoch_length") == EPOCH and st.get("protocol") == protocol

    for p in primary_samples:
        assert same_mode(p), p["_raw"]
        # The original protocol acknowledged every input before
        # delivering it: no output ever waits.
        if protocol == "original":
            assert p["held"] == 0, p["_raw"]
    last = primary_samples[-1]
    assert last["epochs"] > 1000 and last["inputs_delivered"] > 100, last["_raw"]
    # The tests' floor of the heartbeat timeout holds (see TEST_MIN_TIMEOUT_MS).
    assert last["heartbeat_timeout_ms"] >= FLOOR and backup_samples[-1]["heartbeat_timeout_ms"] >= FLOOR, \
        (last["_raw"], backup_samples[-1]["_raw"])
    for b in backup_samples:
        assert b["state"] == "replaying" and same_mode(b), b["_raw"]
        # It runs the epoch that began at the last end it received (P5),
        # never into the next: epoch E+1 waits for [end, E].
        at, end = b["icount"], b["last_end"]
        epoch_end = (end // EPOCH + 1) * EPOCH
        assert at <= epoch_end, \
            f"the backup ran to {at}, past the end of the epoch after its last end mark {end}: {b['_raw']}"
    print(f"primary: {last['_raw']}\nbackup: {backup_samples[-1]['_raw']}")
    _, backup = kill_primary_and_check(site, primary, backup)
    live = event(backup, "going-live")
    at_multiples = live.fields.get("epoch_inputs_at_multiples") if live else None
    assert at_multiples is not None, f"the backup did not report its check of the epoch rule: {live}"
    assert at_multiples > 100, live.text


def test_epoch_mode_revised_protocol_takes_over_with_every_acknowledged_write(ftvm, scratch):
    epoch_failover(ftvm, "e", scratch, "revised")


def test_epoch_mode_original_protocol_takes_over_with_every_acknowledged_write(ftvm, scratch):
    epoch_failover(ftvm, "q", scratch, "original")


# ------------------------------------------------------ checkpoint mode


def test_checkpoint_mode_takes_over_with_every_acknowledged_write_and_a_clean_disk(ftvm, scratch):
    """Checkpoint mode (Remus): each host has its own copy of the disk
    (the backup's made the same as the primary's when protection starts);
    the backup commits checkpoints and goes live from the last one. Before
    the kill the primary's status shows checkpoints going at about the
    configured rate, compressed, and the backup committing them. After the
    failover the guest shuts redis down and powers off on the backup: its
    copy of the disk then passes `e2fsck -n` clean."""
    site = Site("h")
    mine, theirs = ftsite.two_copies(ftvm, scratch)
    # The backup's copy starts stale: scribbled on in two places and cut
    # short. Protection makes it the same as the primary's (Remus §2.5).
    with open(theirs, "r+b") as f:
        for at in (4096, 200 << 20):
            f.seek(at)
            f.write(b"\xa5" * 65536)
        f.truncate(os.fstat(f.fileno()).st_size // 2)
    primary, backup = start_pair(ftvm, site, scratch, REDIS, ["--mode", "checkpoint", "--disk", mine],
                                 ["--disk", theirs])
    conn = wait_for_redis(site, [primary, backup], BOOT_TIMEOUT)
    for i in range(200):
        assert conn.command("SET", f"warmup{i}", "x") == "OK"
    assert conn.command("FLUSHALL") == "OK"
    conn.close()
    p = status(primary.sock)
    assert p.get("mode") == "checkpoint" and p.get("interval") == 25, p["_raw"]
    rate = p["rate_overall"]
    assert 20.0 <= rate <= 41.0, f"checkpoints at {rate}/s for 40/s configured: {p['_raw']}"
    assert p["committed"] > 10 and p["outputs_held_total"] > 200, p["_raw"]
    # Paused, the primary would fall silent and the backup take over.
    paused = control(primary.sock, "pause")
    assert paused.startswith("error a protected VM cannot be paused"), paused
    b = status(backup.sock)
    assert b["state"] == "following" and b["committed"] > 10, b["_raw"]
    assert event(primary, "disk-blocks-sent") is not None, primary.output()
    assert event(backup, "disk-differs") is not None, backup.output()
    assert event(backup, "disk-copied") is not None, backup.output()
    print(f"primary: {p['_raw']}\nbackup: {b['_raw']}")
    total, backup = kill_primary_and_check(site, primary, backup, "following")
    live = event(backup, "going-live")
    assert live is not None and "checkpoint" in live.fields, live
    # Remus §2.5: the backup's copy, flushed, is marked valid before its
    # VM runs, with the checkpoint it went live from.
    record = Path(f"{theirs}.activation").read_text()
    assert "generation=1\n" in record and f"checkpoint={live.fields['checkpoint']}\n" in record, record
    # The guest ends cleanly on the backup: redis exits, the guest syncs,
    # remounts its root read-only and powers off.
    conn = Resp(site.connect(GUEST_IP, REDIS_PORT, timeout=10), reply_timeout=30)
    try:
        conn.command("SHUTDOWN")  # the reply is the connection closing
    except (ConnectionLost, RespError):
        pass
    end = backup.wait(60)
    assert end == 0, f"the backup's VM ended with {end}: {backup.output()}"
    fsck = e2fsck("-fn", theirs)
    assert fsck.returncode == 0, \
        f"e2fsck -fn of the backup's disk after the failover: {fsck.stdout.decode(errors='replace')}" \
        f"{fsck.stderr.decode(errors='replace')}"
    print(f"{total} acknowledged keys; the backup's disk is clean after the failover")


def test_checkpoint_mode_with_two_harts_on_their_own_threads_loses_no_write(ftvm, scratch):
    """Checkpoints carry the state itself, so the primary's harts run in
    parallel on host threads of their own (`--hart-threads multi`): with
    two harts, redis under a client writing, the primary killed, the
    backup goes live from the last checkpoint with every acknowledged
    write, on the same connection."""
    site, primary, backup = checkpoint_pair(ftvm, "m2", scratch, REDIS,
                                            primary_extra=["--cpus", "2", "--hart-threads", "multi"])
    total, backup = kill_primary_and_check(site, primary, backup, "following")
    print(f"two parallel harts: {total} acknowledged keys, none lost")


def test_checkpoint_mode_backup_killed_primary_carries_on_unprotected(ftvm, scratch):
    site, primary, backup = checkpoint_pair(ftvm, "j", scratch, REDIS)
    kill_backup_and_check(site, primary, backup)


def test_checkpoint_mode_cutting_the_link_leaves_exactly_one_vm_live(ftvm, scratch):
    site, primary, backup = checkpoint_pair(ftvm, "l", scratch, "sleep 100000")
    cut_link_and_check(site, primary, backup, "committing checkpoints")


def test_checkpoint_mode_frames_leave_only_once_their_checkpoint_is_acknowledged(ftvm, scratch):
    # Output commit (Remus §2.4): a reply is sent in the epoch after its
    # request arrived, and waits for that epoch's checkpoint, whose
    # acknowledgement the backup holds back.
    ms = str(round(ACK_DELAY * 1000))
    site, primary, backup = checkpoint_pair(ftvm, "m", scratch, REDIS, ["--ack-delay", ms])
    outputs_held_and_check(site, primary, backup)


def test_checkpoint_mode_a_frame_the_dead_primary_received_reaches_the_guest_on_the_backup(ftvm, scratch):
    """Issue 31: a frame the primary received after its last checkpoint
    went to the backup as it arrived, and the backup, going live from
    that checkpoint (whose guest never had it), gives it to its guest.
    A ping shows it: nothing resends an ICMP echo request. With
    checkpoints 2 s apart and none taken early, one is sent just after a
    checkpoint and the primary is killed 0.4 s later, before the next:
    the client still gets its echo reply, from the backup. Before, the
    request died with the primary and the ping failed. (Not longer
    apart: each side's ARP gives up after 3 s, and an ARP reply waits
    for its checkpoint like any frame.)"""
    site, primary, backup = checkpoint_pair(ftvm, "w", scratch, "sleep 100000",
                                            primary_extra=["--interval", "2000", "--no-idle-checkpoints"])
    ping = ["ping", "-n", "-c", "1", "-W", "20", GUEST_IP]
    # Booted, and each side knows the other's MAC (a reply waits up to 2 s
    # for its checkpoint).
    deadline = time.monotonic() + BOOT_TIMEOUT
    while site.run("client", ping, check=False, timeout=30).returncode != 0:
        assert time.monotonic() < deadline, f"the guest never answered a ping:\n{primary.output()}"
        primary.assert_running()
    first = status(primary.sock)["checkpoints"]
    while status(primary.sock)["checkpoints"] == first:
        time.sleep(0.01)
    pinging = subprocess.Popen(site.argv("client", *ping), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(0.4)
    primary.kill9()
    out, _ = pinging.communicate(timeout=60)
    live = event(backup, "going-live", timeout=30)
    print(f"{live.text}\n{out.decode(errors='replace')}")
    assert pinging.returncode == 0, f"no echo reply after the primary was killed: {out.decode(errors='replace')}"
    assert live.fields["frames_given"] >= 1, live.text
    backup.assert_running()


# ------------------------------------------------------------- restored


def test_a_vm_restored_from_a_snapshot_is_protected_and_fails_over(ftvm, scratch):
    """A VM restored from a snapshot can be protected: the header names
    the snapshot (checked by hash), the backup builds the same machine
    from it and replays from there, and takes over when the primary is
    killed. The guest reads /dev/urandom all along, so the backup's replay
    of the entropy it was given is checked by the state digests as it
    goes."""
    site = Site("v")
    shared = scratch / "shared"
    shared.mkdir()
    disk = ftsite.sparse_copy(ftsite.rootfs(ftvm), shared / "disk.img")
    script = ("echo ready-for-snapshot; sleep 2; i=0; while [ $i -lt 60 ]; do "
              "echo tick-$i $(head -c 32 /dev/urandom | sha256sum | head -c 16); sleep 0.1; i=$((i+1)); done; "
              "echo restored-done")
    snap = shared / "vm.snap"
    plain = ftsite.start_plain(site, ftvm, scratch, script, disk=disk)
    plain.wait_console("ready-for-snapshot", BOOT_TIMEOUT)
    for cmd in ("pause", f"snapshot {snap}", "quit"):
        reply = control(plain.sock, cmd, timeout=120)
        assert reply.startswith("ok"), f"{cmd}: {reply}"
    plain.wait(30)

    backup = ftsite.start_backup(site, ftvm, scratch, shared, TIMEOUT_MS, min_timeout_ms=FLOOR)
    primary = ftsite.start_primary(site, ftvm, scratch, shared, None, TIMEOUT_MS, restore=(snap, None), net=False,
                                    min_timeout_ms=FLOOR)
    primary.wait_console("tick-20 ", 120)
    st = status(backup.sock)
    assert st["state"] == "replaying", st["_raw"]
    primary.kill9()
    live = event(backup, "going-live", timeout=10)
    end = backup.wait(120)
    assert end == 0, f"the backup ended with {end}:\n{backup.output()}"
    # The guest's loop went on where the primary died, on the backup.
    assert backup.console_has("restored-done") and backup.console_has("tick-59 "), f"backup:\n{backup.output()}"
    assert not backup.console_has("ready-for-snapshot") and primary.console_has("tick-20 "), \
        f"primary:\n{primary.output()}\nbackup:\n{backup.output()}"
    print(live.text)
