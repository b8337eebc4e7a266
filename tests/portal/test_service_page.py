"""A service's task page shows its port, its health and what the last check said, and its
replicas with theirs; in Chinese too."""

from __future__ import annotations

from scheduling import scheduler
from scheduling.models import TaskAttempt
from scheduling.spec import parse_spec
from scheduling.submission import tasks_submit
from tests.portal.conftest import browser


def test_a_service_s_page_shows_its_port_health_and_replicas(teammate, workstation):
    spec = parse_spec(
        {"name": "llm", "command": "serve", "service": {"health": "/health", "replicas": 2}}
    )
    first, second = tasks_submit(tenant=teammate.tenant, specs=[spec], owner=teammate.user)
    scheduler.schedule_pass()
    for task, port, health in ((first, 20417, "healthy"), (second, 20418, "starting")):
        task.refresh_from_db()
        TaskAttempt.objects.create(
            task=task,
            number=task.attempt,
            node=workstation,
            service_port=port,
            health=health,
            health_detail="GET /health answered 200 at 12:00:03 UTC" if port == 20417 else "",
        )
    client = browser(teammate)
    page = client.get(f"/portal/tasks/{first.pk}/").content.decode()
    assert 'port 20417 · <span class="health health-healthy">healthy</span>' in page
    assert "(GET /health answered 200 at 12:00:03 UTC)" in page
    assert "healthy 1/2" in page
    assert f'href="/portal/tasks/{second.pk}/">#{second.pk}</a>' in page
    chinese = client.get(f"/portal/tasks/{first.pk}/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert "健康 1/2" in chinese.content.decode()
    plain = client.get(f"/portal/tasks/{second.pk}/").content.decode()
    assert 'id="task-service"' in plain and "启动中" not in plain
    assert 'port 20418 · <span class="health health-starting">starting</span>' in plain
