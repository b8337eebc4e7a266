"""The ``services`` route: a tunnel to a service that one of this node's attempts runs.

The gateway (``gateway.tunnel``) asks ``GET /services/?port=<p>&task=<id>`` with
``Upgrade: gpup-tunnel``, signed for this node (``scheduling.nodelink``); the signature covers
the task and the port. The route relays only to 127.0.0.1 at a port that the task's attempt
running on this node holds (``agentapi.serving.holds_port``), so the agent is never an open
proxy: not to another port, another host, or a task that has ended. Once the server answers
101, it splices the two TCP streams until both sides are done (``server.splice``); the
gateway then speaks plain HTTP or websocket to the service through it. Services stay bound
to the loopback.
"""

from __future__ import annotations

from django.db import close_old_connections, connection

from nodeagent.peer.server import Reply, Request
from scheduling import nodelink
from scheduling.agentapi import serving


def serve_service(request: Request) -> Reply:
    if request.headers.get("upgrade", "").lower() != nodelink.TUNNEL_PROTOCOL:
        return Reply.error(400, f"Upgrade: {nodelink.TUNNEL_PROTOCOL} is required")
    task, port = request.params.get("task", ""), request.params.get("port", "")
    if not task.isdigit():
        return Reply.error(400, "task: a task id is required")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return Reply.error(400, "port: a port number is required")
    close_old_connections()
    try:
        held = serving.holds_port(node=request.node, task_id=int(task), port=int(port))
    finally:
        connection.close()  # each connection has a thread of its own: none keeps a session
    if not held:
        return Reply.error(403, f"port {port} is not held by a running attempt of task {task}")
    return Reply(101, tunnel=("127.0.0.1", int(port)))
