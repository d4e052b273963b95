#!/bin/bash
# Boot the default ftvm guest image in QEMU and run one command in it.
#   scripts/qemu-exec.sh [options] 'CMD'      exit status = CMD's exit status
#   scripts/qemu-exec.sh [options]            interactive shell (exit powers off)
# Options: --mem SIZE (1G)  --cpus N (1)  --net (user-mode virtio-net, eth0 10.0.2.15/24)
#          --snapshot (discard disk writes)  --append STR (extra kernel parameters)
#          --image-dir DIR (default: $FTVM_CACHE_DIR|$XDG_CACHE_HOME/ftvm|~/.cache/ftvm + /images/trixie-riscv64)
# Prints the guest console; with a command, boot noise before the
# ftvm-exec-begin marker is hidden unless --verbose.
set -euo pipefail
MEM=1G CPUS=1 NET= SNAP= EXTRA= VERBOSE= DIR=
while [ $# -gt 0 ]; do
    case "$1" in
        --mem) MEM=$2; shift 2 ;;
        --cpus) CPUS=$2; shift 2 ;;
        --net) NET=1; shift ;;
        --snapshot) SNAP=1; shift ;;
        --append) EXTRA=$2; shift 2 ;;
        --image-dir) DIR=$2; shift 2 ;;
        --verbose|-v) VERBOSE=1; shift ;;
        --) shift; break ;;
        -*) echo "qemu-exec.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [ -z "$DIR" ]; then
    if [ -n "${FTVM_CACHE_DIR:-}" ]; then CACHE=$FTVM_CACHE_DIR
    elif [ -n "${XDG_CACHE_HOME:-}" ]; then CACHE=$XDG_CACHE_HOME/ftvm
    else CACHE=$HOME/.cache/ftvm; fi
    DIR=$CACHE/images/trixie-riscv64
fi
for f in Image initrd.img rootfs.ext4 fw_dynamic.bin ftvm-image.stamp; do
    [ -s "$DIR/$f" ] || { echo "qemu-exec.sh: no guest image in $DIR ($f missing): run \`ftvm image build\`" >&2; exit 2; }
done
command -v qemu-system-riscv64 >/dev/null || { echo "qemu-exec.sh: qemu-system-riscv64 not found (Debian package qemu-system-misc)" >&2; exit 2; }

APPEND="console=ttyS0"
if [ $# -gt 0 ]; then
    APPEND="$APPEND quiet ftvm.exec=$(printf %s "$1" | base64 -w0)"
fi
NETARGS=()
if [ -n "$NET" ]; then
    APPEND="$APPEND ftvm.ip=10.0.2.15/24,10.0.2.2"
    NETARGS=(-netdev user,id=n0 -device virtio-net-device,netdev=n0)
fi
[ -n "$EXTRA" ] && APPEND="$APPEND $EXTRA"
DRIVE="file=$DIR/rootfs.ext4,format=raw,if=none,id=d0"
[ -n "$SNAP" ] && DRIVE="$DRIVE,snapshot=on"
QEMU=(qemu-system-riscv64 -M virt -m "$MEM" -smp "$CPUS" -nographic
      -bios "$DIR/fw_dynamic.bin" -kernel "$DIR/Image" -initrd "$DIR/initrd.img"
      -append "$APPEND" -drive "$DRIVE" -device virtio-blk-device,drive=d0 "${NETARGS[@]}")
if [ $# -eq 0 ] || [ -n "$VERBOSE" ]; then
    exec "${QEMU[@]}"
fi
# hide everything up to the begin marker; keep QEMU's exit status
set +o pipefail
"${QEMU[@]}" < /dev/null | { sed -u -n '/^ftvm-exec-begin\r\{0,1\}$/,$p' | sed -u '1d'; }
exit "${PIPESTATUS[0]}"
