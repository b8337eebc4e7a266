"""Where the gateway joins the web server: HTTP under ``/services/`` goes to the proxy (without
the API's throttle: a notebook's page loads many files), everything else to Django. Its
websockets are routes of their own among the others (inside the origin check and Channels'
session and auth middleware)."""

from __future__ import annotations

from django.urls import re_path

from gateway.httpproxy import ServiceProxy
from gateway.sockets import ServiceSocket
from gateway.upstream import PREFIX

websocket_urlpatterns = [re_path(r"^services/(?P<task_id>\d+)/", ServiceSocket())]


class ServicesFirst:
    """HTTP requests under /services/ to the gateway, the rest to ``app``."""

    def __init__(self, app) -> None:
        self.app = app
        self.proxy = ServiceProxy()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (
            scope["path"].startswith(PREFIX) or scope["path"] == PREFIX.rstrip("/")
        ):
            return await self.proxy(scope, receive, send)
        return await self.app(scope, receive, send)
