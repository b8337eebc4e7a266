"""The websocket side of ``/services/<task id>/...`` (Jupyter's kernels): the handshake is
made with a replica first, then accepted with the subprotocol the service chose, and frames
are relayed both ways until either side closes.

A caller who may not reach the service is answered as a path nobody serves (accepted, then
closed with 4404: ``gpuplatform.routing``), so a refusal says nothing about what exists.
"""

from __future__ import annotations

import asyncio
import re

from channels.db import database_sync_to_async
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from gateway import headers, tunnel, upstream
from gateway.upstream import Route

CLOSE_NOT_FOUND = 4404  # as gpuplatform.routing's catch-all
CLOSE_TRY_AGAIN = 4503  # no replica up: HTTP 503 in the range left to applications
OPEN_TIMEOUT_S = 10.0
HOST = re.compile(r"^[A-Za-z0-9.\-]+(:[0-9]+)?$|^\[[0-9A-Fa-f:.]+\](:[0-9]+)?$")


async def _refuse(send, code: int, reason: str = "") -> None:
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code, "reason": reason})


async def _open(scope, route: Route) -> ClientConnection | None:
    """A websocket to the first replica in turn that takes it, with the client's path, Host
    and Origin (a server behind a proxy compares them), or None."""
    sent = headers.upstream_request(scope, route, websocket=True)
    given = dict(scope.get("headers") or [])
    host = given.get(b"host", b"").decode("latin-1")
    origin = given.get(b"origin", b"").decode("latin-1") or None
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    resource = (path + (b"?" + query if query else b"")).decode("latin-1")
    if not HOST.match(host):
        host = ""  # none, or an odd one: the service's own address stands in
    for replica in upstream.rotation(route):
        where: dict = {}
        try:
            if tunnel.through_node(replica):  # the node's agent relays to the service's port
                where["sock"] = await tunnel.open_socket(replica, timeout=OPEN_TIMEOUT_S)
                address, port = "127.0.0.1", replica.port
            else:
                address, port = upstream.address(replica)
                where.update(host=address, port=port)
            uri = f"ws://{host or f'{address}:{port}'}{resource}"
            return await connect(
                uri, **where, origin=origin, additional_headers=sent,
                subprotocols=scope.get("subprotocols") or None, open_timeout=OPEN_TIMEOUT_S,
                ping_interval=None, max_size=None, compression=None, user_agent_header=None,
            )  # fmt: skip
        except (OSError, WebSocketException, TimeoutError):
            if "sock" in where:
                where["sock"].close()
            continue
    return None


class ServiceSocket:
    """ASGI app for websockets under ``services/<task_id>/`` (a Channels route, inside the
    origin check and the session and auth middleware)."""

    async def __call__(self, scope, receive, send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        task_id = int(scope["url_route"]["kwargs"]["task_id"])
        route = await database_sync_to_async(upstream.resolve)(scope, task_id)
        if route is None:
            await _refuse(send, CLOSE_NOT_FOUND)
            return
        service = await _open(scope, route) if route.replicas else None
        if service is None:
            await _refuse(send, CLOSE_TRY_AGAIN, "no replica of this service is up")
            return
        await send({"type": "websocket.accept", "subprotocol": service.subprotocol})
        outward = asyncio.ensure_future(self._to_service(receive, service))
        inward = asyncio.ensure_future(self._to_client(service, send))
        try:
            await asyncio.wait({outward, inward}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (outward, inward):
                task.cancel()
            await asyncio.gather(outward, inward, return_exceptions=True)
            await service.close()

    @staticmethod
    async def _to_service(receive, service: ClientConnection) -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await service.close(code=message.get("code", 1000) or 1000)
                return
            if message["type"] != "websocket.receive":
                continue
            data = message.get("bytes")
            await service.send(data if data is not None else message.get("text", ""))

    @staticmethod
    async def _to_client(service: ClientConnection, send) -> None:
        try:
            async for data in service:
                key = "bytes" if isinstance(data, bytes) else "text"
                await send({"type": "websocket.send", key: data})
        except ConnectionClosed:
            pass
        code = service.close_code or 1000
        if code in (1005, 1006, 1015):  # reserved: never sent in a close frame
            code = 1000
        await send({"type": "websocket.close", "code": code})
