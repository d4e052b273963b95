#!/bin/bash
# Install what building, testing and benchmarking ftvm need on Debian
# (bookworm or later). Idempotent: quiet when everything is present, and runs
# `apt-get update` only when something is missing. Run as root (or with sudo
# available).
#
#   scripts/install-deps.sh          install what is missing
#   scripts/install-deps.sh --check  only list what is missing (exit 1 if any)
set -euo pipefail

PACKAGES=(
    # building the guest image (crates/image)
    mmdebstrap            # extracts Debian riscv64 packages
    debian-archive-keyring  # trixie signing keys
    ca-certificates
    e2fsprogs             # mke2fs -d: the ext4 root
    kmod                  # depmod: modules.dep for the guest kernel
    xz-utils              # the kernel's modules are .ko.xz
    zstd                  # initramfs compression
    gzip
    cpio
    device-tree-compiler  # dtc: inspecting/writing device trees
    gcc-riscv64-linux-gnu # riscv64 test programs
    # building ftvm
    build-essential       # cc as Rust's linker
    pkg-config
    protobuf-compiler     # protoc: etcd's client (crates/etcd) is generated from etcd's protos
    libprotobuf-dev       # ... which import protobuf's own (google/protobuf/descriptor.proto)
    # testing and benchmarking
    qemu-system-misc      # qemu-system-riscv64: the reference machine
    redis-tools
    iperf3
    postgresql-client     # psql, pgbench: the PostgreSQL guest's clients (crates/ftvm/tests/services.rs)
    openssh-client        # ssh, ssh-keygen: logging in to a guest with its key (services.rs)
    curl                  # a web server in the guest (services.rs)
    apache2-utils         # ab: nginx's requests/s in the guest (bench/servers)
    linux-perf            # perf: bench/encryption-price samples where ftvm's CPU time goes
    iputils-ping          # ping: an echo request nothing resends (test_ft.py, a failover's received frames)
    iproute2
    python3               # the harness (harness/ftsite): site, benches, demo
    python3-pytest        # the FT integration tests (harness/tests), run by Debian's python3
    python3-pytest-xdist  # ... two at a time (pytest -n)
    python3-pytest-timeout # ... each with a time limit, so a hang fails with its stacks
    python3-jsonschema    # the agent's OpenAPI document and answers against their schemas (test_openapi.py)
    etcd-server           # the cluster's store: the tests start their own members
    etcd-client           # etcdctl: the tests ask etcd for its quorum
    prometheus            # promtool: the tests check the agent's /metrics with it
    chromium              # a real browser on the dashboard (test_dashboard.py), headless
    chromium-driver       # ... driven through WebDriver
    python3-selenium      # ... from Debian's python3
    openssl               # the browser is told the agents' public keys (harness/ftsite/pki.py)
)

CHECK_ONLY=
[ "${1:-}" = "--check" ] && CHECK_ONLY=1

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

have_cargo() {
    command -v cargo >/dev/null 2>&1 || [ -x "${HOME:-/root}/.cargo/bin/cargo" ] || [ -x /root/.cargo/bin/cargo ]
}
if ! have_cargo; then
    # rustup's toolchain is what our machines use; Debian's is only a fallback
    missing+=(cargo rustc)
    CARGO_FALLBACK=1
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ -n "$CHECK_ONLY" ]; then
    echo "install-deps: missing: ${missing[*]}"
    exit 1
fi

SUDO=
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "install-deps: missing ${missing[*]}; run this script as root" >&2
        exit 1
    fi
fi

echo "install-deps: installing ${missing[*]}"
if [ -n "${CARGO_FALLBACK:-}" ]; then
    echo "install-deps: note: no cargo found (rustup not installed); falling back to Debian's cargo and rustc, which may be too old for the workspace"
fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-deps: apt-get failed" >&2
    exit 1
fi
# On a host with systemd the packages start services of their own (a
# single-member etcd, a Prometheus server); ftvm's tests and demo start and
# stop their own etcd members and need only promtool, so what the packages
# started is stopped and left disabled.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    for p in etcd-server:etcd prometheus:prometheus; do
        if [[ " ${missing[*]} " == *" ${p%%:*} "* ]]; then
            $SUDO systemctl disable --now "${p#*:}" >/dev/null 2>&1 || true
        fi
    done
fi
echo "install-deps: done"
