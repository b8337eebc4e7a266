"""Request rates that protect neighbours: every tenant (and every client address without a
valid token) gets an even pace, shared by all web processes through PostgreSQL, and a web
process refuses a client it already knows to be over its rate before doing any work for it.

The rate is a GCRA (generic cell rate algorithm, a token bucket kept as one timestamp): with
``N/period`` a key may send API_THROTTLE_BURST requests at once after a pause (at most N), then
one every period/N. Unlike
fixed windows, a flooding tenant never gets a whole window's budget in a burst at the start of
each window; its accepted requests are spread out, so neighbours see an even, bounded load.

Refused keys are remembered in the process (``Pacer``) for a few seconds. While remembered, the
web server's ASGI entry answers their requests 429 itself (no Django, no database), except one
request per pace interval that goes on to the shared check, and that one first waits (briefly)
until no other client's request is in progress: neighbours go first. The refusal is sent after
the second its Retry-After announces: a client that ignores Retry-After cannot make the server
spin, it waits as a sleeping coroutine.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import threading
import time
from dataclasses import dataclass

from django.conf import settings

from gpuplatform.db import no_flush_wait, server_bound_cursor

PERIODS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400}
# How long a refused key stays remembered after its last refusal.
REMEMBER_S = 5.0
# Refusals answered by the entry point are held this long (their Retry-After).
MAX_HOLD_S = 1.0
# A remembered key's allowed request waits at most this long for neighbours to finish.
MAX_YIELD_S = 0.5
YIELD_STEP_S = 0.005
_MAX_KEYS = 10_000


def parse_rate(rate: str) -> tuple[int, int]:
    """'600/min' -> (600, 60). Periods: s, min, h, day (DRF's spelling)."""
    count, _, period = rate.partition("/")
    return int(count), PERIODS[period]


@dataclass
class Verdict:
    allowed: bool
    wait_s: float  # until the key may send again (0 when allowed)
    next_at: float  # epoch seconds of the key's next slot


# One step of a key's pace. A step lost in a crash of PostgreSQL costs the key one request's
# pace: its commit does not wait for the disk (gpuplatform.db.no_flush_wait), one flush of the
# WAL fewer per API request.
_STEP = """
    WITH taken AS (
        INSERT INTO tenants_ratelimit AS r (key, tat, refused) VALUES (%(key)s, %(first)s, 0)
        ON CONFLICT (key) DO UPDATE SET
          refused = CASE WHEN GREATEST(r.tat, %(now)s) - %(now)s <= %(tol)s
                         THEN 0 ELSE r.refused + 1 END,
          tat = CASE WHEN GREATEST(r.tat, %(now)s) - %(now)s <= %(tol)s
                     THEN GREATEST(r.tat, %(now)s) + %(interval)s ELSE r.tat END
        RETURNING tat, refused)
    SELECT tat, refused, {no_flush_wait} FROM taken
"""


def consume(key: str, rate: str, now: float | None = None) -> Verdict:
    """Take one request from ``key``'s allowance, atomically, in PostgreSQL (one statement)."""
    limit, period = parse_rate(rate)
    interval = period / limit
    # After a pause a key may send a burst of API_THROTTLE_BURST at once (never more than the
    # rate's whole count); a burst of a minute's budget would swamp a process for seconds.
    tolerance = interval * (min(limit, settings.API_THROTTLE_BURST) - 1)
    now = time.time() if now is None else now
    with server_bound_cursor() as cursor:
        cursor.execute(
            _STEP.format(no_flush_wait=no_flush_wait()),
            {"key": key, "now": now, "first": now + interval, "tol": tolerance,
             "interval": interval},
        )  # fmt: skip
        tat, refused, _ = cursor.fetchone()
    next_at = tat - tolerance
    if refused:
        return Verdict(False, max(0.0, next_at - now), next_at)
    return Verdict(True, 0.0, next_at)


class Pacer:
    """Per process: keys refused recently, and when each may next try the shared check."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refused: dict[str, tuple[float, float, float]] = {}  # key: (until, next, step)
        self._good: dict[str, float] = {}  # token prefixes seen valid: until

    def refused(self, key: str, verdict: Verdict, rate: str) -> None:
        limit, period = parse_rate(rate)
        now = time.time()
        with self._lock:
            if len(self._refused) > _MAX_KEYS:
                self._refused.clear()
            self._refused[key] = (now + REMEMBER_S, verdict.next_at, period / limit)

    def authenticated(self, prefix: str) -> None:
        with self._lock:
            if len(self._good) > _MAX_KEYS:
                self._good.clear()
            self._good[prefix] = time.time() + 60

    def is_good(self, prefix: str | None) -> bool:
        return prefix is not None and self._good.get(prefix, 0) > time.time()

    def hold(self, key: str, now: float) -> float | None:
        """None: let the request go on to the shared check (the key is not remembered, or its
        slot has come: this request takes it). Otherwise the seconds until the key's next
        slot: refuse this request."""
        with self._lock:
            entry = self._refused.get(key)
            if entry is None:
                return None
            until, next_at, step = entry
            if until < now:
                del self._refused[key]
                return None
            if now >= next_at:
                self._refused[key] = (until, now + step, step)
                return None
            # Still over its pace: remember it for as long as it keeps trying, or its clients
            # would all reach the shared check together each time the memory lapsed.
            self._refused[key] = (now + REMEMBER_S, next_at, step)
            return next_at - now

    def remembered(self, key: str, now: float) -> bool:
        with self._lock:
            entry = self._refused.get(key)
            return entry is not None and entry[0] >= now

    def clear(self) -> None:
        with self._lock:
            self._refused.clear()
            self._good.clear()


PACER = Pacer()


def token_prefix(authorization: str | None) -> str | None:
    """The stored prefix of a bearer token in an Authorization header, without the database."""
    from tenants.tokens import prefix_of

    if not authorization:
        return None
    scheme, _, secret = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return prefix_of(secret.strip())


def address_key(address: str) -> str:
    return f"addr-{address}"


def token_key(prefix: str) -> str:
    return f"token-{prefix}"


def early_key(address: str, authorization: str | None) -> str:
    """What the entry point can tell about a request before any work: its token's prefix, or,
    for requests with no token this process has seen valid, its client address."""
    prefix = token_prefix(authorization)
    if PACER.is_good(prefix):
        return token_key(prefix)
    return address_key(address)


def too_many_requests_body(wait_s: float) -> tuple[bytes, int]:
    retry_after = max(1, math.ceil(wait_s))
    unit = "second" if retry_after == 1 else "seconds"
    detail = f"Request was throttled. Expected available in {retry_after} {unit}."
    return json.dumps({"detail": detail, "errors": {}}).encode(), retry_after


class EarlyThrottle:
    """ASGI wrapper (HTTP only, /api/ only): answers 429 for keys this process remembers as
    over their rate, before Django sees the request; and lets the request a remembered key
    may still send wait (up to MAX_YIELD_S) until no other client's request is in progress, so
    neighbours go first.

    It also sheds load: daphne runs Django's views one at a time in one thread, so a burst
    that outruns the process queues up in it and every answer comes later and later, until
    clients time out. Past WEB_MAX_IN_FLIGHT API requests already handed to Django, the next
    is answered 503 with Retry-After (no Django, no database)."""

    def __init__(self, app) -> None:
        self.app = app
        self.neighbours_in_flight = 0  # requests of keys not remembered (event loop only)
        self.in_flight = 0  # requests handed to Django and not answered yet (event loop only)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1") or None
        peer = (scope.get("client") or ("",))[0]
        address = client_address(peer, headers.get(b"x-forwarded-for", b"").decode("latin-1"))
        key = early_key(address, authorization)
        now = time.time()
        wait_s = PACER.hold(key, now)
        if wait_s is None:
            if self.in_flight >= settings.WEB_MAX_IN_FLIGHT:
                # Held like a refusal of the pacer, so a client that retries at once cannot
                # make the server spin.
                await asyncio.sleep(BUSY_RETRY_AFTER_S)
                return await _refuse(send, 503, BUSY_DETAIL, BUSY_RETRY_AFTER_S)
            if PACER.remembered(key, now):
                deadline = now + MAX_YIELD_S
                while self.neighbours_in_flight and time.time() < deadline:
                    await asyncio.sleep(YIELD_STEP_S)
                return await self._handle(scope, receive, send)
            self.neighbours_in_flight += 1
            try:
                return await self._handle(scope, receive, send)
            finally:
                self.neighbours_in_flight -= 1
        # Hold the refusal as long as Retry-After says (a sleeping coroutine costs nothing):
        # a client that ignores it still sends at most one request a second per connection.
        wait_s = max(1.0, wait_s)
        await asyncio.sleep(min(wait_s, MAX_HOLD_S))
        body, retry_after = too_many_requests_body(wait_s)
        return await _answer(send, 429, body, retry_after)

    async def _handle(self, scope, receive, send):
        self.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


BUSY_DETAIL = "the server is busy; retry later"
BUSY_RETRY_AFTER_S = 1


async def _refuse(send, status: int, detail: str, retry_after: int) -> None:
    body = json.dumps({"detail": detail, "errors": {}}).encode()
    await _answer(send, status, body, retry_after)


async def _answer(send, status: int, body: bytes, retry_after: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"retry-after", str(retry_after).encode()),
        (b"content-length", str(len(body)).encode()),
    ]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


# --- Client addresses --------------------------------------------------------------------------


def trusted_proxy(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in settings.TRUSTED_PROXY_NETWORKS)


def client_address(peer: str, forwarded_for: str | None) -> str:
    """The client's address: the connecting peer, unless the peer is a trusted proxy; then the
    right-most address in X-Forwarded-For that is not itself a trusted proxy."""
    if not forwarded_for or not trusted_proxy(peer):
        return peer
    for hop in reversed([h.strip() for h in forwarded_for.split(",") if h.strip()]):
        if not trusted_proxy(hop):
            return hop
    return peer
