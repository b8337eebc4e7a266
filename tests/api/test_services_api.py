"""The service block through the API: submitted with replicas, shown in the detail with each
replica's port and health, refused with a 400 naming the field, and another tenant's 404."""

from __future__ import annotations

import pytest

from scheduling import controls, scheduler
from scheduling.models import Task, TaskAttempt
from tests.api.conftest import assert_error_shape, bearer

pytestmark = pytest.mark.usefixtures("fresh_cache")

TASKS = "/api/v1/tasks/"
SERVICE = {"port": "auto", "health": "/health", "replicas": 2}


@pytest.fixture
def alice(owner):
    return bearer(owner.token)


def submit(client, **service):
    body = {"name": "llm", "command": "serve --port $PORT", "service": service or SERVICE}
    return client.post(TASKS, body, format="json")


def test_replicas_are_tasks_of_their_own_placed_on_gpus_of_their_own(alice, workstation):
    response = submit(alice)
    assert response.status_code == 201, response.content
    first, second = response.json()
    service, replica = Task.objects.get(pk=first["id"]), Task.objects.get(pk=second["id"])
    assert (service.replica_of_id, replica.replica_of_id) == (None, service.pk)
    assert service.task_class == replica.task_class == "online"
    assert not service.preemptible
    scheduler.schedule_pass()
    held = [
        {a.gpu_id for a in task.allocations.filter(released_at=None)} for task in (service, replica)
    ]
    assert len(held[0]) == len(held[1]) == 1 and held[0] != held[1]


def test_the_detail_shows_the_port_health_and_replicas(alice, workstation):
    first, second = submit(alice).json()
    scheduler.schedule_pass()
    for task_id, port, health in ((first["id"], 20001, "healthy"), (second["id"], 20002, "")):
        task = Task.objects.get(pk=task_id)
        TaskAttempt.objects.create(
            task=task, number=task.attempt, node=workstation, service_port=port, health=health
        )
    out = alice.get(f"{TASKS}{first['id']}/").json()["service"]
    assert out["port"] == "auto" and out["replicas_wanted"] == 2
    assert out["health_check"]["path"] == "/health" and out["health_check"]["failures"] == 3
    assert (out["service_port"], out["health"], out["replica_of"]) == (20001, "healthy", None)
    assert [r["id"] for r in out["replicas"]] == [first["id"], second["id"]]
    assert [r["service_port"] for r in out["replicas"]] == [20001, 20002]
    assert out["healthy"] == "healthy 1/2"
    replica = alice.get(f"{TASKS}{second['id']}/").json()["service"]
    assert replica["replica_of"] == first["id"] and replica["healthy"] == "healthy 1/2"


def test_a_task_without_a_service_block_shows_none(alice, workstation):
    [out] = alice.post(TASKS, {"name": "t", "command": "true"}, format="json").json()
    assert alice.get(f"{TASKS}{out['id']}/").json()["service"] is None


def test_another_tenants_service_answers_404(alice, outsider, workstation):
    first, _ = submit(alice).json()
    assert bearer(outsider.token).get(f"{TASKS}{first['id']}/").status_code == 404


@pytest.mark.parametrize(
    "service, field",
    [
        ({"port": 80}, "service.port"),
        ({"port": "any"}, "service.port"),
        ({"health": "health"}, "service.health.path"),
        ({"health": {"path": "/h", "interval": "soon"}}, "service.health.interval"),
        ({"health": {"path": "/h", "failures": 0}}, "service.health.failures"),
        ({"replicas": 0}, "service.replicas"),
        ({"replicas": 17}, "service.replicas"),
        ({"ports": 1}, "service.ports"),
    ],
)
def test_bad_service_values_answer_400_naming_the_field(alice, workstation, service, field):
    assert_error_shape(submit(alice, **service), 400, field)
    assert Task.objects.count() == 0


def test_cancelling_the_service_cancels_its_replicas(alice, owner, workstation):
    first, second = submit(alice).json()
    controls.task_cancel(task=Task.objects.get(pk=first["id"]), by=owner.user)
    states = set(Task.objects.filter(pk__in=[first["id"], second["id"]]).values_list("state"))
    assert states == {("cancelled",)}


def test_a_service_s_problem_is_named_at_its_own_path_and_after_names_the_service(
    alice, workstation
):
    body = {"name": "llm", "command": "serve", "service": {"replicas": 2},
            "resources": {"gpus": 8}}  # fmt: skip
    assert_error_shape(alice.post(TASKS, body, format="json"), 400, "resources.gpus")
    client = [
        {"name": "llm", "command": "serve", "service": {"replicas": 3}},
        {"name": "bench", "command": "bench", "policy": {"after": ["llm"]}},
    ]
    response = alice.post(TASKS, client, format="json")
    assert response.status_code == 201, response.content
    service, *_, bench = (Task.objects.get(pk=out["id"]) for out in response.json())
    assert list(bench.depends_on.all()) == [service]
    assert Task.objects.filter(replica_of=service).count() == 2
