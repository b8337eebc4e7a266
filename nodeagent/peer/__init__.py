"""The node agent's HTTP server for the control plane (``server``) and its routes (``logs``,
``services``).

The control plane reaches a node here for what only the node's host holds; every request is
signed for this node (``scheduling.nodelink``). A new route is a function taking a ``Request``
and returning a ``Reply``, added to the router under the first segment of its path.
"""

from __future__ import annotations

import errno
import logging
import socket

from nodeagent.peer.logs import serve_log
from nodeagent.peer.server import PeerServer, Router
from nodeagent.peer.services import serve_service
from scheduling import nodelink

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1:0"


def router() -> Router:
    """Every route the node serves."""
    routes = Router()
    routes.add("GET", "logs", serve_log)
    routes.add("GET", "services", serve_service)
    return routes


def serve(node_name: str, advertise: str) -> PeerServer:
    """Start the server for ``node_name`` on ``advertise`` (host[:port]; blank: loopback, a
    free port). A host that is not this machine's own address (behind NAT, a name for a
    load balancer) is served on every interface. Returns the started PeerServer."""
    host, port = nodelink.parse_address(advertise or LOOPBACK)
    try:
        server = PeerServer(node_name=node_name, host=host, port=port, router=router())
    except OSError as exc:
        if not (isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL):
            raise  # the port is taken, or not ours to take
        anywhere = "::" if ":" in host else "0.0.0.0"  # noqa: S104 - the operator's address
        logger.info("node %s: %s is not local, serving on %s", node_name, host, anywhere)
        server = PeerServer(node_name=node_name, host=anywhere, port=port, router=router())
        server.advertised_host = host
    return server.start()
