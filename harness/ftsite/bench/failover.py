"""Failover under load: how long a client of a protected redis waits when
the primary's host fails, and whether anything it was told is lost.

Each trial builds a fresh site (harness/ftsite: a switch, a primary
host, a backup host and a client as network namespaces) and fresh shared
storage, starts `ftvm ft backup` and `ftvm ft primary` (primary pinned to
core 0, backup to core 1, as if on two hosts) with the guest running

    redis-server ... --appendonly yes --appendfsync always

and, once redis answers and the primary reports `protected`, a client in
the client namespace writes keys one at a time over ONE TCP connection,
each reply awaited, recording every acknowledged key. After a random 2-6 s
the primary fails, in one of two ways (--kind; `both` alternates):

  kill   kill -9 of the primary's ftvm: the kernel closes its sockets, so
         the backup sees the logging channel close at once;
  crash  the primary host vanishes without a FIN: its switch port goes down
         first, then the process is killed, so the backup can only tell by
         the silence (of its heartbeats: the timeout it learned from
         their arrivals, at most --timeout-ms).

The failover time runs from the kill (or the port going down) to the
acknowledgement of the first key the client sent after it. The client
writes on for 2 s more, then, over the same connection, DBSIZE must equal
the number of keys acknowledged and every acknowledged key (MGET, in
chunks) must read back with its value.

Per trial it prints the failover time, when the backup said "going live",
the keys acknowledged and lost; then medians and maxima per kind and
overall. Targets (issue 5): median failover <= 1 s, 0 acknowledged writes
lost, 0 dropped connections; (issue 31) crash median <= 150 ms and max
<= 300 ms, kill median <= 50 ms. With --wire, each trial slower than
150 ms also prints the client's TCP segments around its failover (which
retransmission timer it waited for).

  bench/failover                       20 trials, kill and crash alternating
  bench/failover --kills 4 --kind crash --log-dir /tmp/fo-logs
  bench/failover --ftvm path/to/ftvm --timeout-ms 500 --seed 7
  bench/failover --mode checkpoint     the same in checkpoint mode (Remus)
  bench/failover --mode epoch --epoch-protocol original
                                       in epoch mode (Bressoud & Schneider)

Needs root, two cores, iproute2 and util-linux's taskset. Each trial takes
about a minute (mostly the guest's boot). Exits 0 when every trial kept
every acknowledged write on an unbroken connection, 1 otherwise (a missed
median target is reported, not an error), 2 on bad input.
"""

import argparse
import shutil
import statistics
import sys
from pathlib import Path

import ftsite
from ftsite.bench import results

MEDIAN_TARGET = 1.0
# Issue 31's targets per kind: (median, max) in s; None: no bound.
KIND_TARGETS = {"kill": (0.050, None), "crash": (0.150, 0.300)}


# The trials whose segments --wire prints: those that waited for more
# than the detection and the start (issue 31's crash median).
WIRE_AFTER = 0.15

def fmt(x, spec=".2f", unit=" s"):
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def summary_row(label, trials):
    """Prints one row of the summary; returns the median and the maximum failover (None: no time)."""
    times = [t.failover for t in trials if t.failover is not None]
    lives = [t.go_live for t in trials if t.go_live is not None]
    lost = sum(t.lost or 0 for t in trials)
    dropped = sum(t.dropped for t in trials)
    failed = sum(t.error is not None for t in trials)
    med = statistics.median(times) if times else None
    print(f"  {label:8} trials {len(trials):3}   failover median {fmt(med)} max {fmt(max(times) if times else None)}"
          f"   going live median {fmt(statistics.median(lives) if lives else None)}"
          f"   lost writes {lost}   dropped connections {dropped}   failed trials {failed}")
    return med, (max(times) if times else None)


def figures(args, mode_args, trials):
    """Per kind and overall: the median failover, with its max, lost and
    dropped beside it (the summary's rows)."""
    mode = "-".join(mode_args[1:]).replace("--", "")
    figs = []
    for kind in ("kill", "crash", "overall"):
        of_kind = [t for t in trials if kind in ("overall", t.kind)]
        times = [t.failover for t in of_kind if t.failover is not None]
        if not times or (kind == "overall" and len({t.kind for t in trials}) < 2):
            continue
        med, top = statistics.median(times), max(times)
        lost = sum(t.lost or 0 for t in of_kind)
        dropped = sum(t.dropped for t in of_kind)
        tmed, tmax = KIND_TARGETS.get(kind, (MEDIAN_TARGET, None))
        target = " and ".join(f"{w} ≤ {v * 1000:.0f} ms" for w, v in (("median", tmed), ("max", tmax)) if v is not None)
        met = med <= tmed and (tmax is None or top <= tmax) and not lost and not dropped
        figs.append(results.figure(
            f"failover.{mode}.{kind}", f"failover ({mode_args[1]} mode), {kind if kind != 'overall' else 'all trials'}: "
            f"the failure to the first acknowledged write after it, median of {len(times)}", med, "s",
            target=target + ", 0 lost, 0 dropped", met=met,
            note=f"max {top:.2f} s; {lost} lost, {dropped} dropped"))
    return figs


def t_details(t):
    """One trial as JSON takes it."""
    return {k: getattr(t, k, None) for k in ("kind", "failover", "go_live", "longest_wait", "acked", "lost",
                                             "dropped", "error")}


def main():
    ap = argparse.ArgumentParser(prog="failover", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=20, help="trials, each failing the primary once (default 20)")
    ap.add_argument("--kind", choices=("kill", "crash", "both"), default="both",
                    help="how the primary fails (default both: alternating, kill first)")
    ap.add_argument("--ftvm", default=ftsite.default_ftvm(), help="ftvm binary (copied privately before use)")
    ap.add_argument("--timeout-ms", type=int, default=500, help="ftvm's failure-detection --timeout (default 500)")
    ap.add_argument("--min-delay", type=float, default=2.0, help="shortest writing before the failure, s (default 2)")
    ap.add_argument("--max-delay", type=float, default=6.0, help="longest writing before the failure, s (default 6)")
    ap.add_argument("--seed", type=int, help="seed of the random failure moments (default: new each run)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin primary and backup to cores 0 and 1")
    ap.add_argument("--log-dir", help="keep each trial's primary and backup output here")
    ap.add_argument("--wire", action="store_true",
                    help="capture the client's interface and print, for each trial slower than 150 ms, its TCP "
                         "segments from just before the failure to the first acknowledgement after it")
    ap.add_argument("--mode", choices=("lockstep", "epoch", "checkpoint"), default="lockstep",
                    help="replication mode (default lockstep; epoch: Bressoud & Schneider; checkpoint: Remus, "
                         "each host its own disk copy)")
    ap.add_argument("--epoch-length", type=int, help="with --mode epoch: instructions per epoch (default ftvm's)")
    ap.add_argument("--epoch-protocol", choices=("original", "revised"),
                    help="with --mode epoch: the protocol of Bressoud & Schneider §4.3 (default ftvm's, revised)")
    results.add_option(ap, "failover")
    args = ap.parse_args()
    mode_args = ["--mode", args.mode]
    if args.mode == "epoch":
        if args.epoch_length is not None:
            mode_args += ["--epoch-length", str(args.epoch_length)]
        if args.epoch_protocol:
            mode_args += ["--epoch-protocol", args.epoch_protocol]
    elif args.epoch_length is not None or args.epoch_protocol:
        ap.error("--epoch-length and --epoch-protocol go with --mode epoch")

    with ftsite.session("failover"):
        if args.kills < 1:
            raise ftsite.SetupError("--kills must be at least 1")
        if not 0 < args.min_delay <= args.max_delay:
            raise ftsite.SetupError("--min-delay must be positive and at most --max-delay")
        ftsite.check_host(("ip", "taskset"), cores=1 if args.no_pin else 2)
        binary = ftsite.private_ftvm(args.ftvm)
        ftsite.image_dir(binary.path)
        if args.log_dir:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        kinds = [args.kind] * args.kills if args.kind != "both" else \
            [("kill", "crash")[i % 2] for i in range(args.kills)]
        delays = ftsite.random_delays(args.kills, args.min_delay, args.max_delay, args.seed)
        cores = None if args.no_pin else (0, 1)
        print(f"failover: {args.kills} trial(s), kinds {args.kind}, failure after {args.min_delay:g}-"
              f"{args.max_delay:g} s of writes, --timeout {args.timeout_ms} ms, "
              f"{'unpinned' if cores is None else 'primary on core 0, backup on core 1'}, {' '.join(mode_args[1:])} mode; {binary.identity}", flush=True)
        trials = []
        for i, (kind, delay) in enumerate(zip(kinds, delays)):
            work = ftsite.work_dir(f"ftvm-failover-{i + 1}-")
            t = ftsite.failover_trial(binary.path, work, f"fo{i + 1}", kind, delay, timeout_ms=args.timeout_ms,
                                      cores=cores, primary_extra=mode_args, wire=args.wire)
            trials.append(t)
            if args.log_dir:
                for role, path in t.logs.items():
                    shutil.copy(path, Path(args.log_dir) / f"trial{i + 1}-{kind}-{role}.out")
            line = (f"  trial {i + 1:2}/{args.kills} {kind:5} after {delay:4.2f} s: failover {fmt(t.failover)}, "
                    f"going live {fmt(t.go_live)}, longest reply {fmt(t.longest_wait)}; "
                    f"{t.acked} keys acked ({t.acked_before} before), DBSIZE {t.dbsize}, "
                    f"lost {fmt(t.lost, 'd', '')}, connection {'DROPPED' if t.dropped else 'kept'}")
            print(line, flush=True)
            if t.failover is not None and t.failover > WIRE_AFTER:
                for segment in t.wire:
                    print(f"      {segment}", flush=True)
            if t.error:
                print(f"    FAILED: {t.error}", flush=True)
            shutil.rmtree(work, ignore_errors=True)

        print()
        print(f"failover time = from the failure to the acknowledgement of the first key sent after it "
              f"(target: median <= {MEDIAN_TARGET:g} s)")
        verdict = []
        for kind in ("kill", "crash"):
            of_kind = [t for t in trials if t.kind == kind]
            if of_kind:
                med, top = summary_row(kind, of_kind)
                for word, value, target in (("median", med, KIND_TARGETS[kind][0]),
                                            ("max", top, KIND_TARGETS[kind][1])):
                    if target is not None and value is not None:
                        verdict.append(f"{kind} {word} {'meets' if value <= target else 'MISSES'} "
                                       f"issue 31's {target * 1000:.0f} ms")
        overall, _ = summary_row("overall", trials)
        lost = sum(t.lost or 0 for t in trials)
        dropped = sum(t.dropped for t in trials)
        failed = sum(t.error is not None for t in trials)
        verdict = [f"median {'meets' if overall is not None and overall <= MEDIAN_TARGET else 'MISSES'} "
                   f"the {MEDIAN_TARGET:g} s target", *verdict,
                   f"{lost} acknowledged write(s) lost (target 0)", f"{dropped} connection(s) dropped (target 0)"]
        if failed:
            verdict.append(f"{failed} trial(s) FAILED")
        print("failover: " + "; ".join(verdict))
        path = results.write("failover", ["bench/failover"] + sys.argv[1:], figures(args, mode_args, trials),
                             [t_details(t) for t in trials], args.json, args.ftvm)
        print(f"failover: figures written to {path}")
    sys.exit(1 if lost or dropped or failed else 0)


if __name__ == "__main__":
    main()
