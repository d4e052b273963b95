"""Compare ftvm with qemu-system-riscv64 on the default guest image.

Boots the same kernel, initrd, root disk, firmware, memory size and CPU count
in both emulators, several times each, and prints the ftvm/QEMU ratios of the
median times for

  (a) boot: from starting the emulator until the guest prints the
      `ftvm-exec-begin` marker (exec command `true`);        target <= 2.0
  (b) a guest CPU job, `dd if=/dev/zero bs=1M count=64 | sha256sum`, timed on
      the host between the console lines the job prints right before and
      after it (boot excluded);                              target <= 3.0

The guest also times (b) itself from /proc/uptime; that figure is shown but,
as ftvm's guest time is virtual, the host-side time is the one that counts.

Each run boots a fresh sparse copy of the root disk, so every run starts from
the same state. This is a benchmark, not a test: it exits 0 unless a run
fails (PASS/MISS are informational).

  bench/vs-qemu --qemu-only            QEMU's figures only (no ftvm needed)
  bench/vs-qemu --runs 5 --cpus 1      both emulators
  bench/vs-qemu --job fp --scenarios job
                                       (b) with a floating-point job instead
                                       (busybox awk: the image has no python)
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ftsite.bench import options, results
BEGIN = "ftvm-exec-begin"
STATUS = "ftvm-exec-status="
JOB_START = "ftvm-bench-job-start"
JOB_END = "ftvm-bench-job-end"
GUEST_SECS = "ftvm-bench-guest-seconds="
JOB = "dd if=/dev/zero bs=1M count=64 2>/dev/null | sha256sum"


def job_cmd(job):
    """The exec command that runs `job` between the start and end markers."""
    return (
        f"s=$(cut -d' ' -f1 /proc/uptime); echo {JOB_START}; "
        f"{job}; "
        f"echo {JOB_END}; e=$(cut -d' ' -f1 /proc/uptime); "
        f"echo {GUEST_SECS}$(awk \"BEGIN {{ print $e - $s }}\")"
    )


JOB_CMD = job_cmd(JOB)
# --job fp: floating point in the guest's userland (the image has no python):
# busybox awk, whose numbers are doubles, in a loop of adds, multiplies,
# divides, compares and int/float conversions.
FP_JOB = ("awk 'BEGIN { s = 0; x = 0.5; for (i = 1; i <= 400000; i++) "
          "{ x = x * 1.0000001 + 0.3 / i; s += x * x / (i + 1.5); if (s > 1e6) s -= 1e6 } "
          "printf \"%.12f\\n\", s }'")
TARGETS = {"boot": 2.0, "job": 3.0}


def die(msg, code=2):
    print(f"vs-qemu: {msg}", file=sys.stderr)
    sys.exit(code)


def cache_dir():
    if os.environ.get("FTVM_CACHE_DIR"):
        return Path(os.environ["FTVM_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "ftvm"
    return Path(os.environ.get("HOME", "/root")) / ".cache" / "ftvm"


def paths_from_ftvm(ftvm):
    """Ask `ftvm image path`; accept KEY=VALUE or KEY: VALUE lines."""
    try:
        out = subprocess.run([str(ftvm), "image", "path"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0:
        return {}
    found = {}
    for line in out.stdout.splitlines():
        for sep in ("=", ":"):
            if sep in line:
                k, v = line.split(sep, 1)
                k, v = k.strip().lower(), v.strip()
                for key, words in (("kernel", ("kernel",)), ("initrd", ("initrd",)),
                                   ("disk", ("rootfs", "disk", "root")),
                                   ("bios", ("firmware", "bios", "opensbi"))):
                    if any(w in k for w in words) and "version" not in k and os.path.isfile(v):
                        found.setdefault(key, v)
                break
    return found


def emulators(args, die):
    """The ftvm binary (None with --qemu-only) and QEMU's, checked: `die`
    (the calling bench's) with a one-line fix if either is missing."""
    ftvm = None
    if not args.qemu_only:
        ftvm = Path(args.ftvm)
        if not (ftvm.is_file() and os.access(ftvm, os.X_OK)):
            die(f"ftvm binary not found at {ftvm}: build it with `cargo build --release -p ftvm`, "
                f"pass --ftvm PATH, or use --qemu-only")
    qemu = shutil.which(args.qemu)
    if not qemu:
        die(f"{args.qemu} not found: install Debian's qemu-system-misc (scripts/install-deps.sh)")
    return ftvm, qemu


def resolve_image(args, ftvm):
    img = {}
    if ftvm is not None and ftvm.exists():
        img.update(paths_from_ftvm(ftvm))
    d = Path(args.image_dir) if args.image_dir else cache_dir() / "images" / "trixie-riscv64"
    defaults = {"kernel": d / "Image", "initrd": d / "initrd.img", "disk": d / "rootfs.ext4", "bios": d / "fw_dynamic.bin"}
    for k, p in defaults.items():
        v = getattr(args, k)
        if v:
            img[k] = v
        elif k not in img or args.image_dir:
            img[k] = str(p)
    for k, p in img.items():
        if not os.path.isfile(p):
            die(f"{k} not found at {p}: build the guest image with `ftvm image build` "
                f"(or `cargo run --release -p ftvm-image --example ftvm-image -- build`), or pass --{k}")
    return img


def run_once(argv, timeout, log_path, on_mark=None, on_line=None):
    """Run an emulator, timestamping console lines. Returns dict of times.
    `on_mark(key)` is called when a marker is first seen (e.g. to sample a
    file the emulator writes at that moment); `on_line(line, seconds)` for
    every console line, with when it came (for a bench's own markers)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
    marks = {}
    killed = []

    def watchdog():
        if proc.poll() is None:
            killed.append(True)
            proc.kill()

    timer = threading.Timer(timeout, watchdog)
    timer.start()
    lines = []
    buf = b""
    try:
        while True:
            chunk = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else os.read(proc.stdout.fileno(), 65536)
            now = time.monotonic() - t0
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode("utf-8", "replace").rstrip("\r")
                lines.append(line)
                if on_line:
                    on_line(line, now)
                for key, prefix in (("begin", BEGIN), ("job_start", JOB_START), ("job_end", JOB_END)):
                    if line == prefix and key not in marks:
                        marks[key] = now
                        if on_mark:
                            on_mark(key)
                if line.startswith(GUEST_SECS):
                    try:
                        marks["guest_job"] = float(line[len(GUEST_SECS):])
                    except ValueError:
                        pass
                if line.startswith(STATUS):
                    marks["status_line"] = line[len(STATUS):]
        if buf:
            lines.append(buf.decode("utf-8", "replace"))
        # wait4 rather than wait: this process's own CPU time, which stays
        # exact when several emulators run at once.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
    finally:
        timer.cancel()
    marks["exit"] = time.monotonic() - t0
    marks["rc"] = rc
    marks["cpu"] = usage.ru_utime + usage.ru_stime
    marks["output"] = lines
    marks["timeout"] = bool(killed)
    if log_path:
        Path(log_path).write_text("\n".join(lines) + "\n")
    return marks


def qemu_argv(qemu, img, disk, args, cmd):
    b64 = __import__("base64").b64encode(cmd.encode()).decode()
    append = f"console=ttyS0 quiet ftvm.exec={b64}"
    return [qemu, "-M", "virt", "-m", args.mem, "-smp", str(args.cpus), "-nographic",
            "-bios", img["bios"], "-kernel", img["kernel"], "-initrd", img["initrd"],
            "-append", append,
            "-drive", f"file={disk},format=raw,if=none,id=d0", "-device", "virtio-blk-device,drive=d0"]


def ftvm_argv(ftvm, img, disk, args, cmd):
    # The same kernel command line as QEMU gets (ftvm adds ftvm.exec= itself);
    # --verbose shows the whole console, markers included, as QEMU does.
    return [str(ftvm), "run", "--bios", img["bios"], "--kernel", img["kernel"], "--initrd", img["initrd"],
            "--disk", disk, "--mem", args.mem, "--cpus", str(args.cpus), "--append", "console=ttyS0 quiet",
            "--verbose", "--exec", cmd]


def measure(name, make_argv, img, args, workdir):
    results = {"boot": [], "job": [], "guest_job": [], "total": []}
    scenarios = [(s, c) for s, c in (("boot", "true"), ("job", job_cmd(args.job))) if s in args.scenarios]
    for scenario, cmd in scenarios:
        for i in range(args.runs):
            disk = os.path.join(workdir, f"{name}-disk.ext4")
            subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
            log = os.path.join(args.log_dir, f"{name}-{scenario}-{i + 1}.log") if args.log_dir else None
            m = run_once(make_argv(img, disk, args, cmd), args.timeout, log)
            os.unlink(disk)
            problem = None
            if m["timeout"]:
                problem = f"timed out after {args.timeout}s"
            elif m["rc"] != 0:
                problem = f"exit status {m['rc']} (status line: {m.get('status_line', 'none')})"
            elif "begin" not in m:
                problem = f"no {BEGIN} marker"
            elif scenario == "job" and ("job_start" not in m or "job_end" not in m):
                problem = "no job start/end markers"
            if problem:
                hint = f"; console log in {log}" if log else "; rerun with --log-dir DIR to keep the console"
                die(f"{name} {scenario} run {i + 1}: {problem}{hint}", 1)
            if scenario == "boot":
                results["boot"].append(m["begin"])
                results["total"].append(m["exit"])
                detail = f"boot {m['begin']:.2f}s, exit {m['exit']:.2f}s"
            else:
                results["job"].append(m["job_end"] - m["job_start"])
                results["guest_job"].append(m.get("guest_job", float("nan")))
                detail = f"job {m['job_end'] - m['job_start']:.2f}s host, {m.get('guest_job', float('nan')):.2f}s guest"
            if not args.quiet:
                print(f"  {name:5} {scenario:4} run {i + 1}/{args.runs}: {detail}", flush=True)
    return results


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def fmt_runs(xs):
    return " ".join(f"{x:.2f}" for x in xs)


def main():
    ap = options.parser("vs-qemu", __doc__)
    ap.add_argument("--runs", type=int, default=3, help="runs per emulator and scenario (default 3)")
    ap.add_argument("--qemu-only", action="store_true", help="measure QEMU only")
    options.add_guest(ap)
    ap.add_argument("--quiet", action="store_true", help="only print the table")
    ap.add_argument("--job", default=JOB, help="the guest command of scenario (b) (default: the dd | sha256sum "
                    "job; 'fp': a busybox awk floating-point loop)")
    ap.add_argument("--scenarios", default="boot,job", help="which to run, of boot,job (default both)")
    results.add_option(ap, "vs-qemu")
    args = ap.parse_args()
    job_kind = "fp" if args.job == "fp" else "" if args.job == JOB else "other"
    if args.job == "fp":
        args.job = FP_JOB
    args.scenarios = set(args.scenarios.split(","))
    if args.runs < 1:
        die("--runs must be at least 1")

    ftvm, qemu = emulators(args, die)
    img = resolve_image(args, ftvm)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)

    print(f"vs-qemu: {args.runs} run(s) each, -m {args.mem}, {args.cpus} cpu(s); kernel {img['kernel']}", flush=True)
    res = {}
    with tempfile.TemporaryDirectory(prefix="ftvm-vs-qemu-") as work:
        res["qemu"] = measure("qemu", lambda i, d, a, c: qemu_argv(qemu, i, d, a, c), img, args, work)
        if ftvm is not None:
            res["ftvm"] = measure("ftvm", lambda i, d, a, c: ftvm_argv(ftvm, i, d, a, c), img, args, work)

    print()
    print(f"{'':6} {'metric':32} {'median s':>9}   runs (s)")
    rows = (("boot", "(a) boot to ftvm-exec-begin"), ("total", "    boot + poweroff (exit)"),
            ("job", "(b) CPU job, host-timed"), ("guest_job", "    CPU job, guest-timed"))
    for emu in ("qemu", "ftvm"):
        if emu not in res:
            continue
        for key, label in rows:
            print(f"{emu:6} {label:32} {med(res[emu][key]):9.2f}   {fmt_runs(res[emu][key])}")
    print()
    for key, label in (("boot", "(a) boot"), ("job", "(b) CPU job")):
        target = TARGETS[key]
        if "ftvm" in res:
            ratio = med(res["ftvm"][key]) / med(res["qemu"][key])
            verdict = "PASS" if ratio <= target else "MISS"
            print(f"ratio ftvm/qemu {label:12} {ratio:6.2f}  (target <= {target:.1f})  {verdict}")
        else:
            print(f"ratio ftvm/qemu {label:12}    n/a  (target <= {target:.1f})  --qemu-only")
    names = {"boot": ("vs-qemu.boot", "boot to userspace, beside QEMU"),
             "job": ("vs-qemu.job" + (f"-{job_kind}" if job_kind else ""),
                     {"": "CPU job in Linux (`dd if=/dev/zero bs=1M count=64 | sha256sum`), beside QEMU",
                      "fp": "floating point in Linux (a busybox awk loop), beside QEMU",
                      "other": f"a guest job (`{args.job}`), beside QEMU"}[job_kind])}
    figs = []
    for key in ("boot", "job"):
        if "ftvm" not in res or key not in args.scenarios:
            continue
        ftvm_s, qemu_s = med(res["ftvm"][key]), med(res["qemu"][key])
        ratio = ftvm_s / qemu_s
        figs.append(results.figure(*names[key], ftvm_s, "s", peer=results.peer("QEMU", qemu_s, "s"), ratio=ratio,
                                   target=f"≤ {TARGETS[key]:.1f}", met=ratio <= TARGETS[key],
                                   note=f"{args.cpus} hart(s), -m {args.mem}" if (args.cpus, args.mem) != (1, "1G") else None))
    path = results.write("vs-qemu", ["bench/vs-qemu"] + sys.argv[1:], figs, res, args.json, ftvm)
    print(f"vs-qemu: figures written to {path}")


if __name__ == "__main__":
    main()
