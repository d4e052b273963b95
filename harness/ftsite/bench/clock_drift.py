"""Measure how closely an ftvm guest's clock follows the wall clock, and
what an idle guest costs the host.

Boots the default guest (a fresh copy of its root disk), has it print
/proc/uptime, sleep SECONDS, and print it again; compares the guest's
elapsed time with the host's between the two lines, and reports the CPU
time ftvm used while the guest slept (user+sys sampled from /proc at the
two lines). Target (issue: virtual time): error within 1% over a minute,
and an idle guest far below one core.
"""
import argparse, os, shutil, subprocess, sys, tempfile, time

import ftsite
from ftsite.bench import results

def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def main():
    ap = argparse.ArgumentParser(prog="clock-drift", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--ftvm", default=ftsite.default_ftvm())
    results.add_option(ap, "clock-drift")
    args = ap.parse_args()
    if not os.path.exists(args.ftvm):
        sys.exit(f"clock-drift: ftvm binary not found at {args.ftvm}: run `cargo build --release`")
    image = subprocess.run([args.ftvm, "image", "path"], capture_output=True, text=True)
    if image.returncode != 0:
        sys.exit("clock-drift: no guest image: run `make image`")
    with tempfile.TemporaryDirectory() as tmp:
        disk = os.path.join(tmp, "root.ext4")
        shutil.copyfile(os.path.join(image.stdout.strip(), "rootfs.ext4"), disk)
        cmd = [args.ftvm, "run", "--mem", "512M", "--disk", disk, "--exec",
               f"cat /proc/uptime; sleep {args.seconds}; cat /proc/uptime"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        marks = []
        for line in p.stdout:
            marks.append((time.monotonic(), cpu_seconds(p.pid), line.strip()))
        p.wait()
    if p.returncode != 0 or len(marks) < 2:
        sys.exit(f"clock-drift: the guest run failed (exit {p.returncode})")
    (h0, c0, a), (h1, c1, b) = marks[0], marks[1]
    host, guest = h1 - h0, float(b.split()[0]) - float(a.split()[0])
    err = 100 * (guest - host) / host
    print(f"wall {host:.3f} s, guest {guest:.3f} s, error {err:+.3f}% ({'PASS' if abs(err) <= 1 else 'MISS'}: target within 1%)")
    print(f"ftvm CPU while the guest slept: {c1 - c0:.2f} s of {host:.1f} s ({100 * (c1 - c0) / host:.1f}% of a core)")
    fig = results.figure("clock-drift.error", "guest time against the wall clock", err, "%",
                         peer=results.peer("the wall clock", host, "s"), target="within 1 %", met=abs(err) <= 1,
                         note=f"over {host:.0f} s; an idle guest used {100 * (c1 - c0) / host:.1f} % of a core")
    path = results.write("clock-drift", ["bench/clock-drift"] + sys.argv[1:], [fig],
                         {"wall_s": host, "guest_s": guest, "error_pct": err, "ftvm_cpu_s": c1 - c0}, args.json, args.ftvm)
    print(f"clock-drift: figures written to {path}")

if __name__ == "__main__":
    main()
