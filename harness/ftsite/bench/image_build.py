"""Image build time, ftvm beside QEMU (issue 63): how long a configured
Debian riscv64 system takes to make on this x86 host.

ftvm's way: `ftvm image build` (mmdebstrap extracts the packages, then
the guest configures them: dpkg and apt run on ftvm itself, under the
guest's minimal init; then the kernel, initramfs and a compacted ext4).
The peer is what Debian offers for a foreign architecture: mmdebstrap
with QEMU's user-mode emulation (qemu-user-static through binfmt_misc)
running the same packages' maintainer scripts in a chroot, into a
directory (no ext4, no initramfs: less work than ftvm's build). Both take
the same package list (Debian's essential set, ftvm's PACKAGES and, for
`web`, postgresql, nginx and openssh-server), from the same mirror (the
one this machine's apt uses, as ftvm's build finds it) and the same .debs
at hand (the cache's, so the network is not what is timed).

Printed and written (bench/results/image-build.json, --json) per image:
the whole build's seconds and ftvm's configuration step alone
(`[7/8] configuring the packages` to `[8/8]`), beside mmdebstrap+QEMU's
whole run and its configuration (from `I: installing essential
packages` to its cleaning up). The ratio is ftvm's
over QEMU's. No target: the issue asks for the figures.

Setup: qemu-user-static, binfmt-support and arch-test are installed if
missing; binfmt_misc is mounted and QEMU's riscv64 handler enabled for
the run, and put back as they were after it.

  bench/image-build                       the default image, then web
  bench/image-build --images default      one of them
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from ftsite.bench import options, results
from ftsite.bench.vs_qemu import cache_dir
from ftsite.host import REPO

IMAGES = {
    "default": [],
    "web": ["postgresql", "nginx", "openssh-server"],
}
# The cache's .debs of each image (crates/image's IMAGE_NAME; the web image
# of the tests, harness/ftsite/host.py's WEB_IMAGE), given to both builds.
DEBS = {"default": ["trixie-riscv64"], "web": ["trixie-riscv64", "ftvm-test-web"]}
BINFMT = "/proc/sys/fs/binfmt_misc"


def die(msg, code=2):
    print(f"image-build: {msg}", file=sys.stderr)
    sys.exit(code)


def timed_lines(argv, env, log):
    """Runs argv; returns (seconds, [(seconds since start, line)] of its
    output, exit status); everything goes to `log` too."""
    t0 = time.monotonic()
    lines = []
    with open(log, "w") as out:
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace")
        for line in p.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))
            out.write(line)
        rc = p.wait()
    return time.monotonic() - t0, lines, rc


def log_path(what):
    """Where a build's whole output is kept (named on failure)."""
    return os.path.join(tempfile.gettempdir(), f"ftvm-bench-image-build-{os.getpid()}-{what}.log")


def at(lines, pattern):
    """When the first line matching `pattern` came, or None."""
    return next((t for t, l in lines if re.search(pattern, l)), None)


def package_list():
    """ftvm's PACKAGES (no command prints them), read from the image
    crate's source: the one list both builds take."""
    src = (REPO / "crates" / "image" / "src" / "lib.rs").read_text()
    body = re.search(r"pub const PACKAGES: &\[&str\] = &\[(.*?)\];", src, re.S).group(1)
    return re.findall(r'"([^"]+)"', body)


def ensure_qemu_user():
    """qemu-user-static and the riscv64 binfmt handler; returns what to
    undo afterwards."""
    undo = []
    missing = [p for p in ("qemu-user-static", "binfmt-support", "arch-test")
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                 text=True).stdout != "install ok installed"]
    if missing:
        print(f"image-build: installing {' '.join(missing)}", flush=True)
        r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing], capture_output=True,
                           text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if r.returncode != 0:
            die(f"apt-get install {' '.join(missing)}: {r.stderr.strip().splitlines()[-1:]}")
    if not os.path.exists(f"{BINFMT}/register"):
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT], check=True)
        undo.append(["umount", BINFMT])
    if not os.path.exists(f"{BINFMT}/qemu-riscv64"):
        subprocess.run(["update-binfmts", "--enable", "qemu-riscv64"], check=True, capture_output=True)
        undo.insert(0, ["update-binfmts", "--disable", "qemu-riscv64"])
    r = subprocess.run(["arch-test", "riscv64"], capture_output=True, text=True)
    if r.returncode != 0:
        die(f"riscv64 binaries do not run under QEMU here: {r.stdout.strip()} {r.stderr.strip()}")
    return undo


def debs_of(name):
    return [cache_dir() / "debs" / d for d in DEBS[name] if (cache_dir() / "debs" / d).is_dir()]


def ftvm_build(args, name, packages, work):
    """`ftvm image build` in a cache of its own, the user's .debs at hand
    (where its build looks for them: the default image's, and the named
    image's own)."""
    cache = os.path.join(work, f"ftvm-cache-{name}")
    image = "trixie-riscv64" if name == "default" else f"bench-{name}"
    for src in debs_of(name):
        dst = os.path.join(cache, "debs", "trixie-riscv64" if src.name == "trixie-riscv64" else image)
        shutil.copytree(src, dst, copy_function=os.link)
    argv = [args.ftvm, "image", "build"]
    if packages:
        argv += ["--name", image, "--packages", ",".join(packages), "--size", "4G"]
    env = {**os.environ, "FTVM_CACHE_DIR": cache}
    total, lines, rc = timed_lines(argv, env, log_path(f"ftvm-{name}"))
    if rc != 0:
        die(f"ftvm image build ({name}) failed: {lines[-1][1] if lines else rc} (all of it: {log_path('ftvm-' + name)})", 3)
    # Its progress lines: `ftvm image: [  12.3s] [7/8] configuring ...`.
    start, end = at(lines, r"\] \[7/\d+\] configuring"), at(lines, r"\] \[8/\d+\]")
    mirror = next((m.group(1) for _, l in lines if (m := re.search(r"packages with mmdebstrap from (\S+)", l))),
                  None)
    shutil.rmtree(cache, ignore_errors=True)
    if start is None or end is None:
        die(f"ftvm's build showed no configuration step ({log_path('ftvm-' + name)})", 3)
    return {"total_s": total, "configure_s": end - start}, mirror


def qemu_build(name, packages, mirror, work):
    """mmdebstrap --variant=apt for riscv64 with QEMU user-mode emulation."""
    root = os.path.join(work, f"qemu-root-{name}")
    hooks = [f'--setup-hook=mkdir -p "$1/var/cache/apt/archives" && for f in {d}/*.deb; do '
             f'ln -f "$f" "$1/var/cache/apt/archives/" 2>/dev/null || cp "$f" "$1/var/cache/apt/archives/"; '
             f'done; true' for d in debs_of(name)]
    argv = ["mmdebstrap", *hooks, "--mode=root", "--variant=apt", "--architectures=riscv64", "--components=main",
            "--include=?essential", "--include=" + ",".join(package_list() + packages),
            '--aptopt=Acquire::Languages "none"', "trixie", root, mirror]
    total, lines, rc = timed_lines(argv, dict(os.environ), log_path(f"qemu-{name}"))
    if rc != 0:
        die(f"mmdebstrap with QEMU ({name}) failed: {lines[-1][1] if lines else rc} (all of it: {log_path('qemu-' + name)})", 3)
    # dpkg configures the essential packages first, then the rest.
    start = at(lines, r"^I: installing (essential packages|remaining packages inside the chroot)")
    end = at(lines, r"^I: (cleaning package lists|success)")
    shutil.rmtree(root, ignore_errors=True)
    if start is None or end is None:
        die(f"mmdebstrap showed no installation in the chroot ({log_path('qemu-' + name)})", 3)
    return {"total_s": total, "configure_s": end - start}


def main():
    ap = options.parser("image-build", __doc__)
    ap.add_argument("--images", default="default,web", help="which images (default,web)")
    ap.add_argument("--ftvm", default=options.DEFAULT_FTVM, help="ftvm binary (default target/release/ftvm)")
    results.add_option(ap, "image-build")
    args = ap.parse_args()
    names = [n for n in args.images.split(",") if n]
    if not names or any(n not in IMAGES for n in names):
        die(f"--images takes {', '.join(IMAGES)}")
    if os.geteuid() != 0:
        die("needs root (both builds extract packages with their owners)")
    if not os.access(args.ftvm, os.X_OK):
        die(f"ftvm binary not found at {args.ftvm}: `cargo build --release -p ftvm`, or --ftvm PATH")
    if not (cache_dir() / "debs").is_dir():
        die("no .debs at hand: build the default image once (`ftvm image build`)")
    undo = ensure_qemu_user()
    print(f"image-build: {', '.join(names)}; repo {results.commit()}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    res, figures = {}, []
    try:
        with tempfile.TemporaryDirectory(prefix="ftvm-bench-imagebuild-", dir=cache_dir()) as work:
            for name in names:
                f, mirror = ftvm_build(args, name, IMAGES[name], work)
                if not mirror:
                    die("ftvm's build did not say its mirror", 3)
                print(f"  {name:7} ftvm: {f['total_s']:.0f} s, configuring {f['configure_s']:.0f} s", flush=True)
                q = qemu_build(name, IMAGES[name], mirror, work)
                print(f"  {name:7} QEMU: {q['total_s']:.0f} s, configuring {q['configure_s']:.0f} s", flush=True)
                res[name] = {"ftvm": f, "qemu": q}
    finally:
        for cmd in undo:
            subprocess.run(cmd, capture_output=True)

    print(f"{'image':8} {'what':12} {'ftvm s':>8} {'qemu s':>8} {'ratio':>6}")
    for name, r in res.items():
        for what, key in (("whole build", "total_s"), ("configuring", "configure_s")):
            f, q = r["ftvm"][key], r["qemu"][key]
            ratio = f / q if f and q else None
            print(f"{name:8} {what:12} {f:8.0f} {q:8.0f} {ratio or float('nan'):6.2f}")
            figures.append(results.figure(
                f"{name}-{key.removesuffix('_s').replace('_', '-')}",
                f"image build, {name} image: {what}", round(f, 1), "s",
                peer=results.peer("mmdebstrap with QEMU user-mode", round(q, 1), "s"), ratio=ratio))
    path = results.write("image-build", ["bench/image-build"] + sys.argv[1:], figures, details=res, path=args.json,
                         ftvm=args.ftvm)
    print(f"image-build: figures in {path}")


if __name__ == "__main__":
    main()
