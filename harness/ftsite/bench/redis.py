"""Compare ftvm with qemu-system-riscv64 serving redis over virtio-net + TAP.

For each emulator (same kernel, initrd, firmware, memory and CPU count; every
boot on its own fresh sparse copy of the root disk) the script boots the
default guest with `redis-server /etc/redis/redis.conf` as the exec command
and a static address on eth0 (`ftvm.ip=`), each VM on its own TAP in a
network namespace the script creates (and deletes again, also on errors and
Ctrl-C). Once `redis-cli ping` answers PONG it runs, from the host side in
that namespace,

  redis-benchmark -h GUEST -n REQUESTS -c CLIENTS -t set,get --csv

for each --clients value (default 1 and 16), then kills the VM. With --runs N
every emulator boots N times; the table shows the medians of requests/second
and of the p50 latency redis-benchmark reports, and the ftvm/QEMU ratio of the
throughput (higher is better for ftvm; 1.0 = as fast as QEMU).

  bench/redis                          both emulators, 3 runs each
  bench/redis --only qemu --runs 1     QEMU only (no ftvm binary needed)
  bench/redis --requests 5000 --clients 1,8,32 --log-dir /tmp/redis-logs
  bench/redis --only ftvm --record     ftvm under `ftvm record`: the log's
                                       bandwidth during redis-benchmark, and
                                       a replay of the log (quit cleanly
                                       through a control socket first)

Needs root (network namespaces, TAP devices), qemu-system-riscv64 (Debian
qemu-system-misc) and redis-benchmark/redis-cli on the host (Debian
redis-tools). This is a benchmark, not a test: it exits 0 unless a run fails.
"""

import csv
import io
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ftsite.bench import options, results
from ftsite.bench.vs_qemu import cache_dir
EXEC_CMD = "redis-server /etc/redis/redis.conf"
PORT = 6379
# one TAP and one /24 per emulator inside the namespace: host .1, guest .2
NETS = {
    "ftvm": {"tap": "tap-ftvm", "host": "10.77.0.1", "guest": "10.77.0.2", "mac": "52:54:00:77:00:02"},
    "qemu": {"tap": "tap-qemu", "host": "10.78.0.1", "guest": "10.78.0.2", "mac": "52:54:00:78:00:02"},
}
LABEL = {"ftvm": "ftvm", "qemu": "QEMU"}


class RunFailed(Exception):
    pass


class Terminated(BaseException):
    """SIGTERM/SIGHUP: unwind like Ctrl-C so the cleanup runs."""


def die(msg, code=2):
    print(f"redis: {msg}", file=sys.stderr)
    sys.exit(code)


def resolve_image(args):
    d = Path(args.image_dir) if args.image_dir else cache_dir() / "images" / "trixie-riscv64"
    img = {}
    for k, name in (("kernel", "Image"), ("initrd", "initrd.img"), ("disk", "rootfs.ext4"), ("bios", "fw_dynamic.bin")):
        img[k] = getattr(args, k) or str(d / name)
        if not os.path.isfile(img[k]):
            die(f"{k} not found at {img[k]}: build the guest image with `ftvm image build` "
                f"(or `cargo run --release -p ftvm-image --example ftvm-image -- build`), or pass --{k}")
    return img


def sh(argv, check=True, timeout=60):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RunFailed(f"`{' '.join(argv)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r


class Netns:
    """A network namespace with one TAP per emulator (its addresses from
    `nets`, by emulator: NETS unless given); deleted on close()."""

    def __init__(self, name, emus, nets=NETS):
        self.name = name
        self.created = False
        if name in sh(["ip", "netns", "list"]).stdout.split():
            die(f"network namespace {name} already exists")
        sh(["ip", "netns", "add", name])
        self.created = True
        sh(["ip", "-n", name, "link", "set", "lo", "up"])
        for emu in emus:
            n = nets[emu]
            sh(["ip", "-n", name, "tuntap", "add", n["tap"], "mode", "tap"])
            sh(["ip", "-n", name, "addr", "add", f"{n['host']}/24", "dev", n["tap"]])
            sh(["ip", "-n", name, "link", "set", n["tap"], "up"])

    def argv(self, *cmd):
        return ["ip", "netns", "exec", self.name, *cmd]

    def close(self):
        if self.created:
            # the TAPs go away with the namespace once no VM holds them
            r = sh(["ip", "netns", "del", self.name], check=False)
            if r.returncode != 0:
                print(f"redis: warning: cannot delete network namespace {self.name}: {r.stderr.strip()}",
                      file=sys.stderr)
            self.created = False


def cmdline(emu):
    # the same kernel command line for both; ftvm adds ftvm.exec= itself and,
    # with --verbose, leaves `quiet` to us as QEMU needs it
    return f"console=ttyS0 root=/dev/vda rw quiet ftvm.ip={NETS[emu]['guest']}/24"


def ftvm_argv(args, img, disk, record=None):
    """`ftvm run`, or with record=(LOG, SOCKET) `ftvm record` with a control
    socket, through which the VM is stopped cleanly so its log ends."""
    n = NETS["ftvm"]
    mode = ["record", "--log", record[0], "--control", record[1]] if record else ["run"]
    return [str(args.ftvm), *mode, "--bios", img["bios"], "--kernel", img["kernel"], "--initrd", img["initrd"],
            "--disk", disk, "--mem", args.mem, "--cpus", str(args.cpus),
            "--net", f"tap={n['tap']},mac={n['mac']}", "--append", cmdline("ftvm"),
            "--verbose", "--exec", EXEC_CMD]


def qemu_argv(args, img, disk):
    import base64
    n = NETS["qemu"]
    b64 = base64.b64encode(EXEC_CMD.encode()).decode()
    return [args.qemu_path, "-M", "virt", "-m", args.mem, "-smp", str(args.cpus), "-nographic",
            "-bios", img["bios"], "-kernel", img["kernel"], "-initrd", img["initrd"],
            "-append", f"{cmdline('qemu')} ftvm.exec={b64}",
            "-drive", f"file={disk},format=raw,if=none,id=d0", "-device", "virtio-blk-device,drive=d0",
            "-netdev", f"tap,id=n0,ifname={n['tap']},script=no,downscript=no",
            "-device", f"virtio-net-device,netdev=n0,mac={n['mac']}"]


LIVE_VMS = []


class Vm:
    """An emulator process (own session) with its console in a log file."""

    def __init__(self, argv, log_path):
        LIVE_VMS.append(self)
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def alive(self):
        return self.proc.poll() is None

    def tail(self, n=15):
        self.log.flush()
        try:
            lines = Path(self.log_path).read_bytes().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join("      | " + l.rstrip("\r") for l in lines[-n:])

    def stop(self):
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if not self.log.closed:
            self.log.close()
        if self in LIVE_VMS:
            LIVE_VMS.remove(self)


def wait_pong(ns, vm, ip, timeout):
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout:
        if not vm.alive():
            raise RunFailed(f"emulator exited with status {vm.proc.returncode} before redis answered:\n{vm.tail()}")
        try:
            r = subprocess.run(ns.argv("redis-cli", "-h", ip, "-p", str(PORT), "ping"),
                               capture_output=True, text=True, timeout=10)
            if r.stdout.strip() == "PONG":
                return time.monotonic() - t0
            last = (r.stdout + r.stderr).strip()
        except subprocess.TimeoutExpired:
            last = "redis-cli ping timed out (10 s)"
        time.sleep(0.5)
    raise RunFailed(f"no PONG from {ip} within {timeout:.0f}s (last: {last or 'nothing'}):\n{vm.tail()}")


def parse_bench(out):
    """{TEST: {"rps": float, "p50": float|None}} from --csv (or -q) output."""
    res = {}
    rows = [l for l in out.splitlines() if l.startswith('"')]
    if rows:
        for row in csv.DictReader(io.StringIO("\n".join(rows))):
            try:
                test = row["test"].split()[0].upper()
                p50 = row.get("p50_latency_ms")
                res[test] = {"rps": float(row["rps"]), "p50": float(p50) if p50 not in (None, "") else None}
            except (KeyError, ValueError, IndexError):
                continue
    if not res:
        # -q style: "SET: 1234.56 requests per second, p50=0.231 msec"
        for line in out.replace("\r", "\n").splitlines():
            if "requests per second" in line and ":" in line:
                test, rest = line.split(":", 1)
                try:
                    rps = float(rest.split()[0])
                except (ValueError, IndexError):
                    continue
                p50 = None
                if "p50=" in rest:
                    try:
                        p50 = float(rest.split("p50=", 1)[1].split()[0])
                    except (ValueError, IndexError):
                        pass
                res[test.strip().split()[0].upper()] = {"rps": rps, "p50": p50}
    return res


def bench(ns, vm, ip, clients, args):
    argv = ns.argv("redis-benchmark", "-h", ip, "-p", str(PORT), "-n", str(args.requests), "-c", str(clients),
                   "-t", "set,get", "--csv")
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=args.bench_timeout)
    except subprocess.TimeoutExpired as e:
        partial = (e.stdout or b"")
        partial = partial.decode("utf-8", "replace") if isinstance(partial, bytes) else partial
        raise RunFailed(f"redis-benchmark -c {clients} did not finish within {args.bench_timeout:.0f}s "
                        f"(VM {'alive' if vm.alive() else 'dead'}; output so far: {partial.strip()!r})")
    secs = time.monotonic() - t0
    res = parse_bench(r.stdout)
    err = r.stderr.strip()
    if r.returncode != 0 or not {"SET", "GET"} <= res.keys():
        raise RunFailed(f"redis-benchmark -c {clients} failed (status {r.returncode}, "
                        f"VM {'alive' if vm.alive() else 'dead'}): stdout {r.stdout.strip()!r} stderr {err!r}")
    if err:
        print(f"      redis-benchmark -c {clients} stderr: {err}", flush=True)
    return res, secs


def stop_and_replay(vm, record, args):
    """Quit a recorded VM through its control socket, so its log ends, and
    replay the log. Returns (seconds, state checks matched)."""
    log, sock = record
    r = sh([str(args.ftvm), "control", sock, "quit"], check=False)
    try:
        vm.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"the recorded VM did not quit (control: {r.stdout.strip() or r.stderr.strip()})")
    t0 = time.monotonic()
    rep = sh([str(args.ftvm), "replay", "--log", log], check=False, timeout=args.timeout * 4)
    secs = time.monotonic() - t0
    if rep.returncode != 0:
        raise RunFailed(f"ftvm replay of {log} failed ({rep.returncode}): {rep.stderr.strip()}")
    checks = [w for w in rep.stderr.strip().split(", ") if w.endswith("state checks matched")]
    return secs, int(checks[0].split()[0]) if checks else 0


def one_run(emu, i, ns, img, args, work):
    disk = os.path.join(work, f"{emu}-disk.ext4")
    subprocess.run(["cp", "--sparse=always", img["disk"], disk], check=True)
    log = os.path.join(args.log_dir or work, f"{emu}-run{i + 1}.log")
    record = None
    if emu == "ftvm" and args.record:
        record = (os.path.join(args.log_dir or work, f"ftvm-run{i + 1}.rr"), os.path.join(work, "ftvm.sock"))
    argv = ns.argv(*(ftvm_argv(args, img, disk, record) if emu == "ftvm" else qemu_argv(args, img, disk)))
    vm = Vm(argv, log)
    ip = NETS[emu]["guest"]
    result = {}
    try:
        result["pong"] = wait_pong(ns, vm, ip, args.timeout)
        detail = [f"PONG after {result['pong']:.1f}s"]
        for c in args.clients:
            before = os.path.getsize(record[0]) if record else 0
            res, secs = bench(ns, vm, ip, c, args)
            for test in ("SET", "GET"):
                result[f"{test} -c {c}"] = res[test]
            detail.append(f"-c {c}: SET {res['SET']['rps']:.0f} GET {res['GET']['rps']:.0f} req/s ({secs:.1f}s)")
            if record:
                # The recorder writes each frame as it closes: the file's
                # growth is what the benchmark put in the log.
                grown = os.path.getsize(record[0]) - before
                result[f"log -c {c}"] = grown * 8 / secs / 1e6
                detail[-1] += f", log {grown} B = {result[f'log -c {c}']:.2f} Mbit/s"
        if not vm.alive():
            raise RunFailed(f"emulator exited (status {vm.proc.returncode}) during the benchmark:\n{vm.tail()}")
        if record:
            result["replay"], result["checks"] = stop_and_replay(vm, record, args)
            detail.append(f"replayed in {result['replay']:.1f}s, {result['checks']} state checks matched")
        if not args.quiet:
            print(f"  {emu:4} run {i + 1}/{args.runs}: " + "; ".join(detail), flush=True)
        return result
    except RunFailed as e:
        hint = f" (console log: {log})" if args.log_dir else " (keep the console with --log-dir DIR)"
        msg, _, tail = str(e).partition("\n")
        msg = msg.rstrip(":")
        raise RunFailed(f"{emu} run {i + 1}: {msg}{hint}" + (f", console tail:\n{tail}" if tail else "")) from None
    finally:
        vm.stop()
        try:
            os.unlink(disk)
        except OSError:
            pass


def med(xs):
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else None


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def print_table(res, emus, args):
    """Prints the medians and ratios; returns them as figures."""
    figs = []
    workloads = [f"{t} -c {c}" for c in args.clients for t in ("SET", "GET")]
    print()
    print(f"redis-benchmark -n {args.requests} -t set,get; medians of {args.runs} run(s); "
          f"ratio = ftvm/QEMU req/s (higher is better for ftvm)")
    print(f"{'workload':16} {'ftvm req/s':>11} {'QEMU req/s':>11} {'ratio':>7} {'ftvm p50 ms':>12} {'QEMU p50 ms':>12}")
    for w in workloads:
        rps = {e: med([r[w]["rps"] for r in res.get(e, []) if w in r]) for e in ("ftvm", "qemu")}
        p50 = {e: med([r[w]["p50"] for r in res.get(e, []) if w in r]) for e in ("ftvm", "qemu")}
        ratio = rps["ftvm"] / rps["qemu"] if rps["ftvm"] and rps["qemu"] else None
        print(f"{w:16} {fmt(rps['ftvm'], '11.0f'):>11} {fmt(rps['qemu'], '11.0f'):>11} {fmt(ratio, '7.3f'):>7} "
              f"{fmt(p50['ftvm'], '12.3f'):>12} {fmt(p50['qemu'], '12.3f'):>12}")
        figs.append(results.figure(f"redis.{w.replace(' ', '')}", f"redis-benchmark {w} -n {args.requests} over TAP, "
                                   f"beside QEMU ({args.cpus} hart(s))", rps["ftvm"], "req/s",
                                   peer=results.peer("QEMU", rps["qemu"], "req/s"), ratio=ratio,
                                   note=f"p50 {fmt(p50['ftvm'], '.3f')} ms, QEMU {fmt(p50['qemu'], '.3f')} ms"))
    if args.record:
        for c in args.clients:
            print(f"{'ftvm log Mbit/s':16} {fmt(med([r.get(f'log -c {c}') for r in res.get('ftvm', [])]), '11.2f'):>11}"
                  f"   (recorded during redis-benchmark -c {c})")
            figs.append(results.figure(f"redis.record-log-c{c}", f"log bandwidth while recording redis-benchmark -c {c}",
                                       med([r.get(f'log -c {c}') for r in res.get('ftvm', [])]), "Mbit/s"))
    pong = {e: med([r.get("pong") for r in res.get(e, [])]) for e in ("ftvm", "qemu")}
    ratio = pong["ftvm"] / pong["qemu"] if pong["ftvm"] and pong["qemu"] else None
    print(f"{'boot to PONG s':16} {fmt(pong['ftvm'], '11.1f'):>11} {fmt(pong['qemu'], '11.1f'):>11} "
          f"{fmt(ratio, '7.2f'):>7}   (time ratio: lower is better for ftvm)")
    figs.append(results.figure("redis.boot-to-pong", "redis: boot to PONG, beside QEMU", pong["ftvm"], "s",
                               peer=results.peer("QEMU", pong["qemu"], "s"), ratio=ratio))
    for e in ("ftvm", "qemu"):
        if e in emus:
            runs = res.get(e, [])
            print(f"  {LABEL[e]}: {len(runs)}/{args.runs} run(s) succeeded")
    return figs


def main():
    ap = options.parser("redis", __doc__)
    ap.add_argument("--runs", type=int, default=3, help="boots per emulator; the table shows medians (default 3)")
    ap.add_argument("--requests", type=int, default=2000, help="requests per redis-benchmark test (default 2000)")
    ap.add_argument("--clients", default="1,16",
                    help="comma-separated redis-benchmark -c values, one invocation each (default 1,16)")
    ap.add_argument("--only", choices=("ftvm", "qemu"), help="measure one emulator only")
    ap.add_argument("--keep-going", action="store_true",
                    help="after a failed run, go on with the remaining runs (exit status 1 at the end)")
    options.add_guest(ap, timeout=300, timeout_help="seconds to wait for PONG after starting a VM (default 300)",
                      log_help="keep each run's console output (and with --record, its log) here")
    ap.add_argument("--bench-timeout", type=float, default=300, help="seconds per redis-benchmark invocation (default 300)")
    ap.add_argument("--netns", default=f"ftvm-redis-{os.getpid()}", help="network namespace to create (default ftvm-redis-PID)")
    ap.add_argument("--record", action="store_true",
                    help="run ftvm under `ftvm record`: measure the log bandwidth of the benchmark, then replay it")
    ap.add_argument("--quiet", action="store_true", help="only print the table")
    results.add_option(ap, "redis")
    args = ap.parse_args()
    if args.runs < 1:
        die("--runs must be at least 1")
    if args.requests < 1:
        die("--requests must be at least 1")
    try:
        args.clients = [int(c) for c in args.clients.split(",") if c.strip()]
        assert args.clients and all(c >= 1 for c in args.clients)
    except (ValueError, AssertionError):
        die(f"--clients wants positive integers separated by commas, not {args.clients!r}")

    emus = [args.only] if args.only else ["ftvm", "qemu"]
    if os.geteuid() != 0:
        die("needs root: it creates a network namespace and TAP devices")
    for tool, pkg in (("ip", "iproute2"), ("redis-benchmark", "redis-tools"), ("redis-cli", "redis-tools")):
        if not shutil.which(tool):
            die(f"{tool} not found on the host: install Debian's {pkg} (apt-get install {pkg}; scripts/install-deps.sh)")
    if "ftvm" in emus:
        args.ftvm = Path(args.ftvm)
        if not (args.ftvm.is_file() and os.access(args.ftvm, os.X_OK)):
            die(f"ftvm binary not found at {args.ftvm}: build it with `cargo build --release -p ftvm`, "
                f"pass --ftvm PATH, or use --only qemu")
    if "qemu" in emus:
        args.qemu_path = shutil.which(args.qemu)
        if not args.qemu_path:
            die(f"{args.qemu} not found: install Debian's qemu-system-misc (scripts/install-deps.sh), or use --only ftvm")
    img = resolve_image(args)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)

    def on_signal(signum, _frame):
        raise Terminated(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # respect nohup
        signal.signal(signal.SIGHUP, on_signal)

    print(f"redis: {args.runs} run(s) per emulator ({', '.join(LABEL[e] for e in emus)}), -m {args.mem}, "
          f"{args.cpus} cpu(s), {args.requests} requests per test, clients {','.join(map(str, args.clients))}; "
          f"netns {args.netns}", flush=True)
    res = {e: [] for e in emus}
    failures = []
    ns = None
    work = tempfile.mkdtemp(prefix="ftvm-bench-redis-")
    try:
        ns = Netns(args.netns, emus)
        for i in range(args.runs):
            for emu in emus:
                try:
                    res[emu].append(one_run(emu, i, ns, img, args, work))
                except RunFailed as e:
                    failures.append(str(e))
                    print(f"redis: FAILED {e}", file=sys.stderr, flush=True)
                    if not args.keep_going:
                        raise
    except RunFailed:
        pass
    except KeyboardInterrupt:
        print("\nredis: interrupted; cleaning up", file=sys.stderr)
        failures.append("interrupted")
    except Terminated as e:
        print(f"\nredis: {e}; cleaning up", file=sys.stderr)
        failures.append(f"terminated by {e}")
    finally:
        # a second Ctrl-C must not cut the cleanup short
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for vm in list(LIVE_VMS):
            vm.stop()
        if ns is not None:
            ns.close()
        shutil.rmtree(work, ignore_errors=True)

    if any(res.values()):
        figs = print_table(res, emus, args)
        path = results.write("redis", ["bench/redis"] + sys.argv[1:], figs if not failures else [], res, args.json,
                             args.ftvm if "ftvm" in emus else None)
        print(f"redis: figures written to {path}" + (" (none kept: a run failed)" if failures else ""))
    if failures:
        print(f"\nredis: {len(failures)} failure(s)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
