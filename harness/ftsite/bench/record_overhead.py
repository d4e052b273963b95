"""What recording costs: `ftvm record` beside `ftvm run`, run at the same
time on the two cores of the host, so both see the same host noise.

Sequential A/B runs on a shared host differ by 5-10 % from one run to the
next, more than the effect measured (the recording overhead target is
<= 3 %, issue 4). Here each pair runs the two commands concurrently, each
pinned to its own core with `taskset`; the next pair swaps the cores, so a
faster core favours neither side. Both use `--fast-time` (no pacing to the
wall clock: the guest runs flat out from boot to power-off) on the CPU job
of `vs-qemu` (`dd if=/dev/zero bs=1M count=64 | sha256sum`), each on its
own fresh sparse copy of the root disk.

Per pair it reports, for record against run: the job's host time (between
the guest's console markers) and the whole process's CPU time (user +
system, from wait4), and prints the median of the per-pair ratios with
their range. The log is checked by replaying it once at the end.

  bench/record-overhead                 6 pairs
  bench/record-overhead --pairs 10 --log-dir /tmp/ro

Needs a host with at least two cores. A benchmark, not a test: exits 0
unless a run fails, 1 if the median overhead misses the target.
"""

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

TARGET = 0.03


from ftsite.bench import options, results
from ftsite.bench import vs_qemu as vs


def die(msg, code=2):
    print(f"record-overhead: {msg}", file=sys.stderr)
    sys.exit(code)


def fresh_disk(img, work, name):
    disk = os.path.join(work, f"{name}.ext4")
    subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
    return disk


def one_pair(i, ftvm, img, args, work):
    """Run and record side by side; returns their marks and the log path."""
    run_disk, rec_disk = fresh_disk(img, work, "run"), fresh_disk(img, work, "rec")
    log = os.path.join(work, "ftvm.log")
    base = vs.ftvm_argv(ftvm, img, run_disk, args, vs.JOB_CMD)
    run_argv = base + ["--fast-time"]
    rec_argv = ([str(ftvm), "record", "--log", log]
                + vs.ftvm_argv(ftvm, img, rec_disk, args, vs.JOB_CMD)[2:] + ["--fast-time"])
    # Even pairs put run on core 0, odd pairs on core 1.
    run_core, rec_core = (0, 1) if i % 2 == 0 else (1, 0)
    out = {}

    def go(key, core, argv):
        keep = os.path.join(args.log_dir, f"{key}-{i + 1}.log") if args.log_dir else None
        out[key] = vs.run_once(["taskset", "-c", str(core)] + argv, args.timeout, keep)

    threads = [threading.Thread(target=go, args=("run", run_core, run_argv)),
               threading.Thread(target=go, args=("record", rec_core, rec_argv))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, m in out.items():
        problem = ("timed out" if m["timeout"] else f"exit status {m['rc']}" if m["rc"] != 0
                   else "no job markers" if "job_start" not in m or "job_end" not in m else None)
        if problem:
            die(f"pair {i + 1}: ftvm {key}: {problem}"
                + ("" if args.log_dir else "; rerun with --log-dir DIR to keep the console"), 3)
    os.unlink(run_disk)
    os.unlink(rec_disk)
    return out, log, run_core


def main():
    ap = options.parser("record-overhead", __doc__)
    ap.add_argument("--pairs", type=int, default=6, help="concurrent run/record pairs (default 6)")
    options.add_guest(ap, qemu=False, boot=False, ftvm_help="ftvm binary")
    results.add_option(ap, "record-overhead")
    args = ap.parse_args()
    if args.pairs < 1:
        die("--pairs must be at least 1")
    if (os.cpu_count() or 1) < 2:
        die("needs at least two cores to run the pair side by side")
    options.default_boot(args)
    ftvm = Path(args.ftvm)
    if not (ftvm.is_file() and os.access(ftvm, os.X_OK)):
        die(f"ftvm binary not found at {ftvm}: build it with `cargo build --release -p ftvm` or pass --ftvm")
    img = vs.resolve_image(args, ftvm)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)

    print(f"record-overhead: {args.pairs} pair(s) of ftvm run and ftvm record side by side, "
          f"--fast-time, -m {args.mem}; boot + `{vs.JOB}`", flush=True)
    job_ratios, cpu_ratios = [], []
    with tempfile.TemporaryDirectory(prefix="ftvm-record-overhead-") as work:
        for i in range(args.pairs):
            out, log, run_core = one_pair(i, ftvm, img, args, work)
            run, rec = out["run"], out["record"]
            run_job, rec_job = run["job_end"] - run["job_start"], rec["job_end"] - rec["job_start"]
            job_ratios.append(rec_job / run_job)
            cpu_ratios.append(rec["cpu"] / run["cpu"])
            print(f"  pair {i + 1} (run on core {run_core}): job run {run_job:.2f}s record {rec_job:.2f}s "
                  f"({(job_ratios[-1] - 1) * 100:+.1f} %); CPU run {run['cpu']:.1f}s record {rec['cpu']:.1f}s "
                  f"({(cpu_ratios[-1] - 1) * 100:+.1f} %)", flush=True)
            if i == args.pairs - 1:
                rep = subprocess.run([str(ftvm), "replay", "--log", log], capture_output=True, text=True,
                                     timeout=args.timeout)
                if rep.returncode != 0:
                    die(f"replay of the last pair's log failed ({rep.returncode}): {rep.stderr.strip()}", 3)
                print(f"  last log replayed: {rep.stderr.strip().splitlines()[-1]}")
            os.unlink(log)

    print()
    worst = 0.0
    for label, rs in (("job time", job_ratios), ("process CPU time", cpu_ratios)):
        over = vs.med(rs) - 1
        worst = max(worst, over)
        print(f"recording overhead, {label:17} median {over * 100:+5.1f} %   "
              f"pairs {min(rs) * 100 - 100:+.1f} .. {max(rs) * 100 - 100:+.1f} %   (target <= +{TARGET * 100:.0f} %)")
    figs = [results.figure(f"record-overhead.{key}", f"recording overhead, {label} (medians of {args.pairs} pairs run side by side)",
                           (vs.med(rs) - 1) * 100, "%", peer=results.peer("`ftvm run`"), ratio=vs.med(rs),
                           target=f"≤ +{TARGET * 100:.0f} %", met=vs.med(rs) - 1 <= TARGET,
                           note=f"pairs {min(rs) * 100 - 100:+.1f} .. {max(rs) * 100 - 100:+.1f} %")
            for key, label, rs in (("job", "job time", job_ratios), ("cpu", "process CPU time", cpu_ratios))]
    path = results.write("record-overhead", ["bench/record-overhead"] + sys.argv[1:], figs,
                         {"job_ratios": job_ratios, "cpu_ratios": cpu_ratios}, args.json, ftvm)
    print(f"record-overhead: figures written to {path}")
    sys.exit(0 if worst <= TARGET else 1)


if __name__ == "__main__":
    main()
