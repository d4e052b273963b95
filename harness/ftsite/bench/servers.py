"""Multi-process guest work, ftvm beside QEMU (issue 69).

What a server with a process per connection does besides computing: fork,
exec, switch address spaces, move bytes through pipes. Boots the default
guest image in ftvm and in qemu-system-riscv64 -M virt (TCG) with the same
kernel, initrd, firmware, memory, hart count and kernel command line, on a
fresh sparse copy of the root disk per run, and times each workload on the
host between the console lines the guest prints around it
(`ftvm-bench-part-start=NAME` / `...-end=NAME`; boot is not timed):

  forkexec  a shell loop of 2,000 (--loops) runs of /usr/bin/true (coreutils,
            dynamically linked: fork, exec, ld.so, exit, wait each time)
  pipe      100 MiB (--pipe-mb) from dd through three /usr/bin/cat into
            wc -c, which must count every byte

  pgbench   PostgreSQL driven by the host's pgbench over TAP      } not yet:
  nginx     nginx driven by a host client over TAP                } see below

pgbench and nginx need an image with those packages configured as services,
which issue 63 (configured packages, services) is building; they are named
in --only so that the selector and the table have room for them, and asking
for them fails with that reason rather than measuring something else.

For each hart count (--cpus, default 1,2) the rounds alternate ftvm and QEMU
(ftvm first in odd rounds, QEMU first in even ones). The table shows each
workload's median seconds and the ratio ftvm/QEMU of the same runs; the
result is also written as JSON (bench/results/servers.json, --json).
Target (issue 69): ratio <= 0.7 for fork/exec and the pipe.

Exit status: 0 the target met (or --qemu-only), 1 missed, 2 bad input or
setup, 3 a run failed.

  bench/servers                              3 rounds, 1 and 2 harts
  bench/servers --runs 1 --cpus 1 --only forkexec
  bench/servers --ftvm path/to/other/ftvm    another build
"""

import os
import subprocess
import sys
import tempfile
import time
import types

from ftsite.bench import options, results, vs_qemu

GUEST_WORKLOADS = ("forkexec", "pipe")
# Server workloads waiting for issue 63's configured image: name -> why not.
NOT_YET = {
    "pgbench": "PostgreSQL in the guest needs issue 63's configured image (packages set up as services)",
    "nginx": "nginx in the guest needs issue 63's configured image (packages set up as services)",
}
TARGET = 0.7
LOOPS = 2000
PIPE_MB = 100

PART_START = "ftvm-bench-part-start="
PART_END = "ftvm-bench-part-end="
RESULT = "ftvm-bench-result="
FAILED = "ftvm-bench-failed="

# The guest's side, given as the exec command (it goes on the kernel command
# line base64-encoded, for QEMU, so it stays short). busybox sh runs its own
# applets before PATH's programs: the real programs are named by path, so
# each is a fork and an exec of a dynamically linked binary.
GUEST = {
    "forkexec": "i=0; while [ $i -lt {loops} ]; do /usr/bin/true || exit 1; i=$((i+1)); done; echo {result}$i",
    "pipe": ("n=$(/usr/bin/dd if=/dev/zero bs=1M count={mb} status=none | /usr/bin/cat | /usr/bin/cat "
             "| /usr/bin/cat | /usr/bin/wc -c); echo {result}$n; [ \"$n\" = {bytes} ]"),
}


def die(msg, code=2):
    print(f"servers: {msg}", file=sys.stderr)
    sys.exit(code)


def guest_command(parts, args):
    """One exec command running `parts` in order, each between its markers;
    a part that fails prints the failure marker and stops the job."""
    steps = []
    for p in parts:
        body = GUEST[p].format(loops=args.loops, mb=args.pipe_mb, bytes=args.pipe_mb << 20, result=f"{RESULT}{p}=")
        steps.append(f"echo {PART_START}{p}; ( {body} ) || {{ echo {FAILED}{p}; exit 1; }}; echo {PART_END}{p}")
    return "; ".join(steps)


def expected(part, args):
    return str(args.loops) if part == "forkexec" else str(args.pipe_mb << 20)


def one_run(emu, make_argv, img, cpus, args, work, rnd):
    """One boot of `emu` running the workloads: seconds per workload, or
    exit 3 on any failure."""
    disk = os.path.join(work, f"{emu}-disk.ext4")
    subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
    log = os.path.join(args.log_dir, f"{emu}-cpus{cpus}-{rnd + 1}.log") if args.log_dir else None
    starts, ends, got, failed = {}, {}, {}, []

    def on_line(line, now):
        for prefix, into in ((PART_START, starts), (PART_END, ends)):
            if line.startswith(prefix):
                into.setdefault(line[len(prefix):].strip(), now)
        if line.startswith(RESULT):
            name, _, value = line[len(RESULT):].partition("=")
            got[name] = value.strip()
        if line.startswith(FAILED):
            failed.append(line[len(FAILED):].strip())

    ns = types.SimpleNamespace(mem=args.mem, cpus=cpus)
    m = vs_qemu.run_once(make_argv(img, disk, ns, guest_command(args.parts, args)), args.timeout, log, on_line=on_line)
    os.unlink(disk)
    problem = None
    if failed:
        problem = f"the guest's {failed[0]} failed (it printed {got.get(failed[0], 'nothing')})"
    elif m["timeout"]:
        problem = f"timed out after {args.timeout:g}s"
    elif m["rc"] != 0:
        problem = f"exit status {m['rc']}"
    elif emu == "qemu" and m.get("status_line") != "0":
        problem = f"the guest command's status {m.get('status_line', '(no status line)')}"
    else:
        missing = [p for p in args.parts if p not in starts or p not in ends]
        wrong = [p for p in args.parts if got.get(p) != expected(p, args)]
        if missing:
            problem = f"no start/end markers of {', '.join(missing)}"
        elif wrong:
            problem = ", ".join(f"{p} gave {got.get(p)!r}, not {expected(p, args)}" for p in wrong)
    if problem:
        if not log:
            tail = "\n".join("    " + line for line in m["output"][-30:])
            print(f"servers: the console's last lines:\n{tail}", file=sys.stderr)
        die(f"{emu} run {rnd + 1} with {cpus} hart(s): {problem}{options.console_hint(log)}", 3)
    return {p: ends[p] - starts[p] for p in args.parts}


def main():
    ap = options.parser("servers", __doc__)
    ap.add_argument("--runs", type=int, default=3, help="rounds per hart count (default 3)")
    ap.add_argument("--cpus", default="1,2", help="hart counts, comma-separated (default 1,2)")
    ap.add_argument("--only", default=",".join(GUEST_WORKLOADS),
                    help=f"workloads, of {','.join(GUEST_WORKLOADS + tuple(NOT_YET))} (default "
                         f"{','.join(GUEST_WORKLOADS)}; {','.join(NOT_YET)}: not yet, issue 63)")
    ap.add_argument("--loops", type=int, default=LOOPS, help=f"forkexec's runs of /usr/bin/true (default {LOOPS})")
    ap.add_argument("--pipe-mb", type=int, default=PIPE_MB, help=f"MiB through the pipe (default {PIPE_MB})")
    ap.add_argument("--hart-threads", choices=("single", "multi"), default="multi",
                    help="ftvm's --hart-threads (default multi)")
    ap.add_argument("--qemu-only", action="store_true", help="measure QEMU only")
    ap.add_argument("--quiet", action="store_true", help="only print the table")
    results.add_option(ap, "servers")
    options.add_guest(ap, boot=False, timeout=1800)
    args = ap.parse_args()
    if args.runs < 1 or args.loops < 1 or args.pipe_mb < 1:
        die("--runs, --loops and --pipe-mb must be at least 1")
    try:
        cpus_list = [int(c) for c in args.cpus.split(",") if c.strip()]
    except ValueError:
        die(f"--cpus {args.cpus!r}: give hart counts such as 1,2")
    if not cpus_list or any(c < 1 or c > 8 for c in cpus_list):
        die(f"--cpus {args.cpus!r}: hart counts from 1 to 8")
    args.parts = [p.strip() for p in args.only.split(",") if p.strip()]
    for p in args.parts:
        if p in NOT_YET:
            die(f"--only {p}: not measured yet: {NOT_YET[p]}")
        if p not in GUEST_WORKLOADS:
            die(f"--only {p!r}: choose from {','.join(GUEST_WORKLOADS + tuple(NOT_YET))}")
    if not args.parts:
        die("--only names no workload")

    options.default_boot(args)
    ftvm, qemu = vs_qemu.emulators(args, die)
    img = vs_qemu.resolve_image(args, ftvm)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    emus = {"qemu": lambda i, d, a, c: vs_qemu.qemu_argv(qemu, i, d, a, c)}
    if ftvm is not None:
        def ftvm_argv(i, d, a, c):
            argv = vs_qemu.ftvm_argv(ftvm, i, d, a, c)
            return argv[:2] + ["--hart-threads", args.hart_threads] + argv[2:]
        emus["ftvm"] = ftvm_argv
        print(f"servers: ftvm {ftvm} (built {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ftvm.stat().st_mtime))}, "
              f"repo {results.commit()})", flush=True)
    print(f"servers: {args.runs} round(s) per hart count, harts {','.join(map(str, cpus_list))} "
          f"(ftvm --hart-threads {args.hart_threads}), -m {args.mem}; workloads {','.join(args.parts)} "
          f"(loops {args.loops}, pipe {args.pipe_mb} MiB); kernel {img['kernel']}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    res = {c: {e: [] for e in emus} for c in cpus_list}
    with tempfile.TemporaryDirectory(prefix="ftvm-bench-servers-") as work:
        for cpus in cpus_list:
            for rnd in range(args.runs):
                order = [e for e in ("ftvm", "qemu") if e in emus]
                if rnd % 2:
                    order.reverse()
                for emu in order:
                    times = one_run(emu, emus[emu], img, cpus, args, work, rnd)
                    res[cpus][emu].append(times)
                    if not args.quiet:
                        detail = ", ".join(f"{p} {times[p]:.2f}s" for p in args.parts)
                        print(f"  {cpus} hart(s) round {rnd + 1}/{args.runs} {emu:4}: {detail}", flush=True)

    print()
    print(f"{'harts':>5} {'workload':9} {'ftvm s':>8} {'qemu s':>8} {'ratio':>6}   runs ftvm | qemu (s)")
    missed = False
    out = {"target_ratio_at_most": TARGET, "loops": args.loops, "pipe_mib": args.pipe_mb, "mem": args.mem,
           "hart_threads": args.hart_threads, "runs": args.runs, "by_harts": {}}
    for cpus in cpus_list:
        rows = out["by_harts"][str(cpus)] = {}
        for part in args.parts:
            row = {e: {"median_s": vs_qemu.med([t[part] for t in res[cpus][e]]),
                       "runs_s": [round(t[part], 3) for t in res[cpus][e]]} for e in emus}
            ratio = row["ftvm"]["median_s"] / row["qemu"]["median_s"] if "ftvm" in row else None
            row["ratio_ftvm_to_qemu"] = round(ratio, 3) if ratio is not None else None
            rows[part] = row
            if ratio is None:
                verdict = f"(target <= {TARGET}) --qemu-only"
            else:
                missed |= ratio > TARGET
                verdict = f"(target <= {TARGET}) {'PASS' if ratio <= TARGET else 'MISS'}"
            ftvm_s = f"{row['ftvm']['median_s']:8.2f}" if "ftvm" in row else f"{'-':>8}"
            ratio_s = f"{ratio:6.2f}" if ratio is not None else f"{'-':>6}"
            runs = " | ".join(" ".join(f"{x:.2f}" for x in row[e]["runs_s"]) for e in ("ftvm", "qemu") if e in row)
            print(f"{cpus:5} {part:9} {ftvm_s} {row['qemu']['median_s']:8.2f} {ratio_s}   {runs}  {verdict}")
    for name, why in NOT_YET.items():
        print(f"{'':5} {name:9} not measured: {why}")
    names = {"forkexec": f"fork/exec: a busybox shell loop of {args.loops:,} `/usr/bin/true`",
             "pipe": f"a pipe: {args.pipe_mb} MiB from `dd` through three `/usr/bin/cat` into `wc -c`"}
    figs = [results.figure(f"servers.{part}.{cpus}", f"{names[part]}, {cpus} hart(s) (`--hart-threads {args.hart_threads}`)",
                           row["ftvm"]["median_s"], "s", peer=results.peer("QEMU", row["qemu"]["median_s"], "s"),
                           ratio=row["ratio_ftvm_to_qemu"], target=f"≤ {TARGET}", met=row["ratio_ftvm_to_qemu"] <= TARGET)
            for cpus, rows in out["by_harts"].items() for part, row in rows.items() if "ftvm" in row]
    path = results.write("servers", ["bench/servers"] + sys.argv[1:], figs, out, args.json, ftvm)
    print(f"servers: figures written to {path}")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
