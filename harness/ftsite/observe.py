"""What a running ftvm says about itself: the ONE place that knows the
formats of ftvm's status replies and of its messages.

  * `status(sock)`: a VM's status, read through its control socket, as a
    dict (the fields are listed in its doc).
  * `event(proc, name, timeout)`: a lifecycle event of a process (the
    backup listening, protection starting, going live, ...), found or
    awaited.

Today both read text (the status line `ok running icount=... role=primary
... held=0 ...` and the "ftvm: ..." lines ftvm writes to stderr). When
ftvm gets `ftvm control SOCK status --json` and a typed event stream,
these two functions change and nothing else: no test or bench parses a
status reply or ftvm's stderr itself.

`control(sock, command)` sends any other command (pause, snapshot, quit)
and returns its one-line reply.
"""

import re
import socket
from dataclasses import dataclass, field

from .errors import TrialFailed


def control(sock, command, timeout=5.0):
    """One command on a VM's control socket; its one-line reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(command.encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply.decode("utf-8", "replace").strip()


# Units dropped from a value, longest first; the dict's numbers are in
# these units (lag, lag_max, interval, paused_total: ms; pause_median,
# pause_p99: us; cpu_share: %; log: Mbit/s; rate, rate_overall: per s;
# time: s).
_UNITS = ("Mbit/s", "/s", "ms", "us", "%", "s")


def _number(value):
    for unit in ("",) + _UNITS:
        if unit and not value.endswith(unit):
            continue
        num = value[: len(value) - len(unit)]
        try:
            return int(num)
        except ValueError:
            pass
        try:
            return float(num)
        except ValueError:
            pass
    return value


def status(sock, timeout=5.0):
    """A VM's status through its control socket, as a dict:

      state        running, paused (a VM), replaying, following (a
                   backup: lockstep or epoch, checkpoint), taking-over
      role         primary or backup (absent without FT)
      unprotected  True when a primary runs without a backup
      every key=value field of the reply (icount, time, backup, primary,
      generation, mode, epoch_length, protocol, epochs, inputs_delivered,
      last_end, lag, cpu_share, log, log_bytes, acked, held,
      outputs_held_total, interval, rate_overall, committed, ...):
      numbers as int or float in the units listed at _UNITS, the rest
      as strings (backup="none" when a primary has lost its backup)
      _raw         the reply as it came, to show in logs and messages only

    TrialFailed if the VM answers with an error."""
    line = control(sock, "status", timeout)
    words = line.split()
    if not words or words[0] != "ok" or len(words) < 2:
        raise TrialFailed(f"status on {sock}: {line}")
    fields = {"_raw": line, "state": words[1]}
    for word in words[2:]:
        if "=" in word:
            key, value = word.split("=", 1)
            fields[key] = _number(value)
        elif word == "(unprotected)":
            fields["unprotected"] = True
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


# The events, and the message that reports each today.
EVENTS = {
    "listening": "a backup listens for its primary",
    "following": "a backup follows its primary; fields: how (replaying, committing checkpoints)",
    "protected": "a primary is protected: its backup receives the log (or checkpoints)",
    "disk-blocks-sent": "a primary sends its backup the disk blocks its copy lacks; fields: blocks",
    "disk-differs": "a backup found its disk differs from the primary's and asks for the blocks",
    "disk-copied": "a backup's disk is now a copy of the primary's",
    "declared-failed": "a side declared the other failed; fields: who (primary, backup)",
    "arbiter": "a side went to the arbiter (to claim the pair's generation)",
    "unprotected": "a primary won at the arbiter and runs unprotected",
    "going-live": "a backup goes live; fields: instruction, checkpoint (checkpoint mode), "
                  "epoch_inputs, epoch_inputs_at_multiples (epoch mode)",
    "halting": "a side lost at the arbiter and halts; fields: reason",
    "vm-ended": "a backup saw its primary end the VM; fields: powered_off, status (the guest's)",
    "refused-protection": "a primary's backup refused to follow it; fields: disk_not_a_copy",
    "refusing-to-follow": "a backup refuses to follow its primary",
}


def _events_in(line):
    """The events one line of ftvm's stderr reports: [(name, fields)]."""
    if not line.startswith("ftvm: "):
        return []
    msg = line[len("ftvm: "):]
    found = []
    if msg.startswith("backup waiting for the primary"):
        found.append(("listening", {}))
    if msg.startswith("backup of the VM at "):
        how = "committing checkpoints" if msg.endswith("committing checkpoints") else \
            "replaying" if msg.endswith("replaying") else msg.rsplit(", ", 1)[-1]
        found.append(("following", {"how": how}))
    if msg.startswith("protected ("):
        found.append(("protected", {}))
    m = re.match(r"sending the backup (\d+) blocks", msg)
    if m:
        found.append(("disk-blocks-sent", {"blocks": int(m.group(1))}))
    if "differs from the primary's: asking for the blocks" in msg:
        found.append(("disk-differs", {}))
    if "is now a copy of the primary's" in msg:
        found.append(("disk-copied", {}))
    m = re.match(r"the (primary|backup) is declared failed", msg)
    if m:
        found.append(("declared-failed", {"who": m.group(1)}))
    if "arbiter" in msg:
        found.append(("arbiter", {}))
    if "running unprotected" in msg:
        found.append(("unprotected", {}))
    m = re.match(r"going live (?:from checkpoint (\d+) )?at instruction (\d+)", msg)
    if m:
        f = {"instruction": int(m.group(2))}
        if m.group(1) is not None:
            f["checkpoint"] = int(m.group(1))
        e = re.search(r"; (\d+) inputs, each at an epoch end \((\d+) at multiples of", msg)
        if e:
            f["epoch_inputs"], f["epoch_inputs_at_multiples"] = int(e.group(1)), int(e.group(2))
        found.append(("going-live", f))
    if msg.startswith("halting:"):
        found.append(("halting", {"reason": msg[len("halting:"):].strip()}))
    m = re.match(r"the primary ended the VM \((?:(powered off) with status (-?\d+)|[^)]*)\)", msg)
    if m:
        found.append(("vm-ended", {"powered_off": m.group(1) is not None,
                                   "status": int(m.group(2)) if m.group(2) is not None else None}))
    if "refused protection" in msg:
        found.append(("refused-protection", {"disk_not_a_copy": "is not a copy of the primary's" in msg}))
    if msg.startswith("refusing to follow"):
        found.append(("refusing-to-follow", {}))
    return found


def event(proc, name, timeout=None, watch=()):
    """The first `name` event (one of EVENTS) that `proc` reported, as an
    Event. With no timeout it only looks: None if it has not happened
    (yet: a process that has exited and been waited for has said all it
    will). With a timeout it waits that many seconds: TrialFailed if the
    event does not come by then, or `proc` (once all its output is read)
    or a process in `watch` exits first."""
    assert name in EVENTS, f"no such event: {name}"

    def find():
        for t, line in list(proc.messages):
            for n, fields in _events_in(line):
                if n == name:
                    return Event(n, t, fields, line.removeprefix("ftvm: "))
        return None

    if timeout is None:
        return find()
    return proc._await(find, f"the {name} event", timeout, watch)
