"""Websocket routes: each app's consumers, then a catch-all that closes with 4404."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import re_path

from gateway.app import websocket_urlpatterns as gateway_routes
from live.routing import websocket_urlpatterns as live_routes
from portal.routing import websocket_urlpatterns as portal_routes

# The close code for a websocket path that matches no route (HTTP's 404 in the 4000-4999
# range the websocket protocol leaves to applications).
CLOSE_NOT_FOUND = 4404

websocket_urlpatterns: list = [*live_routes, *portal_routes, *gateway_routes]


class UnknownPath(AsyncWebsocketConsumer):
    """Accepts and at once closes with 4404, so the client learns why; channels' URLRouter
    would otherwise raise ValueError("No route found") and log a traceback."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)


def routes() -> list:
    """The registered routes, then the catch-all (which must stay last)."""
    return [*websocket_urlpatterns, re_path(r"", UnknownPath.as_asgi())]
