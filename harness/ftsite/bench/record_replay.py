"""Record/replay beside QEMU's: what recording costs, how fast a log
replays, and how big it is.

The workload is vs-qemu's: boot the default guest and run its CPU job
(`dd if=/dev/zero bs=1M count=64 | sha256sum`, between console markers),
one hart, -m 1G, the same kernel command line. Every run boots a fresh
sparse copy of the root disk. Per round, in this order so host noise hits
all alike:

  ftvm run      `ftvm run ... --exec JOB`: total wall time, job time
  ftvm record   the same under `ftvm record --log L`: total, job, log size,
                log bytes written during the job (the recorder writes each
                frame as it closes, every 200 000 instructions or sooner,
                so sampling the file's size at the job's markers is exact
                to a frame)
  ftvm replay   `ftvm replay --log L`: wall time, state checks matched
  QEMU record   `-icount shift=auto,rr=record,rrfile=F` with the disk
                behind QEMU's blkreplay driver (QEMU's docs/replay): total,
                job, log size
  QEMU replay   the same with rr=replay on a fresh copy of the start disk

It prints the medians and the ratios: ftvm's recording overhead (target
<= 3 %) in wall time and in CPU time (user + system, less disturbed by
other load on the host), ftvm replay/record (target <= 1.0), and ftvm against QEMU for
recording time and log size. The two logs hold different things: ftvm's
carries the data of every disk read (VMware FT's default, so a replay or a
backup needs no disk), QEMU's only the completion events (its replay
re-reads an unchanged disk image); ftvm's summary line splits its log by
kind, and the table shows the log without disk data too.

  bench/record-replay                  3 rounds
  bench/record-replay --runs 1 --log-dir /tmp/rr-logs

Needs qemu-system-riscv64 (Debian qemu-system-misc). A benchmark, not a
test: exits 0 unless a run fails.
"""

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path



from ftsite.bench import options, results
from ftsite.bench import vs_qemu as vs


def die(msg, code=2):
    print(f"record-replay: {msg}", file=sys.stderr)
    sys.exit(code)


def checked(name, m, args):
    """The marks of a completed job run, or a one-line failure."""
    problem = options.job_problem(m, args.timeout)
    if problem:
        die(f"{name}: {problem}" + ("" if args.log_dir else "; rerun with --log-dir DIR to keep the console"), 1)
    return m


def qemu_rr_argv(qemu, img, disk, args, mode, rrfile):
    argv = vs.qemu_argv(qemu, img, disk, args, vs.JOB_CMD)
    # Swap the plain disk for the same one behind blkreplay, which makes
    # the order of disk completions part of the recording.
    i = argv.index("-drive")
    del argv[i:i + 4]
    return argv + ["-icount", f"shift=auto,rr={mode},rrfile={rrfile}",
                   "-drive", f"file={disk},format=raw,if=none,id=img-direct",
                   "-drive", "driver=blkreplay,if=none,image=img-direct,id=img-blkreplay",
                   "-device", "virtio-blk-device,drive=img-blkreplay"]


def fresh_disk(img, work, name):
    disk = os.path.join(work, f"{name}.ext4")
    subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
    return disk


def log_path(args, name, i):
    return os.path.join(args.log_dir, f"{name}-{i + 1}.log") if args.log_dir else None


def cpu_seconds():
    """User plus system time of the children waited for so far: unlike wall
    time, not stretched by other load on the host."""
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def one_round(i, ftvm, qemu, img, args, work):
    r = {}
    disk = fresh_disk(img, work, "disk")
    c0 = cpu_seconds()
    run_argv = vs.ftvm_argv(ftvm, img, disk, args, vs.JOB_CMD)
    m = checked("ftvm run", vs.run_once(run_argv, args.timeout, log_path(args, "ftvm-run", i)), args)
    r["run_total"], r["run_job"] = m["exit"], m["job_end"] - m["job_start"]
    r["run_cpu"] = cpu_seconds() - c0

    disk = fresh_disk(img, work, "disk")
    log = os.path.join(work, "ftvm.log")
    sizes = {}
    c0 = cpu_seconds()
    argv = [str(ftvm), "record", "--log", log] + vs.ftvm_argv(ftvm, img, disk, args, vs.JOB_CMD)[2:]
    m = vs.run_once(argv, args.timeout, log_path(args, "ftvm-record", i),
                    on_mark=lambda key: sizes.__setitem__(key, os.path.getsize(log)))
    checked("ftvm record", m, args)
    r["rec_total"], r["rec_job"] = m["exit"], m["job_end"] - m["job_start"]
    r["rec_cpu"] = cpu_seconds() - c0
    r["log"] = os.path.getsize(log)
    r["log_job_mbit"] = (sizes["job_end"] - sizes["job_start"]) * 8 / r["rec_job"] / 1e6
    recorded = next((l for l in m["output"] if l.startswith("ftvm: recorded")), "")
    disk_bytes = re.search(r"disk completions (\d+)", recorded)
    if not disk_bytes:
        die(f"ftvm record round {i + 1}: no summary line with the log's composition", 1)
    r["log_disk"] = int(disk_bytes.group(1))
    t0 = time.monotonic()
    rep = subprocess.run([str(ftvm), "replay", "--log", log], capture_output=True, text=True, timeout=args.timeout)
    r["replay"] = time.monotonic() - t0
    if rep.returncode != 0:
        die(f"ftvm replay round {i + 1} failed ({rep.returncode}): {rep.stderr.strip()}", 1)
    checks = re.search(r"(\d+) state checks matched", rep.stderr)
    r["checks"] = int(checks.group(1)) if checks else 0

    disk = fresh_disk(img, work, "qdisk")
    rr = os.path.join(work, "qemu.rr")
    start_copy = fresh_disk(img, work, "qdisk-start")
    m = checked("QEMU record", vs.run_once(qemu_rr_argv(qemu, img, disk, args, "record", rr), args.timeout,
                                           log_path(args, "qemu-record", i)), args)
    r["q_total"], r["q_job"], r["q_log"] = m["exit"], m["job_end"] - m["job_start"], os.path.getsize(rr)
    m = vs.run_once(qemu_rr_argv(qemu, img, start_copy, args, "replay", rr), args.timeout,
                    log_path(args, "qemu-replay", i))
    r["q_replay"] = m["exit"] if m["rc"] == 0 and not m["timeout"] else float("nan")
    for f in (disk, start_copy, rr, log):
        os.unlink(f)
    return r


def main():
    ap = options.parser("record-replay", __doc__)
    ap.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    options.add_guest(ap, boot=False, ftvm_help="ftvm binary")
    results.add_option(ap, "record-replay")
    args = ap.parse_args()
    if args.runs < 1:
        die("--runs must be at least 1")
    options.default_boot(args)
    ftvm = Path(args.ftvm)
    if not (ftvm.is_file() and os.access(ftvm, os.X_OK)):
        die(f"ftvm binary not found at {ftvm}: build it with `cargo build --release -p ftvm` or pass --ftvm")
    qemu = shutil.which(args.qemu)
    if not qemu:
        die(f"{args.qemu} not found: install Debian's qemu-system-misc (scripts/install-deps.sh)")
    img = vs.resolve_image(args, ftvm)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)

    print(f"record-replay: {args.runs} round(s), -m {args.mem}, 1 cpu; boot + `{vs.JOB}`", flush=True)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="ftvm-record-replay-") as work:
        for i in range(args.runs):
            r = one_round(i, ftvm, qemu, img, args, work)
            rounds.append(r)
            print(f"  round {i + 1}: run {r['run_total']:.1f}s (job {r['run_job']:.2f}s), "
                  f"record {r['rec_total']:.1f}s (job {r['rec_job']:.2f}s, log {r['log']} B), "
                  f"replay {r['replay']:.1f}s ({r['checks']} checks); "
                  f"QEMU record {r['q_total']:.1f}s (job {r['q_job']:.2f}s, log {r['q_log']} B), "
                  f"replay {r['q_replay']:.1f}s", flush=True)

    med = lambda k: vs.med([r[k] for r in rounds])
    print()
    print(f"{'':34} {'median':>12}   rounds")
    rows = (("ftvm run: boot + job (s)", "run_total"), ("ftvm run: job (s)", "run_job"),
            ("ftvm run: CPU time (s)", "run_cpu"),
            ("ftvm record: boot + job (s)", "rec_total"), ("ftvm record: job (s)", "rec_job"),
            ("ftvm record: CPU time (s)", "rec_cpu"),
            ("ftvm replay (s)", "replay"), ("ftvm log (bytes)", "log"), ("  of which disk read data", "log_disk"),
            ("  log rate during the job (Mbit/s)", "log_job_mbit"),
            ("QEMU record: boot + job (s)", "q_total"), ("QEMU record: job (s)", "q_job"),
            ("QEMU replay (s)", "q_replay"), ("QEMU log (bytes)", "q_log"))
    for label, k in rows:
        print(f"{label:34} {med(k):12.6g}   " + " ".join(f"{r[k]:.6g}" for r in rounds))
    print()
    for label, v in (("ftvm recording overhead, boot + job", med("rec_total") / med("run_total") - 1),
                     ("ftvm recording overhead, job only", med("rec_job") / med("run_job") - 1),
                     ("ftvm recording overhead, CPU time", med("rec_cpu") / med("run_cpu") - 1)):
        print(f"{label:44} {v * 100:+7.1f} %   (target <= +3 %)")
    for label, v, target in (
            ("ftvm replay / ftvm record (boot + job)", med("replay") / med("rec_total"), "<= 1.0"),
            ("ftvm record / QEMU record (boot + job)", med("rec_total") / med("q_total"), ""),
            ("ftvm replay / QEMU replay", med("replay") / med("q_replay"), ""),
            ("ftvm log / QEMU log", med("log") / med("q_log"), ""),
            ("ftvm log without disk data / QEMU log", (med("log") - med("log_disk")) / med("q_log"), "")):
        print(f"{label:44} {v:7.2f}     {('(target ' + target + ')') if target else ''}")
    job = f"boot + `{vs.JOB}`"
    figs = [
        results.figure("record-replay.overhead-job", "recording overhead, job only (ftvm record / ftvm run - 1)",
                       (med("rec_job") / med("run_job") - 1) * 100, "%", target="≤ +3 %",
                       met=med("rec_job") / med("run_job") - 1 <= 0.03),
        results.figure("record-replay.record", f"ftvm record beside QEMU's record/replay, {job}", med("rec_total"), "s",
                       peer=results.peer("QEMU record", med("q_total"), "s"), ratio=med("rec_total") / med("q_total")),
        results.figure("record-replay.replay", f"ftvm replay beside QEMU's replay, {job}", med("replay"), "s",
                       peer=results.peer("QEMU replay", med("q_replay"), "s"), ratio=med("replay") / med("q_replay"),
                       note=f"ftvm replay / ftvm record {med('replay') / med('rec_total'):.2f} (target ≤ 1.0)"),
        results.figure("record-replay.log", f"record log size, {job}", med("log"), "bytes",
                       peer=results.peer("QEMU's log", med("q_log"), "bytes"), ratio=med("log") / med("q_log"),
                       note=f"without the disk read data: {(med('log') - med('log_disk')) / med('q_log'):.2f} x QEMU's"),
        results.figure("record-replay.log-rate", "log bandwidth while recording the CPU job", med("log_job_mbit"), "Mbit/s"),
    ]
    path = results.write("record-replay", ["bench/record-replay"] + sys.argv[1:], figs, rounds, args.json, ftvm)
    print(f"record-replay: figures written to {path}")


if __name__ == "__main__":
    main()
