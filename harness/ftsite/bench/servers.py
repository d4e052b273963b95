"""Multi-process guest work, ftvm beside QEMU (issue 69).

What a server with a process per connection does besides computing: fork,
exec, switch address spaces, move bytes through pipes. Boots the default
guest image in ftvm and in qemu-system-riscv64 -M virt (TCG) with the same
kernel, initrd, firmware, memory, hart count and kernel command line, on a
fresh sparse copy of the root disk per run, and times each workload on the
host between the console lines the guest prints around it
(`ftvm-bench-part-start=NAME` / `...-end=NAME`; boot is not timed):

  forkexec  a shell loop of 2,000 (--loops) runs of /usr/bin/true (coreutils,
            dynamically linked: fork, exec, ld.so, exit, wait each time)
  pipe      100 MiB (--pipe-mb) from dd through three /usr/bin/cat into
            wc -c, which must count every byte

and, on a server image (default `ftvm-test-web`, issue 63's: postgresql,
nginx and openssh-server configured, systemd as init; boot_services boots
it the same way) booted in each emulator with the same firmware, kernel,
initrd, command line, memory, harts and devices (virtio-blk on a fresh
sparse copy of its disk, virtio-net on a TAP in a namespace of its own,
virtio-rng), driven from the host once pg_isready and nginx answer:

  pgbench   PostgreSQL by the host's pgbench: `-i -s 5` (timed), then
            TPC-B-like and select-only (-S), each with 1, 4 and 16 clients
            (--pg-clients), -j 2, -T 20 (--pg-seconds): tps
  nginx     its static page by the host's ab (Debian apache2-utils), with
            and without keep-alive (-k), -c 16 (--ab-clients), -t 10
            (--ab-seconds): requests/s

For each hart count (--cpus, default 1,2) the rounds alternate ftvm and QEMU
(ftvm first in odd rounds, QEMU first in even ones). The table shows each
workload's median and the ratio ftvm/QEMU of the same runs (of the seconds
for the guest jobs and pgbench's initialization, of tps and requests/s for
the servers: there higher is better for ftvm); the result is also written
as JSON (bench/results/servers.json, --json). Targets (issue 69): ratio
<= 0.7 for fork/exec and the pipe; tps >= 1.5x QEMU's at 4 clients and
>= 1.0x at 1 and 16; nginx >= 1.5x.

Exit status: 0 the target met (or --qemu-only), 1 missed, 2 bad input or
setup, 3 a run failed.

  bench/servers                              3 rounds, 1 and 2 harts
  bench/servers --runs 1 --cpus 1 --only forkexec
  bench/servers --runs 1 --cpus 1 --only pgbench,nginx   about 10 min
  bench/servers --ftvm path/to/other/ftvm    another build
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types

from ftsite.bench import boot_services, options, redis, results, vs_qemu

GUEST_WORKLOADS = ("forkexec", "pipe")
SERVICE_WORKLOADS = ("pgbench", "nginx")
WORKLOADS = GUEST_WORKLOADS + SERVICE_WORKLOADS
TARGET = 0.7
# The servers' targets, tps or requests/s over QEMU's (issue 69).
PG_TARGET = {4: 1.5}
PG_TARGET_ELSE = 1.0
NGINX_TARGET = 1.5
PG_SCALE = 5
PG_MODES = {"tpcb": ("TPC-B-like", []), "select": ("select-only", ["-S"])}
NGINX_MODES = {"keepalive": ("keep-alive", ["-k"]), "close": ("a connection a request", [])}
# The web image's pg_hba.conf trusts 10.200.0.0/24 (crates/ftvm/tests/data/
# web-image): the host and the guest are there, one emulator's TAP to a
# namespace of its own (boot_services' two /24s are outside it).
SERVICE_NETS = {e: dict(redis.NETS[e], host="10.200.0.1", guest="10.200.0.2") for e in ("ftvm", "qemu")}
LOOPS = 2000
PIPE_MB = 100

PART_START = "ftvm-bench-part-start="
PART_END = "ftvm-bench-part-end="
RESULT = "ftvm-bench-result="
FAILED = "ftvm-bench-failed="

# The guest's side, given as the exec command (it goes on the kernel command
# line base64-encoded, for QEMU, so it stays short). busybox sh runs its own
# applets before PATH's programs: the real programs are named by path, so
# each is a fork and an exec of a dynamically linked binary.
GUEST = {
    "forkexec": "i=0; while [ $i -lt {loops} ]; do /usr/bin/true || exit 1; i=$((i+1)); done; echo {result}$i",
    "pipe": ("n=$(/usr/bin/dd if=/dev/zero bs=1M count={mb} status=none | /usr/bin/cat | /usr/bin/cat "
             "| /usr/bin/cat | /usr/bin/wc -c); echo {result}$n; [ \"$n\" = {bytes} ]"),
}


def die(msg, code=2):
    print(f"servers: {msg}", file=sys.stderr)
    sys.exit(code)


def guest_command(parts, args):
    """One exec command running `parts` in order, each between its markers;
    a part that fails prints the failure marker and stops the job."""
    steps = []
    for p in parts:
        body = GUEST[p].format(loops=args.loops, mb=args.pipe_mb, bytes=args.pipe_mb << 20, result=f"{RESULT}{p}=")
        steps.append(f"echo {PART_START}{p}; ( {body} ) || {{ echo {FAILED}{p}; exit 1; }}; echo {PART_END}{p}")
    return "; ".join(steps)


def expected(part, args):
    return str(args.loops) if part == "forkexec" else str(args.pipe_mb << 20)


def one_run(emu, make_argv, img, cpus, args, work, rnd):
    """One boot of `emu` running the workloads: seconds per workload, or
    exit 3 on any failure."""
    disk = os.path.join(work, f"{emu}-disk.ext4")
    subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
    log = os.path.join(args.log_dir, f"{emu}-cpus{cpus}-{rnd + 1}.log") if args.log_dir else None
    starts, ends, got, failed = {}, {}, {}, []

    def on_line(line, now):
        for prefix, into in ((PART_START, starts), (PART_END, ends)):
            if line.startswith(prefix):
                into.setdefault(line[len(prefix):].strip(), now)
        if line.startswith(RESULT):
            name, _, value = line[len(RESULT):].partition("=")
            got[name] = value.strip()
        if line.startswith(FAILED):
            failed.append(line[len(FAILED):].strip())

    ns = types.SimpleNamespace(mem=args.mem, cpus=cpus)
    m = vs_qemu.run_once(make_argv(img, disk, ns, guest_command(args.guest_parts, args)), args.timeout, log, on_line=on_line)
    os.unlink(disk)
    problem = None
    if failed:
        problem = f"the guest's {failed[0]} failed (it printed {got.get(failed[0], 'nothing')})"
    elif m["timeout"]:
        problem = f"timed out after {args.timeout:g}s"
    elif m["rc"] != 0:
        problem = f"exit status {m['rc']}"
    elif emu == "qemu" and m.get("status_line") != "0":
        problem = f"the guest command's status {m.get('status_line', '(no status line)')}"
    else:
        missing = [p for p in args.guest_parts if p not in starts or p not in ends]
        wrong = [p for p in args.guest_parts if got.get(p) != expected(p, args)]
        if missing:
            problem = f"no start/end markers of {', '.join(missing)}"
        elif wrong:
            problem = ", ".join(f"{p} gave {got.get(p)!r}, not {expected(p, args)}" for p in wrong)
    if problem:
        if not log:
            tail = "\n".join("    " + line for line in m["output"][-30:])
            print(f"servers: the console's last lines:\n{tail}", file=sys.stderr)
        die(f"{emu} run {rnd + 1} with {cpus} hart(s): {problem}{options.console_hint(log)}", 3)
    return {p: ends[p] - starts[p] for p in args.guest_parts}


class Terminated(BaseException):
    """SIGTERM/SIGHUP: unwind like Ctrl-C so that the VM, its disk copy and
    the namespace go."""


def service_keys(args):
    """The servers' figures of one boot, in order: key -> (unit, higher is
    better)."""
    keys = {}
    if "pgbench" in args.parts:
        keys["pgbench.init"] = ("s", False)
        for mode in PG_MODES:
            for c in args.pg_clients:
                keys[f"pgbench.{mode}.c{c}"] = ("tps", True)
    if "nginx" in args.parts:
        for mode in NGINX_MODES:
            for c in args.ab_clients:
                keys[f"nginx.{mode}.c{c}"] = ("req/s", True)
    return keys


def host_run(ns, argv, limit, what):
    """A client run on the host side of the TAP: its output, or RunFailed."""
    try:
        r = subprocess.run(ns.argv(*argv), capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise redis.RunFailed(f"{what} did not finish within {limit:g} s")
    if r.returncode != 0:
        raise redis.RunFailed(f"{what} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-600:]}")
    return r.stdout + r.stderr


def pgbench(ns, guest, args, emit):
    """pgbench's initialization (seconds) and every mode and client count (tps)."""
    base = ["pgbench", "-h", guest, "-U", "postgres"]
    t0 = time.monotonic()
    host_run(ns, base + ["-i", "-q", "-s", str(PG_SCALE), "postgres"], 600, f"pgbench -i -s {PG_SCALE}")
    emit("pgbench.init", time.monotonic() - t0, "")
    for mode, (_, flags) in PG_MODES.items():
        for c in args.pg_clients:
            what = f"pgbench {' '.join(flags + [f'-c {c}'])}"
            out = host_run(ns, base + flags + ["-c", str(c), "-j", str(min(2, c)), "-T", str(args.pg_seconds),
                                               "postgres"], args.pg_seconds + 300, what)
            tps = re.search(r"^tps = ([0-9.]+)", out, re.M)
            lat = re.search(r"^latency average = ([0-9.]+) ms", out, re.M)
            failed = re.search(r"^number of failed transactions: (\d+)", out, re.M)
            if not tps:
                raise redis.RunFailed(f"{what}: no tps in its output: {out.strip()[-600:]}")
            if failed and failed.group(1) != "0":
                raise redis.RunFailed(f"{what}: {failed.group(1)} failed transactions")
            emit(f"pgbench.{mode}.c{c}", float(tps.group(1)), f"latency {lat.group(1) if lat else '?'} ms")


def nginx(ns, guest, args, emit):
    """ab on nginx's static page, with keep-alive and without (requests/s)."""
    for mode, (_, flags) in NGINX_MODES.items():
        for c in args.ab_clients:
            what = f"ab {' '.join(flags + [f'-c {c}'])}"
            # -t first: it sets -n to 50,000, which -n then raises (ab keeps
            # a record per request: 500,000 is 24 MB).
            out = host_run(ns, ["ab", "-q", "-t", str(args.ab_seconds), "-n", "500000", "-c", str(c), *flags,
                                f"http://{guest}/"], args.ab_seconds + 120, what)
            rps = re.search(r"^Requests per second:\s+([0-9.]+)", out, re.M)
            failed = re.search(r"^Failed requests:\s+(\d+)", out, re.M)
            non2xx = re.search(r"^Non-2xx responses:\s+(\d+)", out, re.M)
            if not rps:
                raise redis.RunFailed(f"{what}: no requests/s in its output: {out.strip()[-600:]}")
            if (failed and failed.group(1) != "0") or non2xx:
                raise redis.RunFailed(f"{what}: {failed.group(1) if failed else 0} failed requests, "
                                      f"{non2xx.group(1) if non2xx else 0} not 2xx")
            done = re.search(r"^Complete requests:\s+(\d+)", out, re.M)
            emit(f"nginx.{mode}.c{c}", float(rps.group(1)), f"{done.group(1) if done else '?'} requests")


def service_run(emu, make_argv, img, cpus, args, work, rnd):
    """One boot of the server image in `emu`, the host's clients run against
    it: each figure of service_keys, or exit 3 on any failure."""
    disk = os.path.join(work, f"{emu}-web-disk.ext4")
    subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
    log = os.path.join(args.log_dir or work, f"{emu}-web-cpus{cpus}-{rnd + 1}.log")
    ns = vm = None
    got = {}

    def emit(key, value, detail):
        got[key] = value
        if not args.quiet:
            print(f"    {emu:4} {key:22} {value:10.2f} {service_keys(args)[key][0]:5} {detail}", flush=True)

    try:
        ns = redis.Netns(args.netns, [emu], SERVICE_NETS)
        vm = redis.Vm(ns.argv(*make_argv(types.SimpleNamespace(mem=args.mem, cpus=cpus), img, disk)), log)
        t0 = time.monotonic()
        waiting = [s for s, part in (("postgres", "pgbench"), ("nginx", "nginx")) if part in args.parts]
        while waiting:
            if not vm.alive():
                raise redis.RunFailed(f"{emu} ended after {time.monotonic() - t0:.0f} s")
            if time.monotonic() - t0 > args.boot_timeout:
                raise redis.RunFailed(f"no answer from {', '.join(waiting)} within {args.boot_timeout:g} s")
            waiting = [s for s in waiting if not boot_services.ready(ns, emu, s, SERVICE_NETS)]
            time.sleep(0.5)
        if not args.quiet:
            print(f"    {emu:4} services answer {time.monotonic() - t0:.1f} s after the start", flush=True)
        guest = SERVICE_NETS[emu]["guest"]
        if "pgbench" in args.parts:
            pgbench(ns, guest, args, emit)
        if "nginx" in args.parts:
            nginx(ns, guest, args, emit)
        if not vm.alive():
            raise redis.RunFailed(f"{emu} ended during the clients' runs")
    except redis.RunFailed as e:
        tail = vm.tail() if vm else ""
        die(f"{emu} run {rnd + 1} with {cpus} hart(s) (the web image): {e} (console in {log})\n{tail}", 3)
    finally:
        if vm:
            vm.stop()
        if ns:
            ns.close()
        os.unlink(disk)
    return got


def ints(text, what):
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        xs = []
    if not xs or any(x < 1 for x in xs):
        die(f"{what} {text!r}: give positive integers separated by commas")
    return xs


def main():
    ap = options.parser("servers", __doc__)
    ap.add_argument("--runs", type=int, default=3, help="rounds per hart count (default 3)")
    ap.add_argument("--cpus", default="1,2", help="hart counts, comma-separated (default 1,2)")
    ap.add_argument("--only", default=",".join(GUEST_WORKLOADS),
                    help=f"workloads, of {','.join(WORKLOADS)} (default {','.join(GUEST_WORKLOADS)})")
    ap.add_argument("--loops", type=int, default=LOOPS, help=f"forkexec's runs of /usr/bin/true (default {LOOPS})")
    ap.add_argument("--pipe-mb", type=int, default=PIPE_MB, help=f"MiB through the pipe (default {PIPE_MB})")
    ap.add_argument("--pg-clients", default="1,4,16", help="pgbench's client counts (default 1,4,16)")
    ap.add_argument("--pg-seconds", type=int, default=20, help="pgbench's -T for each mode and client count (default 20)")
    ap.add_argument("--ab-clients", default="16", help="ab's concurrency levels (default 16)")
    ap.add_argument("--ab-seconds", type=int, default=10, help="ab's -t for each (default 10)")
    ap.add_argument("--web-image-dir", help=f"the server image (default <cache>/images/{boot_services.IMAGE})")
    ap.add_argument("--boot-timeout", type=float, default=600,
                    help="seconds from a server image's start to its services answering (default 600)")
    ap.add_argument("--netns", default=f"ftvm-servers-{os.getpid()}", help="network namespace to create (one boot at a time)")
    ap.add_argument("--hart-threads", choices=("single", "multi"), default="multi",
                    help="ftvm's --hart-threads (default multi)")
    ap.add_argument("--qemu-only", action="store_true", help="measure QEMU only")
    ap.add_argument("--quiet", action="store_true", help="only print the table")
    results.add_option(ap, "servers")
    options.add_guest(ap, boot=False, timeout=1800)
    args = ap.parse_args()
    if args.runs < 1 or args.loops < 1 or args.pipe_mb < 1 or args.pg_seconds < 1 or args.ab_seconds < 1:
        die("--runs, --loops, --pipe-mb, --pg-seconds and --ab-seconds must be at least 1")
    cpus_list = ints(args.cpus, "--cpus")
    if any(c > 8 for c in cpus_list):
        die(f"--cpus {args.cpus!r}: hart counts from 1 to 8")
    args.pg_clients = ints(args.pg_clients, "--pg-clients")
    args.ab_clients = ints(args.ab_clients, "--ab-clients")
    args.parts = [p.strip() for p in args.only.split(",") if p.strip()]
    for p in args.parts:
        if p not in WORKLOADS:
            die(f"--only {p!r}: choose from {','.join(WORKLOADS)}")
    if not args.parts:
        die("--only names no workload")
    args.guest_parts = guest_parts = [p for p in args.parts if p in GUEST_WORKLOADS]
    serving = any(p in SERVICE_WORKLOADS for p in args.parts)

    options.default_boot(args)
    ftvm, qemu = vs_qemu.emulators(args, die)
    img = vs_qemu.resolve_image(args, ftvm) if guest_parts else None
    web = None
    if serving:
        if os.geteuid() != 0:
            die("pgbench and nginx need root: a network namespace and a TAP")
        for tool, pkg in (("ip", "iproute2"), ("pg_isready", "postgresql-client"), ("pgbench", "postgresql-client"),
                          ("curl", "curl"), ("ab", "apache2-utils")):
            if not shutil.which(tool):
                die(f"{tool} not found on the host: install Debian's {pkg} (apt-get install {pkg}; "
                    "scripts/install-deps.sh)")
        d = args.web_image_dir or str(vs_qemu.cache_dir() / "images" / boot_services.IMAGE)
        if not os.path.isdir(d):
            die(f"no image {boot_services.IMAGE} at {d}: `cargo test --release -p ftvm --test services` builds it "
                "(or give --web-image-dir)")
        web = redis.resolve_image(types.SimpleNamespace(image_dir=d, kernel=None, initrd=None, disk=None, bios=None))
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    emus = {"qemu": lambda i, d, a, c: vs_qemu.qemu_argv(qemu, i, d, a, c)}
    web_emus = {"qemu": lambda a, i, d: boot_services.qemu_argv(types.SimpleNamespace(**vars(a), qemu_path=qemu), i, d,
                                                                SERVICE_NETS)}
    if ftvm is not None:
        def ftvm_argv(i, d, a, c):
            argv = vs_qemu.ftvm_argv(ftvm, i, d, a, c)
            return argv[:2] + ["--hart-threads", args.hart_threads] + argv[2:]

        def ftvm_web_argv(a, i, d):
            argv = boot_services.ftvm_argv(types.SimpleNamespace(**vars(a), ftvm=ftvm), i, d, SERVICE_NETS)
            return argv[:2] + ["--hart-threads", args.hart_threads] + argv[2:]
        emus["ftvm"] = ftvm_argv
        web_emus["ftvm"] = ftvm_web_argv
        print(f"servers: ftvm {ftvm} (built {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ftvm.stat().st_mtime))}, "
              f"repo {results.commit()})", flush=True)
    server_image = f"; server image {os.path.dirname(web['disk'])}" if web else ""
    print(f"servers: {args.runs} round(s) per hart count, harts {','.join(map(str, cpus_list))} "
          f"(ftvm --hart-threads {args.hart_threads}), -m {args.mem}; workloads {','.join(args.parts)} "
          f"(loops {args.loops}, pipe {args.pipe_mb} MiB; pgbench -s {PG_SCALE} -T {args.pg_seconds} "
          f"-c {','.join(map(str, args.pg_clients))}; ab -t {args.ab_seconds} -c {','.join(map(str, args.ab_clients))})"
          f"; kernel {(img or web)['kernel']}{server_image}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    def on_signal(signum, _frame):
        raise Terminated(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, on_signal)
    res = {c: {e: [] for e in emus} for c in cpus_list}
    loads = []
    try:
        with tempfile.TemporaryDirectory(prefix="ftvm-bench-servers-") as work:
            for cpus in cpus_list:
                for rnd in range(args.runs):
                    order = [e for e in ("ftvm", "qemu") if e in emus]
                    if rnd % 2:
                        order.reverse()
                    for emu in order:
                        times = one_run(emu, emus[emu], img, cpus, args, work, rnd) if guest_parts else {}
                        if serving:
                            times.update(service_run(emu, web_emus[emu], web, cpus, args, work, rnd))
                        res[cpus][emu].append(times)
                        loads.append(os.getloadavg()[0])
                        if not args.quiet:
                            detail = ", ".join(f"{p} {times[p]:.2f}s" for p in guest_parts)
                            load = f"load average {loads[-1]:.2f}"
                            print(f"  {cpus} hart(s) round {rnd + 1}/{args.runs} {emu:4}: {detail or load}"
                                  f"{', ' + load if detail else ''}", flush=True)
    except (KeyboardInterrupt, Terminated) as e:
        die(f"stopped ({type(e).__name__} {e})", 3)
    finally:
        for vm in list(redis.LIVE_VMS):
            vm.stop()

    print()
    missed = False
    out = {"target_ratio_at_most": TARGET, "loops": args.loops, "pipe_mib": args.pipe_mb, "mem": args.mem,
           "hart_threads": args.hart_threads, "runs": args.runs, "by_harts": {},
           "load_average_1min_after_each_run": [round(x, 2) for x in loads]}
    if serving:
        out.update(pg_scale=PG_SCALE, pg_seconds=args.pg_seconds, pg_clients=args.pg_clients,
                   ab_seconds=args.ab_seconds, ab_clients=args.ab_clients, web_image=os.path.dirname(web["disk"]))
    names = {"forkexec": f"fork/exec: a busybox shell loop of {args.loops:,} `/usr/bin/true`",
             "pipe": f"a pipe: {args.pipe_mb} MiB from `dd` through three `/usr/bin/cat` into `wc -c`",
             "pgbench.init": f"pgbench `-i -s {PG_SCALE}` over TAP (the web image)"}
    for mode, (words, flags) in PG_MODES.items():
        for c in args.pg_clients:
            names[f"pgbench.{mode}.c{c}"] = (f"pgbench {words} over TAP (the web image), `-c {c} -j {min(2, c)}"
                                             f" -T {args.pg_seconds}{' ' + ' '.join(flags) if flags else ''}`")
    for mode, (words, flags) in NGINX_MODES.items():
        for c in args.ab_clients:
            names[f"nginx.{mode}.c{c}"] = (f"nginx's static page, {words}, by ab over TAP (the web image), "
                                           f"`-c {c}{' ' + ' '.join(flags) if flags else ''}`")
    keys = {p: ("s", False) for p in guest_parts}
    keys.update(service_keys(args) if serving else {})
    print(f"{'harts':>5} {'workload':22} {'ftvm':>9} {'qemu':>9} {'unit':5} {'ratio':>6}   runs ftvm | qemu")
    figs = []
    for cpus in cpus_list:
        rows = out["by_harts"][str(cpus)] = {}
        for key, (unit, higher) in keys.items():
            row = {e: {"median": vs_qemu.med([t[key] for t in res[cpus][e]]),
                       "runs": [round(t[key], 3) for t in res[cpus][e]], "unit": unit} for e in emus}
            ratio = row["ftvm"]["median"] / row["qemu"]["median"] if "ftvm" in row else None
            row["ratio_ftvm_to_qemu"] = round(ratio, 3) if ratio is not None else None
            rows[key] = row
            if higher:
                c = int(key.rsplit(".c", 1)[1])
                target = NGINX_TARGET if key.startswith("nginx") else PG_TARGET.get(c, PG_TARGET_ELSE)
                words, met = f">= {target}", ratio is not None and ratio >= target
            elif key in GUEST_WORKLOADS:
                target = TARGET
                words, met = f"<= {target}", ratio is not None and ratio <= target
            else:
                words, met = None, None
            if ratio is None:
                verdict = f"(target {words}) --qemu-only" if words else ""
            elif words:
                missed |= not met
                verdict = f"(target {words}) {'PASS' if met else 'MISS'}"
            else:
                verdict = ""
            ftvm_s = f"{row['ftvm']['median']:9.2f}" if "ftvm" in row else f"{'-':>9}"
            ratio_s = f"{ratio:6.2f}" if ratio is not None else f"{'-':>6}"
            runs = " | ".join(" ".join(f"{x:.2f}" for x in row[e]["runs"]) for e in ("ftvm", "qemu") if e in row)
            print(f"{cpus:5} {key:22} {ftvm_s} {row['qemu']['median']:9.2f} {unit:5} {ratio_s}   {runs}  {verdict}")
            if "ftvm" in row:
                figs.append(results.figure(
                    f"servers.{key}.{cpus}", f"{names[key]}, {cpus} hart(s) (`--hart-threads {args.hart_threads}`)",
                    row["ftvm"]["median"], unit, peer=results.peer("QEMU", row["qemu"]["median"], unit),
                    ratio=row["ratio_ftvm_to_qemu"], target=words.replace(">=", "≥").replace("<=", "≤") if words else None,
                    met=met))
    path = results.write("servers", ["bench/servers"] + sys.argv[1:], figs, out, args.json, ftvm)
    print(f"servers: figures written to {path}")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
