"""Who writes a file, and when: the kernel's fanotify, which names the
process behind every modification of a marked file (a disk image here),
whatever thread of it wrote and however (write, pwrite, a mapped page).

The fencing tests use it to show that a deposed primary writes nothing
to the disk after its backup went live: an inotify watch would see the
new primary's writes too and could not tell the two apart. Needs root
(CAP_SYS_ADMIN); Python has no binding, so the two system calls go
through ctypes."""

import ctypes
import os
import select
import struct
import time
from dataclasses import dataclass

from .cleanup import Background

_libc = ctypes.CDLL(None, use_errno=True)
FAN_CLASS_NOTIF = 0x0
FAN_CLOEXEC = 0x1
FAN_MARK_ADD = 0x1
FAN_MODIFY = 0x2
AT_FDCWD = -100
# struct fanotify_event_metadata: event_len u32, vers u8, reserved u8,
# metadata_len u16, mask u64, fd s32, pid s32.
_META = struct.Struct("=IBBHQii")


@dataclass
class Write:
    """A modification of the watched file: when it was read from the
    kernel's queue (time.monotonic(), within a few ms of the write) and
    the process that made it."""
    at: float
    pid: int


class WriteWatch(Background):
    """Every modification of `path` from now on, by process, until
    finish()."""

    def __init__(self, path):
        fd = _libc.fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC, os.O_RDONLY | os.O_LARGEFILE)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"fanotify_init: {os.strerror(err)}")
        self.fd = fd
        _libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        if _libc.fanotify_mark(fd, FAN_MARK_ADD, FAN_MODIFY, AT_FDCWD, os.fsencode(str(path))) != 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"fanotify_mark {path}: {os.strerror(err)}")
        self.writes = []
        self.start_watching()

    def _run(self):
        while not self.halt.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if not ready:
                continue
            try:
                buf = os.read(self.fd, 4096)
            except OSError:
                return
            now = time.monotonic()
            at = 0
            while at + _META.size <= len(buf):
                event_len, _vers, _res, _mlen, mask, efd, pid = _META.unpack_from(buf, at)
                if efd >= 0:
                    os.close(efd)
                if mask & FAN_MODIFY:
                    self.writes.append(Write(now, pid))
                at += max(event_len, _META.size)

    def by(self, pid, after=float("-inf")):
        """The writes process `pid` made after `after` (time.monotonic())."""
        return [w for w in self.writes if w.pid == pid and w.at > after]

    def finish(self):
        """Stops watching; every write seen, in order."""
        if self.stop_watching():
            os.close(self.fd)
        return self.writes
