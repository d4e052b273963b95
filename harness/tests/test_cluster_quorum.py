"""The cluster without etcd's quorum (issue 29): three hosts, each with an
etcd member and an agent (ftsite.cluster), a protected redis VM under a
writing client. Two of the three members are killed:

- the agents keep their VMs running and the client's writes go on (etcd
  is the cluster's memory, not the VMs' lifeline);
- `ftvm cluster host list` fails in one line, within its deadline, not a
  hang;
- the primary's VM process is killed: its backup declares it failed and
  waits at the arbiter (no quorum, no decision), never going live;
- the members come back: the backup goes live, the client's connection
  holds with every acknowledged key, and the controller protects the VM
  again.

The bare pair's version (test_etcd_arbiter) has no agents; this is the
same arbiter as the cluster runs it."""

import json
import os
import signal
import subprocess
import time

import ftsite
from ftsite import REDIS_FT, wait_for_redis
from ftsite.cluster import HOSTS, Cluster, wait_for
from ftsite.trial import KeyWriter, stop_and_check

# A boot plus a 512 MiB pre-copy on a loaded 2-core host.
PROTECTED_WITHIN = 240
# How long the VM is left down without a quorum: long enough to see the
# backup wait, short of the client's 60 s reply timeout.
WITHOUT_QUORUM = 12


def journal(cl, host):
    """The events the VM's process on `host` wrote to its journal (the
    agent's VM directory), as (event name, record)."""
    path = cl.work / f"agent-{host}" / "vms" / "redis" / "events.jsonl"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        out.append((r.get("event"), r))
    return out


def test_without_quorum_vms_run_on_and_a_failed_primarys_backup_waits_for_it(ftvm, scratch):
    cl = Cluster(ftvm, scratch, "cq")
    cl.wait_hosts()
    cl.cli("vm", "create", "redis", "--on", "primary", "--memory", "512", "--command", REDIS_FT,
           "--bridge", "br0", "--ip", f"{ftsite.GUEST_IP}/24", "--protect", "checkpoint")
    conn = wait_for_redis(cl.site, list(cl.agents.values()), ftsite.BOOT_TIMEOUT)
    pair = wait_for("the first protection", PROTECTED_WITHIN, lambda: cl.protected("redis"))
    primary, backup = pair
    third = next(h for h in HOSTS if h not in pair)
    primary_pid = next(v["pid"] for v in cl.views("redis") if v["host"] == primary)
    writer = KeyWriter(conn)
    writer.start()
    time.sleep(2)

    # Quorum gone: the members of the backup's and the third host die.
    for role in (backup, third):
        cl.etcd.kill(role)
    lost = time.monotonic()
    time.sleep(4)
    acked = writer.acked
    time.sleep(3)
    assert writer.error is None and writer.acked > acked, f"the VM stopped answering without etcd: {writer.error}"
    t0 = time.monotonic()
    r = subprocess.run(cl.site.argv("client", "env", *cl.env, ftvm, "cluster", "host", "list"),
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    print(f"without a quorum: `ftvm cluster host list` exit {r.returncode} in {took:.1f} s: {r.stderr.strip()}")
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "etcd" in r.stderr, r
    assert all(a.alive() for a in cl.agents.values()), "an agent died with etcd's quorum"

    # The primary's VM process dies: the backup declares it failed, and
    # waits for the arbiter.
    os.kill(primary_pid, signal.SIGKILL)
    died = time.monotonic()
    wait_for("the backup to declare its primary failed", 30,
             lambda: any(e == "declared_failed" for e, _ in journal(cl, backup)), every=0.2)
    time.sleep(WITHOUT_QUORUM)
    seen = [e for e, _ in journal(cl, backup)]
    print(f"the backup's events {time.monotonic() - died:.0f} s after its primary died, no quorum: {seen}")
    assert "going_live" not in seen and "arbiter_won" not in seen, f"went live without etcd's quorum: {seen}"

    # The quorum back: the backup goes live; the client's writes resume.
    for role in (backup, third):
        cl.etcd.start(role)
    back = time.monotonic()
    wait_for("the backup to go live", 60, lambda: any(e == "going_live" for e, _ in journal(cl, backup)), every=0.2)
    print(f"quorum lost for {back - lost:.0f} s; the backup went live {time.monotonic() - back:.1f} s after it "
          f"was back")
    resumed = writer.acked
    wait_for("the client's writes to resume", 60, lambda: writer.acked > resumed or writer.error)
    assert writer.error is None, f"the client's connection failed: {writer.error}"

    # And the cluster protects it again (on the third host, or on the old
    # primary's, whose agent lives on).
    again = wait_for("protected again", PROTECTED_WITHIN,
                     lambda: (p := cl.protected("redis")) and p[0] == backup and p)
    print(f"protected again: primary on {again[0]}, backup on {again[1]}")
    stop_and_check(writer, conn)
    print(f"{writer.acked} keys acknowledged, every one read back")
