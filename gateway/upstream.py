"""Who may reach a service, and where its replicas listen.

``resolve`` asks the tenancy choke point (``tenants.access.caller_for``) who sent a request or
a websocket handshake, then the selectors for the service among that caller's tenants: someone
else's service, like a task that does not exist, is None (404). ``address`` is the one place
that says where a replica is reached; the multi-host route (through the node agent) replaces it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from scheduling import selectors
from scheduling.selectors import Replica
from scheduling.serviceurl import PREFIX
from tenants import access


@dataclass(frozen=True)
class Route:
    """A service the caller may reach: its id, its tenant's name, who calls, and the replicas
    that take requests now (empty: none is up)."""

    service_id: int
    tenant_name: str
    username: str
    replicas: list[Replica]

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.service_id}"


def resolve(scope: dict, task_id: int) -> Route | None:
    """The route to service ``task_id`` for the caller of ``scope`` (an ASGI HTTP or websocket
    scope carrying ``user`` and ``session`` from Channels' auth middleware); None for nobody
    signed in and for a service that is not one of the caller's tenants' (both answer 404)."""
    caller = access.caller_for(scope)
    if caller is None or not caller.tenant_ids:
        return None
    found = selectors.service_replicas(tenant_ids=caller.tenant_ids, pk=task_id)
    if found is None:
        return None
    service, replicas = found
    tenant = next(m.tenant for m in caller.memberships if m.tenant_id == service.tenant_id)
    return Route(service.pk, tenant.name, caller.user.get_username(), replicas)


def address(replica: Replica) -> tuple[str, int]:
    """Where to connect for ``replica``: its node's loopback when the node is this host (no
    advertise address), else the node's advertised host at the replica's port. The one function
    that the route through the node agent (many hosts, no open service ports) replaces."""
    if not replica.advertise_address:
        return "127.0.0.1", replica.port
    host = replica.advertise_address
    if host.startswith("["):  # [v6 address]:port
        host = host[1 : host.index("]")]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host, replica.port


_turns: dict[int, itertools.count] = {}


def rotation(route: Route) -> list[Replica]:
    """The route's replicas in round-robin order for one request: each request starts at the
    next replica, and the rest follow in case the first does not answer."""
    replicas = sorted(route.replicas, key=lambda r: r.task_id)
    if len(replicas) < 2:
        return replicas
    turn = next(_turns.setdefault(route.service_id, itertools.count())) % len(replicas)
    return replicas[turn:] + replicas[:turn]
