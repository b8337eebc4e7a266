"""A service's task in the API carries its address on the platform (``service_url``) and its
health; a batch task carries neither."""

from __future__ import annotations

from django.utils import timezone

from scheduling.models import TaskAttempt
from tests.api.conftest import bearer
from tests.factories import NodeFactory, TaskFactory


def _running(tenant, node, **fields):
    task = TaskFactory(tenant=tenant, state="running", node=node, **fields)
    port = 8100 + TaskAttempt.objects.filter(node=node).count()  # one running attempt a port
    TaskAttempt.objects.create(
        task=task, number=1, node=node, service_port=port, health="healthy",
        started_at=timezone.now(),
    )  # fmt: skip
    return task


def test_a_service_has_an_absolute_url_and_its_health(owner):
    node = NodeFactory(name="gpu-node-1")
    service = _running(owner.tenant, node, spec={"service": {"port": "auto"}})
    replica = _running(owner.tenant, node, replica_of=service)
    body = bearer(owner.token).get(f"/api/v1/tasks/{service.pk}/").json()
    assert body["service_url"] == f"http://testserver/services/{service.pk}/"
    assert body["health"] == "healthy"
    # A replica leads to its service.
    body = bearer(owner.token).get(f"/api/v1/tasks/{replica.pk}/").json()
    assert body["service_url"] == f"http://testserver/services/{service.pk}/"


def test_a_batch_task_has_no_service_url(owner):
    task = TaskFactory(tenant=owner.tenant, state="pending")
    body = bearer(owner.token).get(f"/api/v1/tasks/{task.pk}/").json()
    assert (body["service_url"], body["health"]) == (None, "")
