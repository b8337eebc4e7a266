"""Who may reach a service, and where its replicas listen.

``resolve`` asks the tenancy choke point (``tenants.access.caller_for``) who sent a request or
a websocket handshake, then the selectors for the service among that caller's tenants: someone
else's service, like a task that does not exist, is None (404). ``address`` is the one place
that says where a replica is reached: on this host's loopback, or through its node's agent.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace

from django.conf import settings
from django.contrib import auth
from django.http import parse_cookie

from gateway import tunnel
from scheduling import selectors
from scheduling.selectors import Upstream
from scheduling.serviceurl import PREFIX
from tenants import access


@dataclass(frozen=True)
class Route:
    """A service the caller may reach: its id, its tenant's name, who calls, and the replicas
    that take requests now (empty: none is up)."""

    service_id: int
    tenant_name: str
    username: str
    replicas: list[Upstream]
    state: str = ""  # the service's task's

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.service_id}"


def resolve(scope: dict, task_id: int) -> Route | None:
    """The route to service ``task_id`` for the caller of ``scope`` (an ASGI HTTP or websocket
    scope); None for nobody signed in and for a service that is not one of the caller's
    tenants' (both answer 404). One trip to a thread for all of it: the session (unless a token
    is sent), the caller, the service."""
    caller = access.caller_for(_signed_in(scope))
    if caller is None or not caller.tenant_ids:
        return None
    found = selectors.service_replicas(tenant_ids=caller.tenant_ids, pk=task_id)
    if found is None:
        return None
    service, replicas = found
    tenant = next(m.tenant for m in caller.memberships if m.tenant_id == service.tenant_id)
    return Route(service.pk, tenant.name, caller.user.get_username(), replicas, service.state)


def _signed_in(scope: dict) -> dict:
    """``scope`` with the session its cookie names and the user signed in there, as Channels'
    auth middleware gives a websocket's scope (which has them already); a request with an
    ``Authorization`` header is the token's alone and needs neither."""
    headers = dict(scope.get("headers") or [])
    if "user" in scope or b"authorization" in headers:
        return scope
    cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin-1"))
    engine = import_module(settings.SESSION_ENGINE)
    session = engine.SessionStore(cookies.get(settings.SESSION_COOKIE_NAME))
    user = auth.get_user(SimpleNamespace(session=session))
    return {**scope, "user": user, "session": session}


def address(replica: Upstream) -> tuple[str, int]:
    """Where the gateway's HTTP client connects for ``replica``: its node's loopback when the
    node is this host (no advertise address); else the name under which the tunnels through
    the node's agent to the replica's port are pooled (``gateway.tunnel``): a service's port
    is never reached over the network."""
    if not tunnel.through_node(replica):
        return "127.0.0.1", replica.port
    return tunnel.BACKEND.remember(replica)


_turns: dict[int, itertools.count] = {}


def rotation(route: Route) -> list[Upstream]:
    """The route's replicas in round-robin order for one request: each request starts at the
    next replica, and the rest follow in case the first does not answer."""
    replicas = sorted(route.replicas, key=lambda r: r.task_id)
    if len(replicas) < 2:
        return replicas
    turn = next(_turns.setdefault(route.service_id, itertools.count())) % len(replicas)
    return replicas[turn:] + replicas[:turn]
