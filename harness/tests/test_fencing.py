"""Fencing (issue 27): a primary that stalled and comes back says
nothing once its backup is live, the backup that won the arbiter goes
live however long the old primary stays stopped, and a primary cut off
from the network leaves the VM to its backup.

The primary's ftvm is stopped with SIGSTOP (a frozen host: no FIN, no
heartbeat, no system call) while a client writes keys; the frames the
guest sends are watched on the old primary's TAP, and the writes to its
disk by the kernel's fanotify, which names the process behind each."""

import os
import signal
import time

import pytest

import ftsite
from ftsite import BOOT_TIMEOUT, CLIENT_IP, REDIS_FT, Site, event
from ftsite.fswatch import WriteWatch
from ftsite.trial import KeyWriter, check_keys

TIMEOUT_MS = ftsite.TIMEOUT_MS
FLOOR = ftsite.TEST_MIN_TIMEOUT_MS
MODES = {"lockstep": [], "epoch": ["--mode", "epoch"], "checkpoint": ["--mode", "checkpoint"]}


def stall(ftvm, scratch, tag, mode, stopped_for):
    """A protected redis written to without pause; the primary stopped for
    `stopped_for` s, then let go on. Returns (the old primary's frames
    and disk writes after the backup went live, the writer, the new
    primary's connection, the backup's going-live event, the old
    primary's exit, the backup)."""
    vm = ftsite.protected_redis(ftvm, scratch, tag, MODES[mode], FLOOR)
    site, primary, backup, conn, shared, primary_extra = vm.site, vm.primary, vm.backup, vm.conn, vm.shared, \
        vm.primary_extra
    cap = site.capture("primary", "t0")
    # The disk the old primary writes: the shared one, or (checkpoint
    # mode) its own copy.
    disk = next((primary_extra[i + 1] for i, a in enumerate(primary_extra) if a == "--disk"), shared / "disk.img")
    disk_writes = WriteWatch(disk)
    writer = KeyWriter(conn)
    writer.start()
    time.sleep(2)
    assert writer.error is None and writer.acked > 0, writer.error
    os.kill(primary.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        live = event(backup, "going-live", timeout=30, watch=[backup])
        time.sleep(max(0.0, stopped + stopped_for - time.monotonic()))
    finally:
        os.kill(primary.pid, signal.SIGCONT)
    resumed = time.monotonic()
    old_exit = primary.wait(60)
    # Writes go on, on the new primary.
    time.sleep(2)
    writer.stop()
    frames = cap.finish()
    disk_writes.finish()
    offset = time.time() - time.monotonic()
    late = [f for f in frames if not f.from_host and f.at > live.t + offset]
    late_writes = disk_writes.by(primary.pid, after=live.t)
    print(f"{mode}: stopped {resumed - stopped:.1f} s; the backup went live {live.t - stopped:.2f} s after the stop; "
          f"{writer.acked} keys acknowledged; {len(frames)} frames on the old TAP, {len(late)} from the guest "
          f"after the backup went live; {len(disk_writes.by(primary.pid))} writes to the disk by the old primary, "
          f"{len(late_writes)} after the backup went live")
    # The guest's redis appends every SET to its disk: a watch that saw
    # none of the primary's writes before the stop would be blind.
    assert disk_writes.by(primary.pid), "fanotify saw no write by the primary to its disk"
    return late + late_writes, writer, conn, live, old_exit, backup


@pytest.mark.parametrize("mode", list(MODES))
def test_a_frozen_primary_says_nothing_after_its_backup_went_live(ftvm, scratch, mode):
    late, writer, conn, live, old_exit, backup = stall(ftvm, scratch, f"f{mode[0]}", mode, 1.5)
    assert not late, f"the old primary sent {len(late)} frames or disk writes after the backup went live: {late[:3]}"
    assert old_exit != 0, "the old primary should halt once it learns it lost"
    assert writer.error is None, f"the client's connection failed: {writer.error}"
    assert backup.alive(), backup.output()
    assert conn.command("DBSIZE") == writer.acked
    assert check_keys(conn, writer.acked) == (0, 0)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_long_stall_leaves_the_vm_serving(ftvm, scratch, mode):
    """15 s stopped: the backup wins the arbiter in a fraction of a second
    and serves while the old primary, still holding the disk's lock, is
    stopped; it halts when it comes back."""
    late, writer, conn, live, old_exit, backup = stall(ftvm, scratch, f"l{mode[0]}", mode, 15)
    assert not late
    assert writer.error is None, f"the client's connection failed: {writer.error}"
    # The client was served during the stall, not after it.
    served = writer.first_ack_sent_after(live.t)
    assert served is not None and served < live.t + 5, "no write acknowledged soon after the backup went live"
    if mode != "checkpoint":
        # The shared disk's lock, still held by the stopped primary, was
        # taken over (checkpoint mode gives each host its own copy).
        assert any("taken over" in line for _, line in backup.messages), backup.output()
    assert old_exit != 0
    assert conn.command("DBSIZE") == writer.acked
    assert check_keys(conn, writer.acked) == (0, 0)


@pytest.mark.parametrize("mode", list(MODES))
def test_an_isolated_primary_leaves_the_vm_to_its_backup(ftvm, scratch, mode):
    """The primary host's switch port goes down with its ftvm running:
    each side hears only silence and declares the other failed. Both
    have the client's address as their isolation address (it stands for
    the outside the VM serves): the primary reaches it no more, leaves the
    arbiter to its backup, finds the backup's claim and halts; the backup
    reaches it, wins at once, and serves the client's same connection.
    Without the check the two race on silence alone, and the cut-off
    primary won 4 races in 7."""
    site = Site(f"i{mode[0]}")
    shared = scratch / "shared"
    shared.mkdir()
    isolation = ["--isolation-address", CLIENT_IP]
    primary_extra, backup_extra = ftsite.disk_options(ftvm, scratch, MODES[mode])
    backup = ftsite.start_backup(site, ftvm, scratch, shared, TIMEOUT_MS, extra=[*backup_extra, *isolation],
                                  min_timeout_ms=FLOOR)
    primary = ftsite.start_primary(site, ftvm, scratch, shared, REDIS_FT, TIMEOUT_MS,
                                   extra=[*primary_extra, *isolation], min_timeout_ms=FLOOR)
    conn = ftsite.wait_for_redis(site, [primary, backup], BOOT_TIMEOUT)
    event(primary, "protected", timeout=10, watch=[backup])
    writer = KeyWriter(conn)
    writer.start()
    time.sleep(2)
    assert writer.error is None and writer.acked > 0, writer.error
    cut = time.monotonic()
    site.port_down("primary")
    live = event(backup, "going-live", timeout=30, watch=[backup])
    isolated = event(primary, "isolated", timeout=30)
    old_exit = primary.wait(60)
    verdict = event(primary, "arbiter")
    time.sleep(2)
    writer.stop()
    print(f"{mode}: the backup went live {live.t - cut:.2f} s after the cut; the primary found itself isolated "
          f"{isolated.t - cut:.2f} s after it ({isolated.fields}); its verdict: {verdict.fields}; "
          f"{writer.acked} keys acknowledged")
    assert event(backup, "isolated") is None, "the backup reaches the outside"
    assert "backup" in verdict.fields.get("winner", ""), f"the cut-off primary won: {verdict.fields}"
    assert old_exit != 0, "the cut-off primary should halt"
    assert writer.error is None, f"the client's connection failed: {writer.error}"
    assert backup.alive(), backup.output()
    assert conn.command("DBSIZE") == writer.acked
    assert check_keys(conn, writer.acked) == (0, 0)
