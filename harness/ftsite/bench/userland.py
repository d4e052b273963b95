"""Userland work in the guest, ftvm beside QEMU (issue 33).

Boots a benchmark image (Debian trixie with python3 and its test suite,
sqlite3, xz-utils and GNU gzip: `ftvm image build --name bench-userland`,
built here if missing) in ftvm and in qemu-system-riscv64 -M virt (TCG) with
the same kernel, initrd, firmware, memory and hart count, on a fresh sparse
copy of its root disk per run, and times three parts of one guest job:

  python    python3 -m test test_math test_float (--tests): CPython's own
            stdlib tests, the interpreter's loop, floats, big integers
  sqlite    sqlite3: 200,000 INSERTs (--rows) in a transaction, two indexes, aggregate
            queries, a join, an UPDATE and a DELETE (the database in /tmp)
  compress  GNU gzip -6 -n and xz -1 of 12 MiB (the first 12 MiB of the files
            under /usr/lib/python3.13 in name order: text and binaries, the
            same bytes every run), each decompressed and compared

Each part is timed on the host between the console lines the guest prints
right before and after it (`ftvm-bench-part-start=NAME`, `...-end=NAME`;
boot and the preparation of the data are not timed), as bench/vs-qemu does
for its job; the guest's own /proc/uptime time is kept too, but ftvm's guest
time is virtual. A part whose command fails (a test failing, sqlite3 or a
compressor exiting non-zero, a round trip that does not compare equal) fails
the run; so do results that differ between the emulators (the digests of
the sqlite output and of the compressed files).

For each hart count (--cpus, default 1,2) the runs alternate ftvm and QEMU
(ftvm first in odd rounds, QEMU first in even ones). The table shows, per
part and in all, the median seconds of each and the ratio ftvm/QEMU.
Target: ratio <= 1.0 in all, for each hart count.

Exit status: 0 the target met (or --qemu-only), 1 missed, 2 bad input or
setup (no image and not root to build it, no QEMU), 3 a run failed.

  bench/userland                         3 rounds, 1 and 2 harts
  bench/userland --runs 1 --cpus 1
  bench/userland --parts sqlite,compress --tests test_math
  bench/userland --qemu-only             QEMU's figures only
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from ftsite.bench import options, results, vs_qemu
from ftsite.host import REPO

IMAGE = "bench-userland"
# GNU gzip too: the base image's gzip is busybox's applet.
PACKAGES = "python3,libpython3.13-testsuite,sqlite3,xz-utils,gzip"
IMAGE_SIZE = "2G"
PARTS = ("python", "sqlite", "compress")
TESTS = "test_math test_float"
ROWS = 200000
TARGET = 1.0
SCRIPT = "ftvm-bench-userland.sh"  # in the root of each run's disk copy

PART_START = "ftvm-bench-part-start="
PART_END = "ftvm-bench-part-end="
GUEST_SECS = "ftvm-bench-guest-seconds="
DIGEST = "ftvm-bench-digest="
FAILED = "ftvm-bench-failed="

# The guest's side: `sh /ftvm-bench-userland.sh 'PARTS' 'TESTS' ROWS`. busybox
# sh runs its own applets before PATH's programs (gzip, xz, awk, ...), so
# the real compressors are named by path.
GUEST_SCRIPT = r"""# bench/userland's guest side (harness/ftsite/bench/userland.py)
parts=$1
tests=$2
rows=$3
W=/tmp/ftvm-bench
fail() { echo "ftvm-bench-failed=$*"; exit 1; }
mkdir -p $W && cd $W || fail "prepare: no $W"
up() { cut -d' ' -f1 /proc/uptime; }
want() { case " $parts " in *" $1 "*) return 0;; esac; return 1; }

# ---- preparation (not timed)
if want compress; then
    find /usr/lib/python3.13 -type f | LC_ALL=C sort | tr '\n' '\0' | xargs -0 cat | head -c 12582912 > data
    n=$(wc -c < data)
    [ "$n" -eq 12582912 ] || fail "prepare: the data is $n bytes, not 12 MiB"
    echo "ftvm-bench-digest=data $(sha256sum < data | cut -d' ' -f1)"
fi
if want sqlite; then
    awk -v q="'" -v rows="$rows" 'BEGIN {
        print "BEGIN;"
        for (i = 1; i <= rows; i++)
            printf "INSERT INTO t(a, b, c) VALUES (%d, %d.%02d, %sk%d-%d%s);\n", (i * 7919) % 10007, (i * 31) % 1000, i % 100, q, (i * 40503) % 65536, i % 977, q
        print "COMMIT;"
    }' > insert.sql || fail "prepare: insert.sql"
    cat > job.sql <<'EOF'
CREATE TABLE t(id INTEGER PRIMARY KEY, a INTEGER, b REAL, c TEXT);
.read insert.sql
CREATE INDEX t_a ON t(a);
CREATE INDEX t_c ON t(c);
SELECT count(*), sum(a), printf('%.2f', sum(b)) FROM t;
SELECT a % 10, count(*), printf('%.4f', avg(b)), min(c), max(c) FROM t GROUP BY a % 10 ORDER BY 1;
SELECT count(*) FROM t WHERE a BETWEEN 1000 AND 2000;
SELECT a, count(*) AS n FROM t GROUP BY a ORDER BY n DESC, a LIMIT 5;
SELECT count(*), printf('%.2f', sum(y.b)) FROM t AS x JOIN t AS y ON y.id = x.a WHERE x.c LIKE 'k1%';
SELECT count(DISTINCT c) FROM t;
BEGIN;
UPDATE t SET b = b * 2 WHERE a % 3 = 0;
DELETE FROM t WHERE a % 7 = 0;
COMMIT;
SELECT count(*), printf('%.2f', sum(b)) FROM t;
PRAGMA integrity_check;
EOF
fi

# ---- the parts
run_python() {
    python3 -m test $tests
}
run_sqlite() {
    rm -f bench.db
    sqlite3 -bail bench.db < job.sql > sqlite.out || return 1
    cat sqlite.out
    head -n 1 sqlite.out | grep -q "^$rows|" || { echo "sqlite: not $rows rows"; return 1; }
    tail -n 1 sqlite.out | grep -qx ok || { echo "sqlite: integrity_check failed"; return 1; }
}
run_compress() {
    rm -f data.gz data.xz data.out
    /usr/bin/gzip -6 -n -c < data > data.gz || return 1
    /usr/bin/gzip -d -c < data.gz > data.out || return 1
    cmp data data.out || return 1
    /usr/bin/xz -1 -c < data > data.xz || return 1
    /usr/bin/xz -d -c < data.xz > data.out || return 1
    cmp data data.out || return 1
    echo "gzip $(wc -c < data.gz) bytes, xz $(wc -c < data.xz) bytes"
}
digest() {
    case $1 in
    sqlite) echo "ftvm-bench-digest=sqlite $(sha256sum < sqlite.out | cut -d' ' -f1)";;
    compress) echo "ftvm-bench-digest=compress gz:$(sha256sum < data.gz | cut -d' ' -f1) xz:$(sha256sum < data.xz | cut -d' ' -f1)";;
    esac
}
for p in $parts; do
    echo "ftvm-bench-part-start=$p"
    s=$(up)
    run_$p > $p.log 2>&1
    rc=$?
    e=$(up)
    echo "ftvm-bench-part-end=$p"
    if [ $rc -ne 0 ]; then
        tail -n 40 $p.log
        fail "$p exit status $rc"
    fi
    echo "ftvm-bench-guest-seconds=$p $(awk "BEGIN { print $e - $s }")"
    digest $p
done
"""


def die(msg, code=2):
    print(f"userland: {msg}", file=sys.stderr)
    sys.exit(code)


def build_command(ftvm, name):
    return [str(ftvm), "image", "build", "--name", name, "--packages", PACKAGES, "--size", IMAGE_SIZE]


def resolve_image(args, ftvm):
    """The image's boot files: --image-dir's, else image NAME's (built as
    the bench wants it if it is not, which needs root)."""
    if args.image_dir:
        d = Path(args.image_dir)
    elif args.image != IMAGE or not ftvm:
        d = vs_qemu.cache_dir() / "images" / args.image
        if ftvm:
            r = subprocess.run([str(ftvm), "image", "path", args.image], capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip():
                d = Path(r.stdout.strip().splitlines()[-1])
    elif os.geteuid() != 0:
        d = vs_qemu.cache_dir() / "images" / args.image
        if not (d / "rootfs.ext4").is_file():
            die(f"no image {args.image} at {d}: build it as root with "
                f"`{shlex.join(build_command(ftvm, args.image))}`, or pass --image-dir")
    else:
        # A cached image built as asked is not built again (it costs nothing);
        # one built otherwise under this name is replaced.
        argv = build_command(ftvm, args.image) + ["--quiet"]
        print(f"userland: the image: {shlex.join(argv[:-1])}", flush=True)
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            die(f"building the image failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
        d = Path(r.stdout.strip().splitlines()[-1])
    img = {"kernel": d / "Image", "initrd": d / "initrd.img", "disk": d / "rootfs.ext4", "bios": d / "fw_dynamic.bin"}
    for k, p in img.items():
        if not p.is_file():
            die(f"{k} not found at {p}: build the image with `{shlex.join(build_command(ftvm or 'ftvm', args.image))}`")
    return {k: str(p) for k, p in img.items()}, d


def prepare_disk(img, work, name):
    """A fresh sparse copy of the root disk with the guest script in its root."""
    disk = os.path.join(work, f"{name}-disk.ext4")
    subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
    script = os.path.join(work, SCRIPT)
    Path(script).write_text(GUEST_SCRIPT)
    r = subprocess.run(["debugfs", "-w", "-R", f"write {script} {SCRIPT}", disk], capture_output=True, text=True)
    if r.returncode != 0 or "Allocated inode" not in r.stdout + r.stderr:
        die(f"writing {SCRIPT} into the disk copy with debugfs failed: {(r.stderr or r.stdout).strip()}", 3)
    return disk


def one_run(emu, make_argv, img, cpus, args, work, rnd):
    """One boot of `emu` running the parts; the per-part host times, guest
    times and digests, or exit 3 on any failure."""
    disk = prepare_disk(img, work, emu)
    cmd = f"sh /{SCRIPT} {shlex.quote(' '.join(args.parts))} {shlex.quote(args.tests)} {args.rows}"
    log = os.path.join(args.log_dir, f"{emu}-cpus{cpus}-{rnd + 1}.log") if args.log_dir else None
    starts, ends, guest, digests, failed = {}, {}, {}, {}, []

    def on_line(line, now):
        for prefix, into in ((PART_START, starts), (PART_END, ends)):
            if line.startswith(prefix):
                into.setdefault(line[len(prefix):].strip(), now)
        if line.startswith(GUEST_SECS):
            name, _, secs = line[len(GUEST_SECS):].partition(" ")
            try:
                guest[name] = float(secs)
            except ValueError:
                pass
        if line.startswith(DIGEST):
            name, _, value = line[len(DIGEST):].partition(" ")
            digests[name] = value.strip()
        if line.startswith(FAILED):
            failed.append(line[len(FAILED):])

    ns = types.SimpleNamespace(mem=args.mem, cpus=cpus)
    m = vs_qemu.run_once(make_argv(img, disk, ns, cmd), args.timeout, log, on_line=on_line)
    os.unlink(disk)
    problem = None
    if failed:
        problem = f"the guest job failed: {failed[0]}"
    elif m["timeout"]:
        problem = f"timed out after {args.timeout:g}s"
    elif m["rc"] != 0:
        problem = f"exit status {m['rc']}"
    elif emu == "qemu" and m.get("status_line") != "0":
        # QEMU exits 0 whatever the command did: the guest's status line tells
        problem = f"the guest command's status {m.get('status_line', '(no status line)')}"
    else:
        missing = [p for p in args.parts if p not in starts or p not in ends]
        if missing:
            problem = f"no start/end markers of {', '.join(missing)}"
    if problem:
        if not log:
            tail = "\n".join("    " + line for line in m["output"][-30:])
            print(f"userland: the console's last lines:\n{tail}", file=sys.stderr)
        die(f"{emu} run {rnd + 1} with {cpus} hart(s): {problem}{options.console_hint(log)}", 3)
    times = {p: ends[p] - starts[p] for p in args.parts}
    return times, guest, digests


def median(xs):
    return vs_qemu.med(xs)


def main():
    ap = options.parser("userland", __doc__)
    ap.add_argument("--runs", type=int, default=3, help="rounds per hart count (default 3)")
    ap.add_argument("--cpus", default="1,2", help="hart counts, comma-separated (default 1,2)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which parts, of {','.join(PARTS)} (default all)")
    ap.add_argument("--tests", default=TESTS, help=f"the python part's tests (default '{TESTS}')")
    ap.add_argument("--rows", type=int, default=ROWS, help=f"the sqlite part's rows (default {ROWS})")
    ap.add_argument("--image", default=IMAGE, help=f"the image's name (default {IMAGE}, built if missing "
                    f"with --packages {PACKAGES} --size {IMAGE_SIZE})")
    ap.add_argument("--hart-threads", choices=("single", "multi"), default="multi",
                    help="ftvm's --hart-threads: its harts each on a host thread of its own, or all on one (default multi)")
    ap.add_argument("--qemu-only", action="store_true", help="measure QEMU only")
    ap.add_argument("--quiet", action="store_true", help="only print the table")
    options.add_guest(ap, boot=False, timeout=3600)
    results.add_option(ap, "userland")
    args = ap.parse_args()
    if args.runs < 1:
        die("--runs must be at least 1")
    if args.rows < 1:
        die("--rows must be at least 1")
    try:
        cpus_list = [int(c) for c in args.cpus.split(",") if c.strip()]
    except ValueError:
        die(f"--cpus {args.cpus!r}: give hart counts such as 1,2")
    if not cpus_list or any(c < 1 or c > 8 for c in cpus_list):
        die(f"--cpus {args.cpus!r}: hart counts from 1 to 8")
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not args.parts or any(p not in PARTS for p in args.parts):
        die(f"--parts {','.join(args.parts)!r}: choose from {','.join(PARTS)}")
    if not args.tests.replace("_", "").replace(" ", "").replace(".", "").isalnum():
        die(f"--tests {args.tests!r}: test module names separated by spaces")

    ftvm, qemu = vs_qemu.emulators(args, die)
    if not shutil.which("debugfs"):
        die("debugfs not found: install Debian's e2fsprogs")
    img, image_dir = resolve_image(args, ftvm)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    emus = {"qemu": lambda i, d, a, c: vs_qemu.qemu_argv(qemu, i, d, a, c)}
    if ftvm is not None:
        def ftvm_argv(i, d, a, c):
            argv = vs_qemu.ftvm_argv(ftvm, i, d, a, c)
            return argv[:2] + ["--hart-threads", args.hart_threads] + argv[2:]
        emus["ftvm"] = ftvm_argv
        print(f"userland: ftvm {ftvm} (built {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ftvm.stat().st_mtime))}, "
              f"repo HEAD {head.stdout.strip() or 'unknown'})", flush=True)
    print(f"userland: {args.runs} round(s) per hart count, harts {','.join(map(str, cpus_list))} "
          f"(ftvm --hart-threads {args.hart_threads}), -m {args.mem}; "
          f"parts {','.join(args.parts)}; tests '{args.tests}'; image {image_dir}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    # res[cpus][emu] = list of per-run {part: seconds}
    res = {c: {e: [] for e in emus} for c in cpus_list}
    guest = {c: {e: [] for e in emus} for c in cpus_list}
    with tempfile.TemporaryDirectory(prefix="ftvm-bench-userland-") as work:
        for cpus in cpus_list:
            seen = {}  # digest name -> (value, who)
            for rnd in range(args.runs):
                order = [e for e in ("ftvm", "qemu") if e in emus]
                if rnd % 2:
                    order.reverse()
                for emu in order:
                    times, gsecs, digests = one_run(emu, emus[emu], img, cpus, args, work, rnd)
                    for name, value in digests.items():
                        first = seen.setdefault(name, (value, f"{emu} run {rnd + 1}"))
                        if first[0] != value:
                            die(f"{name}: {emu} run {rnd + 1} with {cpus} hart(s) got {value}, "
                                f"{first[1]} got {first[0]}: the results differ", 3)
                    res[cpus][emu].append(times)
                    guest[cpus][emu].append(gsecs)
                    if not args.quiet:
                        detail = ", ".join(f"{p} {times[p]:.2f}s (guest {gsecs.get(p, float('nan')):.2f})"
                                           for p in args.parts)
                        print(f"  {cpus} hart(s) round {rnd + 1}/{args.runs} {emu:4}: {detail}; "
                              f"all {sum(times.values()):.2f}s", flush=True)

    print()
    print(f"{'harts':>5} {'part':9} {'ftvm s':>8} {'qemu s':>8} {'ratio':>6}   runs ftvm | qemu (s)")
    missed = False
    figs, details = [], {}
    for cpus in cpus_list:
        for part in args.parts + ["all"]:
            row = {}
            runs = {}
            for emu in emus:
                xs = [sum(t.values()) if part == "all" else t[part] for t in res[cpus][emu]]
                runs[emu] = " ".join(f"{x:.2f}" for x in xs)
                row[emu] = median(xs)
            ftvm_s = f"{row['ftvm']:8.2f}" if "ftvm" in row else f"{'-':>8}"
            ratio = row["ftvm"] / row["qemu"] if "ftvm" in row else None
            ratio_s = f"{ratio:6.2f}" if ratio is not None else f"{'-':>6}"
            verdict = ""
            if part == "all":
                if ratio is None:
                    verdict = f"  (target <= {TARGET:.1f}) --qemu-only"
                else:
                    ok = ratio <= TARGET
                    missed |= not ok
                    verdict = f"  (target <= {TARGET:.1f}) {'PASS' if ok else 'MISS'}"
            print(f"{cpus:5} {part:9} {ftvm_s} {row['qemu']:8.2f} {ratio_s}   "
                  f"{runs.get('ftvm', '-')} | {runs['qemu']}{verdict}")
            details.setdefault(str(cpus), {})[part] = {"median_s": row, "runs_s": runs}
            threads = "" if args.hart_threads == "multi" else f".{args.hart_threads}"
            figs.append(results.figure(
                f"userland.{part}.{cpus}{threads}",
                f"userland beside QEMU, {'all parts' if part == 'all' else part}, {cpus} hart(s) "
                f"(`--hart-threads {args.hart_threads}`)", row.get("ftvm"), "s",
                peer=results.peer("QEMU", row["qemu"], "s"), ratio=ratio,
                target=f"≤ {TARGET:.1f}" if part == "all" else None,
                met=(ratio <= TARGET) if part == "all" and ratio is not None else None))
    path = results.write("userland", ["bench/userland"] + sys.argv[1:], figs, details, args.json, ftvm)
    print(f"userland: figures written to {path}")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
