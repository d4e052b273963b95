"""The command-line options the benchmarks share, and the one-line
verdict on a job run: defined once here so that every bench names the
same thing the same way (its binary, the guest's size and image, its
time limit, where the consoles are kept)."""

import argparse

from ftsite.host import REPO

DEFAULT_FTVM = str(REPO / "target" / "release" / "ftvm")


def parser(prog, doc):
    """An argument parser for bench `prog`, its docstring as the help."""
    return argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_guest(ap, *, qemu=True, boot=True, timeout=900, timeout_help=None,
              ftvm_help="ftvm binary (default target/release/ftvm)", log_help="keep each run's console output here"):
    """The binary (ftvm, and QEMU's where the bench runs it), the guest's
    memory and image, and with `boot` its CPUs and boot files; the time
    limit and the console logs."""
    ap.add_argument("--ftvm", default=DEFAULT_FTVM, help=ftvm_help)
    if qemu:
        ap.add_argument("--qemu", default="qemu-system-riscv64")
    ap.add_argument("--mem", default="1G")
    if boot:
        ap.add_argument("--cpus", type=int, default=1)
    ap.add_argument("--image-dir", help="an image's directory (default <cache>/images/trixie-riscv64)")
    if boot:
        ap.add_argument("--kernel")
        ap.add_argument("--initrd")
        ap.add_argument("--disk")
        ap.add_argument("--bios")
    ap.add_argument("--timeout", type=float, default=timeout,
                    help=timeout_help or f"seconds per run (default {timeout:g})")
    ap.add_argument("--log-dir", help=log_help)


def add_ft_rounds(ap, ftvm_default, *, timeout, timeout_help):
    """A bench of FT beside the unprotected VM: rounds, time, binary, limit, logs."""
    ap.add_argument("--runs", type=int, default=3, help="rounds of FT and non-FT (default 3)")
    ap.add_argument("--fast-time", action="store_true", help="run both with --fast-time (default: real time)")
    ap.add_argument("--ftvm", default=ftvm_default, help="ftvm binary (copied privately before use)")
    ap.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    ap.add_argument("--log-dir", help="keep every VM's output here")


def job_problem(m, timeout, status_line=False):
    """What went wrong with a job run (vs_qemu.run_once's marks), or None."""
    if m["timeout"]:
        return f"timed out after {timeout}s"
    if m["rc"] != 0:
        extra = f" (status line: {m.get('status_line', 'none')})" if status_line else ""
        return f"exit status {m['rc']}{extra}"
    if "job_start" not in m or "job_end" not in m:
        return "no job start/end markers"
    return None


def console_hint(log):
    """Where the failed run's console is, or how to keep it."""
    return f"; console log in {log}" if log else "; rerun with --log-dir DIR to keep the console"


def default_boot(args):
    """For a bench that boots the default guest on one CPU: the boot
    options vs_qemu's argv builders and image lookup read."""
    args.cpus = 1
    for k in ("kernel", "initrd", "disk", "bios"):
        setattr(args, k, None)
