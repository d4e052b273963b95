"""The ftvm showcase (`make demo`): a redis server that survives the death
of the host it runs on.

It builds a small site out of network namespaces (two hosts and a client on
one switch, harness/ftsite), boots the default Debian riscv64 guest with
redis on the primary host under `ftvm ft primary`, with `ftvm ft backup`
replaying it in lockstep on the backup host. A client writes keys over one
TCP connection, waiting for each reply; a few seconds in, the primary's
ftvm is killed with kill -9. The backup goes live, the client's writes
carry on over the same connection, and the demo checks that every key the
client was told was written is still there. It ends with a short report:
failover time, keys acknowledged, keys found afterwards, and whether the
TCP connection survived.

  make demo                            scripts/ft-demo --ftvm target/release/ftvm
  scripts/ft-demo --ftvm path/to/ftvm --kill-after 5
  harness/run ftsite.demo ...          the same (scripts/ft-demo is a wrapper)

Needs root (namespaces, bridges, TAPs), iproute2, and the guest image
(`ftvm image build`). Takes about a minute and a half, mostly the guest's
boot. Exits 0 when nothing acknowledged was lost and the connection held.
"""

import argparse
import os
import shutil
import sys
import time

import ftsite


def main():
    ap = argparse.ArgumentParser(prog="ft-demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ftvm", default=ftsite.default_ftvm(), help="ftvm binary (default target/release/ftvm)")
    ap.add_argument("--kill-after", type=float, default=4.0, help="seconds of writes before the kill (default 4)")
    args = ap.parse_args()
    t0 = time.monotonic()

    def say(msg):
        print(f"[{time.monotonic() - t0:5.1f}s] {msg}", flush=True)

    with ftsite.session("ft-demo"):
        ftsite.check_host(("ip",))
        binary = ftsite.private_ftvm(args.ftvm)
        ftsite.image_dir(binary.path)
        work = ftsite.work_dir("ftvm-demo-")
        cores = (0, 1) if (os.cpu_count() or 1) >= 2 and shutil.which("taskset") else None
        print("== ftvm demo: a fault-tolerant redis VM (VMware FT style lockstep replication) ==", flush=True)
        r = ftsite.failover_trial(binary.path, work, "demo", "kill", args.kill_after, cores=cores, say=say)
        print()
        print("== report ==")
        if r.error:
            print(f"  the demo did not complete: {r.error}")
        print(f"  failover time (kill -9 to the next acknowledged write): "
              + (f"{r.failover * 1000:.0f} ms" if r.failover is not None else "n/a"))
        if r.backup_line:
            print(f"  backup: {r.backup_line}")
        print(f"  keys acknowledged to the client:  {r.acked} ({r.acked_before} before the kill)")
        if r.missing is not None:
            print(f"  keys found after the failover:    {r.acked - r.lost} of {r.acked} (DBSIZE {r.dbsize})")
        same = "no" if r.dropped else "yes" if r.error is None else "not known (the run failed)"
        print(f"  same TCP connection throughout:   {same}")
    sys.exit(0 if r.ok else 1)


if __name__ == "__main__":
    main()
