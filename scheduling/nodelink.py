"""How the control plane reaches a node agent over HTTP, as the API server reaches a kubelet.

A node agent serves what only its host holds (its tasks' logs) on ``NODE_ADVERTISE_ADDRESS``
(``nodeagent.peer``) and records that address on its Node row. Each request carries a signature
made with that node's own key: an HMAC over the method, the node's name, the request target
(path and query) and an expiry. A node checks it against its own name, so a request meant for
one node is refused by any other, and nobody without the platform's secret (a tenant, or a
task running on the node) can make one. Both sides import this module: it holds the request's
form, the signing and the client.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import httpx
import urllib3
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.crypto import salted_hmac

SCHEME = "GpupNode"
PROOF_HEADER = "X-Gpup-Proof"
TUNNEL_PROTOCOL = "gpup-tunnel"  # the Upgrade that turns a request into a tunnel to a service
DEFAULT_PORT = 8470
SIGNATURE_TTL_S = 60  # the clocks of the control plane and the nodes may differ by less
CONNECT_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 3.0


class NodeUnreachable(Exception):
    """The node did not answer, or answered with an error: the reason says which."""


def parse_address(value: str) -> tuple[str, int]:
    """``host[:port]`` (an IPv6 host in brackets) as (host, port); port 0 asks for a free one."""
    try:
        parts = urlsplit(f"//{value.strip()}")
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ImproperlyConfigured(f"NODE_ADVERTISE_ADDRESS: {value!r}: {exc}") from None
    if not host or parts.path or parts.query or parts.username:
        raise ImproperlyConfigured(
            f"NODE_ADVERTISE_ADDRESS: {value!r} is not host[:port] (e.g. 10.0.0.7:{DEFAULT_PORT})"
        )
    return host, DEFAULT_PORT if port is None else port


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _key(node: str) -> bytes:
    return salted_hmac("gpuplatform.nodelink", node, secret=settings.SECRET_KEY).digest()


def _signature(node: str, method: str, target: str, expires: int) -> str:
    message = f"{method}\n{node}\n{target}\n{expires}".encode()
    return hmac.new(_key(node), message, "sha256").hexdigest()


def authorization(node: str, method: str, target: str, *, now: float | None = None) -> str:
    """The Authorization header for ``method target`` sent to ``node``, valid for a minute."""
    expires = int((time.time() if now is None else now) + SIGNATURE_TTL_S)
    return f"{SCHEME} {expires}:{_signature(node, method, target, expires)}"


def check(node: str, method: str, target: str, header: str | None) -> str | None:
    """None when ``header`` authorizes ``method target`` on ``node``, else why not."""
    scheme, _, credential = (header or "").partition(" ")
    expires_text, _, signature = credential.partition(":")
    if scheme != SCHEME or not expires_text.isdigit() or not signature:
        return f"an Authorization header '{SCHEME} <expiry>:<signature>' is required"
    expires = int(expires_text)
    if expires < time.time():
        return "the signature has expired"
    if expires > time.time() + 5 * SIGNATURE_TTL_S:
        return "the signature's expiry is too far ahead"
    if not hmac.compare_digest(signature, _signature(node, method, target, expires)):
        return f"the signature is not valid for node {node}"
    return None


def proof(node: str, authorization: str, status: int, body: bytes) -> str:
    """What the node signs its answer with (PROOF_HEADER): the request's own Authorization,
    the status and the body, under the node's key. The control plane believes only answers
    that carry it: whatever else listens at a node's address (another node, a proxy that
    answers every address) is not taken for the node, nor its 404 for a log not written yet."""
    message = f"{authorization}\n{status}\n".encode() + hashlib.sha256(body).digest()
    return hmac.new(_key(node), message, "sha256").hexdigest()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


# One pool for the process: connections to each node are kept open between a tail's polls.
# A kept connection the node has since closed is tried again once, on a new one; a node that
# refuses or does not answer the connection is not.
_pool = urllib3.PoolManager(
    num_pools=64,
    maxsize=8,
    retries=urllib3.Retry(total=1, connect=0, read=1, status=0, other=0, redirect=0),
    timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
)


def _request(node: str, address: str, path: str, params: dict[str, object]) -> tuple[str, str]:
    """(url, Authorization) of a signed ``GET path?params`` to ``node`` at ``address``."""
    query = urlencode(sorted((k, str(v)) for k, v in params.items() if v is not None))
    target = f"{path}?{query}" if query else path
    try:
        host, port = parse_address(address)
    except ImproperlyConfigured as exc:
        raise NodeUnreachable(f"node {node} advertises a bad address {address!r}") from exc
    return f"http://{format_address(host, port)}{target}", authorization(node, "GET", target)


def _believed(node: str, address: str, signed: str, answer: Answer) -> Answer:
    """``answer`` when the node's proof is on it and it is not a refusal or failure."""
    expected = proof(node, signed, answer.status, answer.body)
    if not hmac.compare_digest(answer.headers.get(PROOF_HEADER, ""), expected):
        raise NodeUnreachable(
            f"node {node} at {address} is unreachable: what answers there ({answer.status}) "
            f"is not node {node}'s agent"
        )
    if answer.status == 401 or answer.status >= 500:
        raise NodeUnreachable(
            f"node {node} at {address} refused: {answer.status} {error_of(answer.body)}"
        )
    return answer


_async: dict[str, object] = {}  # the event loop's client, kept: its connections are reused


def _async_client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    if _async.get("loop") is not loop:
        _async.update(loop=loop, client=httpx.AsyncClient(trust_env=False))
    return _async["client"]


def get(node: str, address: str, path: str, params: dict[str, object]) -> Answer:
    """``GET path?params`` from ``node`` at ``address``, signed; NodeUnreachable when the
    node does not answer, refuses the signature (401) or fails (5xx); a route's own 4xx is
    returned."""
    url, signed = _request(node, address, path, params)
    try:
        reply = _pool.request("GET", url, headers={"Authorization": signed}, redirect=False)
    except urllib3.exceptions.HTTPError as exc:
        reason = str(getattr(exc, "reason", None) or exc)
        if reason.startswith("HTTPConnection("):  # the pool's name for the connection
            reason = reason.partition("): ")[2] or reason
        raise NodeUnreachable(f"node {node} at {address} is unreachable: {reason}") from None
    answer = Answer(reply.status, dict(reply.headers), reply.data)
    return _believed(node, address, signed, answer)


async def aget(
    node: str, address: str, path: str, params: dict[str, object], *, read_timeout: float
) -> Answer:
    """``get`` for the event loop (a long-poll waits there, holding no thread), with a read
    timeout of its own: a waiting route answers only when it has something or its wait ends."""
    url, signed = _request(node, address, path, params)
    timeout = httpx.Timeout(read_timeout, connect=CONNECT_TIMEOUT_S)
    try:
        reply = await _async_client().get(url, headers={"Authorization": signed}, timeout=timeout)
    except httpx.HTTPError as exc:
        raise NodeUnreachable(f"node {node} at {address} is unreachable: {exc}") from None
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in reply.headers.raw}
    return _believed(node, address, signed, Answer(reply.status_code, headers, reply.content))


def error_of(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))[:200]
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", errors="replace")
