"""Reading a task's log through the API: by byte offset (to follow it) or its last lines.

Logs are files on the node that ran the attempt. Where the file is on this host (one host, or a
shared filesystem) it is read here; otherwise the byte range is asked of the node's agent at
the address it advertises (``scheduling.nodelink``). A node that cannot be reached makes the
read fail with ``LogUnavailable`` and its reason: never an empty log passed off as the whole.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from scheduling import nodelink
from scheduling.models import Task, TaskAttempt

MAX_READ = 1024 * 1024
TAIL_WINDOW = 256 * 1024
OFFSET_HEADER = "X-Log-Offset"
SIZE_HEADER = "X-Log-Size"
MAX_WAIT_S = 30  # the longest a read may wait for new bytes (``wait``)
WAIT_STEP_S = 0.05  # how often a waiting read looks at the file's size


class NoLog(Exception):
    pass


class LogUnavailable(Exception):
    """The log is on a node that cannot be reached now; the message says why."""


@dataclass(frozen=True)
class Where:
    """Where an attempt's log lives: its path on the node that ran it, and that node's agent
    (blank address: the control plane's own host)."""

    path: str
    node: str = ""
    address: str = ""

    @classmethod
    def of(cls, attempt: TaskAttempt) -> Where:
        node = attempt.node if attempt.node_id else None
        return cls(
            attempt.log_path, node.name if node else "", node.advertise_address if node else ""
        )

    @property
    def local(self) -> bool:
        """Read here: the node is this host, or the file is here, in this host's TASK_LOG_DIR
        (a shared filesystem). Another agent's directory on this host is asked of that agent,
        as another host's would be."""
        if not self.address:
            return True
        return Path(self.path).is_relative_to(settings.TASK_LOG_DIR) and os.path.exists(self.path)


def read_range(
    path: Path, *, offset: int | None = None, tail: int | None = None, limit: int | None = None
) -> tuple[int, bytes, int]:
    """(start, bytes, size of the file) of a local log: from ``offset`` at most ``limit``
    bytes, or, with ``tail`` and no offset, its last ``tail`` lines."""
    size = path.stat().st_size if path.exists() else 0
    limit = min(limit or MAX_READ, MAX_READ)
    if tail is not None and offset is None:
        start = max(0, size - TAIL_WINDOW)
        lines = _read(path, start, size - start).splitlines(keepends=True)
        kept = b"".join(lines[-tail:]) if tail else b""
        return size - len(kept), kept, size
    start = min(offset or 0, size)
    return start, _read(path, start, limit), size


def wait_local(path: Path, offset: int, timeout: float) -> None:
    """Return once the local log at ``path`` is longer than ``offset``, or after ``timeout``
    seconds (a node agent's waiting read, on its own thread)."""
    deadline = time.monotonic() + timeout
    while _size(path) <= offset and time.monotonic() < deadline:
        time.sleep(WAIT_STEP_S)


def _size(path: Path | str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def fetch(
    where: Where, *, offset: int | None = None, tail: int | None = None, limit: int | None = None
) -> tuple[int, bytes, int]:
    """``read_range`` of the log wherever it is: here, or from its node's agent."""
    if where.local:
        return read_range(Path(where.path), offset=offset, tail=tail, limit=limit)
    params = {"path": where.path, "offset": offset, "tail": tail, "limit": limit}
    try:
        answer = nodelink.get(where.node, where.address, "/logs/", params)
    except nodelink.NodeUnreachable as exc:
        raise LogUnavailable(str(exc)) from None
    if answer.status == 404:  # not written yet: as a missing local file reads
        return 0, b"", 0
    if answer.status != 200:
        raise LogUnavailable(f"node {where.node} answered {answer.status} for the log")
    return int(answer.headers[OFFSET_HEADER]), answer.body, int(answer.headers[SIZE_HEADER])


def size_of(where: Where) -> int:
    """The log's size in bytes, wherever it is."""
    if where.local:
        return _size(where.path)
    return fetch(where, offset=0, limit=1)[2]


def read(
    task: Task,
    *,
    attempt: int | None = None,
    offset: int | None = None,
    tail: int | None = None,
    limit: int | None = None,
) -> dict:
    number = attempt or task.attempt
    row = attempt_row(task, number)
    if row is None or not row.log_path:
        raise NoLog(f"no log for attempt {number}" if number else "the task has not started yet")
    start, data, size = fetch(Where.of(row), offset=offset, tail=tail, limit=limit)
    return {
        "attempt": number,
        "offset": start,
        "next_offset": start + len(data),
        "size": size,
        "text": data.decode("utf-8", errors="replace"),
        "finished": bool(row.outcome) and start + len(data) >= size,
    }


def _read(path: Path, start: int, length: int) -> bytes:
    if length <= 0 or not path.exists():
        return b""
    with open(path, "rb") as handle:
        handle.seek(start, os.SEEK_SET)
        return handle.read(length)


def attempt_row(task: Task, number: int) -> TaskAttempt | None:
    """Attempt ``number`` of ``task`` (a task the caller may read), with where its log is."""
    return (
        TaskAttempt.objects.filter(task=task, number=number)
        .select_related("node")
        .only("number", "log_path", "outcome", "node__name", "node__advertise_address")
        .first()
    )


def attempt_ended(attempt_id: int) -> bool:
    return TaskAttempt.objects.filter(pk=attempt_id).exclude(outcome="").exists()
