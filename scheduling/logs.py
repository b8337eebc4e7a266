"""Reading a task's log through the API: by byte offset (to follow it) or its last lines.

Logs are files on the node that ran the attempt; the web process reads them where it can see
them (one host, or a shared filesystem for TASK_LOG_DIR).
"""

from __future__ import annotations

import os
from pathlib import Path

from scheduling.models import Task, TaskAttempt

MAX_READ = 1024 * 1024
TAIL_WINDOW = 256 * 1024


class NoLog(Exception):
    pass


def read(
    task: Task,
    *,
    attempt: int | None = None,
    offset: int | None = None,
    tail: int | None = None,
    limit: int | None = None,
) -> dict:
    number = attempt or task.attempt
    row = TaskAttempt.objects.filter(task=task, number=number).first()
    if row is None or not row.log_path:
        raise NoLog(f"no log for attempt {number}" if number else "the task has not started yet")
    path = Path(row.log_path)
    size = path.stat().st_size if path.exists() else 0
    limit = min(limit or MAX_READ, MAX_READ)
    if tail is not None and offset is None:
        start = max(0, size - TAIL_WINDOW)
        data = _read(path, start, size - start)
        lines = data.splitlines(keepends=True)
        kept = b"".join(lines[-tail:]) if tail else b""
        start = size - len(kept)
        data = kept
    else:
        start = min(offset or 0, size)
        data = _read(path, start, limit)
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
