"""The interpreter's raw speed beside QEMU's, without a kernel.

Builds bench/cpu-core-job/job.c (SHA-256 of 64 MiB of zeros, produced 1 MiB
at a time into a buffer, as the CPU job of bench/vs-qemu does, in machine
mode with no paging, no interrupts and no device but the UART) with
Debian's riscv64 cross compiler, runs it on ftvm (`--bios none`) and on
qemu-system-riscv64 (`-M virt -bios none`), alternating, several runs each,
and prints the median wall times and their ratio ftvm/QEMU.

It isolates what bench/vs-qemu's job measures of the CPU alone: a change to
the interpreter shows here within a few percent, where a booted guest adds
the kernel, the pipe and more of the host's noise. A benchmark, not a test:
it exits 0 unless a run fails or prints the wrong digest.

  bench/cpu-core --runs 3
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ftsite.bench import results
from ftsite.host import REPO
SRC = REPO / "bench" / "cpu-core-job"
DIGEST = "3b6a07d0d404fab4e23b6d34bc6696a6a312dd92821332385e5af7c01c421351"


def die(msg):
    print(f"cpu-core: {msg}", file=sys.stderr)
    sys.exit(2)


def build(out):
    elf = out / "job.elf"
    cmd = [
        "riscv64-linux-gnu-gcc", "-O2", "-march=rv64gc", "-mabi=lp64d", "-mcmodel=medany",
        "-ffreestanding", "-fno-pie", "-no-pie", "-nostdlib", "-nostartfiles", "-static",
        "-Wl,--no-warn-rwx-segments", "-T", str(SRC / "link.ld"), "-o", str(elf),
        str(SRC / "start.S"), str(SRC / "job.c"),
    ]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        die("riscv64-linux-gnu-gcc is not installed: run scripts/install-deps.sh")
    if r.returncode != 0:
        die(f"building the job failed:\n{r.stderr}")
    return elf


def timed(name, argv):
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        die(f"{name} did not finish within 30 minutes")
    secs = time.monotonic() - t0
    if r.returncode != 0 or DIGEST not in r.stdout:
        die(f"{name} failed (exit {r.returncode}); output:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return secs


def main():
    ap = argparse.ArgumentParser(prog="cpu-core", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ftvm", default=str(REPO / "target" / "release" / "ftvm"))
    ap.add_argument("--qemu", default="qemu-system-riscv64")
    ap.add_argument("--only", choices=["ftvm", "qemu"], help="run one emulator only (no ratio)")
    results.add_option(ap, "cpu-core")
    args = ap.parse_args()
    names = [args.only] if args.only else ["qemu", "ftvm"]
    if "ftvm" in names and not Path(args.ftvm).is_file():
        die(f"{args.ftvm} does not exist: run `cargo build --release` first")
    argv = {}
    with tempfile.TemporaryDirectory(prefix="ftvm-cpu-core-") as tmp:
        elf = build(Path(tmp))
        argv["qemu"] = [args.qemu, "-M", "virt", "-bios", "none", "-kernel", str(elf), "-m", "64M",
                        "-display", "none", "-serial", "stdio", "-monitor", "none"]
        argv["ftvm"] = [args.ftvm, "run", "--bios", "none", "--kernel", str(elf), "--mem", "64M"]
        runs = {name: [] for name in names}
        for i in range(args.runs):
            for name in names:
                secs = timed(name, argv[name])
                runs[name].append(secs)
                print(f"run {i + 1}: {name} {secs:.2f} s", flush=True)
    fmt = lambda xs: f"{statistics.median(xs):.2f} s (" + " ".join(f"{x:.2f}" for x in xs) + ")"
    print()
    if args.only:
        print(f"{args.only}: median {fmt(runs[args.only])}")
        return
    ratio = statistics.median(runs["ftvm"]) / statistics.median(runs["qemu"])
    print("| job | QEMU median (runs) | ftvm median (runs) | ratio ftvm/QEMU |")
    print("|---|---|---|---|")
    print(f"| SHA-256 of 64 MiB, bare metal | {fmt(runs['qemu'])} | {fmt(runs['ftvm'])} | **{ratio:.2f}** |")
    ftvm_s, qemu_s = statistics.median(runs["ftvm"]), statistics.median(runs["qemu"])
    fig = results.figure("cpu-core.sha256", "bare metal: SHA-256 of 64 MiB (`bench/cpu-core`)", ftvm_s, "s",
                         peer=results.peer("QEMU", qemu_s, "s"), ratio=ratio, target="≤ 1.0", met=ratio <= 1.0,
                         note=f"medians of {args.runs}")
    path = results.write("cpu-core", ["bench/cpu-core"] + sys.argv[1:], [fig], {"runs_s": runs}, args.json, args.ftvm)
    print(f"cpu-core: figures written to {path}")


if __name__ == "__main__":
    main()
