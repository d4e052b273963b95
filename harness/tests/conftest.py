"""Fixtures of the FT integration tests: the ftvm binary and the guest
image (checked once; a missing one fails every test with the reason, never
skips it), a scratch directory per test, and the cleanup of everything a
test made (processes, namespaces, captures) however it ends.

Tests run in parallel safely (pytest -n 2, one process per worker): the
site's namespaces carry the worker's pid and the test's tag, and scratch
directories the pid and a random suffix.

Run as `make test` does (as root, after building and `ftvm image build`):

    FTVM=target/release/ftvm PYTHON=/usr/bin/python3 harness/run pytest -n 2 harness/tests
    PYTHON=/usr/bin/python3 harness/run pytest harness/tests -k checkpoint -s     some, with their output
"""

import atexit
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

import ftsite


def _children():
    """This process's child processes (pytest-xdist's workers, on the
    controller)."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def pytest_configure(config):
    # SIGTERM and SIGHUP stop the run as Ctrl-C does, so the fixtures'
    # teardown and the cleanup below still run. Under pytest -n the
    # controller passes the signal on to its workers first: they hold the
    # VMs and namespaces, and a worker shut down by the controller alone
    # would not clean up.
    controller = not hasattr(config, "workerinput")

    def on_signal(signum, _frame):
        if controller:
            for pid in _children():
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, on_signal)
    atexit.register(ftsite.cleanup)


def pytest_unconfigure(config):
    ftsite.cleanup()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # No test is skipped silently: a skip (from anything) fails.
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, which the FT tests never are: {report.longrepr}"
    setattr(item, "rep_" + report.when, report)


@pytest.fixture(scope="session")
def ftvm():
    """The release binary (target/release/ftvm, or $FTVM), on a host that
    can run the site, with the guest image built."""
    try:
        ftsite.check_host(("ip", "e2fsck", "debugfs"))
        path = ftsite.check_ftvm(ftsite.default_ftvm())
        ftsite.image_dir(path)
    except ftsite.SetupError as e:
        pytest.fail(f"the FT tests cannot run here: {e}", pytrace=False)
    return path


@pytest.fixture
def scratch(request):
    """/tmp/ftvm-ft-PID-XXXXXXXX (short: control sockets live there),
    removed after the test (kept, and named, when it failed)."""
    d = Path(tempfile.mkdtemp(prefix=f"ftvm-ft-{os.getpid()}-"))
    yield d
    ftsite.cleanup()  # its VMs first: they write there
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\nkept the failed test's scratch directory (its VMs' output): {d}")
    else:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def clean_up_after_each_test():
    """Stops the test's processes and removes its namespaces and captures
    (ftsite's undo steps), whether it passed or not."""
    yield
    ftsite.cleanup()
