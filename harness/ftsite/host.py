"""The host: the one-line refusals (not root, a missing tool, no binary,
no image), the ftvm binary and the guest image, scratch directories, and
`sh` for the host's own tools."""

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .cleanup import on_cleanup
from .errors import SetupError, TrialFailed

# harness/ftsite/host.py -> the repository
REPO = Path(__file__).resolve().parent.parent.parent

HOST_TOOLS = {
    "ip": "iproute2",
    "taskset": "util-linux",
    "redis-cli": "redis-tools",
    "redis-benchmark": "redis-tools",
    "iperf3": "iperf3",
    "perf": "linux-perf",
    "e2fsck": "e2fsprogs",
    "debugfs": "e2fsprogs",
}


def check_host(tools=("ip", "taskset"), cores=1):
    """Raises SetupError unless this runs as root with `tools` on PATH and
    at least `cores` CPUs."""
    if os.geteuid() != 0:
        raise SetupError("needs root: it creates network namespaces, bridges and TAP devices")
    for tool in tools:
        if not shutil.which(tool):
            pkg = HOST_TOOLS.get(tool, tool)
            raise SetupError(f"{tool} not found on the host: install Debian's {pkg} "
                             f"(apt-get install {pkg}, or scripts/install-deps.sh)")
    if (os.cpu_count() or 1) < cores:
        raise SetupError(f"needs at least {cores} cores (this host has {os.cpu_count()})")


def default_ftvm():
    """$FTVM, else the release build: $CARGO_TARGET_DIR/release/ftvm or
    the repository's target/release/ftvm."""
    if os.environ.get("FTVM"):
        return os.environ["FTVM"]
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    return str(Path(target) / "release" / "ftvm")


def check_ftvm(path):
    """The binary's path, or SetupError if it is not there."""
    src = Path(path)
    if not (src.is_file() and os.access(src, os.X_OK)):
        raise SetupError(f"ftvm binary not found at {src}: build it with `cargo build --release -p ftvm` "
                         f"or pass --ftvm PATH")
    return str(src)


@dataclass
class Binary:
    path: str  # the private copy to run
    source: str  # where it was copied from
    sha256: str
    built: str  # the source file's modification time
    repo_commit: str  # the repository's HEAD when copied (the binary may be older)

    @property
    def identity(self):
        """Which ftvm a benchmark ran, for the first line of its output."""
        return f"ftvm {self.source} (sha256 {self.sha256}, built {self.built}, repo HEAD {self.repo_commit})"


def private_ftvm(path):
    """Copies the ftvm binary to a private temporary directory (removed at
    cleanup): a rebuild during a benchmark must not swap it mid-run."""
    src = Path(check_ftvm(path))
    work = tempfile.mkdtemp(prefix="ftvm-bench-bin-")
    on_cleanup(lambda: shutil.rmtree(work, ignore_errors=True))
    dst = Path(work) / "ftvm"
    shutil.copy2(src, dst)
    digest = hashlib.sha256(dst.read_bytes()).hexdigest()[:12]
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(src.stat().st_mtime))
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True)
    return Binary(str(dst), str(src), digest, built, head.stdout.strip() or "unknown")


def image_dir(ftvm):
    """The guest image's directory (`ftvm image path`), checked to hold a
    root filesystem."""
    r = subprocess.run([ftvm, "image", "path"], capture_output=True, text=True, timeout=60)
    d = Path(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
    if d is None or not (d / "rootfs.ext4").is_file():
        raise SetupError("no guest image: build it with `ftvm image build` (or `make image`)")
    return d


def rootfs(ftvm):
    """The default guest's root filesystem image."""
    return image_dir(ftvm) / "rootfs.ext4"


def sparse_copy(src, dst):
    """A sparse copy of a disk image."""
    sh(["cp", "--sparse=always", str(src), str(dst)], timeout=300)
    return Path(dst)


def work_dir(prefix):
    """A scratch directory removed at cleanup."""
    d = tempfile.mkdtemp(prefix=prefix)
    on_cleanup(lambda: shutil.rmtree(d, ignore_errors=True))
    return Path(d)


def sh(argv, check=True, timeout=60):
    """Runs a host tool; TrialFailed (with its message) if it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise TrialFailed(f"`{' '.join(argv)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r


# The image of PostgreSQL, nginx and openssh-server that
# crates/ftvm/tests/services.rs builds (issue 63), under the tests' own
# name in the user's cache, its key pair and added files beside it.
WEB_IMAGE = "ftvm-test-web"
WEB_PACKAGES = "postgresql,nginx,openssh-server"
# Its added PostgreSQL files, shared with services.rs (the same bytes,
# or each rebuilds the other's image).
_WEB_DATA = REPO / "crates" / "ftvm" / "tests" / "data" / "web-image"


def _keep_file(path, data):
    """Writes `data` at `path` unless it holds it already: the image's
    spec digests its added files' times, so a file written again would
    make the cached image out of date."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)


def cache_dir():
    """ftvm's cache, as crates/image's cache_dir() finds it: the web image
    is built there without waiting for the default one (ftsite.prebuild
    builds both at once)."""
    for var, sub in (("FTVM_CACHE_DIR", ""), ("XDG_CACHE_HOME", "ftvm"), ("HOME", ".cache/ftvm")):
        v = os.environ.get(var)
        if v and (var != "XDG_CACHE_HOME" or os.path.isabs(v)):
            return Path(v) / sub
    return Path(tempfile.gettempdir()) / "ftvm-cache"


def web_image(ftvm, limit=3600):
    """The web image's directory and root key: (image dir, private key).
    Built as services.rs builds it (`ftvm image build --name ftvm-test-web
    --packages postgresql,nginx,openssh-server --size 4G --ssh-key KEY
    --add DIR:/etc/postgresql/17/main`, the same spec, so either finds
    the other's build cached) when it is not built yet: minutes (some 180
    packages configured in the guest)."""
    cache = cache_dir()
    files = cache / f"{WEB_IMAGE}-files"
    key = files / "id_ed25519"
    if not key.exists():
        files.mkdir(parents=True, exist_ok=True)
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "id_ed25519", "-f", str(key)])
    pg = files / "postgresql"
    _keep_file(pg / "pg_hba.conf", (_WEB_DATA / "pg_hba.conf").read_bytes())
    _keep_file(pg / "conf.d" / "listen.conf", (_WEB_DATA / "listen.conf").read_bytes())
    started = time.monotonic()
    r = subprocess.run([ftvm, "image", "build", "--name", WEB_IMAGE, "--packages", WEB_PACKAGES, "--size", "4G",
                        "--ssh-key", f"{key}.pub", "--add", f"{pg}:/etc/postgresql/17/main"],
                       capture_output=True, text=True, timeout=limit)
    if r.returncode != 0:
        raise SetupError(f"ftvm image build --name {WEB_IMAGE} failed ({r.returncode}): {r.stderr.strip()}")
    took = time.monotonic() - started
    if took > 10:
        print(f"ftvm image build --name {WEB_IMAGE}: {took:.0f} s")
    d = Path(r.stdout.strip().splitlines()[-1])
    if not (d / "rootfs.ext4").is_file():
        raise SetupError(f"ftvm image build --name {WEB_IMAGE} said {d}, which holds no rootfs.ext4")
    return d, key
