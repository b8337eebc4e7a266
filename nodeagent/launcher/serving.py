"""A service's side of its supervisor: the port it is given, and its health check.

The supervisor claims the port before the command starts (``scheduling.agentapi.serving``,
with a bind on this node to see that nothing else listens there), hands it to the task as
``PORT``, then checks ``http://127.0.0.1:PORT/<path>`` every interval from its own watch loop:
one short request at a time, so a service costs its supervisor a request per interval and
nothing in between. Health changes are written to the database at once; an unchanged health
is written again now and then (``REFRESH_S``) so ``health_checked_at`` stays recent.
"""

from __future__ import annotations

import errno
import http.client
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime

REFRESH_S = 60.0  # an unchanged health is written again after this long
MAX_ANSWER = 200  # characters of a failed check's answer kept in its detail


def port_free(host: str, port: int) -> bool:
    """Whether a service could listen on ``host:port`` on this node now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As servers bind (uvicorn, aiohttp, Jupyter): a port in TIME_WAIT is free to them.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


@dataclass
class Check:
    """What one health check found: ``ok``, and what to say about it."""

    ok: bool
    said: str  # "GET /health answered 200 at 12:00:03 UTC", "GET /health: refused at ..."
    at: datetime


def check_host(listen: str) -> str:
    """Where the service is asked, given the address it was told to listen on
    (``SERVICE_HOST``): that address, or the loopback for one that means every address."""
    return "127.0.0.1" if listen in ("", "0.0.0.0", "::") else listen  # noqa: S104


def check_once(port: int, path: str, timeout: float, host: str = "127.0.0.1") -> Check:
    """``GET path`` on the service's port: healthy on a 2xx or 3xx answer within ``timeout``."""
    at = datetime.now(tz=UTC)
    when = at.strftime("%H:%M:%S UTC")
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"User-Agent": "gpuplatform-health"})
        answer = connection.getresponse()
        answer.read(4096)
    except (OSError, http.client.HTTPException) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, TimeoutError | socket.timeout):
            problem = f"no answer within {timeout:g} s"
        return Check(False, f"GET {path}: {problem or type(exc).__name__} at {when}", at)
    finally:
        connection.close()
    ok = 200 <= answer.status < 400
    return Check(ok, f"GET {path} answered {answer.status} at {when}", at)


class HealthWatch:
    """A service's health over its attempt: starting until its first good check (failed checks
    within ``start_period`` do not count), then healthy or unhealthy; ``failures`` failed
    checks in a row past start-up mean it is to be restarted (``give_up``)."""

    def __init__(
        self, port: int, health: dict, *, host: str = "127.0.0.1", started: float | None = None
    ) -> None:
        self.port = port
        self.host = host
        self.path = health["path"]
        self.interval = float(health["interval"])
        self.timeout = float(health["timeout"])
        self.start_period = float(health["start_period"])
        self.limit = int(health["failures"])
        self.started = time.monotonic() if started is None else started
        self.next_at = self.started  # the first check at once: a quick service is seen quickly
        self.health = "starting"
        self.failures = 0  # failed checks in a row that count
        self.last: Check | None = None
        self.written_at = 0.0
        self.give_up = False

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def tick(self, now: float) -> bool:
        """Check once; True when the health changed (``health``)."""
        self.next_at = now + self.interval
        self.last = check_once(self.port, self.path, self.timeout, self.host)
        before = self.health
        if self.last.ok:
            self.failures = 0
            self.health = "healthy"
        elif self.health == "starting" and now - self.started < self.start_period:
            pass  # still loading: a failure does not count yet
        else:
            self.failures += 1
            self.health = "unhealthy"
            self.give_up = self.failures >= self.limit
        return self.health != before

    def detail(self) -> str:
        said = self.last.said if self.last is not None else ""
        return said[: MAX_ANSWER + 100]

    def reason_params(self, node: str) -> dict:
        return {
            "node": node,
            "port": self.port,
            "check": self.detail(),
            "failures": self.failures,
            "limit": self.limit,
        }

    def needs_writing(self, changed: bool, now: float) -> bool:
        if changed or now - self.written_at >= REFRESH_S:
            self.written_at = now
            return True
        return False
