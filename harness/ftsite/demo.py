"""The ftvm showcase (`make demo`): a redis server that survives the death
of the host it runs on, and is protected again by the cluster on its own.

The cluster showcase (the default): three hosts and a client on one switch,
built out of network namespaces (harness/ftsite), each host with a member
of a three-member etcd and an `ftvm agent` (ftsite.cluster). A redis VM is
created with `ftvm cluster vm create ... --protect checkpoint`; the
cluster's controller gives it a backup on another host. A client writes
keys over one TCP connection, waiting for each reply; a few seconds in,
the primary's host dies as a real one does (its switch port down, then
every process of it killed: agent, VM, etcd member). The backup goes live,
the client's writes carry on over the same connection, and the controller
protects the VM again on the third host by itself. The report gives the
failover time, the time to redundancy, the keys acknowledged and found,
and the cluster's event log of the VM.

The pair showcase (`--pair`): two hosts, no cluster: `ftvm ft primary`
and `ftvm ft backup` in lockstep (VMware FT's deterministic replay), the
primary's ftvm killed with kill -9.

  make demo                            scripts/ft-demo --ftvm target/release/ftvm
  scripts/ft-demo --pair --kill-after 5
  harness/run ftsite.demo ...          the same (scripts/ft-demo is a wrapper)

Needs root (namespaces, bridges, TAPs), iproute2, Debian's etcd-server
and etcd-client (for the cluster), and the guest image (`ftvm image
build`). The cluster showcase takes about three minutes on a 2-core host,
mostly the guest's boot and its first protection; the pair one about a
minute and a half. Exits 0 when nothing acknowledged was lost, the
connection held and (cluster) redundancy was restored.
"""

import argparse
import os
import shutil
import sys
import time

import ftsite
from ftsite import REDIS_FT, wait_for_redis
from ftsite.cluster import Cluster, wait_for
from ftsite.errors import TrialFailed
from ftsite.trial import KeyWriter, check_keys

# Bounds on what would otherwise be a hang: a boot on a loaded 2-core host
# plus the first protection (a pre-copy of 512 MiB), and the controller's
# re-protection (its backoff tops out at 60 s).
PROTECTED_WITHIN = 300
REPROTECTED_WITHIN = 300
VM = "redis"


def cluster_showcase(binary, work, writes_before, say):
    """Runs the cluster showcase; returns whether everything held."""
    say("three hosts (primary, backup, spare): each an etcd member and an ftvm agent")
    cl = Cluster(binary, work, "demo")
    cl.wait_hosts()
    t0 = time.monotonic()
    cl.cli("vm", "create", VM, "--on", "primary", "--memory", "512", "--command", REDIS_FT,
           "--bridge", "br0", "--ip", f"{ftsite.GUEST_IP}/24", "--protect", "checkpoint")
    say(f"created VM {VM} on host primary (ftvm cluster vm create ... --protect checkpoint); booting")
    conn = wait_for_redis(cl.site, list(cl.agents.values()), ftsite.BOOT_TIMEOUT)
    say(f"redis answers at {ftsite.GUEST_IP}")
    primary, backup = wait_for("the controller's first protection", PROTECTED_WITHIN, lambda: cl.protected(VM))
    third = next(h for h in cl.hosts() if h not in (primary, backup))
    say(f"protected by the controller: primary on {primary}, backup on {backup} "
        f"({time.monotonic() - t0:.0f} s after the create)")
    print(cl.cli("vm", "list").rstrip(), flush=True)

    writer = KeyWriter(conn)
    writer.start()
    time.sleep(writes_before)
    before = writer.acked
    say(f"{before} keys written; host {primary} dies (switch port down, every process of it killed)")
    died = cl.kill_host(primary)
    failover = redundancy = None
    try:
        wait_for("the VM running on its former backup's host", 60,
                 lambda: cl.sides(VM).get(backup) in ("primary", "unprotected"), every=0.2)
        ack = writer.first_ack_sent_after(died)
        failover = None if ack is None else ack - died
        say(f"the VM runs on {backup}" + (f"; the client's next write acknowledged "
                                          f"{failover * 1000:.0f} ms after the death" if failover else ""))
        wait_for("redundancy restored", REPROTECTED_WITHIN,
                 lambda: cl.protected(VM) == (backup, third), every=0.5)
        redundancy = time.monotonic() - died
        say(f"protected again by the controller, nobody asking: backup on {third}")
    except TrialFailed as e:
        say(f"FAILED: {e}")
    time.sleep(2)
    writer.stop()
    missing = wrong = None
    if writer.error is None:
        missing, wrong = check_keys(conn, writer.acked)
    print(flush=True)
    print("== the cluster's event log of the VM (ftvm cluster events --vm redis) ==")
    for line in cl.cli("events", "--vm", VM).splitlines():
        print(f"  {line}")
    print()
    print("== report ==")
    print(f"  failover (the host's death to the client's next acknowledged write): "
          + (f"{failover * 1000:.0f} ms" if failover is not None else "n/a"))
    print(f"  redundancy restored (the host's death to a new backup protecting the VM): "
          + (f"{redundancy:.1f} s (VMware FT: \"within minutes\")" if redundancy is not None else "NOT restored"))
    print(f"  keys acknowledged to the client:  {writer.acked} ({before} before the death)")
    if missing is not None:
        print(f"  keys found afterwards:            {writer.acked - missing - wrong} of {writer.acked}")
    print(f"  same TCP connection throughout:   {'yes' if writer.error is None else f'NO ({writer.error})'}")
    return writer.error is None and missing == 0 and wrong == 0 and redundancy is not None


def pair_showcase(binary, work, kill_after, say):
    """Runs the two-host lockstep pair showcase; returns whether it held."""
    cores = (0, 1) if (os.cpu_count() or 1) >= 2 and shutil.which("taskset") else None
    r = ftsite.failover_trial(binary, work, "demo", "kill", kill_after, cores=cores, say=say)
    print()
    print("== report ==")
    if r.error:
        print(f"  the demo did not complete: {r.error}")
    print(f"  failover time (kill -9 to the next acknowledged write): "
          + (f"{r.failover * 1000:.0f} ms" if r.failover is not None else "n/a"))
    if r.backup_line:
        print(f"  backup: {r.backup_line}")
    print(f"  keys acknowledged to the client:  {r.acked} ({r.acked_before} before the kill)")
    if r.missing is not None:
        print(f"  keys found after the failover:    {r.acked - r.lost} of {r.acked} (DBSIZE {r.dbsize})")
    same = "no" if r.dropped else "yes" if r.error is None else "not known (the run failed)"
    print(f"  same TCP connection throughout:   {same}")
    return r.ok


def main():
    ap = argparse.ArgumentParser(prog="ft-demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ftvm", default=ftsite.default_ftvm(), help="ftvm binary (default target/release/ftvm)")
    ap.add_argument("--pair", action="store_true", help="the two-host lockstep pair, no cluster")
    ap.add_argument("--kill-after", type=float, default=4.0,
                    help="seconds of writes before the primary's death (default 4)")
    args = ap.parse_args()
    if args.kill_after < 0:
        ap.error("--kill-after cannot be negative")
    t0 = time.monotonic()

    def say(msg):
        print(f"[{time.monotonic() - t0:5.1f}s] {msg}", flush=True)

    with ftsite.session("ft-demo"):
        ftsite.check_host(("ip",) if args.pair else ("ip", "etcd", "etcdctl"), cores=1 if args.pair else 2)
        binary = ftsite.private_ftvm(args.ftvm)
        ftsite.image_dir(binary.path)
        work = ftsite.work_dir("ftvm-demo-")
        if args.pair:
            print("== ftvm demo: a fault-tolerant redis VM (VMware FT style lockstep replication) ==", flush=True)
            ok = pair_showcase(binary.path, work, args.kill_after, say)
        else:
            print("== ftvm demo: a fault-tolerant redis VM on a cluster of three hosts ==", flush=True)
            ok = cluster_showcase(binary.path, work, args.kill_after, say)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
