"""Cost of dirty-page tracking: ftvm with and without --dirty-tracking.

Boots the default guest image in `ftvm run --exec` with the same options
except `--dirty-tracking`, alternating on and off, `--runs` times each
(default 3), and prints the median host time of each guest job and the
ratio on/off of the medians. Target: on/off <= 1.03 for every job.

Jobs (timed on the host between the console lines the guest prints right
before and after the job, so boot and power-off are excluded):

  cpu   the CPU job of bench/vs-qemu: `dd if=/dev/zero bs=1M count=64 |
        sha256sum` (its stores go to a few pipe and stack pages);
  mem   a store-heavy job: `dd if=/dev/zero of=/dev/shm/x bs=1M count=64
        conv=notrunc` four times, i.e. 256 MiB written over 16384 distinct
        guest pages (the tmpfs page cache), again and again.

With tracking on, a page is marked dirty when a store first enters a hart's
store-translation cache; `ftvm run` never takes the dirty set, so this is
the marking cost alone (a checkpointing host would also pay for the
translations dropped each time it takes the set).

Runs use `--fast-time` (idle periods skipped at once; `--real-time` turns
that off): otherwise idle stretches inside a job last wall-clock time, the
same with tracking on or off, and only add noise to the ratio.

The whole-process CPU time (user + system, boot included) is shown too: it
is less disturbed by other load on the machine than wall-clock time.

Each run boots a fresh sparse copy of the root disk. Exit status: 0 when
every job meets the target, 1 when one does not, 2 on a usage or setup
error, 3 when a run fails.

  bench/dirty-tracking                 3 runs each, both jobs
  bench/dirty-tracking --runs 5 --jobs mem --log-dir /tmp/dt-logs
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ftsite.host import REPO
from ftsite.bench import options, results
from ftsite.bench.vs_qemu import fmt_runs, med, run_once
JOB_START = "ftvm-bench-job-start"
JOB_END = "ftvm-bench-job-end"
JOBS = {
    "cpu": "dd if=/dev/zero bs=1M count=64 2>/dev/null | sha256sum",
    "mem": "for i in 1 2 3 4; do dd if=/dev/zero of=/dev/shm/ftvm-bench bs=1M count=64 conv=notrunc 2>/dev/null; done",
}
TARGET = 1.03


def die(msg, code=2):
    print(f"dirty-tracking: {msg}", file=sys.stderr)
    sys.exit(code)


def job_cmd(job):
    return f"echo {JOB_START}; {JOBS[job]}; echo {JOB_END}"


def default_ftvm():
    target = os.environ.get("CARGO_TARGET_DIR")
    base = Path(target) if target else REPO / "target"
    if not base.is_absolute():
        base = REPO / base
    return base / "release" / "ftvm"


def ensure_ftvm(args):
    ftvm = Path(args.ftvm) if args.ftvm else default_ftvm()
    if ftvm.is_file() and os.access(ftvm, os.X_OK):
        return ftvm
    if args.ftvm:
        die(f"ftvm binary not found at {ftvm}")
    print(f"dirty-tracking: {ftvm} missing; building it with `cargo build --release -p ftvm`", flush=True)
    r = subprocess.run(["cargo", "build", "--release", "-p", "ftvm"], cwd=REPO)
    if r.returncode != 0 or not ftvm.is_file():
        die(f"building ftvm failed (exit status {r.returncode})")
    return ftvm


def image_disk(ftvm, args):
    if args.disk:
        disk = Path(args.disk)
    else:
        out = subprocess.run([str(ftvm), "image", "path"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            die(f"`{ftvm} image path` failed: {out.stderr.strip()} (build the image with `ftvm image build`)")
        disk = Path(out.stdout.strip().splitlines()[-1]) / "rootfs.ext4"
    if not disk.is_file():
        die(f"root disk not found at {disk}: build the guest image with `ftvm image build`, or pass --disk")
    return disk


def ftvm_argv(ftvm, disk, args, job, tracking):
    argv = [str(ftvm), "run", "--disk", str(disk), "--mem", args.mem, "--cpus", str(args.cpus), "--exec", job_cmd(job)]
    if not args.real_time:
        argv.insert(2, "--fast-time")
    if tracking:
        argv.insert(2, "--dirty-tracking")
    return argv


def main():
    ap = options.parser("dirty-tracking", __doc__)
    ap.add_argument("--runs", type=int, default=3, help="runs per job with tracking on and off each (default 3)")
    ap.add_argument("--jobs", default="cpu,mem", help="comma-separated jobs: cpu, mem (default both)")
    ap.add_argument("--ftvm", help="ftvm binary (default $CARGO_TARGET_DIR or target/, release/ftvm; built if missing)")
    ap.add_argument("--disk", help="root disk to copy for each run (default <image>/rootfs.ext4)")
    ap.add_argument("--mem", default="1G")
    ap.add_argument("--cpus", type=int, default=1)
    ap.add_argument("--real-time", action="store_true", help="run without --fast-time (guest time follows the wall clock)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    ap.add_argument("--log-dir", help="keep each run's console output here")
    ap.add_argument("--quiet", action="store_true", help="only print the table")
    results.add_option(ap, "dirty-tracking")
    args = ap.parse_args()
    if args.runs < 1:
        die("--runs must be at least 1")
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    for j in jobs:
        if j not in JOBS:
            die(f"unknown job {j!r} (known: {', '.join(JOBS)})")
    if not jobs:
        die("no jobs given")

    ftvm = ensure_ftvm(args)
    disk = image_disk(ftvm, args)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)

    print(f"dirty-tracking: {args.runs} run(s) each with tracking on and off, --mem {args.mem}, "
          f"--cpus {args.cpus}, {'real' if args.real_time else 'fast'} time; {ftvm}", flush=True)
    res = {j: {"off": {"job": [], "cpu": []}, "on": {"job": [], "cpu": []}} for j in jobs}
    with tempfile.TemporaryDirectory(prefix="ftvm-dirty-tracking-") as work:
        for job in jobs:
            for i in range(args.runs):
                # Alternate, and swap the order every round, so slow drift
                # in the machine's load hits both sides alike.
                order = ("off", "on") if i % 2 == 0 else ("on", "off")
                for mode in order:
                    copy = os.path.join(work, "disk.ext4")
                    subprocess.run(["cp", "--sparse=always", str(disk), copy], check=True)
                    log = os.path.join(args.log_dir, f"{job}-{mode}-{i + 1}.log") if args.log_dir else None
                    m = run_once(ftvm_argv(ftvm, copy, args, job, mode == "on"), args.timeout, log)
                    os.unlink(copy)
                    problem = options.job_problem(m, args.timeout, status_line=True)
                    if problem:
                        die(f"{job} job, tracking {mode}, run {i + 1}: {problem}{options.console_hint(log)}", 3)
                    t = m["job_end"] - m["job_start"]
                    res[job][mode]["job"].append(t)
                    res[job][mode]["cpu"].append(m["cpu"])
                    if not args.quiet:
                        print(f"  {job:3} tracking {mode:3} run {i + 1}/{args.runs}: job {t:.2f}s, "
                              f"whole run {m['exit']:.2f}s wall, {m['cpu']:.2f}s cpu", flush=True)

    print()
    print(f"{'job':4} {'tracking':8} {'median s':>9}   runs (s)")
    for job in jobs:
        for mode in ("off", "on"):
            print(f"{job:4} {mode:8} {med(res[job][mode]['job']):9.2f}   {fmt_runs(res[job][mode]['job'])}")
        for mode in ("off", "on"):
            label = f"{mode}, cpu"
            print(f"{job:4} {label:8} {med(res[job][mode]['cpu']):9.2f}   {fmt_runs(res[job][mode]['cpu'])}"
                  f"   (whole-run CPU time, boot included)")
    print()
    missed, figs = [], []
    names = {"cpu": "the CPU job (`dd if=/dev/zero bs=1M count=64 | sha256sum`)",
             "mem": "the memory job (256 MiB written over 16384 pages)"}
    for job in jobs:
        ratio = med(res[job]["on"]["job"]) / med(res[job]["off"]["job"])
        cpu_ratio = med(res[job]["on"]["cpu"]) / med(res[job]["off"]["cpu"])
        verdict = "PASS" if ratio <= TARGET else "MISS"
        if verdict == "MISS":
            missed.append(job)
        print(f"ratio on/off {job:4} job {ratio:6.3f}  (target <= {TARGET:.2f})  {verdict}"
              f"   whole-run CPU time {cpu_ratio:6.3f}")
        figs.append(results.figure(f"dirty-tracking.{job}", f"dirty-page tracking cost: {names.get(job, job)}, time on/off",
                                   med(res[job]["on"]["job"]), "s", peer=results.peer("tracking off", med(res[job]["off"]["job"]), "s"),
                                   ratio=ratio, target=f"≤ {TARGET:.2f}", met=ratio <= TARGET,
                                   note=f"whole-process CPU time on/off {cpu_ratio:.3f}"))
    path = results.write("dirty-tracking", ["bench/dirty-tracking"] + sys.argv[1:], figs, res, args.json, ftvm)
    print(f"dirty-tracking: figures written to {path}")
    if missed:
        print(f"dirty-tracking: over the target for: {', '.join(missed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
