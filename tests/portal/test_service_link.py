"""A service's task page has an Open link to its address on the platform and shows its
health; a batch task's page has neither."""

from __future__ import annotations

from django.utils import timezone

from scheduling.models import TaskAttempt
from tests.factories import NodeFactory, TaskFactory
from tests.portal.conftest import browser


def test_a_running_service_has_an_open_link_and_its_health(owner):
    node = NodeFactory(name="gpu-node-1")
    task = TaskFactory(tenant=owner.tenant, state="running", node=node, spec={"service": {}})
    TaskAttempt.objects.create(
        task=task, number=1, node=node, service_port=8100, health="unhealthy",
        started_at=timezone.now(),
    )  # fmt: skip
    page = browser(owner).get(f"/portal/tasks/{task.pk}/").content.decode()
    assert f'id="service-open" href="/services/{task.pk}/"' in page
    assert 'data-health="unhealthy">unhealthy<' in page
    chinese = browser(owner, "zh-hans").get(f"/portal/tasks/{task.pk}/").content.decode()
    assert "打开" in chinese


def test_a_batch_task_has_no_open_link(owner):
    task = TaskFactory(tenant=owner.tenant, state="pending")
    page = browser(owner).get(f"/portal/tasks/{task.pk}/").content.decode()
    assert "service-open" not in page and 'id="service"' not in page
