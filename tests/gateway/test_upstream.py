"""The gateway's parts without a server: which replicas take requests, where each is reached,
the order they are asked in, and the headers a service sees and the client gets back."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from gateway import headers, tunnel, upstream
from gateway.upstream import Route
from scheduling import selectors
from scheduling.models import TaskAttempt
from scheduling.selectors import Upstream
from tests.gateway.conftest import run_service


def replica(task_id: int = 1, advertise: str = "", port: int = 8100) -> Upstream:
    return Upstream(task_id, "node", advertise, port, "")


def test_only_running_replicas_with_a_port_and_not_unhealthy_take_requests(node, owner, outsider):
    service = run_service(owner.tenant, node, 9001)
    healthy = run_service(owner.tenant, node, 9002, replica_of=service, health="healthy")
    run_service(owner.tenant, node, 9003, replica_of=service, health="unhealthy")
    run_service(owner.tenant, node, 9004, replica_of=service, health="starting")
    run_service(owner.tenant, node, 9005, replica_of=service, state="pending")
    ended = run_service(owner.tenant, node, 9006, replica_of=service)
    TaskAttempt.objects.filter(task=ended).update(ended_at=timezone.now())
    found, replicas = selectors.service_replicas(tenant_ids=[owner.tenant.pk], pk=healthy.pk)
    assert found == service
    assert sorted(r.port for r in replicas) == [9001, 9002]
    assert selectors.service_replicas(tenant_ids=[outsider.tenant.pk], pk=service.pk) is None
    assert selectors.service_replicas(tenant_ids=[owner.tenant.pk], pk=10**9) is None


def test_a_replica_is_reached_on_loopback_or_through_its_nodes_agent():
    assert upstream.address(replica()) == ("127.0.0.1", 8100)
    for advertise in ("gpu-2.lab:9443", "10.0.0.7", "[fd00::7]:9443"):
        remote = replica(task_id=5, advertise=advertise)
        assert upstream.address(remote) == ("task-5.node-tunnel.invalid", 8100)
        assert tunnel.BACKEND.replicas[("task-5.node-tunnel.invalid", 8100)] == remote


def test_each_request_starts_at_the_next_replica_and_the_others_follow():
    route = Route(42, "lab", "alice", [replica(1), replica(2), replica(3)])
    orders = [[r.task_id for r in upstream.rotation(route)] for _ in range(3)]
    assert sorted(order[0] for order in orders) == [1, 2, 3]
    assert all(sorted(order) == [1, 2, 3] for order in orders)


def test_the_platforms_credentials_and_claims_never_reach_a_service():
    route = Route(7, "vision-lab", "alice", [])
    session = settings.SESSION_COOKIE_NAME.encode()
    scope = {
        "client": ("10.1.1.1", 5000),
        "scheme": "https",
        "headers": [
            (b"host", b"gpu.example"),
            (b"authorization", b"Bearer gpup_secret"),
            (b"x-gpuplatform-user", b"root"),
            (b"X-Gpuplatform-Tenant", b"other"),
            (b"x-forwarded-for", b"192.0.2.1"),
            (b"cookie", session + b"=s3cret; _xsrf=abc"),
            (b"connection", b"keep-alive"),
            (b"accept", b"text/html"),
        ],
    }
    sent = headers.upstream_request(scope, route)
    assert sent == [
        ("host", "gpu.example"),
        ("cookie", "_xsrf=abc"),
        ("accept", "text/html"),
        ("x-forwarded-for", "192.0.2.1, 10.1.1.1"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "gpu.example"),
        ("x-forwarded-prefix", "/services/7"),
        ("x-gpuplatform-user", "alice"),
        ("x-gpuplatform-tenant", "vision-lab"),
    ]


def test_a_service_cannot_set_the_platforms_cookies():
    session = settings.SESSION_COOKIE_NAME.encode()
    raw = [
        (b"Set-Cookie", session + b"=forged; Path=/"),
        (b"Set-Cookie", settings.CSRF_COOKIE_NAME.encode() + b"=forged"),
        (b"Set-Cookie", b"_xsrf=2|abc; Path=/services/7/"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Content-Type", b"text/html"),
    ]
    assert headers.downstream_response(raw) == [
        (b"set-cookie", b"_xsrf=2|abc; Path=/services/7/"),
        (b"content-type", b"text/html"),
    ]
