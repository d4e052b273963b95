"""The arbiter on etcd (issue 29, item 3): a pair whose split-brain
test-and-set is a transaction in a real three-member etcd cluster (one
member on each host, Debian's etcd-server) instead of a shared directory;
each host keeps its own disk. One member down changes nothing; without a
quorum the backup of a crashed primary waits, and goes live only once
the quorum is back, with every acknowledged write; a primary cut off
from the others never goes live beside its backup."""

import subprocess
import time

import ftsite
from ftsite import BOOT_TIMEOUT, REDIS_FT, Site, event, start_backup, start_primary, wait_for_redis
from ftsite.etcd import EtcdCluster
from ftsite.trial import KeyWriter, check_keys

TIMEOUT_MS = ftsite.TIMEOUT_MS
FLOOR = ftsite.TEST_MIN_TIMEOUT_MS


def etcd_pair(ftvm, scratch, tag):
    """A site with three hosts, etcd on each, and a protected redis
    (lockstep, each host its own disk) whose arbiter is etcd; a client
    writing keys to it. Returns (site, etcd, primary, backup, conn,
    writer)."""
    site = Site(tag, spare=True)
    etcd = EtcdCluster(site, scratch)
    key = scratch / "pair.key"
    subprocess.run([ftvm, "ft", "keygen", str(key)], check=True, capture_output=True)
    arbiter = ["--etcd", etcd.endpoints, "--vm-name", "redis-1", "--pair-key", str(key)]
    mine, theirs = ftsite.two_copies(ftvm, scratch)
    backup = start_backup(site, ftvm, scratch, arbiter, TIMEOUT_MS, extra=["--disk", theirs], min_timeout_ms=FLOOR)
    primary = start_primary(site, ftvm, scratch, arbiter, REDIS_FT, TIMEOUT_MS,
                            extra=["--disk-sharing", "separate", "--disk", mine], min_timeout_ms=FLOOR)
    conn = wait_for_redis(site, [primary, backup], BOOT_TIMEOUT)
    event(primary, "protected", timeout=10, watch=[backup])
    writer = KeyWriter(conn)
    writer.start()
    time.sleep(2)
    assert writer.error is None and writer.acked > 0, writer.error
    return site, etcd, primary, backup, conn, writer


def test_without_quorum_the_backup_waits_and_goes_live_once_it_is_back(ftvm, scratch):
    site, etcd, primary, backup, conn, writer = etcd_pair(ftvm, scratch, "eq")
    # One member down (the spare's): a majority remains.
    etcd.kill("spare")
    time.sleep(1)
    # The primary's host crashes, its etcd member with it: one of three left.
    site.port_down("primary")
    primary.kill9()
    etcd.kill("primary")
    crashed = time.monotonic()
    waiting = event(backup, "arbiter-unreachable", timeout=30, watch=[backup])
    assert "redis-1" in waiting.fields["store"], waiting.fields
    time.sleep(5)
    assert event(backup, "going-live") is None, "went live without etcd's quorum"
    backup.assert_running()
    # The spare's member comes back: a quorum again, and the backup wins.
    etcd.start("spare")
    back = time.monotonic()
    live = event(backup, "going-live", timeout=60, watch=[backup])
    print(f"the backup waited {back - crashed:.1f} s for etcd's quorum, and went live "
          f"{live.t - back:.2f} s after it was back")
    assert event(backup, "arbiter").fields.get("generation") == 1
    time.sleep(2)
    writer.stop()
    assert writer.error is None, f"the client's connection failed: {writer.error}"
    assert conn.command("DBSIZE") == writer.acked
    assert check_keys(conn, writer.acked) == (0, 0)


def test_a_primary_cut_off_from_etcd_never_goes_live_beside_its_backup(ftvm, scratch):
    site, etcd, primary, backup, conn, writer = etcd_pair(ftvm, scratch, "ec")
    # The primary's host is cut off, its etcd member (a minority) with it;
    # both sides declare the other failed and contend.
    site.port_down("primary")
    live = event(backup, "going-live", timeout=30, watch=[backup])
    assert event(backup, "arbiter").fields.get("winner") is None, "the backup should win"
    # The primary reaches only its own member: no quorum, it waits.
    waiting = event(primary, "arbiter-unreachable", timeout=30, watch=[primary])
    time.sleep(2)
    assert event(primary, "arbiter") is None, "the cut-off primary decided without a quorum"
    # Back on the network: it learns it lost, and halts.
    site.port_up("primary")
    lost = event(primary, "arbiter", timeout=60)
    assert "backup" in (lost.fields.get("winner") or ""), lost.fields
    assert primary.wait(60) != 0
    print(f"the backup went live; the cut-off primary waited from {waiting.t - live.t:+.2f} s and lost "
          f"{lost.t - live.t:.1f} s after the backup went live")
    writer.stop()
    assert writer.error is None, f"the client's connection failed: {writer.error}"
    assert check_keys(conn, writer.acked) == (0, 0)
