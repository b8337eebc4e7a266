"""The HTTP side of ``/services/<task id>/...``: any method, the request body streamed to the
service and its answer streamed back piece by piece as it comes (server-sent events, chunked
and long downloads are never buffered).

The path goes to the service unchanged, prefix included (``X-Forwarded-Prefix`` names it):
what a server given a base URL wants (JupyterLab's ``--ServerApp.base_url=/services/<id>/``).
Each request goes to the next replica in turn; one that refuses the connection is skipped.
"""

from __future__ import annotations

import asyncio
import re

import httpx
from channels.db import database_sync_to_async
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext as _

from gateway import headers, tunnel, upstream
from gateway.upstream import Route
from gpuplatform.language import scope_language
from scheduling.states import TERMINAL

PATH = re.compile(r"^/services/(\d+)(/.*)?$")
# Waiting for a service to accept a connection; answers may take as long as they take.
CONNECT_TIMEOUT_S = 10.0
RETRY = (b"retry-after", b"5")


class Clients:
    """One pooled HTTP client per event loop (daphne runs one; tests may run several)."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
                transport=tunnel.transport(tunnel.BACKEND, limits=limits),
                follow_redirects=False,
                trust_env=False,
            )
            self._client.headers.clear()  # no User-Agent, Accept... of httpx's own
            self._loop = loop
        return self._client


CLIENTS = Clients()


async def plain(send, status: int, text: str, extra: list | None = None) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def not_found(send) -> None:
    await plain(send, 404, _("Not found."))


class Body:
    """The client's request body as the service is sent it: whole when it came in one piece
    (the service gets a Content-Length), else streamed as it arrives."""

    def __init__(self, receive) -> None:
        self.receive = receive
        self.started = False  # the stream began: the request cannot go to another replica
        self.done = asyncio.Event()
        self.disconnected = False

    async def first(self) -> bytes | None:
        """The whole body when it came in one message, else None (``stream`` then)."""
        message = await self.receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True
            self.done.set()
            return b""
        self._head = message.get("body", b"")
        if not message.get("more_body"):
            self.done.set()
            return self._head
        return None

    async def stream(self):
        self.started = True
        yield self._head
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                break
            yield message.get("body", b"")
            if not message.get("more_body"):
                break
        self.done.set()


class ServiceProxy:
    """ASGI app for HTTP requests under ``/services/``: reads the caller's token or session
    itself (``upstream.resolve``), in one trip to a thread."""

    async def __call__(self, scope, receive, send) -> None:
        with translation.override(scope_language(scope)):  # the gateway's own answers
            await self.serve(scope, receive, send)

    async def serve(self, scope, receive, send) -> None:
        match = PATH.match(scope["path"])
        if match is None:
            await not_found(send)
            return
        if match.group(2) is None:  # /services/7 -> /services/7/: relative links resolve
            query = scope.get("query_string", b"")
            location = f"/services/{match.group(1)}/".encode() + (b"?" + query if query else b"")
            await plain(send, 308, "", [(b"location", location)])
            return
        route = await database_sync_to_async(upstream.resolve)(scope, int(match.group(1)))
        if route is None:
            await not_found(send)
            return
        if not route.replicas:
            await self.not_up(send, route)
            return
        await self.forward(scope, receive, send, route)

    @staticmethod
    async def not_up(send, route: Route) -> None:
        """503 saying why. While the service may still come up, the answer asks the browser
        to try again (``Refresh``): a notebook opened as it is submitted appears by itself."""
        page = reverse("portal:task", args=[route.service_id])
        state = route.state.replace("_", " ")
        if route.state in TERMINAL:
            text = _("This service is not running: its task is %(state)s. Its page: %(page)s")
            await plain(send, 503, text % {"state": state, "page": page})
            return
        text = _(
            "This service has no replica up yet (its task is %(state)s): starting, or not "
            "healthy. This page tries again every 5 seconds. Its task's page: %(page)s"
        )
        await plain(send, 503, text % {"state": state, "page": page}, [RETRY, (b"refresh", b"5")])

    async def forward(self, scope, receive, send, route: Route) -> None:
        body = Body(receive)
        whole = await body.first()
        sent_headers = headers.upstream_request(scope, route)
        target = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        client = CLIENTS.get()
        response = None
        for replica in upstream.rotation(route):
            host, port = upstream.address(replica)
            raw = target + (b"?" + query if query else b"")
            url = httpx.URL(scheme="http", host=host, port=port, raw_path=raw)
            # The client's Host goes on; without one, not the name of the node's tunnels.
            own = []
            if tunnel.through_node(replica) and all(n != "host" for n, _ in sent_headers):
                own = [("host", f"127.0.0.1:{replica.port}")]
            request = client.build_request(
                scope["method"],
                url,
                headers=[*own, *sent_headers],
                content=whole if whole is not None else body.stream(),
            )
            try:
                response = await client.send(request, stream=True)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if body.started:
                    break
        if response is None:
            text = _("No replica of this service answered.")
            await plain(send, 502 if body.started else 503, text, [RETRY])
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": headers.downstream_response(response.headers.raw),
                }
            )
            relay = asyncio.ensure_future(self._relay(response, send))
            watch = asyncio.ensure_future(self._watch(body, receive))
            await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
            for task in (relay, watch):
                task.cancel()
            await asyncio.gather(relay, watch, return_exceptions=True)
            if relay.done() and not relay.cancelled() and relay.exception() is not None:
                raise relay.exception()
        finally:
            await response.aclose()

    @staticmethod
    async def _relay(response: httpx.Response, send) -> None:
        try:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError:
            pass  # the service went away mid-answer: end what the client has
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _watch(body: Body, receive) -> None:
        """Returns when the client goes away (an endless event stream then stops)."""
        await body.done.wait()
        if body.disconnected:
            return
        while (await receive())["type"] != "http.disconnect":
            pass
