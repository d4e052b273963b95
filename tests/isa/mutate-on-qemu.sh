#!/usr/bin/env bash
# Checks the checks: for every numbered check n of the given tests (all by
# default), rebuilds the test with -DMUTATE_CHECK=n, which makes check n's
# comparisons fail (see common.h), and verifies that QEMU then exits with
# status n. Prints the checks that could not be made to fail.
#
#   tests/isa/mutate-on-qemu.sh [name.S ...]      (EVERY=k: only every k-th check)
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$(mktemp -d /tmp/isa-mutate.XXXXXX)}
cc=${CROSS_CC:-riscv64-linux-gnu-gcc}
every=${EVERY:-1}

if [ $# -gt 0 ]; then
    sources=()
    for name in "$@"; do sources+=("$here/$(basename "$name")"); done
else
    sources=("$here"/*.S)
fi

total=0
bad=0
for src in "${sources[@]}"; do
    name=$(basename "$src" .S)
    header=$(head -n 20 "$src")
    cpus=$(sed -n 's/^# *cpus: *\([0-9][0-9]*\).*/\1/p' <<<"$header" | head -n 1)
    extra=$(sed -n 's/^# *qemu-args: *//p' <<<"$header" | head -n 1)
    build() {
        "$cc" -march=rv64gc -mabi=lp64d -nostdlib -nostartfiles -static \
            -T "$here/link.ld" "$@" -o "$out/$name.elf" "$src"
    }
    build || { echo "$name: does not assemble"; bad=$((bad + 1)); continue; }
    checks=$(riscv64-linux-gnu-nm "$out/$name.elf" | sed -n 's/.* check_\([0-9]*\)$/\1/p' | sort -n)
    survived=()
    count=0
    for n in $checks; do
        count=$((count + 1))
        [ $(( (count - 1) % every )) -eq 0 ] || continue
        total=$((total + 1))
        build -DMUTATE_CHECK="$n" || { survived+=("$n(build)"); continue; }
        # shellcheck disable=SC2086
        timeout 30 qemu-system-riscv64 -M virt -bios none -nographic -m 128M \
            -smp "${cpus:-1}" $extra -kernel "$out/$name.elf" </dev/null >/dev/null 2>&1
        status=$?
        [ "$status" -eq "$n" ] || survived+=("$n(exit $status)")
    done
    if [ ${#survived[@]} -eq 0 ]; then
        echo "$name: all $count checks fail when mutated"
    else
        echo "$name: ${#survived[@]} of $count checks did not fail as expected: ${survived[*]}"
        bad=$((bad + ${#survived[@]}))
    fi
done
echo "$((total - bad)) passed, $bad failed"
[ "$bad" -eq 0 ]
