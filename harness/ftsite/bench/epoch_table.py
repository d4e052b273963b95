"""Bressoud & Schneider's Table 1 on our machine: normalized performance
(time of a workload under FT in epoch mode / time of the same workload with
no FT) for several epoch lengths, under the original protocol (the primary
waits for the backup's acknowledgement at every epoch end, P2) and the
revised one (only before an output leaves, §4.3), beside the paper's
figures and beside lockstep mode (VMware FT) on the same workloads.

The guest boots once, with no FT, makes its data file and is snapshotted
(`ftvm control ... snapshot`); every configuration then starts from that
snapshot (`ftvm run --restore`, `ftvm ft primary --restore`) on a fresh
site (harness/ftsite) and a fresh copy of the disk, with the primary
(or the plain run) on core 0 and the backup on core 1: a boot under the
original protocol at 1K epochs would take far longer than the workloads
(--boot boots each configuration instead). The guest runs three
workloads in turn, each timed on the host between console markers the
guest prints around it:

  cpu    `dd if=/dev/zero bs=1M count=M | sha256sum` (the CPU job).
  write  B writes of one 4 KiB block at a random place of a 16 MiB file,
         each with O_DIRECT and awaited (busybox dd oflag=direct), as the
         paper's write benchmark.
  read   B reads likewise (iflag=direct: past the page cache).

Each iteration of the disk loops starts a dd (busybox has no program that
picks random blocks), so each block also costs a process start: about
12 ms of guest CPU, far more than the paper's benchmark spent choosing a
block and starting the transfer.

The guest's disk is a file in the host's page cache, which answers in
microseconds, so the disk workloads cost about what their CPU work costs.
The paper's disk took 26 ms per write and 24.2 ms per read (§4.2), which
hid most of each epoch's cost. Two options rebuild the paper's conditions:

  --disk-latency 26ms  the restored guest's disk (with FT and without
                       alike) takes at least that long for every request
                       (`--disk PATH,latency=26ms`): a disk like the paper's.
  --one-program        each disk workload is one dd writing (reading) B
                       consecutive blocks, each with O_DIRECT and awaited
                       before the next: one program, as the paper's. On a
                       disk with a flat latency, consecutive blocks cost
                       what random ones do.

  bench/epoch-table                              every length, both protocols (~25 min)
  bench/epoch-table --lengths 4096,65536 --protocols revised --blocks 64
  bench/epoch-table --one-program --disk-latency 26ms      the paper's conditions

Needs root, two cores, iproute2 and taskset. Exits 0 when every run
completed, 3 when one failed, 2 on bad input.
"""

import argparse
import re
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import ftsite
from ftsite.bench import ft_overhead, results

WORKLOADS = ("cpu", "write", "read")
MARK = "ftvm-epoch-"
# Bressoud & Schneider, Table 1 (normalized performance; their Read "New"
# column did not survive in the text we have, so it is left out).
PAPER = {
    ("cpu", "original"): {1024: 22.24, 2048: 11.83, 4096: 6.50, 8192: 3.83},
    ("cpu", "revised"): {1024: 11.67, 2048: 4.49, 4096: 3.21, 8192: 2.20},
    ("write", "original"): {1024: 1.87, 2048: 1.71, 4096: 1.67, 8192: 1.64},
    ("write", "revised"): {1024: 1.70, 2048: 1.66, 4096: 1.66, 8192: 1.64},
    ("read", "original"): {1024: 2.32, 2048: 2.10, 4096: 2.03, 8192: 1.98},
}


def guest_script(cpu_mb, blocks, one_program=False):
    """The guest's --exec: the file made first, a marker where the
    snapshot is taken and a pause for the restored VM to settle, then the
    three workloads between markers."""
    loop = lambda body: (f"i=0; while [ $i -lt {blocks} ]; do {body} 2>/dev/null; i=$((i+1)); done")  # noqa: E731
    if one_program:
        write = f"dd if=/dev/zero of=/root/epoch-bench bs=4k count={blocks} conv=notrunc oflag=direct 2>/dev/null"
        read = f"dd if=/root/epoch-bench of=/dev/null bs=4k count={blocks} iflag=direct 2>/dev/null"
    else:
        write = loop("dd if=/dev/zero of=/root/epoch-bench bs=4k count=1 seek=$((RANDOM % 4096)) conv=notrunc "
                     "oflag=direct")
        read = loop("dd if=/root/epoch-bench of=/dev/null bs=4k count=1 skip=$((RANDOM % 4096)) iflag=direct")
    return "; ".join([
        "dd if=/dev/zero of=/root/epoch-bench bs=1M count=16 conv=fsync 2>/dev/null",
        "sync", f"echo {MARK}ready", "sleep 3",
        f"echo {MARK}cpu", f"dd if=/dev/zero bs=1M count={cpu_mb} 2>/dev/null | sha256sum >/dev/null",
        f"echo {MARK}write", write,
        f"echo {MARK}read", read,
        f"echo {MARK}end",
    ])


def snapshot_ready(binary, script, args):
    """Boots the guest once with no FT to its `ready` marker and snapshots
    it there. Returns ((snapshot, disk), work directory to remove)."""
    work = ftsite.work_dir("ftvm-epoch-snap-")
    site = ftsite.Site("eps")
    ready = threading.Event()

    def on_line(t, line):
        if line.strip() == MARK + "ready":
            ready.set()

    try:
        vm = ftsite.start_plain(site, binary, work, script, core=0, on_line=on_line)
        deadline = time.monotonic() + args.timeout
        while not ready.wait(0.5):
            if not vm.alive() or time.monotonic() > deadline:
                raise ftsite.TrialFailed(f"the guest never got ready for its snapshot:\n{vm.tail()}")
        snap = Path(work) / "ready.snap"
        for cmd in ("pause", f"snapshot {snap}", "quit"):
            reply = ftsite.control(vm.sock, cmd, timeout=120)
            if not reply.startswith("ok"):
                raise ftsite.TrialFailed(f"{cmd}: {reply}")
        vm.wait(60)
        vm.stop()
    finally:
        site.close()
    return (snap, Path(work) / "plain-disk.img"), work


def timed_run(boot_class, mode, tag, binary, script, args, ft_extra=(), snapshot=None):
    """One run from boot (or from `snapshot`); {workload: seconds} from
    the console markers."""
    marks = {}

    def on_line(t, line):
        s = line.strip()
        if s.startswith(MARK) and s not in marks:
            marks[s] = t

    with boot_class(mode, tag, binary, script, args, on_line=on_line, ft_extra=ft_extra,
                    snapshot=snapshot) as boot:
        boot.wait_exit(args.timeout)
        names = [*WORKLOADS, "end"]
        if any(MARK + n not in marks for n in names):
            raise ftsite.TrialFailed(f"{tag}: the guest did not print every marker:\n{boot.vm.tail()}")
    return {w: marks[MARK + nxt] - marks[MARK + w] for w, nxt in zip(WORKLOADS, names[1:])}


def main():
    ap = argparse.ArgumentParser(prog="epoch-table", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096,8192,32768,131072,1048576",
                    help="epoch lengths in instructions, comma-separated")
    ap.add_argument("--protocols", default="original,revised", help="original, revised or both (default)")
    ap.add_argument("--runs", type=int, default=1, help="boots per configuration; medians (default 1)")
    ap.add_argument("--cpu-mb", type=int, default=16, help="MiB hashed by the CPU job (default 16)")
    ap.add_argument("--blocks", type=int, default=256, help="blocks written, then read (default 256)")
    ap.add_argument("--ftvm", default=ftsite.default_ftvm(), help="ftvm binary (copied privately before use)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per boot (default 3600)")
    ap.add_argument("--log-dir", help="keep every VM's output here")
    ap.add_argument("--boot", action="store_true", help="boot every configuration instead of restoring a snapshot")
    ap.add_argument("--one-program", action="store_true",
                    help="each disk workload is one dd awaiting each block in turn (consecutive blocks)")
    ap.add_argument("--disk-latency", help="the least time each disk request takes, e.g. 26ms (the paper's disk); "
                    "default: the host's page cache")
    results.add_option(ap, "epoch-table")
    args = ap.parse_args()
    args.fast_time = False

    with ftsite.session("epoch-table"):
        try:
            lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
            protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
            assert lengths and protocols and not set(protocols) - {"original", "revised"}
            assert args.runs >= 1 and args.cpu_mb >= 1 and args.blocks >= 1
        except (ValueError, AssertionError):
            raise ftsite.SetupError("--lengths wants instruction counts, --protocols original and/or revised, "
                                    "--runs, --cpu-mb and --blocks positive numbers") from None
        if args.disk_latency is not None:
            if not re.fullmatch(r"[0-9]+(us|ms|s)", args.disk_latency):
                raise ftsite.SetupError(f"--disk-latency {args.disk_latency}: use a whole number of us, ms or s")
            if args.boot:
                raise ftsite.SetupError("--disk-latency needs the snapshot (it cannot be given with --boot)")
        ftsite.check_host(("ip", "taskset"), cores=2)
        binary = ftsite.private_ftvm(args.ftvm)
        ftsite.image_dir(binary.path)
        if args.log_dir:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        boot_class = ft_overhead.Boot
        script = guest_script(args.cpu_mb, args.blocks, args.one_program)
        disk = f"{args.disk_latency} per request" if args.disk_latency else "the host's page cache"
        print(f"epoch-table: lengths {lengths}, protocols {protocols}, {args.runs} run(s) each; CPU job "
              f"{args.cpu_mb} MiB, {args.blocks} blocks; disk: {disk}; {binary.identity}", flush=True)

        snapshot = None
        if not args.boot:
            snapshot, snap_work = snapshot_ready(binary.path, script, args)
            ftsite.on_cleanup(lambda: shutil.rmtree(snap_work, ignore_errors=True))
            print(f"  snapshot of the ready guest: {snapshot[0]} ({snapshot[0].stat().st_size >> 20} MiB)", flush=True)

        configs = [("none", None, None), ("lockstep", None, None)]
        configs += [("epoch", p, n) for p in protocols for n in lengths]
        times = {c: [] for c in configs}
        failed = None
        try:
            for r in range(args.runs):
                for c in configs:
                    kind, protocol, length = c
                    tag = f"e{r}{len(times[c])}{configs.index(c)}"
                    if kind == "none":
                        t = timed_run(boot_class, "run", tag, binary.path, script, args, snapshot=snapshot)
                    else:
                        extra = [] if kind == "lockstep" else ["--mode", "epoch", "--epoch-length", str(length),
                                                                 "--epoch-protocol", protocol]
                        t = timed_run(boot_class, "ft", tag, binary.path, script, args, ft_extra=extra,
                                      snapshot=snapshot)
                    times[c].append(t)
                    name = kind if kind != "epoch" else f"epoch {protocol} {length}"
                    print(f"  run {r + 1} {name:24}: " + ", ".join(f"{w} {t[w]:7.2f} s" for w in WORKLOADS),
                          flush=True)
        except ftsite.TrialFailed as e:
            failed = str(e)
            print(f"epoch-table: a run FAILED: {e}", file=sys.stderr, flush=True)

        def med(c, w):
            xs = [t[w] for t in times[c]]
            return statistics.median(xs) if xs else None

        base = {w: med(configs[0], w) for w in WORKLOADS}
        print()
        print("normalized performance = time with FT / time without (1 is free; the paper's figure in brackets)")
        print(f"{'mode':26}" + "".join(f"{w:>18}" for w in WORKLOADS))
        print(f"{'no FT (seconds)':26}" + "".join(f"{'n/a' if base[w] is None else f'{base[w]:.2f} s':>18}"
                                                  for w in WORKLOADS))
        cond = ("one-program" if args.one_program else "dd-per-block") + (f"-{args.disk_latency}" if args.disk_latency
                                                                           else "-page-cache")
        figs, beaten, compared = [], 0, 0
        for c in configs[1:]:
            kind, protocol, length = c
            name = "lockstep (VMware FT)" if kind == "lockstep" else f"epoch {protocol} {length}"
            cells = []
            for w in WORKLOADS:
                t = med(c, w)
                ours = "n/a" if t is None or not base[w] else f"{t / base[w]:.2f}"
                paper = PAPER.get((w, protocol or ""), {}).get(length)
                cells.append(f"{ours} [{paper:.2f}]" if paper else ours)
                if paper and t is not None and base[w]:
                    compared += 1
                    beaten += t / base[w] < paper
                if t is not None and base[w]:
                    figs.append(results.figure(
                        f"epoch-table.{cond}.{kind}{f'.{protocol}.{length}' if protocol else ''}.{w}",
                        f"{name}, {w} workload ({cond}): time with FT / without", t, "s",
                        peer=results.peer("no FT", base[w], "s"), ratio=t / base[w],
                        note=f"the paper: {paper:.2f}" if paper else None))
            print(f"{name:26}" + "".join(f"{cell:>18}" for cell in cells))
        if compared:
            figs.insert(0, results.figure(f"epoch-table.{cond}.beaten", f"epoch mode, Bressoud & Schneider's Table 1 "
                                          f"({cond}): the paper's cells beaten", beaten, f"of {compared} cells",
                                          peer=results.peer("the paper's Table 1")))
        path = results.write("epoch-table", ["bench/epoch-table"] + sys.argv[1:], [] if failed else figs,
                             {f"{k} {p or ''} {n or ''}".strip(): v for (k, p, n), v in times.items()}, args.json, args.ftvm)
        print(f"epoch-table: figures written to {path}" + (" (none kept: a run failed)" if failed else ""))
        if failed:
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
