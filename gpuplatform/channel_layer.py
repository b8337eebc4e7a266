"""channels_postgres's channel layer, with a listener that survives its connection.

The library LISTENs on one connection per process and starts that listener once: when the
connection dies (the database restarted, or failed over to its standby), the listener ends
and the process never delivers another message to its websockets until it is restarted. Here
the listener reconnects (to whichever host of ``DATABASE_URL`` takes writes) with a short
backoff, and then catches up with the messages for this process's channels that were stored
while nobody listened (NOTIFY is not queued for a session that is gone). Catching up reads
those messages without deleting them, unlike the library's start-up, which deletes every
stored message of every process; messages already handed to a queue are not handed again.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import OrderedDict

import psycopg
from channels_postgres import core
from channels_postgres.db import MESSAGE_TABLE
from psycopg import sql

logger = logging.getLogger(__name__)

RECONNECT_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0)  # then 2 s between attempts
REMEMBERED_IDS = 10_000  # message ids already queued, so a catch-up never queues one twice

_CATCH_UP = sql.SQL(
    "SELECT id, channel, message, extract(epoch from expire)::text FROM {table} "
    "WHERE expire > now() AND channel = ANY(%s) ORDER BY id"
).format(table=sql.Identifier(MESSAGE_TABLE))


class PostgresChannelLayer(core.PostgresChannelLayer):
    """The library's layer; its listener reconnects and catches up (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._queued: OrderedDict[int, None] = OrderedDict()

    async def listen_to_all_channels(self) -> None:
        attempt = 0
        while True:
            try:
                await self._listen()
                return  # told to shut down
            except psycopg.Error as exc:
                delay = RECONNECT_DELAYS_S[min(attempt, len(RECONNECT_DELAYS_S) - 1)]
                logger.warning("channel layer: listener lost (%s); reconnecting", exc)
                attempt += 1
            await asyncio.sleep(delay)

    async def _listen(self) -> None:
        conn_info = psycopg.conninfo.make_conninfo("", **self.db_params)
        async with await psycopg.AsyncConnection.connect(
            conninfo=conn_info, autocommit=True
        ) as connection:
            # LISTEN first, then read what is stored: nothing sent in between is missed.
            await connection.execute("LISTEN channels_postgres_messages;")
            channels = list(core.ASYNCIO_EVENT_CHANNEL_MAPPING)
            rows = await (await connection.execute(_CATCH_UP, [channels])).fetchall()
            for message_id, channel, message, expire in rows:
                payload = base64.b64encode(message).decode("utf-8")
                self._queue(message_id, channel, f"{message_id}:{channel}:{payload}:{expire}")
            if self.listener_task_is_running is not None:  # set by receive() before this
                self.listener_task_is_running.set()
            async for event in connection.notifies():
                if event.payload == "1:shutdown":
                    if self.listener_task_is_running is not None:
                        self.listener_task_is_running.clear()
                    return
                message_id, channel = event.payload.split(":", 2)[:2]
                # Another process holds this channel's lock: it delivers the message.
                if not self._channel_advisory_locks.get(channel, False):
                    continue
                self._queue(int(message_id), channel, event.payload)

    def _queue(self, message_id: int, channel: str, payload: str) -> None:
        if message_id in self._queued:
            return
        self._queued[message_id] = None
        while len(self._queued) > REMEMBERED_IDS:
            self._queued.popitem(last=False)
        self._get_or_create_queue(channel).put_nowait(payload)
