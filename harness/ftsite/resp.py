"""A small RESP (redis) client over one TCP socket, and waiting for the
guest's services to answer from the client namespace."""

import socket
import time

from .errors import ConnectionLost, TrialFailed
from .site import GUEST_IP, REDIS_PORT

BOOT_TIMEOUT = 600

# redis as the FT tests run it: every write fsynced to the (shared) disk
# before it is acknowledged, so an acknowledged key is an output the
# backup must be consistent with.
REDIS_FT = "redis-server /etc/redis/redis.conf --protected-mode no --appendonly yes --appendfsync always"


class RespError(Exception):
    """redis answered with an error reply."""


class Resp:
    """A RESP client over one TCP socket: one command, one awaited reply.
    Replies: simple strings and bulk strings as str (None for a null
    bulk), integers as int, arrays as lists; an error reply raises
    RespError, a broken connection ConnectionLost."""

    def __init__(self, sock, reply_timeout=60.0):
        self.sock = sock
        self.sock.settimeout(reply_timeout)
        self.buf = b""

    def command(self, *args):
        req = [f"*{len(args)}\r\n".encode()]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            req.append(b"$%d\r\n%s\r\n" % (len(a), a))
        try:
            self.sock.sendall(b"".join(req))
            return self._reply()
        except (OSError, socket.timeout) as e:
            raise ConnectionLost(f"{type(e).__name__}: {e}") from None

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionLost("the server closed the connection")
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode("utf-8", "replace")

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data.decode("utf-8", "replace")

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == "+":
            return rest
        if kind == "-":
            raise RespError(rest)
        if kind == ":":
            return int(rest)
        if kind == "$":
            return None if int(rest) < 0 else self._exact(int(rest))
        if kind == "*":
            return None if int(rest) < 0 else [self._reply() for _ in range(int(rest))]
        raise ConnectionLost(f"not a RESP reply: {line!r}")

    def close(self):
        self.sock.close()


def wait_for_redis(site, procs, timeout=BOOT_TIMEOUT, ip=GUEST_IP):
    """Connects from the client to the guest's redis (at `ip`) once it
    answers PING; TrialFailed if a process in `procs` dies or `timeout` s
    pass."""
    t0 = time.monotonic()
    last = "nothing"
    while time.monotonic() - t0 < timeout:
        for p in procs:
            if not p.alive():
                raise TrialFailed(f"{p.name} exited (status {p.proc.returncode}) before redis answered:\n{p.tail()}")
        try:
            conn = Resp(site.connect(ip, REDIS_PORT, timeout=2.0), reply_timeout=10.0)
            if conn.command("PING") == "PONG":
                conn.sock.settimeout(60.0)
                return conn
            conn.close()
        except (OSError, ConnectionLost, RespError) as e:
            last = str(e)
        time.sleep(0.5)
    raise TrialFailed(f"redis did not answer within {timeout:.0f} s (last: {last})")


def wait_for_port(site, ip, port, procs, timeout=BOOT_TIMEOUT):
    """Waits until a TCP port in the guest accepts a connection (which is
    closed again); returns how long that took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for p in procs:
            if not p.alive():
                raise TrialFailed(f"{p.name} exited (status {p.proc.returncode}) before port {port} "
                                  f"opened:\n{p.tail()}")
        try:
            site.connect(ip, port, timeout=2.0).close()
            return time.monotonic() - t0
        except OSError:
            time.sleep(0.5)
    raise TrialFailed(f"{ip}:{port} did not accept a connection within {timeout:.0f} s")
