"""The websocket every live page opens: ``/ws/live/``.

Browsers authenticate with their session, scripts with an API token (``Authorization: Bearer``),
as ``tenants.access.caller_for`` reads them.
Operators join the operators' group, everyone else the groups of their tenants; the groups carry
only what their members may see (live.events), so a consumer needs no per-event filtering.

Back-pressure: events (task, GPU, node, alert changes) are sent as they come. Samples are
coalesced, the newest per GPU, and sent as numbered frames; the browser acknowledges each, and
while LIVE_UNACKED_FRAMES are unacknowledged newer samples replace older ones instead of
queueing. A slow browser loses old points; the node agent never waits for it.
"""

from __future__ import annotations

import json
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.utils import translation

from gpuplatform.language import scope_language
from live import selectors
from live.events import SAMPLE_FIELDS
from scheduling import reasons
from tenants import access

# More events than this in one message (a pass that placed thousands of tasks): the page is told
# to catch up from the database instead of applying them one by one.
MAX_EVENTS = 1000


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.caller = await database_sync_to_async(access.caller_for)(self.scope)
        self.joined = selectors.groups_for(self.caller) if self.caller else []
        if not self.joined:
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        self.language = scope_language(self.scope)
        self.samples: dict[int, list] = {}
        self.seq = 0
        self.acked = 0
        await self.accept()
        await self.send_json(
            {
                "type": "hello",
                "operator": self.caller.operator,
                "tenant_ids": sorted(self.caller.tenant_ids),
                "server_time": time.time(),
                "unacked_frames": settings.LIVE_UNACKED_FRAMES,
                "sample_fields": SAMPLE_FIELDS,
            }
        )

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "ack":
            seq = content.get("seq")
            if not isinstance(seq, int) or not 0 <= seq <= self.seq:
                await self._error("seq", f"expected a frame number from 0 to {self.seq}")
                return
            self.acked = max(self.acked, seq)
            await self._flush()
        elif kind == "catch_up":
            since = content.get("since")
            if not isinstance(since, int | float) or isinstance(since, bool):
                await self._error("since", "expected seconds since the epoch (a number)")
                return
            answer = await database_sync_to_async(selectors.catch_up)(
                caller=self.caller, since=float(since)
            )
            answer["events"] = self._localized(answer["events"])
            await self.send_json({"type": "catch_up", **answer})
        else:
            await self._error("type", "expected 'ack' or 'catch_up'")

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        try:
            await super().receive(text_data=text_data, bytes_data=bytes_data, **kwargs)
        except ValueError:
            await self._error("message", "expected a JSON object")

    async def live_batch(self, message: dict) -> None:
        """Events go out at once; samples wait while the page has too many frames unread (the
        newest per GPU replaces the older), so a slow page gets fewer, not later, samples."""
        events = []
        for event in message["events"]:
            if event["kind"] == "samples":
                for row in event["rows"]:
                    self.samples[row[0]] = row
            else:
                events.append(event)
        if len(events) > MAX_EVENTS:
            await self.send_json({"type": "resync"})
        elif events:
            await self.send_json({"type": "events", "events": self._localized(events)})
        await self._flush()

    def _localized(self, events: list[dict]) -> list[dict]:
        """The events with each task's reason rendered in this reader's language from its
        code and parameters (``scheduling.reasons``); events without a code as they came."""
        if not any(event.get("reason_code") or event.get("kind") == "reasons" for event in events):
            return events
        with translation.override(self.language):
            return [
                {
                    **event,
                    "reason": reasons.render(
                        event["reason_code"], event.get("reason_params"), event.get("reason", "")
                    ),
                }
                if event.get("reason_code")
                else {**event, "reasons": [_rendered(*row) for row in event["reasons"]]}
                if event.get("kind") == "reasons"
                else event
                for event in events
            ]

    async def _flush(self) -> None:
        if self.samples and self.seq - self.acked < settings.LIVE_UNACKED_FRAMES:
            rows, self.samples = list(self.samples.values()), {}
            self.seq += 1
            await self.send_json({"type": "samples", "seq": self.seq, "rows": rows})

    async def _error(self, field: str, message: str) -> None:
        await self.send_json({"type": "error", "field": field, "message": message})


def _rendered(task_id: int, reason: str, code: str = "", params: dict | None = None) -> list:
    """One row of a "reasons" event, [task id, reason], the reason in the active language."""
    if isinstance(params, str):  # a raw row's jsonb comes as its text (Django's loader)
        params = json.loads(params)
    return [task_id, reasons.render(code, params, reason)]
