"""Protecting a running VM (issue 28, FT VMotion): how long the machine
takes to go across, in how many pre-copy rounds and bytes, and the
final pause, for a 1 GiB redis guest under write load; and the time from
a failure to "protected again" with a spare host given.

Per mode, on one site: a plain `ftvm run --mem 1G` (core 0) of redis
(appendonly, fsync always; its disk on the shared storage, or in
checkpoint mode, and with --separate in every mode, each host its own
copy, the transfer making the backup's the same) is filled with --fill-mb of
data (DEBUG POPULATE), then loaded from the client by redis-benchmark
(SET, 2 connections, random keys) while a probe client writes keys one at
a time over its own connection, each reply awaited. Then --trials times:
`ftvm ft backup` (core 1) on the backup host, `protect` on the VM's
control socket, 2 s protected, `unprotect` (the backup stops). The figures
of each protection come from its `machine-sent` event (rounds, pages,
bytes, the final pause, the total); the probe's longest wait during the
protection is set beside its median wait before.

Last, per mode: the VM protected once more, its host's ftvm killed, and
a spare backup started beforehand on a third host: the time from the
kill to the new primary's `protect` answer (the failover, then a
protection of the VM from its new host), the probe's keys all checked.

  bench/protect                         5 protections per mode, all three
  bench/protect --trials 10 --modes lockstep --fill-mb 800
  bench/protect --fill-mb 100 --random-mb 500   memory in use that does not compress
  bench/protect --modes lockstep,epoch --separate   each host its own copy of the disk

Needs root, two cores, redis-benchmark (Debian redis-tools); the fill
takes some minutes a mode on this emulator. Target: a final pause of at
most 100 ms (median); VMware FT reports "less than a second". Exits 0
when every protection and the failover kept every probe key on an
unbroken connection, 1 otherwise (a missed target is reported, not an
error), 2 on bad input.
"""

import shutil
import statistics
import sys
import time
from pathlib import Path

import ftsite
from ftsite.bench import results
from ftsite.bench.options import parser
from ftsite.errors import TrialFailed
from ftsite.observe import ask, control, event
from ftsite.proc import CHANNEL_PORT, TIMEOUT_MS, Proc, rootfs, sparse_copy, start_plain
from ftsite.resp import BOOT_TIMEOUT, REDIS_FT, wait_for_redis
from ftsite.site import BACKUP_HOST_IP, GUEST_IP, PRIMARY_HOST_IP, SPARE_HOST_IP, Site
from ftsite.trial import KeyWriter, check_keys

MODES = {"lockstep": [], "epoch": ["--mode", "epoch"], "checkpoint": ["--mode", "checkpoint"]}
TARGET_MS = 100


def backup(site, ftvm, work, role, shared, name, extra, core):
    ip = {"primary": PRIMARY_HOST_IP, "backup": BACKUP_HOST_IP, "spare": SPARE_HOST_IP}[role]
    events = Path(work) / f"{name}.events"
    events.unlink(missing_ok=True)
    argv = [ftvm, "ft", "backup", "--listen", f"{ip}:{CHANNEL_PORT}", "--shared", str(shared), "--timeout",
            str(TIMEOUT_MS), "--net", "tap=t0", "--control", str(Path(work) / f"{name}.sock"), "--events",
            str(events), *extra]
    p = Proc(name, site, role, argv, Path(work) / f"{name}.out", core=core)
    p.sock, p.events = str(Path(work) / f"{name}.sock"), str(events)
    event(p, "listening", timeout=30)
    return p


def protect(vm, journal, backup_ip, shared, mode, separate=False):
    """`protect` on `vm`'s control socket (the typed request, its events
    in `journal`); the typed reply's figures: rounds, pages, final_pages,
    bytes, pause_ms (the guest stopped, the I/O in flight let finish
    included), total_ms."""
    Path(journal).unlink(missing_ok=True)
    args = {"backup": f"{backup_ip}:{CHANNEL_PORT}", "lag_threshold": 1000, "connect_wait": 60,
            "disk_sharing": "separate" if separate and mode != "checkpoint" else None,
            "backup_reads": False, "mode": mode, "epoch_length": 65536,
            "epoch_protocol": "revised", "interval": 25, "no_idle_checkpoints": False,
            "pair": {"shared": str(shared), "timeout": TIMEOUT_MS, "min_timeout": 60, "heartbeat_port": 7701,
                     "events": str(journal),
                     "pair_key": None, "isolation_addresses": [], "isolation_defer": 3000, "host_id": None,
                     "no_isolation_check": False}}
    answer = ask(vm.sock, {"request": "protect", **args}, timeout=600)
    reply = answer.get("ok")
    if not reply or reply.get("reply") != "protected":
        raise TrialFailed(f"protect: {answer}")
    vm.events = str(journal)
    return reply


def wait_stats(writer, since, until):
    waits = [a - s for s, a in writer.times if since <= a <= until + 1.0 or since <= s <= until]
    return max(waits) if waits else None


def ms(x):
    return "n/a" if x is None else f"{x * 1000:.0f} ms"


def run_mode(binary, mode, args):
    work = ftsite.work_dir(f"ftvm-protect-{mode}-")
    site = Site(f"bp{mode[0]}", spare=True)
    shared = Path(work) / "shared"
    shared.mkdir()
    image = rootfs(binary.path)
    if mode == "checkpoint" or args.separate:
        disk = sparse_copy(image, Path(work) / "a-disk.img")
        copies = {n: ["--disk", str(sparse_copy(image, Path(work) / f"{n}-disk.img"))] for n in ("b", "c")}
    else:
        disk = sparse_copy(image, shared / "disk.img")
        copies = {"b": [], "c": []}
    # Random bytes in a tmpfs first, if asked: memory in use that does
    # not compress (DEBUG POPULATE's values do, some 20 times).
    fill = (f"mount -t tmpfs -o size={args.random_mb + 16}M none /mnt && "
            f"head -c {args.random_mb}M /dev/urandom > /mnt/random && " if args.random_mb else "")
    vm = start_plain(site, binary.path, work, fill + REDIS_FT + " --enable-debug-command yes", core=0,
                     extra=["--mem", "1G"], disk=disk)
    row = {"mode": mode, "trials": [], "bad": 0}
    procs = [vm]
    try:
        conn = wait_for_redis(site, [vm], BOOT_TIMEOUT + args.random_mb)
        conn.sock.settimeout(3600)
        t0 = time.monotonic()
        keys = args.fill_mb * 1024
        conn.command("DEBUG", "POPULATE", str(keys), "fill", "1024")
        print(f"  {mode}: filled {args.fill_mb} MiB ({keys} keys of 1 KiB) in {time.monotonic() - t0:.0f} s",
              flush=True)
        load = Proc("redis-benchmark", site, "client",
                    ["redis-benchmark", "-h", GUEST_IP, "-p", "6379", "-t", "set", "-n", "2000000000", "-c", "2",
                     "-d", "256", "-r", "1000000", "-q"], Path(work) / "load.out")
        procs.append(load)
        probe = KeyWriter(conn)
        probe.start()
        time.sleep(3.0)
        for i in range(args.trials):
            b = backup(site, binary.path, work, "backup", shared, f"backup{i + 1}", copies["b"], core=1)
            procs.append(b)
            before = [a - s for s, a in probe.times[-200:]]
            start = time.monotonic()
            sent = protect(vm, Path(work) / f"protect{i + 1}.events", BACKUP_HOST_IP, shared, mode, args.separate)
            done = time.monotonic()
            time.sleep(2.0)
            worst = wait_stats(probe, start, done)
            answer = control(vm.sock, "unprotect", timeout=60)
            if not answer.startswith("ok unprotected") or b.wait(30) != 0:
                raise TrialFailed(f"unprotect: {answer}\n{b.tail()}")
            t = dict(sent, worst=worst, typical=statistics.median(before) if before else None)
            row["trials"].append(t)
            print(f"  {mode:10} {i + 1:2}/{args.trials}: {t['rounds']} rounds, {t['pages']} pages, "
                  f"{t['bytes'] / 2**20:.0f} MiB, final pause {t['pause_ms']} ms ({t['final_pages']} pages), "
                  f"{t['total_ms'] / 1000:.1f} s in all; probe's longest wait {ms(worst)} "
                  f"(median before {ms(t['typical'])})", flush=True)
            if probe.error:
                raise TrialFailed(f"the probe client failed: {probe.error}")
        # A failure, then protected again from the new host onto a spare.
        b = backup(site, binary.path, work, "backup", shared, "last", copies["b"], core=1)
        procs.append(b)
        protect(vm, Path(work) / "vm-last.events", BACKUP_HOST_IP, shared, mode, args.separate)
        spare = backup(site, binary.path, work, "spare", shared, "spare", copies["c"], core=0)
        procs.append(spare)
        time.sleep(1.0)
        failed = vm.kill9()
        event(b, "going-live", timeout=60, watch=[b])
        protect(b, Path(work) / "vm-again.events", SPARE_HOST_IP, shared, mode, args.separate)
        row["again"] = time.monotonic() - failed
        event(spare, "following", timeout=10, watch=[spare])
        time.sleep(2.0)
        probe.stop()
        load.stop()
        if probe.error:
            raise TrialFailed(f"the probe client failed across the failover: {probe.error}")
        missing, wrong = check_keys(conn, probe.acked)
        row["lost"] = missing + wrong
        print(f"  {mode}: failure to protected again {row['again']:.1f} s; {probe.acked} probe keys, "
              f"{row['lost']} lost", flush=True)
        if row["lost"]:
            row["bad"] += 1
    except TrialFailed as e:
        print(f"  {mode}: FAILED: {e}", flush=True)
        row["bad"] += 1
    finally:
        # Nothing of this mode may run on beside the next one's VM.
        for p in procs:
            p.stop()
        site.close()
        shutil.rmtree(work, ignore_errors=True)
    return row


def main():
    ap = parser("protect", __doc__)
    ap.add_argument("--trials", type=int, default=5, help="protections per mode (default 5)")
    ap.add_argument("--modes", default="lockstep,epoch,checkpoint", help="comma-separated (default all three)")
    ap.add_argument("--fill-mb", type=int, default=600, help="data put into redis first (default 600 MiB)")
    ap.add_argument("--random-mb", type=int, default=0,
                    help="random bytes the guest writes into a tmpfs before redis starts (default 0)")
    ap.add_argument("--separate", action="store_true",
                    help="each host its own copy of the disk in lockstep and epoch mode too (checkpoint mode always)")
    ap.add_argument("--ftvm", default=ftsite.default_ftvm(), help="ftvm binary (copied privately before use)")
    results.add_option(ap, "protect")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if args.trials < 1 or args.fill_mb < 0 or not 0 <= args.random_mb <= 700 or any(m not in MODES for m in modes):
        ap.error(f"--trials must be at least 1, --fill-mb not negative, --random-mb 0 to 700 and --modes a list "
                 f"of {', '.join(MODES)}")
    with ftsite.session("protect"):
        ftsite.check_host(("ip", "taskset", "redis-benchmark"), cores=2)
        binary = ftsite.private_ftvm(args.ftvm)
        ftsite.image_dir(binary.path)
        print(f"protect: {args.trials} protection(s) per mode ({', '.join(modes)}) of a 1 GiB redis guest "
              f"holding {args.fill_mb} MiB (and {args.random_mb} MiB of random bytes in a tmpfs), under redis-benchmark; "
              f"disks {'separate' if args.separate else 'shared (checkpoint mode: separate)'}; {binary.identity}", flush=True)
        rows = [run_mode(binary, mode, args) for mode in modes]
        print()
        print("pause = the final pause (guest stopped); probe = a client's longest wait for a reply during the "
              "protection, beside its median before; again = a failure to protected again with a spare host")
        print(f"{'mode':10} {'pause median':>12} {'max':>7} {'rounds':>6} {'MiB':>6} {'total s':>8} "
              f"{'probe worst':>11} {'before':>7} {'again s':>8}")
        missed, figs = [], []
        for r in rows:
            ts = r["trials"]
            if not ts:
                print(f"{r['mode']:10} (no protection completed)")
                missed.append(r["mode"])
                continue
            med = lambda k: statistics.median(t[k] for t in ts if t[k] is not None)  # noqa: E731
            pause = med("pause_ms")
            if pause > TARGET_MS:
                missed.append(r["mode"])
            again = f"{r['again']:.1f}" if "again" in r else "n/a"
            print(f"{r['mode']:10} {pause:>9.0f} ms {max(t['pause_ms'] for t in ts):>4} ms {med('rounds'):>6.0f} "
                  f"{med('bytes') / 2**20:>6.0f} {med('total_ms') / 1000:>8.1f} {ms(med('worst')):>11} "
                  f"{ms(med('typical')):>7} {again:>8}")
            fill = f"{args.fill_mb} MiB of redis data" + (f", {args.random_mb} MiB random" if args.random_mb else "")
            figs.append(results.figure(
                f"protect.{r['mode']}" + (f".random{args.random_mb}" if args.random_mb else ""),
                f"protecting a running 1 GiB redis guest ({fill}) under redis-benchmark, {r['mode']}: the final pause "
                f"(median of {len(ts)})", pause, "ms", peer=results.peer('VMware FT: "less than a second"'),
                target=f"median ≤ {TARGET_MS} ms", met=pause <= TARGET_MS,
                note=f"max {max(t['pause_ms'] for t in ts)} ms; {med('rounds'):.0f} rounds, "
                     f"{med('bytes') / 2**20:.0f} MiB, {med('total_ms') / 1000:.1f} s in all; a probe's longest wait "
                     f"{ms(med('worst'))} (before {ms(med('typical'))}); failure to protected again {again} s"))
        bad = sum(r["bad"] for r in rows)
        print(f"protect: target median final pause <= {TARGET_MS} ms: "
              + ("met in every mode" if not missed else f"MISSED in {', '.join(missed)}")
              + (f"; {bad} mode(s) FAILED" if bad else ""))
        path = results.write("protect", ["bench/protect"] + sys.argv[1:], figs if not bad else [], rows,
                             args.json, args.ftvm)
        print(f"protect: figures written to {path}" + (" (none kept: a mode failed)" if bad else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
