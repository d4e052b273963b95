"""Undo steps for everything the harness makes (namespaces, processes,
scratch directories, cgroups), run last-in first-out by `cleanup()`.

`session()` runs a command-line program's body with SIGTERM/SIGHUP turned
into exceptions and runs `cleanup()` however the body ends; the pytest
suite (harness/tests/conftest.py) does the same around each test and at
the end of the run.
"""

import contextlib
import signal
import sys
import threading

from .errors import SetupError, Terminated

_UNDO = []  # callables, run last-in first-out by cleanup()


def on_cleanup(fn):
    """Registers an undo step; returns it, so it can be run early with
    `undo_now(fn)` or dropped with `forget(fn)`."""
    _UNDO.append(fn)
    return fn


def forget(fn):
    """Drops an undo step that its owner has already carried out."""
    if fn in _UNDO:
        _UNDO.remove(fn)


def undo_now(fn):
    if fn in _UNDO:
        _UNDO.remove(fn)
        fn()


def cleanup():
    while _UNDO:
        fn = _UNDO.pop()
        try:
            fn()
        except Exception as e:  # cleanup goes on whatever one step does
            print(f"ftsite: cleanup step failed: {e}", file=sys.stderr)


def raise_on_termination():
    """Turns SIGTERM and SIGHUP (unless ignored, as under nohup) into a
    `Terminated` exception, which unwinds like Ctrl-C."""

    def on_signal(signum, _frame):
        raise Terminated(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # respect nohup
        signal.signal(signal.SIGHUP, on_signal)


@contextlib.contextmanager
def session(prog):
    """Runs the body with SIGTERM/SIGHUP turned into exceptions, and
    cleans up whatever the site made however the body ends. Ctrl-C exits
    130, SIGTERM/SIGHUP 143, a SetupError 2 with its one-line message."""
    raise_on_termination()
    code = None
    try:
        yield
    except SetupError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted; cleaning up", file=sys.stderr)
        code = 130
    except Terminated as e:
        print(f"\n{prog}: {e}; cleaning up", file=sys.stderr)
        code = 143
    finally:
        # a second Ctrl-C must not cut the cleanup short
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        cleanup()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if code is not None:
        sys.exit(code)


class Background:
    """Something gathered by a thread of its own (its `_run`, which returns
    once `self.halt` is set) until finish(), or until cleanup."""

    def start_watching(self):
        self.halt = threading.Event()
        self._undo = on_cleanup(self.finish)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop_watching(self):
        """Stops the thread; True the first time only."""
        if self.halt.is_set():
            return False
        self.halt.set()
        self.thread.join(timeout=10)
        forget(self._undo)
        return True
