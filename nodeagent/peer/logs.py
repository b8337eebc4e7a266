"""The ``logs`` route: a byte range (or the tail) of one of this node's task logs.

The control plane names the log by the path this node recorded for the attempt; the route
serves only regular files under this node's TASK_LOG_DIR. The body is the raw bytes; the
headers say where they start and how large the log is. A log not written yet answers 404.
With ``wait`` (seconds) and an offset, the answer waits until the log is longer than the
offset, at most that long: the web's long-poll of a live tail (``scheduling.logs``).
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from nodeagent.peer.server import Reply, Request
from scheduling import logs


def serve_log(request: Request) -> Reply:
    try:
        offset = _whole(request.params, "offset")
        tail = _whole(request.params, "tail")
        limit = _whole(request.params, "limit")
        wait = _whole(request.params, "wait")
    except ValueError as exc:
        return Reply.error(400, str(exc))
    path = Path(request.params.get("path", "")).resolve()
    root = Path(settings.TASK_LOG_DIR).resolve()
    if not path.is_relative_to(root) or path == root:
        return Reply.error(403, "path: not a log of this node")
    if wait and offset is not None:
        logs.wait_local(path, offset, min(wait, logs.MAX_WAIT_S))
    if not path.is_file():
        return Reply.error(404, "path: no such log (yet)")
    start, data, size = logs.read_range(path, offset=offset, tail=tail, limit=limit)
    headers = {
        "Content-Type": "application/octet-stream",
        logs.OFFSET_HEADER: str(start),
        logs.SIZE_HEADER: str(size),
    }
    return Reply(200, data, headers)


def _whole(params: dict[str, str], name: str) -> int | None:
    text = params.get(name)
    if text is None:
        return None
    if not text.isdigit():
        raise ValueError(f"{name}: a whole number is required")
    return int(text)
