"""The cluster on etcd (issue 29): three hosts, each with an etcd member
and an `ftvm agent` (ftsite.cluster); a redis VM created through `ftvm
cluster` with `--protect checkpoint` is given a backup on another host by
the cluster's controller without anyone asking; the primary's host dies
(its switch port down, every process of it killed: agent, VM, etcd
member); the VM fails over, and the controller protects it again on the
third host; every acknowledged write is there."""

import time

import ftsite
from ftsite import REDIS_FT, wait_for_redis
from ftsite.cluster import HOSTS, Cluster, wait_for
from ftsite.trial import KeyWriter, check_keys

# Boot to redis's first answer on a loaded 2-core host, and the copy of
# 512 MiB of guest RAM to a new backup (a few seconds) plus a controller's
# pass: generous, as a hang is what this bounds.
PROTECTED_WITHIN = 240
# From the host's death: the failure timeout (0.5 s), the controller's
# lease and pass if the dead host held it (10 s + 2 s), the dead host's
# agent unreachable (5 s per look), the pre-copy to the new backup.
REPROTECTED_WITHIN = 120


def test_the_cluster_protects_a_vm_and_protects_it_again_after_its_host_dies(ftvm, scratch):
    cl = Cluster(ftvm, scratch, "cl")
    cl.wait_hosts()

    t0 = time.monotonic()
    cl.cli("vm", "create", "redis", "--on", "primary", "--memory", "512", "--command", REDIS_FT,
           "--bridge", "br0", "--ip", f"{ftsite.GUEST_IP}/24", "--protect", "checkpoint")
    conn = wait_for_redis(cl.site, list(cl.agents.values()), ftsite.BOOT_TIMEOUT)
    first = wait_for("a backup", PROTECTED_WITHIN,
                     lambda: (s := cl.sides("redis")).get("primary") == "primary" and
                     [h for h, r in s.items() if r == "backup"])
    backup_host = first[0]
    third = next(h for h in HOSTS if h not in ("primary", backup_host))
    print(f"protected by the controller with a backup on {backup_host}, {time.monotonic() - t0:.1f} s after create")

    writer = KeyWriter(conn)
    writer.start()
    time.sleep(3)
    assert writer.error is None and writer.acked > 0, writer.error
    died = cl.kill_host("primary")
    # The VM runs on its former backup's host, and the controller gives it
    # a backup on the third host.
    wait_for("protected again", REPROTECTED_WITHIN,
             lambda: cl.sides("redis") == {backup_host: "primary", third: "backup"})
    took = time.monotonic() - died
    time.sleep(2)
    writer.stop()
    print(f"the primary's host died; {took:.1f} s later the VM ran on {backup_host} protected again by a backup "
          f"on {third}; {writer.acked} keys acknowledged")
    assert writer.error is None, f"the client's connection failed: {writer.error}"
    assert conn.command("DBSIZE") == writer.acked
    assert check_keys(conn, writer.acked) == (0, 0)
    hosts = cl.hosts()
    assert "primary" not in hosts, f"the dead host is still listed: {hosts}"
