"""The cluster on etcd (issue 29): three hosts, each with an etcd member
and an `ftvm agent`; a redis VM created through `ftvm cluster` with
`--protect checkpoint` is given a backup on another host by the cluster's
controller without anyone asking; the primary's host dies (its switch
port down, every process of it killed: agent, VM, etcd member); the VM
fails over, and the controller protects it again on the third host;
every acknowledged write is there."""

import json
import os
import signal
import subprocess
import time

import ftsite
from ftsite import REDIS_FT, Proc, Site, wait_for_redis
from ftsite.etcd import EtcdCluster
from ftsite.trial import KeyWriter, check_keys

HOSTS = ("primary", "backup", "spare")
# Boot to redis's first answer on a loaded 2-core host, and the copy of
# 512 MiB of guest RAM to a new backup (a few seconds) plus a controller's
# pass: generous, as a hang is what this bounds.
PROTECTED_WITHIN = 240
# From the host's death: the failure timeout (0.5 s), the controller's
# lease and pass if the dead host held it (10 s + 2 s), the dead host's
# agent unreachable (5 s per look), the pre-copy to the new backup.
REPROTECTED_WITHIN = 120


def cluster(site, ftvm, env, *args):
    """`ftvm cluster ARGS` from the client's host; its JSON when --json."""
    r = subprocess.run(site.argv("client", "env", *env, ftvm, "cluster", *args), capture_output=True, text=True,
                       timeout=330)
    assert r.returncode == 0, f"ftvm cluster {' '.join(args)}: {r.stderr.strip()}"
    return json.loads(r.stdout) if "--json" in args else r.stdout


def sides(site, ftvm, env, name):
    """{host: role} of the VM's processes the agents answer for."""
    try:
        views = cluster(site, ftvm, env, "--json", "vm", "show", name)
    except AssertionError:
        return {}
    return {v["host"]: v["role"] for v in views}


def wait_for(what, within, f):
    t0 = time.monotonic()
    while True:
        v = f()
        if v:
            return v
        assert time.monotonic() - t0 < within, f"{what} did not happen within {within} s"
        time.sleep(1)


def kill_host(site, role):
    """The host vanishes: its switch port goes down, then every process in
    its namespace is killed."""
    site.port_down(role)
    pids = subprocess.run(["ip", "netns", "pids", site.ns[role]], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_cluster_protects_a_vm_and_protects_it_again_after_its_host_dies(ftvm, scratch):
    site = Site("cl", spare=True)
    etcd = EtcdCluster(site, scratch)
    token = scratch / "token"
    subprocess.run([ftvm, "cluster", "token", str(token)], check=True, capture_output=True)
    env = [f"FTVM_ETCD={etcd.endpoints}", f"FTVM_TOKEN_FILE={token}"]
    agents = {}
    for role in HOSTS:
        ip = Site.HOSTS[role][1]
        argv = [ftvm, "agent", "--host-id", role, "--etcd", etcd.endpoints, "--address", ip,
                "--state-dir", str(scratch / f"agent-{role}"), "--token-file", str(token)]
        agents[role] = Proc(f"agent on {role}", site, role, argv, scratch / f"agent-{role}.log")
    wait_for("three hosts in etcd", 60, lambda: len(cluster(site, ftvm, env, "--json", "host", "list")) == 3)

    t0 = time.monotonic()
    cluster(site, ftvm, env, "vm", "create", "redis", "--on", "primary", "--memory", "512", "--command", REDIS_FT,
            "--bridge", "br0", "--ip", f"{ftsite.GUEST_IP}/24", "--protect", "checkpoint")
    conn = wait_for_redis(site, list(agents.values()), ftsite.BOOT_TIMEOUT)
    first = wait_for("a backup", PROTECTED_WITHIN,
                     lambda: (s := sides(site, ftvm, env, "redis")).get("primary") == "primary" and
                     [h for h, r in s.items() if r == "backup"])
    backup_host = first[0]
    third = next(h for h in HOSTS if h not in ("primary", backup_host))
    print(f"protected by the controller with a backup on {backup_host}, {time.monotonic() - t0:.1f} s after create")

    writer = KeyWriter(conn)
    writer.start()
    time.sleep(3)
    assert writer.error is None and writer.acked > 0, writer.error
    kill_host(site, "primary")
    died = time.monotonic()
    # The VM runs on its former backup's host, and the controller gives it
    # a backup on the third host.
    wait_for("protected again", REPROTECTED_WITHIN,
                     lambda: sides(site, ftvm, env, "redis") == {backup_host: "primary", third: "backup"})
    took = time.monotonic() - died
    time.sleep(2)
    writer.stop()
    print(f"the primary's host died; {took:.1f} s later the VM ran on {backup_host} protected again by a backup "
          f"on {third}; {writer.acked} keys acknowledged")
    assert writer.error is None, f"the client's connection failed: {writer.error}"
    assert conn.command("DBSIZE") == writer.acked
    assert check_keys(conn, writer.acked) == (0, 0)
    hosts = [h["id"] for h in cluster(site, ftvm, env, "--json", "host", "list")]
    assert "primary" not in hosts, f"the dead host is still listed: {hosts}"
