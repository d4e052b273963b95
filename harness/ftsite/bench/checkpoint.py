"""Checkpoint mode (Remus) beside the paper: overhead against an
unprotected run at 10, 20, 30 and 40 checkpoints per second, the rate
achieved against the rate configured, pause time against pages dirtied
(Remus Fig. 5), and the latency checkpointing adds to redis requests.

One boot per configuration, on a fresh site (harness/ftsite) with the
primary (or the plain run) on core 0 and the backup on core 1; each host
has its own copy of the disk, as checkpoint mode wants.

  overhead  A CPU-and-memory job in the guest, timed on the host between
            console markers (boot excluded): R rounds of writing 4 MiB of
            /dev/urandom to a new file in /dev/shm, hashing it and
            compressing it with gzip -1 into another (new pages every
            round, as a compiler's heap and output are). Remus's figure is
            a kernel compile: 31%, 52%, 80% and 103% slower at 10-40/s.
            Target: <= 30% at 40/s. After the job the primary's status
            gives the achieved rate, the pause time (median, p99, and by
            pages dirtied), bytes per checkpoint and the compression ratio.
  redis     redis-benchmark -c 1 (one request at a time) SET and GET from
            the client namespace (bench/ft-overhead's redis, no AOF),
            without FT and at 40/s twice: on Remus's beat alone
            (--no-idle-checkpoints: each reply waits for the end of its
            interval, then the checkpoint's round trip) and with idle
            checkpoints (the default: the epoch ends as soon as the guest
            idles with a reply waiting).

  bench/checkpoint                               every rate, then redis (~45 min)
  bench/checkpoint --rates 40 --rounds 4 --no-redis
  bench/checkpoint --no-overhead                 redis only

Needs root, two cores, iproute2 and taskset. Exits 0 when every run
completed, 3 when one failed, 2 on bad input.
"""

import argparse
import statistics
import sys
from pathlib import Path

import ftsite
from ftsite.bench import ft_overhead, results
from ftsite.bench import redis as redis_bench

MARK = "ftvm-ckpt-"
# Remus §3.3, Fig. 6 (kernel compile): overhead at 10, 20, 30, 40 checkpoints/s.
PAPER_OVERHEAD = {10: 0.31, 20: 0.52, 30: 0.80, 40: 1.03}
# Remus Fig. 4 (SPECweb): achieved checkpoint rate at 10-40/s configured.
PAPER_RATE = {10: 9.98, 20: 16.38, 30: 20.25, 40: 23.34}
OVERHEAD_TARGET = 0.30


def guest_script(rounds):
    body = ("dd if=/dev/urandom of=/dev/shm/a$i bs=64k count=64 2>/dev/null; sha256sum /dev/shm/a$i >/dev/null; "
            "gzip -1 -c /dev/shm/a$i > /dev/shm/b$i; rm /dev/shm/a$i /dev/shm/b$i")
    return f"echo {MARK}start; i=0; while [ $i -lt {rounds} ]; do {body}; i=$((i+1)); done; echo {MARK}end"


def field(status, key):
    """A field of the primary's status (ftsite.status), shown with the unit
    the status gives it; None if it is not there."""
    v = status.get(key) if status else None
    if v is None:
        return None
    if key == "rate_overall":
        return f"{v:.2f}/s"
    if key in ("pause_median", "pause_p99"):
        return f"{v}us"
    if key == "compression":
        return f"{v:.2f}"
    if key == "pause_by_dirty":
        return ",".join(f"{b['lo']}-{'' if b['hi'] is None else b['hi']}:{b['median_us']}/{b['p99_us']}us/"
                        f"{b['checkpoints']}" for b in v) or None
    return str(v)


def timed_run(boot_class, mode, tag, binary, script, args, ft_extra=()):
    """Boots once; returns (seconds between the markers, primary status
    taken at the end marker or None)."""
    marks, holder = {}, {}

    def on_line(t, line):
        s = line.strip()
        if s.startswith(MARK) and s not in marks:
            marks[s] = t
            if s == MARK + "end" and "boot" in holder and mode == "ft":
                try:
                    holder["status"] = ftsite.status(holder["boot"].vm.sock)
                except (OSError, ftsite.TrialFailed):
                    pass

    with boot_class(mode, tag, binary, script, args, on_line=on_line, ft_extra=ft_extra) as boot:
        holder["boot"] = boot
        boot.wait_exit(args.timeout)
        if MARK + "start" not in marks or MARK + "end" not in marks:
            raise ftsite.TrialFailed(f"{tag}: the guest did not print both markers:\n{boot.vm.tail()}")
    return marks[MARK + "end"] - marks[MARK + "start"], holder.get("status")


def main():
    ap = argparse.ArgumentParser(prog="checkpoint", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10,20,30,40", help="checkpoints per second, comma-separated")
    ap.add_argument("--runs", type=int, default=1, help="boots per configuration; medians (default 1)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of the CPU-and-memory job (default 8)")
    ap.add_argument("--requests", type=int, default=500, help="redis-benchmark requests per test (default 500)")
    ap.add_argument("--no-redis", action="store_true", help="skip the redis latency part")
    ap.add_argument("--no-overhead", action="store_true", help="skip the overhead part (redis only)")
    ap.add_argument("--ftvm", default=ftsite.default_ftvm(), help="ftvm binary (copied privately before use)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per boot (default 1800)")
    ap.add_argument("--log-dir", help="keep every VM's output here")
    results.add_option(ap, "checkpoint")
    args = ap.parse_args()
    args.fast_time = False

    with ftsite.session("checkpoint"):
        try:
            rates = [int(x) for x in args.rates.split(",") if x.strip()]
            assert rates and all(1 <= r <= 1000 for r in rates)
            assert args.runs >= 1 and args.rounds >= 1 and args.requests >= 1
        except (ValueError, AssertionError):
            raise ftsite.SetupError("--rates wants checkpoints per second (1-1000), --runs, --rounds and "
                                    "--requests positive numbers") from None
        ftsite.check_host(("ip", "taskset"), cores=2)
        binary = ftsite.private_ftvm(args.ftvm)
        ftsite.image_dir(binary.path)
        if args.log_dir:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        fto = ft_overhead
        script = guest_script(args.rounds)
        print(f"checkpoint: rates {rates}/s, {args.runs} run(s) each, job of {args.rounds} rounds; {binary.identity}",
              flush=True)

        configs = [] if args.no_overhead else [None, *rates]
        times = {c: [] for c in configs}
        statuses = {c: [] for c in configs}
        failed = None
        try:
            for r in range(args.runs):
                for c in configs:
                    tag = f"k{r}{configs.index(c)}"
                    if c is None:
                        t, st = timed_run(fto.Boot, "run", tag, binary.path, script, args)
                    else:
                        extra = ["--mode", "checkpoint", "--interval", str(round(1000 / c))]
                        t, st = timed_run(fto.Boot, "ft", tag, binary.path, script, args, ft_extra=extra)
                    times[c].append(t)
                    if st:
                        statuses[c].append(st)
                    name = "no FT" if c is None else f"{c}/s"
                    print(f"  run {r + 1} {name:6}: job {t:7.2f} s" + (f"; {st['_raw']}" if st else ""), flush=True)
        except ftsite.TrialFailed as e:
            failed = str(e)
            print(f"checkpoint: a run FAILED: {e}", file=sys.stderr, flush=True)

        base = statistics.median(times[None]) if times.get(None) else None
        if configs:
            print()
            print("overhead = time with checkpoints / time without - 1 (Remus's kernel compile in brackets)")
            print(f"{'rate':>6} {'job s':>8} {'overhead':>16} {'achieved/s':>18} {'pause med':>10} {'p99':>8} "
              f"{'dirty med':>9} {'bytes/ckpt':>10} {'compr':>6}  pause by pages dirtied (median/p99 us/checkpoints)")
        if base is not None:
            print(f"{'no FT':>6} {base:8.2f}")
        at_target = None
        figs, pauses = [], []
        for c in rates:
            if not times.get(c):
                continue
            t = statistics.median(times[c])
            over = t / base - 1 if base else None
            if c == 40:
                at_target = over
            st = statuses[c][-1] if statuses[c] else {}
            ach = field(st, "rate_overall")
            over_text = "n/a" if over is None else f"{over * 100:.0f}%"
            paper_over = f"[{PAPER_OVERHEAD[c] * 100:.0f}%]" if c in PAPER_OVERHEAD else ""
            paper_rate = f"[{PAPER_RATE[c]}]" if c in PAPER_RATE else ""
            print(f"{c:>5}/s {t:8.2f} {over_text + ' ' + paper_over:>16} {(ach or 'n/a') + ' ' + paper_rate:>18} "
                  f"{field(st, 'pause_median') or 'n/a':>10} "
                  f"{field(st, 'pause_p99') or 'n/a':>8} {field(st, 'dirty_median') or 'n/a':>9} "
                  f"{field(st, 'bytes_per_checkpoint') or 'n/a':>10} {field(st, 'compression') or 'n/a':>6}  "
                  f"{field(st, 'pause_by_dirty') or 'n/a'}")
            figs.append(results.figure(
                f"checkpoint.overhead.{c}", f"checkpoint mode at {c} checkpoints/s: the overhead on a CPU-and-memory "
                "job", over * 100 if over is not None else None, "%",
                peer=results.peer("Remus (kernel compile)", PAPER_OVERHEAD[c] * 100 if c in PAPER_OVERHEAD else None, "%"),
                target=f"≤ {OVERHEAD_TARGET * 100:.0f} % at 40/s" if c == 40 else None,
                met=(over <= OVERHEAD_TARGET) if c == 40 and over is not None else None,
                note=f"job {t:.2f} s, {base:.2f} s without FT; achieved {ach or 'n/a'}" if base else None))
            if st.get("pause_median") is not None:
                pauses.append((st["pause_median"], st.get("pause_p99")))
        if pauses:
            lo, hi = min(m for m, _ in pauses), max(m for m, _ in pauses)
            p99 = [p for _, p in pauses if p is not None]
            figs.append(results.figure(
                "checkpoint.pauses", "checkpoint mode: the pause (median, across the rates)",
                f"{lo}-{hi}" if lo != hi else lo, "µs",
                note=f"p99 {min(p99)}-{max(p99)} µs" if p99 else None))
        if at_target is not None:
            print(f"target: overhead <= {OVERHEAD_TARGET * 100:.0f}% at 40/s: "
                  f"{'met' if at_target <= OVERHEAD_TARGET else 'MISSED'} ({at_target * 100:.0f}%)")

        if not args.no_redis and not failed:
            args.clients = [1]
            parse_bench = redis_bench.parse_bench
            rows = {}
            try:
                ckpt = ("--mode", "checkpoint", "--interval", "25")
                for name, mode, extra in (("no FT", "run", ()), ("40/s beat", "ft", (*ckpt, "--no-idle-checkpoints")),
                                          ("40/s idle", "ft", ckpt)):
                    res = fto.redis_round(mode, f"kr{len(rows)}", binary.path, args, parse_bench, ft_extra=extra)
                    rows[name] = {k.split()[0]: v[0] for k, v in res.items()}
                    print(f"  redis {name}: " + ", ".join(f"{k} {v:.0f} req/s" for k, v in rows[name].items()),
                          flush=True)
            except ftsite.TrialFailed as e:
                failed = str(e)
                print(f"checkpoint: a redis run FAILED: {e}", file=sys.stderr, flush=True)
            if len(rows) == 3:
                print()
                print("redis-benchmark -c 1: one request at a time; latency = 1 / rate; "
                      "beat = Remus (--no-idle-checkpoints), idle = ftvm's default")
                for k in rows["no FT"]:
                    a = rows["no FT"][k]
                    cells = []
                    for name in ("40/s beat", "40/s idle"):
                        b = rows[name].get(k)
                        if b:
                            cells.append(f"{name} {b:7.0f} req/s ({1000 / b:6.2f} ms, +{1000 / b - 1000 / a:.2f} ms)")
                    print(f"  {k:4}: no FT {a:7.0f} req/s ({1000 / a:6.2f} ms); " + "; ".join(cells))
                    for name in ("40/s beat", "40/s idle"):
                        b = rows[name].get(k)
                        if b:
                            figs.append(results.figure(
                                f"checkpoint.redis-{k}.{name.split('/s ')[1]}", f"checkpoint mode, redis-benchmark -c 1 "
                                f"{k} at {name} ({'Remus: --no-idle-checkpoints' if 'beat' in name else 'idle checkpoints'})"
                                ": the latency added", 1000 / b - 1000 / a, "ms",
                                peer=results.peer("no FT", a, "req/s"), note=f"{b:.0f} req/s"))
        path = results.write("checkpoint", ["bench/checkpoint"] + sys.argv[1:], [] if failed else figs,
                             {"times_s": {str(k): v for k, v in times.items()},
                              "statuses": {str(k): v for k, v in statuses.items()}, "failed": failed},
                             args.json, args.ftvm)
        print(f"checkpoint: figures written to {path}" + (" (none kept: a run failed)" if failed else ""))
        if failed:
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
