"""A task's output, copied from its pipe into its attempt's log by its supervisor: output that
cannot be written (a full, failed or removed log disk) is dropped and counted, never the task
(``logfaults`` says what was lost)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import time
from pathlib import Path

from nodeagent.launcher import logfaults

logger = logging.getLogger("scheduling.supervisor")

PIPE_SIZE = 1 << 20
CHUNK = 1 << 16
F_SETPIPE_SZ = 1031


class LogRelay:
    """Copies the task's output (one pipe for stdout and stderr) into its log file.

    The task writes to a pipe, never to the log itself: a full disk then costs output, not the
    task (a Python program whose final flush fails exits with 120). Lost output is counted and
    marked in the log as soon as writing works again. No fault of the log (it cannot be made,
    written or closed, or it was removed meanwhile) raises: each is counted for ``note``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.read_fd, self.write_fd = os.pipe()
        try:
            fcntl.fcntl(self.read_fd, F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # the default 64 KiB pipe works, with more wake-ups
        os.set_blocking(self.read_fd, False)
        self.dropped = 0  # since the last marker
        self.dropped_total = 0
        self.error: OSError | None = None
        self.removed = False  # the log was unlinked while the task wrote to it
        # Truncated: a file already there is not this attempt's (a database reset numbers tasks
        # again, and the same tenant name may be another lab's); one attempt, one relay.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        try:
            self.log_fd: int | None = _open_log(path, flags)
        except OSError as exc:
            self.log_fd = None
            self._failed(exc)

    def pump(self, timeout: float, wake: int | None = None) -> bool:
        """Copy what the task wrote, waiting up to ``timeout`` (or until ``wake``, a file
        descriptor, is readable); False once every writer is gone."""
        ready, _, _ = select.select([self.read_fd, *fds(wake)], [], [], timeout)
        if self.read_fd not in ready:
            return True
        for _ in range(16):  # at most 1 MiB per call, so signals and timeouts are not starved
            try:
                chunk = os.read(self.read_fd, CHUNK)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self._write(chunk)
        return True

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.pump(0.05):
            pass

    def close(self) -> None:
        if self.dropped:
            self._write(b"")  # one last try at the marker
        os.close(self.read_fd)
        if self.log_fd is None:
            return
        try:
            # Written into a file nobody can open any more: an operator's clean-up, or a log
            # directory removed while the task ran.
            self.removed = os.fstat(self.log_fd).st_nlink == 0
        except OSError as exc:
            self._failed(exc)
        try:
            os.close(self.log_fd)  # where a network file system reports a failed write
        except OSError as exc:
            self._failed(exc)
        self.log_fd = None

    def note(self) -> str:
        """What the task's reason says of its output when not all of it was kept."""
        if self.dropped_total or self.error is not None:
            return logfaults.lost(self.error, self.dropped_total)
        return logfaults.lost(None, 0) if self.removed else ""

    @property
    def trouble(self) -> str:
        """The log's fault in the system's words, for the node's alert ("" when none)."""
        if self.error is not None:
            return self.error.strerror or str(self.error)
        return logfaults.REMOVED if self.removed else ""

    def _write(self, data: bytes) -> None:
        if self.log_fd is None:
            self.dropped += len(data)
            self.dropped_total += len(data)
            return
        if self.dropped:
            marker = f"\n[gpuplatform] {self.dropped} bytes of output dropped here: " + (
                f"{self.error.strerror if self.error else 'write error'}\n"
            )
            if not self._write_all(marker.encode()):
                self.dropped += len(data)
                self.dropped_total += len(data)
                return
            self.dropped = 0
        if not self._write_all(data):
            self.dropped += len(data)
            self.dropped_total += len(data)

    def _write_all(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.log_fd, view)
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self._failed(exc)
                return False
            view = view[written:]
        return True

    def _failed(self, exc: OSError) -> None:
        self.error = exc


def _open_log(path: Path, flags: int) -> int:
    """The attempt's log, its task's and tenant's directories made again (``0700``) when they
    were removed since the launch made them: an operator's clean-up, or a log disk that failed
    and says why only when one is made (read-only, full)."""
    try:
        return os.open(path, flags, 0o640)
    except FileNotFoundError:
        for directory in (path.parent.parent, path.parent):
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                pass
        return os.open(path, flags, 0o640)


def fds(fd: int | None) -> list[int]:
    return [] if fd is None else [fd]
