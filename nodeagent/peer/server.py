"""A small threaded HTTP server in the node agent process, serving signed requests only.

The standard library's ThreadingHTTPServer is enough here: a handful of requests a second per
open log tail, answered from local files. (Twisted, which daphne brings, would add its weight to
every node agent for this.) Each request is checked against this node's key before its route
runs; a request without a valid signature answers 401 and reaches no route. A route may answer
with a tunnel (``Reply.tunnel``): the connection is then spliced with a loopback port on its
thread until both sides end (``splice``), one thread per open tunnel.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from scheduling import nodelink

logger = logging.getLogger(__name__)

SPLICE_CHUNK = 64 * 1024
POLL_S = 60.0  # how often an idle server's loop looks at its stop flag (``PeerServer.stop``)


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    params: dict[str, str]  # the last value of each query parameter
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case
    node: str = ""  # this node's name


@dataclass
class Reply:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    tunnel: tuple[str, int] | None = None  # 101: splice the connection with this address

    @classmethod
    def error(cls, status: int, message: str) -> Reply:
        body = json.dumps({"error": message}).encode()
        return cls(status, body, {"Content-Type": "application/json"})


Route = Callable[[Request], Reply]


class Router:
    """Routes by the first segment of the path: ``/logs/...`` goes to the ``logs`` route."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Route] = {}

    def add(self, method: str, name: str, route: Route) -> None:
        self.routes[(method, name)] = route

    def dispatch(self, request: Request) -> Reply:
        name = request.path.strip("/").split("/", 1)[0]
        route = self.routes.get((request.method, name))
        if route is None:
            return Reply.error(404, f"no route {request.method} /{name}/")
        return route(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a tail's polls reuse one connection
    # Headers and body go out as two writes: with Nagle's algorithm the body would wait for the
    # client's delayed ACK of the headers, a stall on every poll of a live tail.
    disable_nagle_algorithm = True
    timeout = 60  # an idle or stalled connection lets its thread go
    server_version = "gpuplatform-node"
    sys_version = ""
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self._answer("GET")

    def _answer(self, method: str) -> None:
        node = self.server.node_name
        signed = self.headers.get("Authorization") or ""
        why = nodelink.check(node, method, self.path, signed)
        if why is not None:
            reply = Reply.error(401, why)
        else:
            parts = urlsplit(self.path)
            params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            try:
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = Request(method, parts.path, params, headers, node)
                reply = self.server.router.dispatch(request)
            except Exception:
                logger.exception("node %s: %s %s failed", node, method, parts.path)
                reply = Reply.error(500, "the node agent failed to answer: see its log")
        if reply.tunnel is not None:
            reply = self._tunnel(node, signed, reply.tunnel)
            if reply is None:
                return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header(
            nodelink.PROOF_HEADER, nodelink.proof(node, signed, reply.status, reply.body)
        )
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def _tunnel(self, node: str, signed: str, address: tuple[str, int]) -> Reply | None:
        """Answer 101 and splice this connection with ``address`` until both are done (None);
        a 502 Reply when nothing listens there."""
        try:
            upstream = socket.create_connection(address, timeout=nodelink.CONNECT_TIMEOUT_S)
        except OSError as exc:
            return Reply.error(502, f"nothing answers at port {address[1]}: {exc.strerror}")
        with upstream:
            self.send_response(101)
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", nodelink.TUNNEL_PROTOCOL)
            self.send_header(nodelink.PROOF_HEADER, nodelink.proof(node, signed, 101, b""))
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            splice(self.connection, upstream)
        return None

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        logger.debug("node %s peer: %s", self.server.node_name, format % args)


def splice(a: socket.socket, b: socket.socket) -> None:
    """Relay bytes both ways between ``a`` and ``b`` until each side has ended what it sends
    (an end is passed on as a half-close) or either fails. Blocking sends: a slow reader holds
    back its writer, as a direct connection would."""
    peers = {a: b, b: a}
    open_ = {a, b}  # the sockets still sending
    for sock in peers:
        sock.settimeout(None)  # a websocket may stay quiet for hours
    with selectors.DefaultSelector() as selector:
        for sock in peers:
            selector.register(sock, selectors.EVENT_READ)
        while open_:
            for key, _ in selector.select():
                sock = key.fileobj
                try:
                    data = sock.recv(SPLICE_CHUNK)
                    if data:
                        peers[sock].sendall(data)
                        continue
                    peers[sock].shutdown(socket.SHUT_WR)
                except OSError:
                    return
                selector.unregister(sock)
                open_.discard(sock)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    node_name: str
    router: Router


class PeerServer:
    """Serve ``router`` for node ``node_name`` on ``host:port`` (port 0: a free one) on a
    thread of its own. ``address`` is what to advertise once started."""

    def __init__(self, *, node_name: str, host: str, port: int, router: Router) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("_PeerServer", (_Server,), {"address_family": family})
        self.httpd = server_class((host, port), _Handler)
        self.httpd.node_name = node_name
        self.httpd.router = router
        self.advertised_host = host
        # Idle, the server's loop wakes only this often (a request wakes it at once); ``stop``
        # wakes it with a connection of its own instead of waiting.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, args=(POLL_S,), name="node-peer", daemon=True
        )

    @property
    def address(self) -> str:
        return nodelink.format_address(self.advertised_host, self.httpd.server_address[1])

    def start(self) -> PeerServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread.is_alive():
            # shutdown() waits for the loop to look at its flag, which it does when a select
            # ends: a connection ends it (refused or not, it is answered by nothing).
            stopper = threading.Thread(target=self.httpd.shutdown, daemon=True)
            stopper.start()
            while stopper.is_alive():
                self._poke()
                stopper.join(0.05)
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def _poke(self) -> None:
        host, port = self.httpd.server_address[:2]
        if host in ("0.0.0.0", "::"):  # noqa: S104 - a wildcard bind: reach it on loopback
            host = "::1" if ":" in host else "127.0.0.1"
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            pass
