"""The PostgreSQL channel layer keeps delivering after its connections die (the database
restarted or failed over): the listener reconnects, catches up with what was sent meanwhile,
and hands no message twice."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from asgiref.sync import sync_to_async
from channels_postgres import db as library_db
from django.db import connection

from gpuplatform.channel_layer import PostgresChannelLayer
from gpuplatform.dburl import current_database_url

APPLICATION = "gpuplatform layer test"


def layer() -> PostgresChannelLayer:
    settings = connection.settings_dict
    return PostgresChannelLayer(
        **{**settings, "TIME_ZONE": None, "OPTIONS": {"application_name": APPLICATION}},
        PSYCOPG_OPTIONS={"min_size": 1, "max_size": 2},
    )


def kill_the_layers_connections() -> int:
    """What a fail-over does to every session: the server ends them."""
    with psycopg.connect(current_database_url(), autocommit=True) as admin:
        return len(
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                [APPLICATION],
            ).fetchall()
        )


async def send(channel_layer, channel: str, message: dict) -> None:
    """Send as a caller does: a connection found dead raises once, the next attempt gets a
    new one."""
    for attempt in range(5):
        try:
            await channel_layer.send(channel, message)
            return
        except psycopg.OperationalError:
            if attempt == 4:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_messages_arrive_after_the_layers_connections_die():
    channel_layer = layer()
    try:
        channel = await channel_layer.new_channel()
        await send(channel_layer, channel, {"type": "test", "n": 1})
        assert (await asyncio.wait_for(channel_layer.receive(channel), 10))["n"] == 1

        receiving = asyncio.create_task(channel_layer.receive(channel))
        await asyncio.sleep(0.2)  # waiting on the listener, as a websocket consumer does

        assert await sync_to_async(kill_the_layers_connections)() >= 1
        await send(channel_layer, channel, {"type": "test", "n": 2})
        assert (await asyncio.wait_for(receiving, 10))["n"] == 2
        # ...and the first message is not handed again by the catch-up.
        await send(channel_layer, channel, {"type": "test", "n": 3})
        assert (await asyncio.wait_for(channel_layer.receive(channel), 10))["n"] == 3
    finally:
        await channel_layer.flush()
        if library_db.connection_pool is not None:
            await library_db.connection_pool.close()
            library_db.connection_pool = None
