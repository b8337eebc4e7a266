"""Websockets: a path no consumer serves is closed cleanly (4404), without a traceback."""

import logging

import pytest
from channels.testing import WebsocketCommunicator

from gpuplatform.asgi import application
from gpuplatform.routing import CLOSE_NOT_FOUND

ORIGIN = [(b"origin", b"http://localhost")]  # AllowedHostsOriginValidator wants one (NOTES.md)


@pytest.mark.asyncio
async def test_an_unknown_path_is_closed_with_4404_and_nothing_logged(caplog):
    communicator = WebsocketCommunicator(application, "/ws/nowhere/", headers=ORIGIN)
    with caplog.at_level(logging.WARNING):
        connected, _ = await communicator.connect()
        assert connected
        assert await communicator.receive_output() == {
            "type": "websocket.close",
            "code": CLOSE_NOT_FOUND,
        }
        await communicator.wait()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.asyncio
async def test_a_foreign_origin_is_still_refused():
    communicator = WebsocketCommunicator(
        application, "/ws/nowhere/", headers=[(b"origin", b"http://evil.example")]
    )
    connected, _ = await communicator.connect()
    assert not connected
