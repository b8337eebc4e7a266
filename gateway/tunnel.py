"""Reaching a service on another host through that node's agent (``nodeagent.peer``'s
``services`` route), as its logs are reached: the service's port stays on the node's loopback.

``open_socket`` connects to the node's advertised address, asks for a tunnel to the replica's
port with a request signed for that node, that task and that port (``scheduling.nodelink``),
and checks that the 101 carries the node's proof; the socket is then a plain connection to
the service. Websockets use it as it is (``sockets``); HTTP goes through ``Backend``, an
httpcore network backend that opens a tunnel where httpx would open a TCP connection, so that
httpx's pool keeps tunnels open between requests like any connection.
"""

from __future__ import annotations

import asyncio
import hmac
import select
import socket
from urllib.parse import urlencode

import httpcore
import httpx

from scheduling import nodelink
from scheduling.selectors import Upstream

SUFFIX = ".node-tunnel.invalid"  # the pool's name for a replica reached through its node
HEAD_LIMIT = 16 * 1024


class TunnelRefused(OSError):
    """The node did not open the tunnel: the message says why."""


def through_node(replica: Upstream) -> bool:
    """A replica whose node advertises an address is reached through that node's agent; a
    blank address is the control plane's own host, reached on its loopback."""
    return bool(replica.advertise_address)


def target(replica: Upstream) -> str:
    query = urlencode({"port": replica.port, "task": replica.task_id})
    return f"/services/?{query}"


async def open_socket(replica: Upstream, *, timeout: float) -> socket.socket:
    """A non-blocking socket that reaches ``replica``'s service through its node's agent;
    TunnelRefused when the node answers otherwise, OSError or TimeoutError when it does not."""
    return await asyncio.wait_for(_open(replica), timeout)


async def _open(replica: Upstream) -> socket.socket:
    loop = asyncio.get_running_loop()
    try:
        host, port = nodelink.parse_address(replica.advertise_address)
    except Exception as exc:  # ImproperlyConfigured: a bad address on the node's row
        raise TunnelRefused(f"node {replica.node_name}: {exc}") from None
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"node {replica.node_name}: no address for {host}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        try:
            await _handshake(loop, sock, replica)
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error


async def _handshake(loop, sock: socket.socket, replica: Upstream) -> None:
    path = target(replica)
    signed = nodelink.authorization(replica.node_name, "GET", path)
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {replica.advertise_address}\r\n"
        f"Authorization: {signed}\r\nConnection: Upgrade\r\n"
        f"Upgrade: {nodelink.TUNNEL_PROTOCOL}\r\n\r\n"
    )
    await loop.sock_sendall(sock, request.encode("latin-1"))
    # Byte by byte up to the end of the head: what follows a 101 is the service's.
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        byte = await loop.sock_recv(sock, 1)
        if not byte or len(head) > HEAD_LIMIT:
            raise TunnelRefused(f"node {replica.node_name} closed the tunnel's handshake")
        head += byte
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    parts = status_line.split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    body = b""
    if status != 101:
        length = int(fields.get("content-length", "0") or 0)
        while len(body) < min(length, HEAD_LIMIT):
            chunk = await loop.sock_recv(sock, length - len(body))
            if not chunk:
                break
            body += chunk
    expected = nodelink.proof(replica.node_name, signed, status, body)
    if not hmac.compare_digest(fields.get(nodelink.PROOF_HEADER.lower(), ""), expected):
        raise TunnelRefused(
            f"what answers at {replica.advertise_address} ({status}) is not node "
            f"{replica.node_name}'s agent"
        )
    if status != 101:
        reason = nodelink.error_of(body)
        raise TunnelRefused(f"node {replica.node_name} refused the tunnel: {status} {reason}")


def pool_host(replica: Upstream) -> str:
    """The name under which httpx pools the tunnels to ``replica`` (with its port)."""
    return f"task-{replica.task_id}{SUFFIX}"


class Backend(httpcore.AsyncNetworkBackend):
    """httpcore's own backend, but a connection to ``pool_host(replica)`` is a tunnel through
    the replica's node (``remember`` says which replica a name stands for)."""

    def __init__(self) -> None:
        self.plain = httpcore.AnyIOBackend()
        self.replicas: dict[tuple[str, int], Upstream] = {}

    def remember(self, replica: Upstream) -> tuple[str, int]:
        key = (pool_host(replica), replica.port)
        self.replicas[key] = replica
        return key

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        replica = self.replicas.get((host, port))
        if replica is None:
            return await self.plain.connect_tcp(host, port, timeout, local_address, socket_options)
        try:
            sock = await open_socket(replica, timeout=timeout or nodelink.CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        reader, writer = await asyncio.open_connection(sock=sock)
        return Stream(reader, writer)

    async def connect_unix_socket(self, *args, **kwargs):
        return await self.plain.connect_unix_socket(*args, **kwargs)

    async def sleep(self, seconds: float) -> None:
        await self.plain.sleep(seconds)


class Stream(httpcore.AsyncNetworkStream):
    """An asyncio stream pair as httpcore's network stream (plain TCP: no TLS on a tunnel)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return await asyncio.wait_for(self.reader.read(max_bytes), timeout)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self.writer.write(buffer)
            await asyncio.wait_for(self.writer.drain(), timeout)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass

    async def start_tls(self, *args, **kwargs):
        raise httpcore.ConnectError("no TLS inside a node's tunnel")

    def get_extra_info(self, info: str):
        sock = self.writer.get_extra_info("socket")
        if info == "is_readable":  # a kept connection the other side has closed
            return sock is not None and bool(select.select([sock], [], [], 0)[0])
        if info == "socket":
            return sock
        return None


def transport(backend: Backend, **options) -> httpx.AsyncHTTPTransport:
    """httpx's transport with ``backend`` under its pool. httpx takes no network backend of
    its own, so its pool is rebuilt with the same limits and this backend."""
    made = httpx.AsyncHTTPTransport(**options)
    limits = options.get("limits") or httpx.Limits()
    made._pool = httpcore.AsyncConnectionPool(  # noqa: SLF001 - httpx offers no other way
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=backend,
    )
    return made


BACKEND = Backend()  # the gateway's one: its pool and the replicas its names stand for
