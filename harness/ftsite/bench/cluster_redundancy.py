"""Redundancy restored by the cluster after a host dies, beside VMware
FT's "within minutes", and what the agents cost.

Three hosts (ftsite.cluster: each a namespace with an etcd member and an
`ftvm agent`); a 512 MiB redis VM created with `ftvm cluster vm create
... --protect checkpoint`, which the cluster's controller gives a backup
on another host; a client writing keys one at a time over one TCP
connection (ftsite.trial.KeyWriter). Each trial kills the host the
VM's primary runs on (its switch port down, then every process of it:
agent, VM, etcd member) and measures
  (a) failover: the host's death to the acknowledgement of the first key
      the client sent after it (bench/failover's measure);
  (b) redundancy: the host's death to the VM protected again on another
      host: the controller's line that the VM was protected (the agent's
      log, each line stamped as it arrived), confirmed by `ftvm cluster
      vm show` (a primary in its mode, no longer the transfer, and a
      backup elsewhere);
and where the failover's time went: which host held etcd's leader at the
death, when the survivors elected a new one (their etcd logs), and when
the heir declared its primary failed, won the arbiter and went live (its
events in the cluster's log, stamped by its host's clock: the same clock
here); then brings the host back (its etcd member restarted on its data and
rejoining, a fresh agent with the same identity), so the next trial has
three hosts again. At the end every acknowledged key must read back over
the same connection.

Peer: VMware FT "typically can re-establish VM redundancy within minutes
of a server failure" (../shared/seeds/vmware-ft-techreport.txt §3.1).
"Minutes" is at least two: the ratio is taken against 120 s, the most
demanding reading of the plural; against 60 s (one minute) beside it.

The agents' own cost, before the trials: over `--window` s with no VM,
then over as long with the one protected VM idle (the client not yet
writing), each agent's CPU (utime+stime from /proc/PID/stat) and RSS, and
etcd's traffic from its members' own /metrics: requests by gRPC method,
lease renewals, puts, transactions, raft proposals committed, bytes.
The difference of the two windows is the traffic one protected VM adds.

With `--vms N`, N such VMs (redis, redis-2, ...; each its own address and
writing client), all created on host primary: each trial kills the host
of the first VM's primary, and redundancy is the time until every VM is
protected again with neither side on the dead host (VMware's measure:
"every VM"); failover is each VM's whose primary died there. The
controller takes its steps for several VMs side by side, so N VMs should
cost less than N times one.

  bench/cluster-redundancy                    10 trials, 60 s windows
  bench/cluster-redundancy --trials 3 --window 30
  bench/cluster-redundancy --no-cost          the trials only
  bench/cluster-redundancy --vms 2 --trials 3 --no-cost

Needs root, two cores, iproute2, Debian's etcd-server and etcd-client,
the guest image; about a minute a trial on this 2-core host, plus boot
and the two windows. Exits 0 when every trial restored redundancy and
every acknowledged key was kept on an unbroken connection, 1 otherwise,
2 on bad input.
"""

import datetime
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
import re
import time

import ftsite
from ftsite import REDIS_FT, wait_for_redis
from ftsite.bench import results
from ftsite.bench.options import parser
from ftsite.cluster import HOSTS, Cluster, wait_for
from ftsite.errors import TrialFailed
from ftsite.trial import KeyWriter, check_keys

VMWARE_S = 120  # "within minutes": two, the least the plural says
VMWARE_ONE_MINUTE_S = 60
# A hang, not a figure: the controller's backoff tops out at 60 s.
REPROTECT_LIMIT = 300
VM = "redis"

# etcd's counters, and how each is read across the members: requests are
# counted by the member a client sent them to (sum); what every member
# applies is counted on each (max); lease renewals on the leader only (sum).
COUNTERS = [
    ("requests: Range", "sum", 'grpc_server_handled_total{grpc_code="OK",grpc_method="Range"'),
    ("requests: Put", "sum", 'grpc_server_handled_total{grpc_code="OK",grpc_method="Put"'),
    ("requests: Txn", "sum", 'grpc_server_handled_total{grpc_code="OK",grpc_method="Txn"'),
    ("requests: LeaseGrant", "sum", 'grpc_server_handled_total{grpc_code="OK",grpc_method="LeaseGrant"'),
    ("keep-alive streams opened", "sum", 'grpc_server_started_total{grpc_method="LeaseKeepAlive"'),
    ("keep-alive messages", "sum", 'grpc_server_msg_received_total{grpc_method="LeaseKeepAlive"'),
    ("lease renewals", "sum", "etcd_debugging_lease_renewed_total"),
    ("mvcc puts", "max", "etcd_debugging_mvcc_put_total"),
    ("mvcc txns", "max", "etcd_debugging_mvcc_txn_total"),
    # What etcd keeps of every put until its history is compacted.
    ("mvcc put bytes", "max", "etcd_debugging_mvcc_total_put_size_in_bytes"),
    ("raft proposals committed", "max", "etcd_server_proposals_committed_total"),
    ("client bytes received", "sum", "etcd_network_client_grpc_received_bytes_total"),
    ("client bytes sent", "sum", "etcd_network_client_grpc_sent_bytes_total"),
]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    """utime + stime of a process, clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def counters(cl):
    """{label: value} of COUNTERS across the etcd members."""
    per_member = [cl.etcd_metrics(role) for role in HOSTS]
    out = {}
    for label, how, prefix in COUNTERS:
        values = [sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + ",") or
                      k.startswith(prefix + "}")) for m in per_member]
        out[label] = sum(values) if how == "sum" else max(values)
    return out


def cost(cl, window):
    """Each agent's and etcd member's CPU share and RSS, and etcd's traffic
    per second, over `window` s."""
    procs = {f"agent {r}": cl.agents[r].pid for r in HOSTS} | {f"etcd {r}": cl.etcd.members[r].pid for r in HOSTS}
    t0, ticks0, c0 = time.monotonic(), {k: cpu_ticks(p) for k, p in procs.items()}, counters(cl)
    time.sleep(window)
    t1, ticks1, c1 = time.monotonic(), {k: cpu_ticks(p) for k, p in procs.items()}, counters(cl)
    span = t1 - t0
    cpu = {k: (ticks1[k] - ticks0[k]) / CLK_TCK / span * 100 for k in procs}
    rss = {k: rss_kib(p) for k, p in procs.items()}
    rates = {k: (c1[k] - c0[k]) / span for k in c0}
    return span, cpu, rss, rates


def s(x):
    return "n/a" if x is None else f"{x:.2f} s"


def etcd_leader(cl):
    """The host whose etcd member leads now (asked of every member from the
    client's host), or None if none says so."""
    r = cl.site.run("client", cl.etcd.etcdctl("--command-timeout=2s", "endpoint", "status", "-w", "json"),
                    check=False)
    try:
        statuses = json.loads(r.stdout)
    except ValueError:
        return None
    ids = {st["Status"]["header"]["member_id"]: st["Endpoint"] for st in statuses}
    leaders = {st["Status"]["leader"] for st in statuses}
    for role in HOSTS:
        if cl.etcd.url(role) in [ids.get(leader) for leader in leaders]:
            return role
    return None


def etcd_elected_after(cl, roles, wall):
    """Seconds from `wall` (Unix time) to the first "became leader" line
    after it in the etcd logs of hosts `roles`, and the new leader's host;
    (None, None) if there is none."""
    best = (None, None)
    for role in roles:
        try:
            lines = (cl.work / f"etcd-{role}.log").read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if "became leader at term" not in line:
                continue
            m = re.search(r'"ts":"([^"]+)"', line)
            if not m:
                continue
            ts = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            if ts > wall and (best[0] is None or ts - wall < best[0]):
                best = (ts - wall, role)
    return best


def heir_times(cl, vm, heir, wall):
    """Seconds from `wall` to the heir's failure declared, arbiter won and
    going live (its first such events after `wall`), each None if absent."""
    out = {"declared_failed": None, "arbiter_won": None, "going_live": None}
    try:
        events = cl.events(vm)
    except TrialFailed:
        return out
    for kind, host, e in events:
        if host == heir and kind in out and out[kind] is None and e["unix_ms"] / 1000 > wall - 1:
            out[kind] = e["unix_ms"] / 1000 - wall
    return out


def stats(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), max(xs)) if xs else (None, None)


def vm_names(n):
    """The benchmark's VMs' names: redis, redis-2, ..."""
    return [VM] + [f"{VM}-{i + 1}" for i in range(1, n)]


def vm_ip(i):
    """The address of VM number `i` (0: the site's guest address)."""
    head, last = ftsite.GUEST_IP.rsplit(".", 1)
    return f"{head}.{int(last) + i}"


def controller_protected_at(cl, vm, since):
    """When an agent's controller said it protected VM `vm`, after `since`
    (its log line's arrival), or None."""
    times = [t for p in list(cl.agents.values()) for t, line in list(p.messages)
             if t > since and f"controller: {vm}: protected" in line]
    return min(times) if times else None


def main():
    ap = parser("cluster-redundancy", __doc__)
    ap.add_argument("--trials", type=int, default=10, help="host deaths (default 10)")
    ap.add_argument("--window", type=float, default=60, help="seconds of each cost window (default 60)")
    ap.add_argument("--no-cost", action="store_true", help="skip the agents' cost")
    ap.add_argument("--keep", action="store_true", help="keep the run's files (agents' and etcd's logs)")
    ap.add_argument("--ftvm", default=ftsite.default_ftvm(), help="ftvm binary (copied privately before use)")
    ap.add_argument("--seed", type=int, help="seed of the writing time before each death (default: new each run)")
    ap.add_argument("--vms", type=int, default=1, help="protected VMs, all created on host primary (default 1)")
    results.add_option(ap, "cluster-redundancy")
    args = ap.parse_args()
    if args.trials < 1 or args.window < 5:
        ap.error("--trials must be at least 1 and --window at least 5")
    if not 1 <= args.vms <= 8:
        ap.error("--vms must be from 1 to 8")
    names = vm_names(args.vms)
    rng = random.Random(args.seed)

    with ftsite.session("cluster-redundancy"):
        ftsite.check_host(("ip", "etcd", "etcdctl"), cores=2)
        binary = ftsite.private_ftvm(args.ftvm)
        ftsite.image_dir(binary.path)
        print(f"cluster-redundancy: {args.trials} host death(s), cost windows of "
              f"{'none' if args.no_cost else f'{args.window:g} s'}; {binary.identity}; {time.strftime('%Y-%m-%d %H:%M')}",
              flush=True)
        if args.keep:
            # The agents' and members' logs, for a trial that needs a look.
            work = Path(tempfile.mkdtemp(prefix="ftvm-clred-"))
            print(f"files kept in {work}", flush=True)
        else:
            work = ftsite.work_dir("ftvm-clred-")
        cl = Cluster(binary.path, work, "cr")
        cl.wait_hosts()
        idle = None if args.no_cost else cost(cl, args.window)

        t0 = time.monotonic()
        for i, name in enumerate(names):
            cl.cli("vm", "create", name, "--on", "primary", "--memory", "512", "--command", REDIS_FT,
                   "--bridge", "br0", "--ip", f"{vm_ip(i)}/24", "--protect", "checkpoint")
        conns = [wait_for_redis(cl.site, list(cl.agents.values()), ftsite.BOOT_TIMEOUT, ip=vm_ip(i))
                 for i in range(len(names))]
        booted = time.monotonic() - t0
        pairs = {n: wait_for(f"{n}'s first protection", 240 * len(names), lambda n=n: cl.protected(n)) for n in names}
        print(f"created {len(names)} VM(s) on primary: redis answered after {booted:.1f} s, protected (backups on "
              f"{', '.join(sorted(set(p[1] for p in pairs.values())))}) {time.monotonic() - t0:.1f} s after the "
              f"create", flush=True)
        one = None if args.no_cost else cost(cl, args.window)

        writers = {n: KeyWriter(c) for n, c in zip(names, conns)}
        for w in writers.values():
            w.start()
        rows, bad = [], 0
        for i in range(args.trials):
            time.sleep(rng.uniform(2.0, 4.0))
            pairs = {n: cl.protected(n) for n in names}
            if not all(pairs.values()):
                print(f"  {i + 1:2}/{args.trials}: FAILED: not every VM is protected before the trial: {pairs}",
                      flush=True)
                bad += 1
                break
            victim = pairs[names[0]][0]
            heirs = {n: p[1] for n, p in pairs.items() if p[0] == victim}
            leader = etcd_leader(cl)
            died = cl.kill_host(victim)
            died_wall = time.time() - (time.monotonic() - died)

            def restored():
                now = {n: cl.protected(n) for n in names}
                ok = all(p and victim not in p and (n not in heirs or p[0] == heirs[n]) for n, p in now.items())
                return ok and now
            try:
                again = wait_for("redundancy restored", REPROTECT_LIMIT * len(names), restored, every=0.5)
                seen = time.monotonic()
            except TrialFailed as e:
                print(f"  {i + 1:2}/{args.trials}: killed {victim}: FAILED: {e}", flush=True)
                bad += 1
                break
            # Each VM's protection said by the controller, else seen by
            # vm show; the trial's redundancy is the last VM's.
            said = [controller_protected_at(cl, n, died) for n in names if pairs[n] != again[n]]
            redundancy = (max(said) if said and None not in said else seen) - died
            acks = [writers[n].first_ack_sent_after(died) for n in heirs]
            failovers = [None if a is None else a - died for a in acks]
            failover = None if not failovers or None in failovers else max(failovers)
            # Where the first VM's failover went, before the dead host's
            # member comes back (and its log is started anew).
            elected, new_leader = etcd_elected_after(cl, [r for r in HOSTS if r != victim], died_wall)
            heir = heirs[names[0]]
            t = heir_times(cl, names[0], heir, died_wall)
            at_arbiter = (None if t["declared_failed"] is None or t["arbiter_won"] is None
                          else t["arbiter_won"] - t["declared_failed"])
            leader_died = None if leader is None else leader == victim
            print(f"      etcd's leader at the death: {leader or 'unknown'}"
                  f"{' (died with the host)' if leader_died else ''}; a new leader elected "
                  f"{'(none in the logs)' if elected is None else f'after {elected:.3f} s, on {new_leader}'}; "
                  f"{names[0]} on {heir}: failure declared after {s(t['declared_failed'])}, arbiter won after "
                  f"{s(t['arbiter_won'])} ({'n/a' if at_arbiter is None else f'{at_arbiter * 1000:.0f} ms'} at the "
                  f"arbiter), live after {s(t['going_live'])}", flush=True)
            cl.revive(victim)
            cl.wait_hosts()
            rows.append((failover, redundancy, leader_died, at_arbiter))
            broken = [f"{n}: {w.error}" for n, w in writers.items() if w.error]
            broke = f"; a client's connection FAILED: {broken}" if broken else ""
            moved = ", ".join(f"{n} to {again[n][0]} (backup on {again[n][1]})" for n in heirs)
            print(f"  {i + 1:2}/{args.trials}: killed {victim}: failover {s(failover)} ({moved}), redundancy "
                  f"{s(redundancy)} ({'the controller' if said and None not in said else 'vm show'} said so, "
                  f"vm show {seen - died:.1f} s); {victim} back; "
                  f"{sum(w.acked for w in writers.values())} keys so far{broke}", flush=True)
            if broken:
                bad += 1
                break
        time.sleep(2)
        for w in writers.values():
            w.stop()
        lost = None
        if not any(w.error for w in writers.values()):
            lost = 0
            for n, c in zip(names, conns):
                missing, wrong = check_keys(c, writers[n].acked)
                lost += missing + wrong
                if missing + wrong or c.command("DBSIZE") != writers[n].acked:
                    bad += 1

        if idle and one:
            print()
            print(f"the agents' own cost over {idle[0]:.0f} s windows (CPU % of one core, RSS MiB):")
            k_vms = f"{len(names)} VM" + ("s" if len(names) > 1 else "")
            print(f"{'process':14} {'CPU, 0 VMs':>11} {'CPU, ' + k_vms:>10} {'RSS, 0 VMs':>11} {'RSS, ' + k_vms:>10}")
            for k in idle[1]:
                print(f"{k:14} {idle[1][k]:10.2f}% {one[1][k]:9.2f}% {idle[2][k] / 1024:11.1f} "
                      f"{one[2][k] / 1024:10.1f}")
            print(f"etcd's traffic per second (three hosts, all members):")
            print(f"{'counter':28} {'0 VMs':>9} {k_vms + ' protected':>15} {'per VM':>9}")
            for k in idle[3]:
                print(f"{k:28} {idle[3][k]:9.2f} {one[3][k]:15.2f} {(one[3][k] - idle[3][k]) / len(names):9.2f}")
        print()
        (fm, fx), (rm, rx) = stats(r[0] for r in rows), stats(r[1] for r in rows)
        print(f"cluster-redundancy: {len(rows)} of {args.trials} trial(s): failover median {s(fm)} max {s(fx)}; "
              f"redundancy restored median {s(rm)} max {s(rx)}")
        for died_too, label in ((True, "the dead host held etcd's leader"), (False, "etcd's leader survived")):
            some = [r for r in rows if r[2] is died_too]
            if some:
                print(f"  {label}: {len(some)} trial(s), failover "
                      f"{', '.join(s(r[0]) for r in some)}; at the arbiter "
                      f"{', '.join('n/a' if r[3] is None else f'{r[3] * 1000:.0f} ms' for r in some)}")
        if rm is not None:
            print(f"beside VMware FT's \"within minutes\" (taken as {VMWARE_S} s, the least the plural says): "
                  f"median {rm / VMWARE_S:.3f}, max {rx / VMWARE_S:.3f}; against one minute ({VMWARE_ONE_MINUTE_S} s): "
                  f"{rm / VMWARE_ONE_MINUTE_S:.3f}, {rx / VMWARE_ONE_MINUTE_S:.3f}")
        dropped = any(w.error for w in writers.values())
        print(f"{sum(w.acked for w in writers.values())} keys acknowledged over {len(names)} VM(s), "
              f"{'n/a' if lost is None else lost} lost, connection{'s' if len(names) > 1 else ''} "
              f"{'DROPPED' if dropped else 'kept'}" + (f"; {bad} FAILED" if bad else ""))
        figs = []
        if rm is not None:
            figs.append(results.figure(
                "cluster-redundancy.redundancy", f"the cluster: a host's death to the VM protected again on another "
                f"host ({len(names)} VM(s), median of {len(rows)})", rm, "s",
                peer=results.peer('VMware FT: "within minutes", taken as 120 s', VMWARE_S, "s"), ratio=rm / VMWARE_S,
                note=f"max {s(rx)}; failover median {s(fm)}, max {s(fx)}; "
                     f"{'n/a' if lost is None else lost} keys lost, connection{'s' if len(names) > 1 else ''} "
                     f"{'dropped' if dropped else 'kept'}"))
        if idle and one:
            agents = [k for k in idle[1] if "agent" in k]
            figs.append(results.figure(
                "cluster-redundancy.agent-cost", "the agent's own cost, idle: CPU share of one core, each agent, "
                f"with no VM and with {len(names)} protected", f"{min(min(idle[1][k], one[1][k]) for k in agents):.2f}-"
                f"{max(max(idle[1][k], one[1][k]) for k in agents):.2f}", "%",
                note=f"{idle[0]:.0f} s windows; RSS {min(idle[2][k] for k in agents) / 1024:.1f}-"
                     f"{max(one[2][k] for k in agents) / 1024:.1f} MiB"))
        path = results.write("cluster-redundancy", ["bench/cluster-redundancy"] + sys.argv[1:],
                             figs if not bad and len(rows) == args.trials else [],
                             {"trials": rows, "cost_idle": idle, "cost_one": one}, args.json, args.ftvm)
        print(f"cluster-redundancy: figures written to {path}")
    sys.exit(1 if bad or len(rows) < args.trials else 0)


if __name__ == "__main__":
    main()
