"""The price of the pair's encryption (issue 26), measured as the CPU time
ftvm spends in it while the benches that carry the most traffic between
the hosts run: the share of each ftvm process's and thread's samples
that fall in the channel's cipher (Noise's AES-GCM through `snow`: the
`aes`, `aes_gcm`, `polyval`/`ghash`, `snow` and `channel::secure` code),
in the handshakes (X25519, SHA-256, HKDF) and in the heartbeats' MAC
(BLAKE3 on the heartbeat thread).

Why a profile and not only an A/B of builds: an unencrypted build is the
one before the Noise channel, many commits old by now, and the benches'
ratios move by ±10-25 % between runs on this shared host, far more than
the price (see docs/PERFORMANCE.md, 2026-11-26). The time a thread spends
sealing and opening is what encryption adds to it, and a sampled share of
that thread's own time does not depend on how busy the host is. Sampling
is system-wide (`perf record -a -e cpu-clock`, software clock, so it
works without hardware counters); only the processes whose binary is
ftvm are counted. Which ftvm process plays which part (`ft primary`,
`ft backup`, `run`) is read from /proc while the bench runs.

  bench/encryption-price                         the four benches below (~25 min)
  bench/encryption-price --only ft-network --keep /tmp/ep
  bench/encryption-price -- bench/failover --kills 2   any command, profiled the same way

Default benches, one round each (the issue's list): `bench/ft-overhead
--only cpu,redis --runs 1`, `bench/ft-network --runs 1`, `bench/checkpoint
--rates 40 --runs 1 --no-redis`, `bench/failover --kills 4`. Each bench's
own output is printed as it runs; after it, a table per ftvm process: CPU
seconds sampled, the cipher's, handshakes' and MAC's shares, and the
threads where the cipher runs.

Needs root, perf (Debian `linux-perf`) and what each bench needs. Exits 0
when every bench ran and was profiled (a bench's own exit status 1, a
target it missed, is printed and its profile stands), 3 when one did not,
2 on bad input.
"""

import collections
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import ftsite
from ftsite.bench import options, results
from ftsite.host import REPO

BENCHES = {
    "ft-overhead": ["bench/ft-overhead", "--only", "cpu,redis", "--runs", "1"],
    "ft-network": ["bench/ft-network", "--runs", "1"],
    "checkpoint": ["bench/checkpoint", "--rates", "40", "--runs", "1", "--no-redis"],
    "failover": ["bench/failover", "--kills", "4"],
}
FREQUENCY = 997  # Hz per CPU: prime, so that it beats with no periodic work

# What each sample's symbol is counted as. The cipher's crates are named
# in full; with thin LTO some of their code is inlined into snow's or our
# own wrappers (`channel::secure`), which are counted with them: framing
# a message costs a copy with or without encryption, so this errs on the
# side of a higher price.
CIPHER = re.compile(r"(^|[<\s&])(aes|aes_gcm|polyval|ghash|ctr|aead|cipher|snow)::|channel::secure::"
                    r"|core_arch::x86::(aes|pclmulqdq)::")
HANDSHAKE = re.compile(r"(^|[<\s&])(curve25519_dalek|x25519_dalek|sha2|hkdf|hmac)::")
MAC = re.compile(r"(^|[<\s&])blake3::|blake3_")
# `perf script -F comm,pid,tid,ip,sym,dso`: "  ft-heartbeat 123/125  55d0c0 sym (dso)".
LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+[0-9a-f]+\s+(?P<sym>.*?)\s*"
                  r"\((?P<dso>[^()]*)\)\s*$")


class Roles(threading.Thread):
    """Polls /proc for ftvm processes and remembers what each was started
    as, until stopped: perf's samples name a process only by its pid."""

    def __init__(self):
        super().__init__(daemon=True)
        self.roles = {}
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.wait(0.2):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit() or int(entry.name) in self.roles:
                    continue
                try:
                    argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if argv and os.path.basename(argv[0].decode(errors="replace")).startswith("ftvm"):
                    args = [a.decode(errors="replace") for a in argv[1:] if a]
                    words = args[:2] if args[:1] == ["ft"] else args[:1]
                    self.roles[int(entry.name)] = " ".join(words) or "ftvm"

    def stop(self):
        self.stopping.set()
        self.join()


def kind(sym, comm):
    if CIPHER.search(sym):
        return "cipher"
    if HANDSHAKE.search(sym):
        return "handshake"
    if MAC.search(sym) and comm == "ft-heartbeat":
        return "mac"
    return "other"


def symbol_root(data, ftvm):
    """A directory for `perf script --symfs` in which every binary the
    samples name can be found: a bench runs a private copy of ftvm that
    it deletes before perf is done (so perf cannot read its symbols or
    its build id), and the copy is byte for byte `ftvm`."""
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,dso"], capture_output=True, text=True,
                         errors="replace")
    if out.returncode != 0:
        raise ftsite.TrialFailed(f"perf script: {out.stderr.strip()[:300]}")
    root = Path(tempfile.mkdtemp(prefix="ftvm-price-symfs-"))
    paths = {m[1] for m in re.finditer(r"\((/[^()]*)\)\s*$", out.stdout, re.M)}
    for path in paths:
        if os.path.basename(path).startswith("ftvm") and not os.path.exists(path):
            target = ftvm
        elif os.path.exists(path):
            target = path
        else:
            continue
        link = root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(target)
    return root


def tally(data, ftvm):
    """Samples per ftvm pid: {pid: {comm: Counter(kind)}}."""
    root = symbol_root(data, ftvm)
    try:
        out = subprocess.run(["perf", "script", "-i", str(data), "--symfs", str(root), "--kallsyms", "/proc/kallsyms",
                              "-F", "comm,pid,tid,ip,sym,dso"], capture_output=True, text=True, errors="replace")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if out.returncode != 0:
        raise ftsite.TrialFailed(f"perf script: {out.stderr.strip()[:300]}")
    samples = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    ftvm_pids = set()
    for line in out.stdout.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        pid = int(m["pid"])
        if os.path.basename(m["dso"]).startswith("ftvm"):
            ftvm_pids.add(pid)
        samples[pid][m["comm"]][kind(m["sym"], m["comm"])] += 1
    return {pid: samples[pid] for pid in ftvm_pids}


def pct(part, whole):
    return f"{100.0 * part / whole:5.2f} %" if whole else "    -  "


def report(name, tallies, roles):
    """Prints the table of one bench's profile; returns each role's
    shares, {role: {"cpu_s", "cipher", "handshake", "mac"}} (percent)."""
    print(f"\n{name}: ftvm's CPU time and the encryption's share of it (perf, {FREQUENCY} Hz per CPU)")
    print(f"  {'process':24} {'CPU s':>7} {'cipher':>8} {'handshake':>9} {'MAC':>8}   threads with the cipher")
    by_role = collections.defaultdict(collections.Counter)
    brief = 0
    for pid, threads in sorted(tallies.items()):
        total = collections.Counter()
        for counts in threads.values():
            total.update(counts)
        n = sum(total.values())
        if n < FREQUENCY // 10:
            brief += 1  # `ftvm image path` and the like: no pair in it
            continue
        role = roles.get(pid, "ftvm (started and gone between polls)")
        by_role[role].update(total)
        busy = sorted(((c["cipher"], comm, sum(c.values())) for comm, c in threads.items() if c["cipher"]), reverse=True)
        where = ", ".join(f"{comm} {pct(k, t).strip()} of its {t / FREQUENCY:.1f} s" for k, comm, t in busy[:3])
        print(f"  {role + ' ' + str(pid):24} {n / FREQUENCY:7.1f} {pct(total['cipher'], n):>8} "
              f"{pct(total['handshake'], n):>9} {pct(total['mac'], n):>8}   {where or '-'}")
    if brief:
        print(f"  ({brief} ftvm process(es) of under 0.1 CPU s left out)")
    for role, total in sorted(by_role.items()):
        n = sum(total.values())
        print(f"  all '{role}': {n / FREQUENCY:.1f} CPU s, cipher {pct(total['cipher'], n).strip()}, "
              f"handshake {pct(total['handshake'], n).strip()}, MAC {pct(total['mac'], n).strip()}")
    return {role: {"cpu_s": sum(total.values()) / FREQUENCY,
                   **{k: 100.0 * total[k] / sum(total.values()) for k in ("cipher", "handshake", "mac")}}
            for role, total in by_role.items() if sum(total.values())}


def profile(name, argv, keep, ftvm):
    """Runs one bench under perf; prints its table. Returns whether it
    ran through, and the roles' shares (`report`)."""
    data = Path(keep) / f"{name}.perf.data" if keep else Path(tempfile.mkdtemp(prefix="ftvm-price-")) / "perf.data"
    roles = Roles()
    roles.start()
    print(f"\n== {name}: {shlex.join(argv)}", flush=True)
    try:
        rc = subprocess.run(["perf", "record", "-q", "-a", "-e", "cpu-clock", "-F", str(FREQUENCY), "-o", str(data),
                             "--", *argv], cwd=REPO).returncode
    finally:
        roles.stop()
    # 1 is a bench's own verdict (a target missed, a key lost: its output
    # says which); the profile stands. Above that it did not run through.
    ok = rc in (0, 1)
    if rc != 0:
        print(f"encryption-price: {name} exited {rc}; its profile is reported all the same", file=sys.stderr)
    shares = {}
    try:
        tallies = tally(data, ftvm)
        shares = report(name, tallies, roles.roles)
        if not tallies:
            print(f"encryption-price: {name}: no sample of an ftvm process", file=sys.stderr)
            ok = False
    except ftsite.TrialFailed as e:
        print(f"encryption-price: {name}: {e}", file=sys.stderr)
        ok = False
    finally:
        if not keep:
            data.unlink(missing_ok=True)
            data.parent.rmdir()
    return ok, shares


def main():
    ap = options.parser("encryption-price", __doc__)
    ap.add_argument("--only", help=f"comma-separated, from {','.join(BENCHES)} (default all)")
    ap.add_argument("--keep", help="keep each perf.data in this directory")
    ap.add_argument("--ftvm", default=ftsite.default_ftvm(),
                    help="the ftvm binary the benches run, and whose symbols are read (default $FTVM or the release build)")
    ap.add_argument("command", nargs="*", help="profile this command instead (after --)")
    results.add_option(ap, "encryption-price")
    args = ap.parse_args()
    with ftsite.session("encryption-price"):
        ftsite.check_host(("perf",), cores=2)
        # The benches' own figures, taken under perf, are not theirs to
        # keep: they go to a scratch directory, not bench/results.
        scratch = tempfile.mkdtemp(prefix="ftvm-price-json-")
        ftsite.on_cleanup(lambda: shutil.rmtree(scratch, ignore_errors=True))
        if args.command:
            if args.only:
                raise ftsite.SetupError("give --only or a command, not both")
            name = Path(args.command[0]).name
            bench = args.command[0].startswith("bench/") and "--json" not in args.command
            runs = {name: args.command + (["--json", f"{scratch}/{name}.json"] if bench else [])}
        else:
            names = args.only.split(",") if args.only else list(BENCHES)
            unknown = [n for n in names if n not in BENCHES]
            if unknown:
                raise ftsite.SetupError(f"unknown bench {','.join(unknown)}: choose from {','.join(BENCHES)}")
            runs = {n: [*BENCHES[n], "--ftvm", args.ftvm, "--json", f"{scratch}/{n}.json"] for n in names}
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
        started = time.time()
        ftvm = str(Path(ftsite.check_ftvm(args.ftvm)).resolve())
        profiles = {name: profile(name, argv, args.keep, ftvm) for name, argv in runs.items()}
        failed = [name for name, (ok, _) in profiles.items() if not ok]
        figs = [results.figure(f"encryption-price.{name}.{role.replace(' ', '-')}",
                               f"the pair's encryption: the cipher's share of `{role}`'s CPU time under {name}",
                               sh["cipher"], "%", note=f"{sh['cpu_s']:.1f} CPU s; handshakes {sh['handshake']:.2f} %, "
                                                       f"MACs {sh['mac']:.2f} %")
                for name, (ok, shares) in profiles.items() if ok for role, sh in sorted(shares.items())
                if role.startswith(("ft ", "run"))]
        path = results.write("encryption-price", ["bench/encryption-price"] + sys.argv[1:], figs,
                             {name: shares for name, (_, shares) in profiles.items()}, args.json, ftvm)
        print(f"encryption-price: figures written to {path}")
        print(f"\nencryption-price: {len(runs)} bench(es) in {time.time() - started:.0f} s"
              + (f"; FAILED: {', '.join(failed)}" if failed else ""))
        return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
