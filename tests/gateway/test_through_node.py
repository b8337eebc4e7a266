"""A service on another host, reached through that node's agent (``nodeagent.peer``'s
``services`` route, ``gateway.tunnel``): HTTP, a streamed answer and a websocket come through
``/services/<id>/``; the agent relays only a tunnel signed for its node, a task of its own and
the port that task's running attempt holds.

The "other host" is an agent's peer server on 127.0.0.2, the address its node advertises: the
services listen on 127.0.0.1 only, so nothing reaches them at the node's address but the
agent's tunnel.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import httpx
import pytest
from django.utils import timezone
from websockets.sync.client import connect

from gateway import tunnel
from nodeagent import peer
from scheduling import nodelink
from scheduling.models import TaskAttempt
from scheduling.selectors import Upstream
from tests.factories import NodeFactory
from tests.gateway.conftest import run_service

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = httpx.Timeout(30)
OTHER_HOST = "127.0.0.2"


def bearer(actor) -> dict[str, str]:
    return {"Authorization": f"Bearer {actor.token}"}


@pytest.fixture
def far_node(db):
    """Node gpu-node-2, its agent's peer server at the address it advertises."""
    server = peer.serve("gpu-node-2", f"{OTHER_HOST}:0")
    try:
        yield NodeFactory(name="gpu-node-2", advertise_address=server.address)
    finally:
        server.stop()


def refusal(replica: Upstream) -> str:
    """Why the node refuses a tunnel to ``replica`` (the test fails if it opens one)."""

    async def attempt() -> str:
        try:
            sock = await tunnel.open_socket(replica, timeout=10)
        except tunnel.TunnelRefused as exc:
            return str(exc)
        sock.close()
        pytest.fail(f"the node opened a tunnel to {replica}")

    return asyncio.run(attempt())


def test_http_and_a_stream_reach_a_service_on_another_host(
    platform, far_node, owner, start_service
):
    service = start_service("far")
    task = run_service(owner.tenant, far_node, service.port)
    with pytest.raises(OSError):  # the service is not open to the network
        socket.create_connection((OTHER_HOST, service.port), timeout=5).close()
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:
        answer = client.get(f"/services/{task.pk}/whoami", headers=bearer(owner))
        assert answer.status_code == 200, answer.text
        assert answer.json()["name"] == "far"
        assert answer.json()["path"] == f"/services/{task.pk}/whoami"
        assert answer.json()["headers"]["host"] == platform.removeprefix("http://")
        assert answer.json()["headers"]["x-gpuplatform-user"] == "alice"
        posted = client.post(
            f"/services/{task.pk}/echo", headers=bearer(owner), content=iter([b"a" * 70000, b"b"])
        )
        assert posted.json()["body"] == "a" * 70000 + "b"
        with client.stream("GET", f"/services/{task.pk}/stream", headers=bearer(owner)) as sse:
            assert sse.headers["content-type"] == "text/event-stream"
            pieces = sse.iter_raw()
            assert next(pieces) == b"data: first\n\n"  # before the service has finished
            httpx.get(f"http://127.0.0.1:{service.port}/release", timeout=TIMEOUT)
            assert b"".join(pieces) == b"data: second\n\n"
        # Kept tunnels carry later requests too.
        for _ in range(3):
            again = client.get(f"/services/{task.pk}/whoami", headers=bearer(owner))
            assert again.json()["name"] == "far"


def test_a_websocket_reaches_a_service_on_another_host(platform, far_node, owner, echo_socket):
    task = run_service(owner.tenant, far_node, echo_socket)
    url = platform.replace("http://", "ws://") + f"/services/{task.pk}/api/kernels/1/channels"
    with connect(
        url, additional_headers=bearer(owner), origin=platform,
        subprotocols=["v1.kernel.websocket.jupyter.org"],
    ) as ws:  # fmt: skip
        assert ws.subprotocol == "v1.kernel.websocket.jupyter.org"
        assert ws.recv(timeout=30) == (
            f"hello alice at /services/{task.pk}/api/kernels/1/channels "
            "(v1.kernel.websocket.jupyter.org)"
        )
        ws.send("ping")
        assert ws.recv(timeout=30) == "ping"
        ws.send(b"\x00" * 200000)
        assert ws.recv(timeout=30) == b"\x00" * 200000


def test_the_agent_relays_only_to_the_port_a_running_task_of_its_node_holds(
    far_node, owner, start_service
):
    service = start_service("far")
    other = start_service("not-a-task")
    task = run_service(owner.tenant, far_node, service.port)
    address = far_node.advertise_address
    good = Upstream(task.pk, "gpu-node-2", address, service.port, "")

    async def opens() -> bytes:
        sock = await tunnel.open_socket(good, timeout=10)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await reader.read()
        writer.close()
        return data

    assert b'"name": "far"' in asyncio.run(opens())
    # Another port on the node (a program that is no task's, or a task's other port).
    assert "403" in refusal(replace(good, port=other.port))
    # Another task's id with this port, and a task not placed on this node.
    assert "403" in refusal(replace(good, task_id=task.pk + 1000))
    # Signed for another node: the agent does not take it, and its answer is not that node's.
    assert "not node gpu-node-1's agent" in refusal(replace(good, node_name="gpu-node-1"))
    # Once the attempt has ended its port is no longer reachable.
    TaskAttempt.objects.filter(task=task).update(ended_at=timezone.now())
    assert "403" in refusal(good)


def _raw(address: str, head: str) -> bytes:
    host, port = nodelink.parse_address(address)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer


def test_an_unsigned_or_altered_tunnel_request_is_refused(far_node, owner, start_service):
    service = start_service("far")
    task = run_service(owner.tenant, far_node, service.port)
    address = far_node.advertise_address
    upgrade = f"Connection: Upgrade\r\nUpgrade: {nodelink.TUNNEL_PROTOCOL}\r\n"
    target = f"/services/?port={service.port}&task={task.pk}"
    unsigned = _raw(address, f"GET {target} HTTP/1.1\r\nHost: n\r\n{upgrade}\r\n")
    assert unsigned.startswith(b"HTTP/1.1 401")
    # A signature for one port does not open another: the port is part of what is signed.
    other = start_service("other")
    signed = nodelink.authorization("gpu-node-2", "GET", target)
    altered = target.replace(f"port={service.port}", f"port={other.port}")
    head = f"GET {altered} HTTP/1.1\r\nHost: n\r\nAuthorization: {signed}\r\n{upgrade}\r\n"
    assert _raw(address, head).startswith(b"HTTP/1.1 401")
    # The signed request itself opens the tunnel.
    head = f"GET {target} HTTP/1.1\r\nHost: n\r\nAuthorization: {signed}\r\n{upgrade}\r\n"
    assert _raw(address, head).startswith(b"HTTP/1.1 101")
