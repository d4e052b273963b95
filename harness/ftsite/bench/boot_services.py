"""Boot to a service, ftvm beside QEMU (issue 63): a Debian server image
(default `ftvm-test-web`: postgresql, nginx, openssh-server, configured as
apt would, booting systemd) booted in ftvm and in qemu-system-riscv64
-M virt (TCG) with the same firmware, kernel, initrd, kernel command line,
memory, harts and devices (virtio-blk, virtio-net on a TAP, virtio-rng),
each run on a fresh sparse copy of the image's root disk (so every boot is
a first boot: ssh host keys made, as a new VM's are). From the emulator's
start, the host polls the guest over the TAP (every 0.1 s) and times

  postgres  the first `pg_isready` that says it accepts connections
  nginx     the first HTTP 200 from nginx (curl)

Rounds alternate ftvm and QEMU (ftvm first in odd rounds). The table shows
each service's median seconds and the ratio ftvm/QEMU of the same runs; the
result is also written as JSON (bench/results/boot-services.json, --json).
Target (issue 63): ratio <= 1.0.

Exit status: 0 the target met (or --qemu-only), 1 missed, 2 bad input or
setup, 3 a run failed.

  bench/boot-services                      3 rounds, the web image
  bench/boot-services --runs 1 --image-dir ~/.cache/ftvm/images/NAME
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from ftsite.bench import options, results
from ftsite.bench.redis import LIVE_VMS, NETS, Netns, RunFailed, Vm, resolve_image
from ftsite.bench.vs_qemu import cache_dir

SERVICES = ("postgres", "nginx")
TARGET = 1.0
IMAGE = "ftvm-test-web"
POLL = 0.1


def die(msg, code=2):
    print(f"boot-services: {msg}", file=sys.stderr)
    sys.exit(code)


def cmdline(n):
    # The same for both: Debian's systemd as init (no ftvm.exec), the
    # guest's address from the image's setup.
    return f"console=ttyS0 root=/dev/vda rw quiet ftvm.ip={n['guest']}/24"


def ftvm_argv(args, img, disk, nets=NETS):
    """`ftvm run` of the image on `nets`' TAP for ftvm (args: ftvm, mem,
    cpus); the same machine as qemu_argv's."""
    n = nets["ftvm"]
    return [str(args.ftvm), "run", "--bios", img["bios"], "--kernel", img["kernel"], "--initrd", img["initrd"],
            "--disk", disk, "--mem", args.mem, "--cpus", str(args.cpus),
            "--net", f"tap={n['tap']},mac={n['mac']}", "--append", cmdline(n)]


def qemu_argv(args, img, disk, nets=NETS):
    """QEMU's machine of ftvm_argv (args: qemu_path, mem, cpus)."""
    n = nets["qemu"]
    return [args.qemu_path, "-M", "virt", "-m", args.mem, "-smp", str(args.cpus), "-nographic",
            "-bios", img["bios"], "-kernel", img["kernel"], "-initrd", img["initrd"], "-append", cmdline(n),
            "-drive", f"file={disk},format=raw,if=none,id=d0", "-device", "virtio-blk-device,drive=d0",
            "-netdev", f"tap,id=n0,ifname={n['tap']},script=no,downscript=no",
            "-device", f"virtio-net-device,netdev=n0,mac={n['mac']}",
            # ftvm gives its guests host entropy; so does this one.
            "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-device,rng=rng0"]


def ready(ns, emu, service, nets=NETS):
    """Whether `service` answers in `emu`'s guest now."""
    guest = nets[emu]["guest"]
    if service == "postgres":
        argv = ns.argv("pg_isready", "-q", "-h", guest, "-t", "1")
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    argv = ns.argv("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "1", f"http://{guest}/")
    return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip() == "200"


def one_boot(emu, args, img, ns, work, rnd):
    """Seconds from the emulator's start to each service's first answer."""
    disk = os.path.join(work, f"{emu}-disk.ext4")
    subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
    log = os.path.join(args.log_dir or work, f"{emu}-{rnd + 1}.log")
    argv = ftvm_argv(args, img, disk) if emu == "ftvm" else qemu_argv(args, img, disk)
    t0 = time.monotonic()
    vm = Vm(ns.argv(*argv), log)
    got = {}
    try:
        while len(got) < len(SERVICES):
            now = time.monotonic() - t0
            if not vm.alive():
                raise RunFailed(f"{emu} ended after {now:.0f} s (console in {log})")
            if now > args.timeout:
                missing = ", ".join(s for s in SERVICES if s not in got)
                raise RunFailed(f"{emu}: no answer from {missing} within {args.timeout:g} s (console in {log})")
            for s in SERVICES:
                if s not in got and ready(ns, emu, s):
                    got[s] = time.monotonic() - t0
            time.sleep(POLL)
    finally:
        vm.stop()
        os.unlink(disk)
    return got


def main():
    ap = options.parser("boot-services", __doc__)
    ap.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--qemu-only", action="store_true", help="measure QEMU only")
    ap.add_argument("--netns", default=f"ftvm-bootsvc-{os.getpid()}", help="network namespace to create")
    results.add_option(ap, "boot-services")
    options.add_guest(ap, timeout=900)
    args = ap.parse_args()
    if args.runs < 1:
        die("--runs must be at least 1")
    if not args.image_dir:
        args.image_dir = str(cache_dir() / "images" / IMAGE)
        if not os.path.isdir(args.image_dir):
            die(f"no image {IMAGE}: `cargo test --release -p ftvm --test services` builds it (or give --image-dir)")
    img = resolve_image(args)
    args.qemu_path = shutil.which(args.qemu)
    if not args.qemu_path:
        die(f"{args.qemu} not found: install Debian's qemu-system-misc (scripts/install-deps.sh)")
    for tool in ("pg_isready", "curl"):
        if not shutil.which(tool):
            die(f"{tool} not found: scripts/install-deps.sh installs it")
    emus = ["qemu"] if args.qemu_only else ["ftvm", "qemu"]
    if not args.qemu_only and not os.access(args.ftvm, os.X_OK):
        die(f"ftvm binary not found at {args.ftvm}: `cargo build --release -p ftvm`, or --ftvm PATH")
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    print(f"boot-services: {args.runs} round(s), image {args.image_dir}, -m {args.mem}, {args.cpus} hart(s), "
          f"repo {results.commit()}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    res = {e: [] for e in emus}
    ns = Netns(args.netns, emus)
    try:
        with tempfile.TemporaryDirectory(prefix="ftvm-bench-bootsvc-") as work:
            for rnd in range(args.runs):
                order = emus if rnd % 2 == 0 else list(reversed(emus))
                for emu in order:
                    got = one_boot(emu, args, img, ns, work, rnd)
                    res[emu].append(got)
                    print(f"  round {rnd + 1}/{args.runs} {emu:4}: "
                          + ", ".join(f"{s} {got[s]:.1f} s" for s in SERVICES), flush=True)
    except RunFailed as e:
        die(str(e), 3)
    finally:
        for vm in list(LIVE_VMS):
            vm.stop()
        ns.close()

    print(f"{'service':9} {'ftvm s':>8} {'qemu s':>8} {'ratio':>6}")
    figures, met_all = [], True
    for s in SERVICES:
        q = statistics.median(r[s] for r in res["qemu"])
        f = statistics.median(r[s] for r in res["ftvm"]) if "ftvm" in res else None
        ratio = f / q if f is not None else None
        met = ratio is not None and ratio <= TARGET
        met_all &= met or ratio is None
        print(f"{s:9} {f if f is not None else float('nan'):8.1f} {q:8.1f} "
              f"{ratio if ratio is not None else float('nan'):6.2f}  (target <= {TARGET})")
        figures.append(results.figure(f"boot-to-{s}", f"boot to {s} answering", f, "s",
                                      peer=results.peer("QEMU", q, "s"), ratio=ratio, target=f"≤ {TARGET}",
                                      met=met if ratio is not None else None))
    path = results.write("boot-services", ["bench/boot-services"] + sys.argv[1:], figures, details=res, path=args.json,
                         ftvm=None if args.qemu_only else args.ftvm)
    print(f"boot-services: figures in {path}")
    sys.exit(0 if met_all else 1)


if __name__ == "__main__":
    main()
