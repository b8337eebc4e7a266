"""Services for real: a port the node gives the task, its health checked, restarts when it
stays unhealthy. Real supervisors run real HTTP servers (Python's http.server) on the node."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from scheduling import scheduler
from scheduling.models import Task, TaskAttempt, TaskEvent
from scheduling.spec import parse_spec
from scheduling.submission import task_submit
from tests.factories import TenantFactory
from tests.nodeagent.launcher.conftest import state_of, wait_for

SERVE = "exec python3 -m http.server $PORT --bind $GPUPLATFORM_SERVICE_HOST"


def start(tenant, command: str, service: dict, **more) -> Task:
    spec = parse_spec({"name": "svc", "command": command, "service": service, **more})
    task = task_submit(tenant=tenant, spec=spec)
    scheduler.schedule_pass()
    return task


def attempt_of(task: Task, number: int = 1) -> TaskAttempt:
    return TaskAttempt.objects.get(task=task, number=number)


def health_of(task: Task, *wanted: str, number: int = 1):
    def check():
        attempt = TaskAttempt.objects.filter(task=task, number=number).first()
        return attempt if attempt is not None and attempt.health in wanted else None

    check.__doc__ = f"task {task.pk} attempt {number} to be {wanted}"
    return check


def answers(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:  # noqa: S310
        return answer.status


def test_two_auto_services_of_two_tenants_on_one_node_get_ports_of_their_own(
    launcher, node, lab, settings
):
    other = TenantFactory(name="nlp-lab")
    service = {"port": "auto", "health": {"path": "/", "interval": 1}}
    first, second = start(lab, SERVE, service), start(other, SERVE, service)
    ports = []
    for task in (first, second):
        attempt = wait_for(health_of(task, "healthy"))
        low, high = settings.SERVICE_PORT_RANGE
        assert low <= attempt.service_port <= high
        assert answers(attempt.service_port) == 200
        task.refresh_from_db()
        assert task.state == "running"
        assert task.reason_code == "service_healthy"
        assert f"port {attempt.service_port}; healthy: GET / answered 200" in task.reason
        ports.append(attempt.service_port)
    assert ports[0] != ports[1]


def test_a_fixed_port_in_use_fails_the_attempt_with_its_reason_and_no_retry(launcher, node, lab):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        task = start(lab, SERVE, {"port": port}, policy={"retries": 3})
        wait_for(state_of(task, "failed"))
    assert f"port {port} is in use on node {node.name} by another program" in task.reason
    assert task.attempt == 1
    assert attempt_of(task).service_port is None


def test_a_health_check_that_fails_then_passes_is_seen_in_the_attempt_and_the_reason(
    launcher, node, lab
):
    health = {"path": "/", "interval": 1, "start_period": 1, "failures": 30}
    task = start(lab, f"sleep 3; {SERVE}", {"health": health})
    unhealthy = wait_for(health_of(task, "unhealthy"))
    assert "GET /: Connection refused at" in unhealthy.health_detail
    healthy = wait_for(health_of(task, "healthy"))
    assert "GET / answered 200 at" in healthy.health_detail
    assert healthy.health_checked_at is not None
    codes = list(
        TaskEvent.objects.filter(task=task, from_state="running", to_state="running")
        .order_by("at", "id")
        .values_list("reason_code", flat=True)
    )
    assert codes[-1] == "service_healthy"
    assert "service_unhealthy" in codes
    task.refresh_from_db()
    assert task.state == "running"
    assert "healthy: GET / answered 200" in task.reason


def test_a_service_unhealthy_past_its_limit_is_restarted_as_a_failure(launcher, node, lab):
    health = {"path": "/missing", "interval": 1, "start_period": 1, "failures": 2}
    task = start(lab, SERVE, {"health": health}, policy={"retries": 1})
    wait_for(state_of(task, "failed"), timeout=60)
    assert task.attempt == 2  # restarted once (its one retry), then failed
    assert [a.outcome for a in TaskAttempt.objects.filter(task=task)] == ["failed", "failed"]
    assert task.reason.startswith("stopped as unhealthy: 2 failed health checks in a row")
    assert "GET /missing answered 404" in task.reason
    assert task.reason_code == "service_restarted"
    retried = TaskEvent.objects.filter(
        task=task, to_state="pending", reason_code="service_restarted"
    )
    assert retried.exists()


@pytest.mark.parametrize("replicas", [2])
def test_replicas_run_on_gpus_of_their_own_and_go_with_their_service(launcher, node, lab, replicas):
    from scheduling import controls

    service = {"health": {"path": "/", "interval": 1}, "replicas": replicas}
    first = start(lab, SERVE, service)
    replicas_of = list(Task.objects.filter(replica_of=first).order_by("id"))
    assert len(replicas_of) == replicas - 1
    tasks = [first, *replicas_of]
    attempts = [wait_for(health_of(task, "healthy")) for task in tasks]
    assert len({tuple(a.gpu_uuids) for a in attempts}) == replicas
    assert len({a.service_port for a in attempts}) == replicas
    controls.task_cancel(task=first)
    for task in tasks:
        wait_for(state_of(task, "cancelled"))
