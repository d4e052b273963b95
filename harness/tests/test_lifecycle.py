"""The lifecycle of a protected VM (issue 28): a planned handover.

SIGTERM to the primary's ftvm (what a host being shut down for
maintenance sends), or `handover` on its control socket, while a client
writes keys one at a time over one TCP connection: the backup goes live
where the primary stopped, at once (no failure is declared, no timeout
waited out), the old primary exits 0, and every acknowledged key is
there, read over the same connection. A handover to a backup that cannot
take it (stopped) fails without losing the VM: the primary runs on.
"""

import os
import random
import signal
import time

import pytest

import ftsite
from ftsite import event, status
from ftsite.trial import KeyWriter, check_keys, fail_primary, shutdown_and_fsck

MODES = {"lockstep": [], "epoch": ["--mode", "epoch"], "checkpoint": ["--mode", "checkpoint"]}
# The longest a client may wait on a handover here: well under a
# failover's (the failure timeout, then the takeover), with room for a
# loaded host and for one TCP retransmission (200 ms) of a request that
# reached the old primary after it stopped.
PAUSE_MOST = 1.0


@pytest.mark.parametrize("mode,how", [("lockstep", "handover"), ("lockstep", "handover-command"),
                                      ("epoch", "handover"), ("checkpoint", "handover")])
def test_a_handover_under_load_loses_nothing_and_the_old_primary_exits_0(ftvm, scratch, mode, how):
    vm = ftsite.protected_redis(ftvm, scratch, f"ho{mode[0]}{how[-1]}", MODES[mode], ftsite.TEST_MIN_TIMEOUT_MS)
    site, primary, backup, conn = vm.site, vm.primary, vm.backup, vm.conn
    writer = KeyWriter(conn)
    writer.start()
    time.sleep(2.0 + random.random() * 2.0)
    assert writer.error is None and writer.acked > 0, writer.error
    asked = fail_primary(site, primary, how)
    assert primary.wait(30) == 0, primary.output()
    done = event(primary, "handed-over")
    assert done is not None, primary.output()
    event(backup, "hand-over-received", timeout=5, watch=[backup])
    live = event(backup, "going-live", timeout=10, watch=[backup])
    if how == "handover-command":
        answer = primary.handover_answer
        assert answer is not None and answer.startswith("ok handed over: the backup went live for generation 1"), \
            answer
    # Nothing failed: neither side declared the other failed.
    assert event(backup, "declared-failed") is None, backup.output()
    assert event(primary, "declared-failed") is None, primary.output()
    deadline = time.monotonic() + 30
    while writer.first_ack_sent_after(asked) is None:
        assert writer.error is None, f"the client failed after the handover: {writer.error}"
        assert time.monotonic() < deadline, f"no write acknowledged within 30 s of the handover:\n{backup.tail()}"
        time.sleep(0.01)
    time.sleep(2.0)
    writer.stop()
    assert writer.error is None, f"the client failed: {writer.error}"
    pause = max(a - s for s, a in writer.times if a >= asked)
    total = writer.acked
    assert conn.command("DBSIZE") == total
    assert check_keys(conn, total) == (0, 0)
    print(f"{mode} ({how}): {total} keys acknowledged, none lost; the client's longest wait across the "
          f"handover {pause * 1000:.0f} ms; the primary saw the backup's claim {done.fields['millis']} ms "
          f"after its guest stopped; backup: {live.text}")
    assert pause < PAUSE_MOST, f"a key waited {pause * 1000:.0f} ms across the handover"
    st = status(backup.sock)
    assert st.get("unprotected") is True, st["_raw"]
    if mode == "checkpoint":
        # The guest ends cleanly on the new primary: its copy of the disk
        # passes e2fsck.
        theirs = vm.backup_extra[vm.backup_extra.index("--disk") + 1]
        shutdown_and_fsck(site, conn, backup, theirs)


def test_a_handover_to_a_stopped_backup_fails_and_the_vm_runs_on(ftvm, scratch):
    """The backup's ftvm is stopped (SIGSTOP) when the handover is asked
    for: it never acknowledges, the primary declares it failed, wins the
    arbiter and runs on alone; the handover's answer says it failed, and
    the client's keys are all there."""
    vm = ftsite.protected_redis(ftvm, scratch, "hostop", min_timeout_ms=ftsite.TEST_MIN_TIMEOUT_MS)
    primary, backup, conn = vm.primary, vm.backup, vm.conn
    writer = KeyWriter(conn)
    writer.start()
    time.sleep(2.0)
    os.kill(backup.pid, signal.SIGSTOP)
    try:
        answer = ftsite.control(primary.sock, "handover", timeout=60)
        assert answer.startswith("error the handover failed"), answer
        time.sleep(1.0)
        writer.stop()
        assert writer.error is None, f"the client failed: {writer.error}"
        primary.assert_running()
        assert event(primary, "hand-over-failed") is not None or event(primary, "unprotected") is not None, \
            primary.output()
        st = status(primary.sock)
        assert st.get("unprotected") is True, st["_raw"]
        total = writer.acked
        assert conn.command("DBSIZE") == total
        assert check_keys(conn, total) == (0, 0)
        print(f"{total} keys; the handover's answer: {answer}")
    finally:
        os.kill(backup.pid, signal.SIGCONT)
