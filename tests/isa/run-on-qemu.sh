#!/usr/bin/env bash
# Builds every tests/isa/*.S and runs it on QEMU's virt machine, the
# reference the same binaries are checked against on ftvm.
#
#   tests/isa/run-on-qemu.sh [name.S ...]
#
# Header lines of a source adjust the run: "# cpus: N" gives QEMU -smp N
# (ftvm: --cpus N); "# qemu-args: ..." adds QEMU-only options (counters.S
# needs -icount shift=0 for an exact instret); "# qemu: skip (why)" leaves
# out a test of what ftvm promises beyond the spec and QEMU does not. Exit
# status n of a test is the number of its failing check (255: outside any
# check); the program's UART output says what was found and expected.
# Needs qemu-system-riscv64 (qemu-system-misc) and riscv64-linux-gnu-gcc
# (gcc-riscv64-linux-gnu); scripts/install-deps.sh installs both.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$(mktemp -d /tmp/isa-qemu.XXXXXX)}
mkdir -p "$out"
cc=${CROSS_CC:-riscv64-linux-gnu-gcc}
timeout_s=${TIMEOUT:-30}

for tool in "$cc" qemu-system-riscv64; do
    command -v "$tool" >/dev/null || { echo "$tool not found: run scripts/install-deps.sh" >&2; exit 2; }
done

if [ $# -gt 0 ]; then
    sources=()
    for name in "$@"; do sources+=("$here/$(basename "$name")"); done
else
    sources=("$here"/*.S)
fi

passed=0
failed=0
for src in "${sources[@]}"; do
    name=$(basename "$src" .S)
    header=$(head -n 20 "$src")
    cpus=$(sed -n 's/^# *cpus: *\([0-9][0-9]*\).*/\1/p' <<<"$header" | head -n 1)
    extra=$(sed -n 's/^# *qemu-args: *//p' <<<"$header" | head -n 1)
    skip=$(sed -n 's/^# *qemu: *skip *//p' <<<"$header" | head -n 1)
    if [ -n "$skip" ]; then
        echo "skip $name $skip"
        continue
    fi
    if ! "$cc" -march=rv64gc -mabi=lp64d -nostdlib -nostartfiles -static \
            -T "$here/link.ld" -o "$out/$name.elf" "$src"; then
        echo "FAIL $name: does not assemble"
        failed=$((failed + 1))
        continue
    fi
    start=$(date +%s.%N)
    # shellcheck disable=SC2086  # $extra is a list of options
    timeout "$timeout_s" qemu-system-riscv64 -M virt -bios none -nographic -m 128M \
        -smp "${cpus:-1}" $extra -kernel "$out/$name.elf" </dev/null >"$out/$name.log" 2>&1
    status=$?
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }')
    case $status in
        0)   echo "ok   $name (${secs}s)"; passed=$((passed + 1)); continue ;;
        124) echo "FAIL $name: timed out after ${timeout_s}s" ;;
        255) echo "FAIL $name: failed outside any numbered check" ;;
        *)   echo "FAIL $name: check $status failed" ;;
    esac
    sed 's/^/     | /' "$out/$name.log"
    failed=$((failed + 1))
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
