"""The long-poll of a live log tail (``GET /api/v1/tasks/<id>/log/?offset=N&wait=S``): the
answer comes as soon as the log has bytes beyond the offset or its attempt ends, at most S
seconds later.

The API view makes the first read on its pool thread as any read; when that has nothing new,
the waiting goes on in an async generator on the web server's event loop (the answer is a
streamed one), so a waiting follower holds no thread of the web's small pool. A local log's
size is looked at every ``logs.WAIT_STEP_S``; a log on another node is asked of its agent with
``wait`` (the agent waits on its own side); every ``SLICE_S`` the attempt's end is checked in
the database. Then the read is made again and sent whole.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from channels.db import database_sync_to_async

from scheduling import logs, nodelink
from scheduling.models import Task

SLICE_S = 1  # between checks that the attempt has ended (a whole second: the agent's unit)
HELP = (
    "with `offset`: seconds to wait for bytes beyond it or the attempt's end, answering as "
    "soon as either comes"
)


def nothing_new(chunk: dict) -> bool:
    """A read (``logs.read``) with no bytes past its offset, of an attempt still running."""
    return chunk["next_offset"] == chunk["offset"] and not chunk["finished"]


async def grew(where: logs.Where, offset: int, timeout: float) -> bool:
    """True once the log at ``where`` is longer than ``offset`` (or cannot be asked: the read
    that follows says why), False after ``timeout`` seconds without."""
    if not where.local:
        return await grew_at_node(where, offset, timeout)
    deadline = time.monotonic() + timeout
    while logs.size_of(where) <= offset:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(logs.WAIT_STEP_S)
    return True


async def grew_at_node(where: logs.Where, offset: int, timeout: float) -> bool:
    """``grew`` for a log on another node: its agent waits (``wait``) and answers."""
    params = {"path": where.path, "offset": offset, "limit": 1, "wait": max(1, round(timeout))}
    try:
        answer = await nodelink.aget(
            where.node, where.address, "/logs/", params,
            read_timeout=timeout + nodelink.READ_TIMEOUT_S,
        )  # fmt: skip
    except nodelink.NodeUnreachable:
        return True
    return answer.status != 200 or int(answer.headers.get(logs.SIZE_HEADER, 0)) > offset


async def later(
    task: Task, params: dict, first: dict, wait: float, render: Callable[[dict], dict]
) -> AsyncIterator[bytes]:
    """The body of a waiting read: ``render`` of the read made once the log grew past
    ``first`` (a read with nothing new), its attempt ended, or ``wait`` seconds passed. A read
    that then fails sends ``first`` again: the client asks again and hears why."""
    row = await database_sync_to_async(logs.attempt_row)(task, first["attempt"])
    chunk = first
    if row is not None:
        where = logs.Where.of(row)
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if await grew(where, first["offset"], min(left, SLICE_S)):
                break
            if await database_sync_to_async(logs.attempt_ended)(row.pk):
                break
        try:
            chunk = await database_sync_to_async(logs.read)(task, **params)
        except (logs.NoLog, logs.LogUnavailable):
            chunk = first
    yield json.dumps(render(chunk)).encode()
