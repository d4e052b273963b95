"""Network throughput with and without fault tolerance, beside the paper's
Table 2 (VMware FT techreport §5.2).

The guest runs `iperf3 -s` with a static address (10.201.0.100) on the
primary host's TAP of a fresh site (harness/ftsite), either protected
(`ftvm ft primary` pinned to core 0 + `ftvm ft backup` pinned to core 1)
or not (`ftvm run` with the same options, core 0). From the client
namespace, over the site's switch, iperf3 measures

  receive   client -> guest:  iperf3 -c 10.201.0.100 -t SECONDS
  transmit  guest -> client:  iperf3 -c 10.201.0.100 -t SECONDS -R

(the receiver's figure from iperf3's JSON). Received frames are inputs the
primary must log for the backup; sent frames are outputs held by the
Output Rule until the backup acknowledges the log up to them. With FT the
log bandwidth over each test is the growth of the primary's `log_bytes`
(control-socket status). FT and non-FT alternate per round (order swapped
each round); the table shows medians and the FT/non-FT ratio.

  bench/ft-network                     3 rounds, 10 s per direction
  bench/ft-network --runs 1 --seconds 5 --log-dir /tmp/ftn

Needs root, two cores, iproute2, taskset and iperf3 on the host (Debian
iperf3). A benchmark: exits 0 unless a run fails (3), 2 on bad input.
"""

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ftsite
from ftsite.bench import options, results

IPERF_SERVER = "iperf3 -s"
DIRECTIONS = {"receive": [], "transmit": ["-R"]}
# VMware FT techreport, Table 2 (netperf, Mbit/s): base, FT, logging;
# client link 1 Gbit/s, logging link 1 or 10 Gbit/s.
PAPER_TABLE2 = [("Receive (1Gb)", 940, 604, 730), ("Transmit (1Gb)", 940, 855, 42),
                ("Receive (10Gb)", 940, 860, 990), ("Transmit (10Gb)", 940, 935, 60)]


def iperf(site, seconds, extra, timeout):
    """Mbit/s the receiving side counted."""
    argv = site.argv("client", "iperf3", "-c", ftsite.GUEST_IP, "-t", str(seconds), "-J", *extra)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ftsite.TrialFailed(f"iperf3 {' '.join(extra)} took over {timeout:.0f} s") from None
    try:
        out = json.loads(r.stdout)
    except ValueError:
        raise ftsite.TrialFailed(f"iperf3 printed no JSON ({r.returncode}): {(r.stderr or r.stdout).strip()[:300]}") \
            from None
    if "error" in out:
        raise ftsite.TrialFailed(f"iperf3: {out['error']}")
    return out["end"]["sum_received"]["bits_per_second"] / 1e6


def one_boot(mode, tag, binary, args):
    """{direction: (Mbit/s, FT log Mbit/s or None)}."""
    work = ftsite.work_dir(f"ftvm-ftn-{tag}-")
    site = ftsite.Site(tag)
    extra = ["--fast-time"] if args.fast_time else []
    procs = []
    try:
        if mode == "ft":
            backup = ftsite.start_backup(site, binary, work, work / "shared", core=1)
            procs.append(backup)
            vm = ftsite.start_primary(site, binary, work, work / "shared", IPERF_SERVER, core=0, extra=extra)
        else:
            vm = ftsite.start_plain(site, binary, work, IPERF_SERVER, core=0, extra=extra)
        procs.insert(0, vm)
        vm.wait_console("Server listening", args.timeout, watch=procs)

        def log_bytes():
            st = ftsite.try_status(vm.sock) if mode == "ft" else None
            return st.get("log_bytes") if st else None

        out = {}
        for direction, flags in DIRECTIONS.items():
            before, t0 = log_bytes(), time.monotonic()
            rate = iperf(site, args.seconds, flags, args.seconds + 120)
            secs, after = time.monotonic() - t0, log_bytes()
            log = (after - before) * 8 / secs / 1e6 if before is not None and after is not None else None
            out[direction] = (rate, log)
            for p in procs:
                if not p.alive():
                    raise ftsite.TrialFailed(f"{p.name} exited during iperf3:\n{p.tail()}")
        return out
    finally:
        if mode == "ft" and procs and procs[0].alive():
            try:
                ftsite.control(procs[0].sock, "quit")
                procs[0].wait(30)
            except (OSError, ftsite.TrialFailed):
                pass
        for p in procs:
            p.stop()
            if args.log_dir and p.log_path.exists():
                shutil.copy(p.log_path, Path(args.log_dir) / f"{tag}-{p.log_path.name}")
        site.close()
        shutil.rmtree(work, ignore_errors=True)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = options.parser("ft-network", __doc__)
    ap.add_argument("--seconds", type=int, default=10, help="iperf3 -t per direction (default 10)")
    options.add_ft_rounds(ap, ftsite.default_ftvm(), timeout=600,
                          timeout_help="seconds for the guest's iperf3 to listen (default 600)")
    results.add_option(ap, "ft-network")
    args = ap.parse_args()

    with ftsite.session("ft-network"):
        if args.runs < 1 or args.seconds < 1:
            raise ftsite.SetupError("--runs and --seconds must be at least 1")
        ftsite.check_host(("ip", "taskset", "iperf3"), cores=2)
        binary = ftsite.private_ftvm(args.ftvm)
        ftsite.image_dir(binary.path)
        if args.log_dir:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        print(f"ft-network: {args.runs} round(s), iperf3 -t {args.seconds} each way; FT = ftvm ft primary (core 0) "
              f"+ backup (core 1), non-FT = ftvm run (core 0); {binary.identity}", flush=True)
        res = {"ft": [], "plain": []}
        failed = None
        try:
            for i in range(args.runs):
                for mode in (("ft", "plain") if i % 2 == 0 else ("plain", "ft")):
                    r = one_boot(mode, f"n{i}{mode[0]}", binary.path, args)
                    res[mode].append(r)
                    print(f"  round {i + 1} {mode:5}: " + "; ".join(
                        f"{d} {rate:.1f} Mbit/s" + (f" (log {log:.1f} Mbit/s)" if log is not None else "")
                        for d, (rate, log) in r.items()), flush=True)
        except ftsite.TrialFailed as e:
            failed = str(e)
            print(f"ft-network: a run FAILED: {e}", file=sys.stderr, flush=True)

        if res["ft"] and res["plain"]:
            print()
            print(f"medians of {min(len(res['ft']), len(res['plain']))} round(s), Mbit/s (iperf3 receiver's count)")
            print(f"{'':27} {'non-FT':>9} {'FT':>9} {'FT/non-FT':>10} {'FT log':>9}")
            figs = []
            for d in DIRECTIONS:
                base = med([r[d][0] for r in res["plain"]])
                ft = med([r[d][0] for r in res["ft"]])
                log = med([r[d][1] for r in res["ft"]])
                label = f"{d} ({'client -> guest' if d == 'receive' else 'guest -> client'})"
                print(f"{label:27} {base:9.1f} {ft:9.1f} {ft / base:10.3f} {log if log is not None else float('nan'):9.1f}")
                figs.append(results.figure(f"ft-network.{d}", f"lockstep, iperf3 {label}: Mbit/s with FT / without",
                                           ft, "Mbit/s", peer=results.peer("the unprotected VM", base, "Mbit/s"),
                                           ratio=ft / base, note=f"log {f'{log:.1f}' if log is not None else 'n/a'} Mbit/s"))
            print()
            print("paper (VMware FT techreport, Table 2; netperf, Mbit/s):")
            print(f"{'':27} {'base':>9} {'FT':>9} {'FT/base':>10} {'logging':>9}")
            for name, base, ft, log in PAPER_TABLE2:
                print(f"{name:27} {base:9d} {ft:9d} {ft / base:10.3f} {log:9d}")
            path = results.write("ft-network", ["bench/ft-network"] + sys.argv[1:], [] if failed else figs,
                                 {"rounds": res, "failed": failed}, args.json, args.ftvm)
            print(f"ft-network: figures written to {path}" + (" (none kept: a run failed)" if failed else ""))
    sys.exit(3 if failed else 0)


if __name__ == "__main__":
    main()
