"""The task page's live log: a websocket that tails the log file the launcher writes
(``scheduling.paths.log_path``) and pushes new bytes as they appear, with the task's
state when it changes. The file is read here when this host sees it, else from the agent of
the node that ran the attempt (``scheduling.logs.fetch``); while that node cannot be reached
the page is told so, with the reason.

Authenticated by the browser's session (or an API token), scoped to the tenant it acts for
(tenants.access.caller_for): a task of another tenant closes with 4404, like a 404; an
anonymous socket closes with 4401, and a bad ``attempt`` parameter with 4400. It polls the
file every POLL_S seconds and the task's row every STATE_EVERY polls, so a line the task
prints reaches the page well within a second (bench/bench_portal.py measures it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import Http404
from django.template.loader import render_to_string
from django.utils import translation
from rest_framework.exceptions import ValidationError

from gpuplatform import query
from gpuplatform.language import scope_language
from portal.controls import controls_for
from portal.views import AttemptQuery
from scheduling import logs, selectors
from scheduling.states import TERMINAL
from tenants import access

logger = logging.getLogger(__name__)

CLOSE_INTERNAL = 1011
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
POLL_S = 0.1
STATE_EVERY = 5  # polls: the task's state is read twice a second
FIRST_CHUNK = 256 * 1024  # at most this much of an existing log on connect (its tail)
MAX_CHUNK = 256 * 1024  # at most this much per message
UNAVAILABLE_POLL_S = 1.0  # how often a node that cannot be reached is asked again


class TaskLogConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.task_id = int(self.scope["url_route"]["kwargs"]["pk"])
        self.language = scope_language(self.scope)
        code = await sync_to_async(self._admit)()
        await self.accept()
        if code:
            await self.close(code=code)
            return
        self.pump = asyncio.ensure_future(self._pump())

    def _admit(self) -> int | None:
        """None when the socket may follow the task (``self.tenant``, ``self.pinned`` set),
        else the close code saying why not."""
        who = access.caller_for(self.scope)
        if who is None:
            return CLOSE_UNAUTHENTICATED
        params = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        try:
            asked = query.parse(AttemptQuery, params)
        except ValidationError:
            return CLOSE_BAD_REQUEST
        self.pinned = asked.get("attempt") or None
        if who.tenant is None:
            return CLOSE_NOT_FOUND
        try:
            selectors.task_get(tenant=who.tenant, pk=self.task_id)
        except Http404:
            return CLOSE_NOT_FOUND
        self.tenant = who.tenant
        return None

    async def disconnect(self, code) -> None:
        pump = getattr(self, "pump", None)
        if pump is not None:
            pump.cancel()

    def _look(self) -> dict:
        """The task's state and the attempt to show (its number and log file, if any), with
        its reason in the reader's language."""
        task = selectors.task_get(tenant=self.tenant, pk=self.task_id)
        number = self.pinned or task.attempt
        attempt = selectors.task_attempt(tenant=self.tenant, task_id=task.pk, number=number)
        with translation.override(self.language):
            reason = task.reason_text
        return {
            "state": task.state,
            "reason": reason,
            "number": number,
            "where": logs.Where.of(attempt) if attempt and attempt.log_path else None,
            "attempt_ended": bool(attempt and attempt.outcome),
            "task_ended": task.state in TERMINAL,
            "controls": controls_for(task),
        }

    async def _pump(self) -> None:
        look = sync_to_async(self._look)
        shown_state = None
        number, where, offset, ended_sent = None, None, 0, False
        unavailable = ""  # the reason last said, while the log's node cannot be reached
        polls = 0
        try:
            while True:
                if polls % STATE_EVERY == 0:
                    seen = await look()
                    if (seen["state"], seen["reason"]) != shown_state:
                        shown_state = (seen["state"], seen["reason"])
                        with translation.override(self.language):
                            html = render_to_string("portal/_state.html", {"state": seen["state"]})
                        await self._send(
                            "state",
                            html=html.strip(),
                            reason=seen["reason"],
                            state=seen["state"],
                            controls=seen["controls"],
                        )
                    if seen["number"] != number or seen["where"] != where:
                        number, where, ended_sent = seen["number"], seen["where"], False
                        offset = None  # the tail's start, once the log can be read
                        if number:
                            await self._send("attempt", attempt=number)
                    attempt_ended = seen["attempt_ended"]
                polls += 1
                if where:
                    try:
                        if offset is None:
                            offset = await asyncio.to_thread(_start_offset, where)
                        data = await asyncio.to_thread(_read_from, where, offset)
                    except logs.LogUnavailable as exc:
                        if str(exc) != unavailable:
                            unavailable = str(exc)
                            await self._send("unavailable", attempt=number, reason=unavailable)
                        await asyncio.sleep(UNAVAILABLE_POLL_S)
                        continue
                    unavailable = ""
                    if data:
                        offset += len(data)
                        await self._send("chunk", attempt=number, offset=offset,
                                         text=data.decode("utf-8", errors="replace"))  # fmt: skip
                        continue
                    if attempt_ended and not ended_sent:
                        ended_sent = True
                        await self._send("ended", attempt=number)
                if seen["task_ended"] and (ended_sent or not where):
                    return  # all said: nothing more will come (a retry reloads the page)
                await asyncio.sleep(POLL_S)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A task of the event loop: nobody awaits it, so say what broke and close.
            logger.exception("log tail of task %s failed", self.task_id)
            await self.close(code=CLOSE_INTERNAL)

    async def _send(self, kind: str, **fields) -> None:
        await self.send(text_data=json.dumps({"type": kind, **fields}))


def _start_offset(where: logs.Where) -> int:
    """Where a newly opened page starts reading: the log's tail, not a huge whole."""
    return max(0, logs.size_of(where) - FIRST_CHUNK)


def _read_from(where: logs.Where, offset: int) -> bytes:
    try:
        return logs.fetch(where, offset=offset, limit=MAX_CHUNK)[1]
    except OSError:
        return b""
