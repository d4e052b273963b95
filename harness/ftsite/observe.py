"""What a running ftvm says about itself: the ONE place that reads ftvm's
typed API.

  * `status(sock)`: a VM's status, asked as JSON through its control
    socket (`{"request":"status"}`), as a flat dict (the fields are
    listed in its doc).
  * `event(proc, name, timeout)`: a lifecycle event of a process (the
    backup listening, protection starting, going live, ...), found or
    awaited in the journal the process keeps (`--events FILE`: one typed
    event a JSON line).

No test or bench parses a status line or ftvm's stderr.

`control(sock, command)` sends any other command (pause, snapshot, quit)
and returns its one-line readable reply.
"""

import json
import socket
import time
from dataclasses import dataclass, field

from .errors import TrialFailed


def _exchange(sock, line, timeout):
    """One line to a VM's control socket; the line it answers (b"" if
    it closes without one)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(line.encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    return reply


def control(sock, command, timeout=5.0):
    """One command in words on a VM's control socket; its one-line
    readable reply."""
    return _exchange(sock, command, timeout).decode("utf-8", "replace").strip()


def ask(sock, request, timeout=5.0):
    """One typed request (a dict, the API's JSON) on a VM's control
    socket; its typed answer: {"ok": reply} or {"error": ...}."""
    return _ask(sock, request, timeout)


def _ask(sock, request, timeout):
    """One JSON request on a VM's control socket; its JSON answer."""
    reply = _exchange(sock, json.dumps(request), timeout)
    return json.loads(reply) if reply else {"error": {"error": "no_answer"}}


# Status fields as the dict names them: the JSON's leaves, with these
# renamed to the status line's words (their units are the JSON's: ms,
# us, Mbit/s, %, per s, s).
_RENAMED = {
    "guest_time_s": "time", "lag_ms": "lag", "lag_max_ms": "lag_max", "log_mbit_s": "log",
    "cpu_share_percent": "cpu_share", "cpu_limit_percent": "cpu_limit", "paused_total_ms": "paused_total", "ends": "epochs",
    "length": "epoch_length", "interval_ms": "interval", "pause_median_us": "pause_median",
    "pause_p99_us": "pause_p99", "ack_wait_total_ms": "ack_wait_total", "ack_wait_mean_us": "ack_wait_mean",
}


def _flatten(obj, into):
    for key, value in obj.items():
        if isinstance(value, dict):
            _flatten(value, into)
        else:
            into[_RENAMED.get(key, key)] = value


def status(sock, timeout=5.0):
    """A VM's status through its control socket, as a dict:

      state        running, paused (a VM), replaying, following (a
                   backup: lockstep or epoch, checkpoint), taking_over
      role         primary or backup (absent without FT)
      unprotected  True when a primary runs without a backup (then
                   backup="none")
      mode         lockstep, epoch or checkpoint
      every other leaf of the JSON status (icount, time, backup, primary,
      generation, epoch_length, protocol, epochs, inputs_delivered,
      last_end, lag, cpu_share, log, log_bytes, acked, held,
      outputs_held_total, interval, rate_overall, committed, ...), named
      as _RENAMED says
      _raw         the JSON as it came, to show in logs and messages only

    TrialFailed if the VM answers with an error."""
    answer = _ask(sock, {"request": "status"}, timeout)
    reply = answer.get("ok")
    if not reply or reply.get("reply") != "status":
        raise TrialFailed(f"status on {sock}: {json.dumps(answer)}")
    fields = {"_raw": json.dumps(reply)}
    pair = reply.pop("pair", None) or {}
    _flatten(reply, fields)
    if pair.get("role") == "unprotected":
        fields.update(role="primary", backup="none", unprotected=True)
    elif pair:
        mode = pair.pop("mode")
        fields["mode"] = mode.pop("name")
        _flatten(pair, fields)
        _flatten(mode, fields)
    fields.pop("reply", None)
    return fields


def try_status(sock):
    """status(), or None if the VM does not answer."""
    try:
        return status(sock, timeout=2.0)
    except (OSError, TrialFailed):
        return None


@dataclass
class Event:
    """A lifecycle event: its name, when it arrived (time.monotonic()),
    its details, and the message that reported it (to show people)."""
    name: str
    t: float
    fields: dict = field(default_factory=dict)
    text: str = ""


# The events, and the typed event of ftvm's journal each is.
EVENTS = {
    "listening": "a backup listens for its primary",
    "stranger-refused": "a waiting backup closed a connection that did not prove it holds the pair's key; "
                        "fields: peer, reason",
    "following": "a backup follows its primary; fields: how (replaying, committing checkpoints)",
    "protected": "a primary is protected: its backup receives the log (or checkpoints)",
    "disk-blocks-sent": "a primary sends its backup the disk blocks its copy lacks; fields: blocks",
    "disk-differs": "a backup found its disk differs from the primary's and asks for the blocks",
    "disk-copied": "a backup's disk is now a copy of the primary's",
    "declared-failed": "a side declared the other failed; fields: who (primary, backup)",
    "isolated": "a side that declared the other failed reached none of its isolation addresses and leaves "
                "the arbiter to the other side for a while; fields: addresses, defer_ms",
    "arbiter-unreachable": "a side that wants to go live cannot reach the arbiter's store (a shared "
                           "directory gone, an etcd without quorum) and waits; fields: store, problem",
    "arbiter": "a side went to the arbiter (to claim the pair's generation)",
    "unprotected": "a primary won at the arbiter and runs unprotected",
    "going-live": "a backup goes live; fields: instruction, checkpoint (checkpoint mode), "
                  "epoch_inputs, epoch_inputs_at_multiples (epoch mode), segments_sent_again, frames_given",
    "halting": "a side lost at the arbiter and halts; fields: reason",
    "vm-ended": "a backup saw its primary end the VM; fields: powered_off, status (the guest's)",
    "refused-protection": "a primary's backup refused to follow it; fields: disk_not_a_copy",
    "refusing-to-follow": "a backup refuses to follow its primary",
    "handing-over": "a primary hands its VM over to its backup (handover, SIGTERM); fields: backup, generation",
    "handed-over": "a primary's backup claimed the VM; fields: generation, millis (guest stopped to claim)",
    "hand-over-failed": "a handover did not complete: the primary runs on unprotected; fields: reason",
    "hand-over-received": "a backup received its primary's handover and goes live at once",
    "protecting": "a running VM's protection began: its machine goes to the backup; fields: backup, generation, "
                  "mode",
    "machine-sent": "a running VM's machine is with its backup; fields: rounds, pages, final_pages, bytes, "
                    "pause_ms, total_ms",
    "protection-failed": "a running VM's protection did not start; it runs on as it did; fields: reason",
    "protection-stopped": "protection was stopped on purpose (unprotect): the backup stopped following; "
                          "fields: released",
    "timeout-changed": "the pair's failure timeout changed: on the primary when it sent the change, on the backup "
                       "when the control entry reached it; fields: timeout_ms",
    "cpu-limit-changed": "the VM's CPU limit changed: on the primary when it sent the change, on the backup when "
                         "the control entry reached it (its VM runs under it once live); fields: percent",
}


def _named(record):
    """The EVENTS name and fields of one record of ftvm's journal."""
    kind = record["event"]
    fields = {k: v for k, v in record.items() if k not in ("event", "seq", "unix_ms") and v is not None}
    if kind in ("arbiter_won", "arbiter_lost"):
        return "arbiter", fields
    if kind == "following":
        fields["how"] = "committing checkpoints" if record["mode"] == "checkpoint" else "replaying"
    if kind == "vm_ended":
        fields.update(powered_off=record["status"] is not None, status=record["status"])
    if kind == "refused_protection":
        # What the user is told: the backup's reason, passed on.
        fields["disk_not_a_copy"] = "is not a copy of the primary's" in record["reason"]
    return kind.replace("_", "-"), fields


def _journal(proc):
    """The records of `proc`'s journal so far, each with its time as
    time.monotonic() would have said it."""
    if proc.events is None:
        return []
    return journal_records(proc.events)


def journal(path):
    """Every event of the journal file at `path`, as Events."""
    out = []
    for t, record, line in journal_records(path):
        n, fields = _named(record)
        out.append(Event(n, t, fields, line))
    return out


def journal_records(path):
    """The records of the journal file at `path` so far, each with its
    time as time.monotonic() would have said it."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    offset = time.monotonic() - time.time()
    records = []
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            break  # a line being written: the next look has it whole
        records.append((r["unix_ms"] / 1000 + offset, r, line))
    return records


def event(proc, name, timeout=None, watch=()):
    """The first `name` event (one of EVENTS) that `proc` reported, as an
    Event. With no timeout it only looks: None if it has not happened
    (yet: a process that has exited and been waited for has said all it
    will). With a timeout it waits that many seconds: TrialFailed if the
    event does not come by then, or `proc` (once all its output is read)
    or a process in `watch` exits first."""
    assert name in EVENTS, f"no such event: {name}"

    def find():
        for t, record, line in _journal(proc):
            n, fields = _named(record)
            if n == name:
                return Event(n, t, fields, line)
        return None

    if timeout is None:
        return find()
    return proc._await(find, f"the {name} event", timeout, watch)
