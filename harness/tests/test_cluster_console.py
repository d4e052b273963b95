"""A cluster VM's serial console (issue 63, part 3), as an operator uses
it: three hosts (ftsite.cluster), a VM of the default image (systemd,
root logged in on the serial console) created with `--protect
checkpoint`.

- `ftvm cluster vm console NAME` from the client's host, its input piped:
  the console's recent output first (the shell's prompt), a typed command's
  output comes back; a watcher (`--read-only`) sees it too; a second
  client that wants to type is refused in one line, as are a VM the
  cluster does not have and a wrong token.
- The route itself (`GET /v1/vms/NAME/console`, a WebSocket), spoken to by
  hand: refused without the token (401), on a host that runs no side of
  the VM (404) or only its backup (409), without an upgrade (400); a read-
  only attach's first message is the attachment; a client that sends
  garbage or announces a huge frame is let go, and the agent and VM go on.
- The dashboard in a real browser, on the host that runs neither side:
  the VM's card opens its console, relayed from the primary's agent; it
  shows the prompt, a line typed in the page runs, and what the guest
  prints is shown as text, never as HTML.
- The primary's host dies; once the VM runs on its backup's host, the
  same command attaches to it there and a typed command's output comes
  back."""

import base64
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.error
from pathlib import Path

import ftsite
from ftsite.browser import Browser
from ftsite.cleanup import on_cleanup, undo_now
from ftsite.cluster import HOSTS, Cluster, wait_for
from ftsite.errors import TrialFailed
from ftsite.site import in_netns

# systemd to root's prompt on the serial console, on a loaded 2-core host.
BOOTED_WITHIN = 300
PROTECTED_WITHIN = 240  # as test_cluster: the transfer and a controller's pass
LIVE_AGAIN_WITHIN = 120  # from the host's death: failover, records rewritten
PROMPT = ":~# "
VM = "shell"
ARTIFACTS = Path(os.environ.get("FTVM_ARTIFACTS", ftsite.REPO / "target" / "artifacts"))


class ConsoleClient:
    """`ftvm cluster vm console [OPTIONS] NAME` running in the client's
    namespace, its stdin a pipe; its stdout (the console) and stderr (its
    own lines) gathered apart as they come."""

    def __init__(self, cl, name, *options, env=None):
        argv = cl.site.argv("client", "env", *(env or cl.env), cl.ftvm, "cluster", "vm", "console", *options, name)
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out, self.err = bytearray(), bytearray()
        self.lock = threading.Lock()
        for pipe, into in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=self._gather, args=(pipe, into), daemon=True).start()
        self._undo = on_cleanup(self._kill)

    def _gather(self, pipe, into):
        for chunk in iter(lambda: pipe.read1(4096), b""):
            with self.lock:
                into.extend(chunk)

    def _kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def text(self):
        with self.lock:
            return self.out.decode(errors="replace")

    def said(self):
        with self.lock:
            return self.err.decode(errors="replace")

    def wait(self, needle, within, after=0):
        """The end of `needle`'s first showing after `after` on the console."""
        def seen():
            if self.p.poll() is not None and needle not in self.text()[after:]:
                raise TrialFailed(f"the console client ended ({self.p.returncode}): {self.said()}\n{self.text()}")
            at = self.text().find(needle, after)
            return at + len(needle) if at >= 0 else None
        try:
            return wait_for(f"{needle!r} on the console", within, seen, every=0.2)
        except TrialFailed:
            print(f"the console so far:\n{self.text()[-3000:]}\nits lines: {self.said()}")
            raise

    def type(self, keys):
        self.p.stdin.write(keys.encode())
        self.p.stdin.flush()

    def detach(self, within=30):
        """Ends the session as piped input does (its end), or by the
        detach key for a watcher; its exit status."""
        if "--read-only" in self.p.args:
            self.type("\x1d")
        self.p.stdin.close()
        status = self.p.wait(timeout=within)
        undo_now(self._undo)
        return status


def typed_and_seen(console, word, after=0, within=60):
    """Types a command whose output (`WORD-N-console`, N computed by the
    guest's shell) differs from its echo, and waits for the output; where
    it ended."""
    n = random.randrange(10**6, 10**7)
    console.type(f"echo {word}-$(({n}+1))-console\n")
    return console.wait(f"{word}-{n + 1}-console", within, after)


def refused(cl, *args, env=None):
    """`ftvm cluster vm console ARGS`, expected to fail: its one line."""
    r = subprocess.run(cl.site.argv("client", "env", *(env or cl.env), cl.ftvm, "cluster", "vm", "console", *args),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, f"console {args} was not refused: {r.stdout} {r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftvm: "), r.stderr
    return lines[0]


class Handshake:
    """A WebSocket handshake by hand with an agent's console route, from the
    client's namespace: `status`, `body` (a refusal's JSON), and the socket
    (open after a 101)."""

    def __init__(self, cl, api, path, token):
        hostport = api.removeprefix("https://")
        host, port = hostport.rsplit(":", 1)
        headers = {"Host": hostport, "Upgrade": "websocket", "Connection": "Upgrade",
                   "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(), "Sec-WebSocket-Version": "13"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"

        def connect():
            raw = socket.create_connection((host, int(port)), timeout=30)
            s = cl.pki.ssl_context().wrap_socket(raw, server_hostname=host)
            s.sendall(request.encode())
            return s

        self.sock = in_netns(cl.site.ns["client"], connect)
        head = b""
        while b"\r\n\r\n" not in head:
            got = self.sock.recv(1)
            assert got, f"the agent closed during the handshake: {head!r}"
            head += got
        lines = head.decode().split("\r\n")
        self.status = int(lines[0].split()[1])
        length = next((int(v) for k, _, v in (line.partition(": ") for line in lines[1:])
                       if k.lower() == "content-length"), 0)
        self.body = b""
        while len(self.body) < length:
            self.body += self.sock.recv(length - len(self.body))

    def frame(self):
        """The next frame the server sends: (opcode, payload)."""
        def exactly(n):
            data = b""
            while len(data) < n:
                got = self.sock.recv(n - len(data))
                assert got, "the agent closed the WebSocket"
                data += got
            return data
        b0, b1 = exactly(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", exactly(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", exactly(8))[0]
        return b0 & 0x0F, exactly(n)

    def closed_within(self, seconds):
        """Whether the agent closes the connection within `seconds` (what it
        sends meanwhile is read and dropped)."""
        self.sock.settimeout(seconds)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionError, OSError):
            return True
        return False


def test_a_cluster_vm_console_from_the_command_line_the_dashboard_and_after_a_failover(ftvm, scratch):
    cl = Cluster(ftvm, scratch, "cc")
    cl.wait_hosts()
    assert refused(cl, "nosuch") == "ftvm: no VM nosuch in the cluster"
    t0 = time.monotonic()
    cl.cli("vm", "create", VM, "--on", "primary", "--memory", "512", "--protect", "checkpoint")

    # The first client types; systemd logs root in on the serial console.
    console = ConsoleClient(cl, VM)
    at = console.wait(PROMPT, BOOTED_WITHIN)
    print(f"root's prompt on the console {time.monotonic() - t0:.1f} s after create; the client said: "
          f"{console.said().strip()}")
    assert "attached to the console of VM shell on primary" in console.said(), console.said()
    watcher = ConsoleClient(cl, VM, "--read-only")
    watcher.wait(PROMPT, 30)  # the replayed output
    at = typed_and_seen(console, "hello", at)
    watcher.wait(console.text()[at - 20:at], 30)
    assert "watching the console of VM shell on primary" in watcher.said(), watcher.said()
    # One types at a time; a wrong token is refused.
    taken = refused(cl, VM)
    assert "another client types" in taken, taken
    stranger = scratch / "stranger"
    shutil.copytree(cl.pki.operator, stranger)
    (stranger / "token").write_text("0123456789abcdef" * 4 + "\n")
    wrong = refused(cl, VM, env=[f"FTVM_ETCD={cl.etcd.endpoints}", f"FTVM_CREDENTIALS={stranger}"])
    assert "bearer token" in wrong, wrong
    assert console.detach() == 0 and "detached" in console.said(), console.said()
    assert watcher.detach() == 0, watcher.said()

    # The route by hand, on each host.
    primary, backup = wait_for("the VM protected", PROTECTED_WITHIN, lambda: cl.protected(VM))
    third = next(h for h in HOSTS if h not in (primary, backup))
    records = cl.records()
    path = f"/v1/vms/{VM}/console"
    token = cl.pki.token
    for host, tok, status, kind in ((primary, None, 401, "unauthorized"), (primary, "0" * 64, 401, "unauthorized"),
                                    (third, token, 404, "not_found"), (backup, token, 409, "conflict")):
        h = Handshake(cl, records[host]["api"], path, tok)
        print(f"console on {host} ({'a token' if tok == token else tok and 'a wrong token' or 'no token'}): "
              f"{h.status} {h.body.decode()}")
        assert h.status == status and f'"error":"{kind}"' in h.body.decode(), (host, h.status, h.body)
    try:
        cl.https(records[primary]["api"] + path, timeout=30)
        raise AssertionError("a console request that is no WebSocket was answered")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and json.loads(e.read())["error"] == "bad_request", e
    h = Handshake(cl, records[primary]["api"], path + "?read_only=true", token)
    assert h.status == 101, h.body
    opcode, first = h.frame()
    assert opcode == 1 and first == f'{{"vm":"{VM}","host":"{primary}","typing":false}}'.encode(), first
    h.sock.sendall(os.urandom(4096))  # no frame: the agent lets it go
    assert h.closed_within(15), "the agent kept a client that sent garbage"
    h = Handshake(cl, records[primary]["api"], path, token)
    assert h.status == 101, h.body
    h.sock.sendall(bytes([0x82, 0xFF]) + struct.pack(">Q", 1 << 40) + os.urandom(4))  # a 1 TiB frame, announced
    assert h.closed_within(15), "the agent kept a client that announced a huge frame"

    # The dashboard on the host that runs neither side.
    b = Browser(cl.site, pins=cl.pki.spki_pins())
    try:
        b.get(records[third]["api"] + "/ui")
        b.type("#token", token)
        b.click("#login")
        card = f'article.vm[data-vm="{VM}"]'
        wait_for("the VM on the page", 30, lambda: b.css(f"{card} button.console-open"), every=0.2)
        b.click(f"{card} button.console-open")
        state = wait_for("the console attached on the page", 30,
                         lambda: (t := b.text("#console-state")) and t != "connecting…" and t, every=0.2)
        assert state == f"on {primary}, typing", state
        shown = lambda: b.attr("#console-out", "textContent") or ""  # noqa: E731
        wait_for("the prompt on the page", 30, lambda: PROMPT in shown(), every=0.2)
        n = random.randrange(10**6, 10**7)
        b.type("#console-in", f"echo page-$(({n}+1))-console '<b>bold</b>'\n")
        wait_for("the output on the page", 60, lambda: f"page-{n + 1}-console <b>bold</b>" in shown(), every=0.2)
        assert not b.css("#console-out b"), "the guest's output became HTML"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = b.screenshot(ARTIFACTS / f"dashboard-console-{int(time.time())}.png")
        print(f"the page's console showed the guest's output; screenshot: {shot}")
        b.click("#console-close")
        errors = b.console_errors()
        assert not errors, f"the page's console: {errors}"
    finally:
        b.quit()

    # The primary's host dies; the same command reaches the new live side.
    died = cl.kill_host(primary)
    wait_for("the VM live on its backup's host", LIVE_AGAIN_WITHIN,
             lambda: cl.sides(VM).get(backup) in ("primary", "unprotected"))
    console = ConsoleClient(cl, VM)
    wait_for("the client attached", 60, lambda: "attached to" in console.said() or console.p.poll() is not None,
             every=0.2)
    assert f"attached to the console of VM shell on {backup}" in console.said(), console.said()
    typed_and_seen(console, "again")
    print(f"{time.monotonic() - died:.1f} s after the primary's host died, a command typed on the VM's console on "
          f"{backup} answered")
    assert console.detach() == 0, console.said()
