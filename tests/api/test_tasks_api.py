"""The tasks API: submission (JSON, YAML, sweeps, idempotency), lists and filters, detail,
events, logs, controls, throttling, and what list pages cost in queries."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from scheduling import scheduler, transitions
from scheduling.api import TaskOut, TaskPage, TaskSubmitted, submitted_data
from scheduling.models import (
    GPU,
    Allocation,
    IdempotencyKey,
    Pool,
    SchedulerState,
    Task,
    TaskAttempt,
    TaskEvent,
)
from scheduling.spec import MAX_COMMAND_LENGTH, MAX_ENV, MAX_SWEEP_TASKS, TaskSpec
from scheduling.submission import task_submit, tasks_submit
from tests.api.conftest import assert_constant_queries, assert_error_shape, bearer, make_actor
from tests.factories import (
    AllocationFactory,
    NodeFactory,
    PoolFactory,
    TaskEventFactory,
    TaskFactory,
    TenantFactory,
    make_gpus,
)

pytestmark = pytest.mark.usefixtures("fresh_cache")

TASKS = "/api/v1/tasks/"


def task_url(task: Task, what: str = "") -> str:
    return f"{TASKS}{task.pk}/{what + '/' if what else ''}"


def spec(name: str = "train", command: str = "python train.py", **extra) -> dict:
    return {"name": name, "command": command, **extra}


def submit(actor, name: str = "train", **fields) -> Task:
    return task_submit(
        tenant=actor.tenant,
        spec=TaskSpec(name=name, command="python train.py", **fields),
        owner=actor.user,
    )


def move(task: Task, *states: str) -> Task:
    for state in states:
        task.refresh_from_db()
        transitions.task_transition(task=task, to_state=state)
    task.refresh_from_db()
    return task


@pytest.fixture
def alice(owner):
    return bearer(owner.token)


# --- Submitting -----------------------------------------------------------------------------------


def test_it_submits_one_task_as_json(alice, owner, workstation):
    response = alice.post(TASKS, spec(resources={"gpus": "1-2"}), format="json")
    assert response.status_code == 201, response.content
    [out] = response.json()
    shown = {key: out[key] for key in ("name", "state", "owner", "gpus", "node")}
    assert shown == {
        "name": "train",
        "state": "pending",
        "owner": "alice",
        "gpus": "1-2",
        "node": None,
    }
    task = Task.objects.get(pk=out["id"])
    assert (task.tenant, task.owner) == (owner.tenant, owner.user)
    assert list(task.events.values_list("to_state", flat=True)) == ["pending"]


def test_it_submits_a_list_of_tasks_in_order(alice, workstation):
    response = alice.post(TASKS, [spec("prep"), spec("train")], format="json")
    assert response.status_code == 201
    assert [t["name"] for t in response.json()] == ["prep", "train"]


def test_it_expands_a_sweep(alice, workstation):
    sweep = {
        "kind": "sweep",
        "name": "lr-search",
        "parameters": {"lr": [0.1, 0.01], "bs": [32, 64]},
        "template": {"command": "python train.py --lr {lr} --bs {bs}"},
    }
    response = alice.post(TASKS, sweep, format="json")
    assert response.status_code == 201
    names = [t["name"] for t in response.json()]
    assert names == [f"lr-search-{i}" for i in range(4)]
    commands = set(Task.objects.values_list("command", flat=True))
    assert "python train.py --lr 0.01 --bs 64" in commands


def test_a_queue_new_for_the_tenant_is_taken_with_a_warning(alice, owner, outsider, workstation):
    submit(outsider, "theirs", queue="sweep")  # another tenant's queues do not count
    body = [spec(f"s{i}", queue="sweep") for i in range(3)] + [spec("plain")]

    first = alice.post(TASKS, body, format="json")

    assert first.status_code == 201, first.content
    # once, on the first task of the new queue
    assert [task["warnings"] for task in first.json()] == [
        ["queue 'sweep' is new for tenant vision-lab: it starts a serial queue of its own"],
        [],
        [],
        [],
    ]
    again = alice.post(TASKS, spec("s3", queue="sweep"), format="json").json()
    assert again[0]["warnings"] == []
    typo = alice.post(TASKS, spec("s4", queue="swep"), format="json").json()
    assert typo[0]["warnings"] == [
        "queue 'swep' is new for tenant vision-lab: it starts a serial queue of its own; "
        "did you mean 'sweep'?"
    ]
    assert Task.objects.filter(tenant=owner.tenant, queue="swep").count() == 1  # still taken


def test_the_submit_answer_and_its_warnings_are_in_the_schema(alice):
    schema = alice.get("/api/v1/schema/", {"format": "json"}).json()

    answer = schema["paths"][TASKS]["post"]["responses"]["201"]["content"]["application/json"]
    assert answer["schema"] == {
        "type": "array",
        "items": {"$ref": "#/components/schemas/TaskSubmitted"},
    }
    warnings = schema["components"]["schemas"]["TaskSubmitted"]["properties"]["warnings"]
    assert warnings["type"] == "array" and "queue" in warnings["description"]


@pytest.mark.parametrize("content_type", ["application/yaml", "text/yaml"])
def test_it_submits_yaml_with_several_documents(alice, workstation, content_type):
    text = """
name: prep
command: python prep.py
---
kind: sweep
name: s
parameters:
  x: [1, 2]
template:
  command: echo {x}
  resources: {gpus: 1, gpu_memory: 4Gi}
"""
    response = alice.post(TASKS, text, content_type=content_type)
    assert response.status_code == 201, response.content
    assert [t["name"] for t in response.json()] == ["prep", "s-0", "s-1"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("tenant", "nlp-lab"),
        ("owner", "charlie"),
        ("state", "running"),
        ("node", "workstation-1"),
        ("allocation", {"gpu": 1}),
        ("id", 1),
    ],
)
def test_fields_a_tenant_may_not_set_are_refused_naming_the_field(alice, workstation, field, value):
    response = alice.post(TASKS, spec(**{field: value}), format="json")
    body = assert_error_shape(response, 400, field)
    assert "unknown key" in body["errors"][field][0]
    listed = alice.post(TASKS, [spec("a"), spec("b", **{field: value})], format="json")
    assert_error_shape(listed, 400, f"[1].{field}")
    assert Task.objects.count() == 0


def test_a_batch_is_all_or_nothing(alice, workstation):
    response = alice.post(TASKS, [spec("ok"), spec("bad", priority=101)], format="json")
    assert_error_shape(response, 400, "[1].priority")
    assert Task.objects.count() == 0


def _many(count: int) -> list[dict]:
    return [spec(f"t{i}") for i in range(count)]


@pytest.mark.parametrize(
    "body, field",
    [
        (spec(command="x" * (MAX_COMMAND_LENGTH + 1)), "command"),
        (spec(env={f"V{i}": "1" for i in range(MAX_ENV + 1)}), "env"),
        (spec(env={"LD_PRELOAD": "/tmp/evil.so"}), "env.LD_PRELOAD"),
        (spec(resources={"gpus": 65}), "resources.gpus"),
        (spec(resources={"gpus": 8}), "resources.gpus"),  # no node has 8
        (_many(MAX_SWEEP_TASKS + 1), "tasks"),
        (
            {
                "kind": "sweep",
                "name": "big",
                "parameters": {"a": list(range(40)), "b": list(range(30))},
                "template": {"command": "echo {a} {b}"},
            },
            "parameters",
        ),
        ({"command": "echo"}, "name"),
        ([], "spec"),
    ],
    ids=["command", "env", "env-reserved", "gpus-cap", "gpus-infeasible", "batch", "sweep",
         "name-missing", "empty-list"],
)  # fmt: skip
def test_caps_and_bad_values_answer_400_naming_the_field(alice, workstation, body, field):
    assert_error_shape(alice.post(TASKS, body, format="json"), 400, field)
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    "body, content_type, status, field",
    [
        ("{bad", "application/json", 400, "request"),
        ("[" * 100_000 + "]" * 100_000, "application/json", 400, "request"),
        (b"\xff\xfe\x00", "application/json", 400, "request"),
        ("", "application/json", 400, "name"),
        ("null", "application/json", 400, "spec"),
        ('"just a string"', "application/json", 400, "spec"),
        ("name: [", "application/yaml", 400, "yaml"),
        ("a: 1\n\tb: 2", "application/yaml", 400, "yaml"),
        ("- " * 5000 + "x", "application/yaml", 400, "yaml"),
        (b"name: \xff\ncommand: x", "application/yaml", 400, "name"),
        ("---\n---\n", "application/yaml", 400, "spec"),
        ("name=x&command=y", "application/x-www-form-urlencoded", 415, None),
        ("name x", "text/plain", 415, None),
    ],
    ids=["json-syntax", "json-deep", "json-binary", "empty", "null", "string", "yaml-syntax",
         "yaml-tab", "yaml-deep", "yaml-binary", "yaml-empty", "form", "text"],
)  # fmt: skip
def test_malformed_bodies_answer_4xx_never_500(
    alice, workstation, body, content_type, status, field
):
    response = alice.post(TASKS, body, content_type=content_type)
    assert_error_shape(response, status, field)


def test_a_body_over_the_upload_limit_answers_413_in_the_error_shape(alice, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = alice.post(TASKS, spec(command="x" * 2000), format="json")
    assert_error_shape(response, 413, "request")


def test_a_task_cannot_wait_for_another_tenants_task(outsider, owner, workstation):
    theirs = submit(owner, "alice-run")
    response = bearer(outsider.token).post(
        TASKS, spec(policy={"after": [theirs.pk]}), format="json"
    )
    body = assert_error_shape(response, 400, "policy.after")
    assert body["errors"]["policy.after"] == [f"no task #{theirs.pk} in this tenant"]


# --- Idempotency-Key --------------------------------------------------------------------------


def test_a_retried_submission_returns_the_first_result_and_creates_nothing(alice, workstation):
    headers = {"HTTP_IDEMPOTENCY_KEY": "submit-42"}
    first = alice.post(TASKS, [spec("a"), spec("b")], format="json", **headers)
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first
    again = alice.post(TASKS, [spec("a"), spec("b")], format="json", **headers)
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert [t["id"] for t in again.json()] == [t["id"] for t in first.json()]
    assert Task.objects.count() == 2
    assert TaskEvent.objects.count() == 2


def test_the_same_key_with_another_body_answers_409(alice, workstation):
    headers = {"HTTP_IDEMPOTENCY_KEY": "submit-42"}
    assert alice.post(TASKS, spec("a"), format="json", **headers).status_code == 201
    response = alice.post(TASKS, spec("other"), format="json", **headers)
    assert_error_shape(response, 409, "Idempotency-Key")
    assert Task.objects.count() == 1


def test_a_refused_submission_does_not_use_up_its_key(alice, workstation):
    headers = {"HTTP_IDEMPOTENCY_KEY": "k1"}
    assert alice.post(TASKS, spec(priority=101), format="json", **headers).status_code == 400
    assert not IdempotencyKey.objects.exists()
    assert alice.post(TASKS, spec(), format="json", **headers).status_code == 201


def test_keys_belong_to_one_tenant(alice, outsider, workstation):
    headers = {"HTTP_IDEMPOTENCY_KEY": "shared-key"}
    mine = alice.post(TASKS, spec("alice-run"), format="json", **headers)
    theirs = bearer(outsider.token).post(TASKS, spec("charlie-run"), format="json", **headers)
    assert theirs.status_code == 201
    assert "Idempotent-Replayed" not in theirs
    assert "alice" not in theirs.content.decode()
    assert theirs.json()[0]["id"] != mine.json()[0]["id"]


def test_an_overlong_key_is_refused(alice, workstation):
    response = alice.post(TASKS, spec(), format="json", HTTP_IDEMPOTENCY_KEY="k" * 201)
    assert_error_shape(response, 400, "Idempotency-Key")


# --- Listing ------------------------------------------------------------------------------------


def test_filters_by_state_queue_name_and_submission_time(alice, owner, workstation):
    old = submit(owner, "old-prep", queue="etl")
    Task.objects.filter(pk=old.pk).update(submitted_at=timezone.now() - timedelta(days=2))
    submit(owner, "train-a", queue="gpu")
    done = move(submit(owner, "train-b"), "cancelled")

    def names(**params):
        response = alice.get(TASKS, params)
        assert response.status_code == 200, response.content
        return [t["name"] for t in response.json()["results"]]

    assert names() == ["train-b", "train-a", "old-prep"]
    assert names(state="pending") == ["train-a", "old-prep"]
    assert names(state="cancelled,pending") == ["train-b", "train-a", "old-prep"]
    assert names(queue="etl") == ["old-prep"]
    assert names(name="TRAIN") == ["train-b", "train-a"]
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()
    assert names(submitted_after=yesterday) == ["train-b", "train-a"]
    assert names(submitted_before=yesterday) == ["old-prep"]
    assert done.state == "cancelled"


def test_the_name_filter_takes_wildcards_literally_and_pages_go_on(alice, owner, workstation):
    for name in ("run_1", "runx1", "RUN_2"):
        submit(owner, name)

    def page(**params):
        body = alice.get(TASKS, params).json()
        return body["count"], [t["name"] for t in body["results"]], body["next"]

    assert page(name="n_") == (2, ["RUN_2", "run_1"], None)
    assert page(name="%") == (0, [], None)
    count, names, after = page(limit=1, offset=1)
    assert (count, names) == (3, ["runx1"])
    assert "offset=2" in after
    assert page(limit=2, offset=3) == (3, [], None)


def test_the_count_stops_past_the_page_and_says_so(alice, owner, monkeypatch):
    """A tenant's whole history is not counted for each page: up to COUNTED_PAST tasks past
    its end; beyond that, count is what was counted and count_exact is false."""
    monkeypatch.setattr(TaskPage, "COUNTED_PAST", 3)
    Task.objects.bulk_create(
        Task(tenant=owner.tenant, name=f"t{i}", command="true") for i in range(10)
    )

    def page(offset):
        body = alice.get(TASKS, {"limit": 2, "offset": offset}).json()
        return body["count"], body["count_exact"], len(body["results"]), body["next"] is not None

    assert page(0) == (5, False, 2, True)  # counted 2 + 3, more exist
    assert page(4) == (9, False, 2, True)
    assert page(5) == (10, True, 2, True)  # 5 + 2 + 3: every task counted, and no more
    assert page(8) == (10, True, 2, False)
    assert page(10) == (10, True, 0, False)


def test_the_operators_task_list_counts_as_far_past_its_page(operator, owner, monkeypatch):
    monkeypatch.setattr(TaskPage, "COUNTED_PAST", 3)
    Task.objects.bulk_create(
        Task(tenant=owner.tenant, name=f"t{i}", command="true") for i in range(10)
    )
    client = bearer(operator.token)

    def page(offset):
        body = client.get("/api/v1/operator/tasks/", {"limit": 2, "offset": offset}).json()
        return body["count"], body["count_exact"], len(body["results"]), body["next"] is not None

    assert page(0) == (5, False, 2, True)
    assert page(5) == (10, True, 2, True)
    assert page(8) == (10, True, 2, False)


@pytest.mark.parametrize(
    "param, value",
    [
        ("submitted_after", "yesterday"),
        ("submitted_before", "2024-13-01T00:00:00Z"),
        ("state", "runing"),
    ],
)
def test_bad_filters_answer_400_naming_the_parameter(alice, param, value):
    assert_error_shape(alice.get(TASKS, {param: value}), 400, param)


def test_a_page_holds_at_most_500_tasks(alice, owner):
    Task.objects.bulk_create(
        Task(tenant=owner.tenant, name=f"t{i}", command="true") for i in range(501)
    )
    body = alice.get(TASKS, {"limit": 1000}).json()
    assert body["count"] == 501
    assert len(body["results"]) == 500
    assert "limit=500" in body["next"]


# --- Detail ---------------------------------------------------------------------------------------


def test_detail_shows_the_place_in_line_while_pending(alice, owner, workstation):
    running = submit(owner, "big", gpus_min=4, gpus_max=4)
    waiting = submit(owner, "next", gpus_min=4, gpus_max=4)
    scheduler.schedule_pass()
    body = alice.get(task_url(waiting)).json()
    assert body["state"] == "pending"
    assert "in line" in body["reason"]
    assert body["position"] == 1
    assert body["wait"]["code"] == "reserved"
    assert (body["wait"]["position"], body["wait"]["line"]) == (1, 1)
    assert body["wait"]["details"]["node"] == "workstation-1"
    assert (body["node"], body["gpu_uuids"], body["attempts"]) == (None, [], [])
    assert alice.get(task_url(running)).json()["position"] is None
    assert alice.get(task_url(running)).json()["wait"] is None


def test_the_place_in_line_is_read_from_data_not_from_the_reason_text(alice, owner, workstation):
    task = submit(owner, "next")
    others = [submit(owner, f"other-{i}") for i in range(2)]
    wait = {"code": "capacity", "details": {"fitting_now": 0}}
    Task.objects.filter(pk=task.pk).update(
        reason="a reason in any words", reason_code="", reason_params={}, wait=wait
    )
    SchedulerState.objects.update_or_create(
        pk=1, defaults={"line": [others[0].pk, others[1].pk, task.pk, 10**9]}
    )
    body = alice.get(task_url(task)).json()
    assert (body["position"], body["wait"]) == (3, {**wait, "position": 3, "line": 4})
    assert body["reason"] == "a reason in any words; 3rd of 4 in line"
    listed = alice.get("/api/v1/tasks/").json()["results"]
    assert {t["id"]: t["reason"] for t in listed}[task.pk] == body["reason"]


def test_detail_shows_gpus_node_and_attempts_once_scheduled(alice, owner, workstation):
    task = submit(owner, "train", gpus_min=2, gpus_max=2)
    scheduler.schedule_pass()
    task.refresh_from_db()
    TaskAttempt.objects.create(
        task=task, number=1, node=workstation, gpu_uuids=["u0", "u1"], exit_code=None
    )
    body = alice.get(task_url(task)).json()
    assert (body["state"], body["node"], body["position"]) == ("scheduled", "workstation-1", None)
    held = Allocation.objects.filter(task=task).values_list("gpu__uuid", flat=True)
    assert sorted(body["gpu_uuids"]) == sorted(held) and len(held) == 2
    assert [(a["number"], a["node"], a["outcome"]) for a in body["attempts"]] == [
        (1, "workstation-1", "")
    ]
    assert body["command"] == "python train.py"


def test_an_unknown_task_id_is_404_and_one_past_bigint_400(alice, workstation):
    assert_error_shape(alice.get(f"{TASKS}999999/"), 404)
    assert_error_shape(alice.get(f"{TASKS}99999999999999999999999/"), 400, "id")


# --- Events ---------------------------------------------------------------------------------------


def test_events_come_in_order_with_their_actor(alice, owner, teammate, workstation):
    task = submit(teammate, "train")
    scheduler.schedule_pass()
    move(task, "running")
    # The tenant admin cancels a member's task.
    assert alice.post(task_url(task, "cancel")).status_code == 200
    body = alice.get(task_url(task, "events")).json()
    steps = [(e["from_state"], e["to_state"]) for e in body["results"]]
    assert steps[:3] == [("", "pending"), ("pending", "scheduled"), ("scheduled", "running")]
    assert steps[-1] == ("running", "cancelled")
    assert body["results"][0]["actor"] == "bob"
    assert body["results"][-1]["actor"] == "alice"


# --- Logs -----------------------------------------------------------------------------------------


@pytest.fixture
def logged(owner, workstation, tmp_path):
    """A task on its first attempt, whose log holds three lines."""
    task = TaskFactory(tenant=owner.tenant, state="running", node=workstation, attempt=1)
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"one\ntwo\nthree\n")
    attempt = TaskAttempt.objects.create(task=task, number=1, node=workstation, log_path=str(log))
    return task, attempt, log


def test_the_log_reads_from_an_offset_and_says_where_to_go_on(alice, logged):
    task, attempt, log = logged
    body = alice.get(task_url(task, "log")).json()
    assert body == {
        "attempt": 1,
        "offset": 0,
        "next_offset": 14,
        "size": 14,
        "text": "one\ntwo\nthree\n",
        "finished": False,
    }
    with log.open("ab") as handle:
        handle.write(b"four\n")
    body = alice.get(task_url(task, "log"), {"offset": 14}).json()
    assert (body["text"], body["offset"], body["next_offset"]) == ("four\n", 14, 19)
    body = alice.get(task_url(task, "log"), {"offset": 0, "limit": 3}).json()
    assert (body["text"], body["next_offset"]) == ("one", 3)
    TaskAttempt.objects.filter(pk=attempt.pk).update(outcome="succeeded")
    body = alice.get(task_url(task, "log"), {"offset": 19}).json()
    assert (body["text"], body["finished"]) == ("", True)


def test_the_log_tail_gives_the_last_lines(alice, logged):
    task, _, _ = logged
    body = alice.get(task_url(task, "log"), {"tail": 2}).json()
    assert (body["text"], body["offset"], body["next_offset"]) == ("two\nthree\n", 4, 14)
    assert alice.get(task_url(task, "log"), {"tail": 0}).json()["text"] == ""


def test_the_log_of_an_earlier_attempt_is_readable(alice, logged, workstation, tmp_path):
    task, _, _ = logged
    second = tmp_path / "attempt-2.log"
    second.write_text("again\n")
    TaskAttempt.objects.create(task=task, number=2, node=workstation, log_path=str(second))
    Task.objects.filter(pk=task.pk).update(attempt=2)
    assert alice.get(task_url(task, "log")).json()["text"] == "again\n"
    assert alice.get(task_url(task, "log"), {"attempt": 1}).json()["text"] == "one\ntwo\nthree\n"


@pytest.mark.parametrize(
    "param, value", [("offset", "-1"), ("tail", "abc"), ("limit", "1.5"), ("attempt", "²")]
)
def test_bad_log_parameters_answer_400_naming_them(alice, logged, param, value):
    task, _, _ = logged
    assert_error_shape(alice.get(task_url(task, "log"), {param: value}), 400, param)


def test_a_task_without_that_attempt_has_no_log(alice, owner, logged):
    task, _, _ = logged
    body = assert_error_shape(alice.get(task_url(task, "log"), {"attempt": 7}), 404, "attempt")
    assert body["errors"]["attempt"] == ["no log for attempt 7"]
    fresh = TaskFactory(tenant=owner.tenant)
    body = assert_error_shape(alice.get(task_url(fresh, "log")), 404, "attempt")
    assert "not started" in body["detail"]


# --- Controls -------------------------------------------------------------------------------------


def running_task(owner, workstation) -> Task:
    task = submit(owner, "train")
    scheduler.schedule_pass()
    return move(task, "running")


def test_a_pending_task_is_cancelled_and_a_cancelled_one_refused(alice, owner, workstation):
    task = submit(owner, "train")
    response = alice.post(task_url(task, "cancel"))
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["reason"]) == (
        "cancelled",
        "cancelled by alice",
    )
    body = assert_error_shape(alice.post(task_url(task, "cancel")), 409, "state")
    # Said as it is, not as the table of legal moves ("allowed from cancelled: pending").
    assert body["errors"]["state"] == ["the task is already cancelled"]


def test_a_running_task_pauses_and_resumes(alice, owner, workstation):
    task = running_task(owner, workstation)
    assert_error_shape(alice.post(task_url(task, "resume")), 409, "state")
    response = alice.post(task_url(task, "pause"))
    assert response.json()["state"] == "paused"
    assert_error_shape(alice.post(task_url(task, "pause")), 409, "state")
    assert alice.post(task_url(task, "resume")).json()["state"] == "running"


def test_only_a_running_task_pauses(alice, owner, workstation):
    task = submit(owner, "train")
    body = assert_error_shape(alice.post(task_url(task, "pause")), 409, "state")
    assert "cannot go from pending to paused" in body["detail"]


def test_a_failed_task_is_retried_a_succeeded_one_is_not(alice, owner, workstation):
    failed = move(running_task(owner, workstation), "failed")
    response = alice.post(task_url(failed, "retry"))
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["exit_code"]) == ("pending", None)
    done = move(running_task(owner, workstation), "succeeded")
    body = assert_error_shape(alice.post(task_url(done, "retry")), 409, "state")
    assert "succeeded" in body["detail"]
    pending = submit(owner, "waiting")
    assert_error_shape(alice.post(task_url(pending, "retry")), 409, "state")


def test_retry_releases_a_held_task(alice, owner, workstation):
    task = submit(owner, "train")
    Task.objects.filter(pk=task.pk).update(hold_reason="held after 5 infrastructure requeues")
    response = alice.post(task_url(task, "retry"))
    assert response.status_code == 200
    task.refresh_from_db()
    assert (task.state, task.hold_reason, task.reason) == ("pending", "", "released by alice")


# --- Throttling -----------------------------------------------------------------------------------


def test_a_tenant_over_its_rate_gets_429_with_retry_after(
    alice, teammate, outsider, settings, workstation
):
    settings.API_THROTTLE_RATE = "3/min"
    assert [alice.get(TASKS).status_code for _ in range(3)] == [200, 200, 200]
    response = alice.get(TASKS)
    body = assert_error_shape(response, 429)
    assert int(response["Retry-After"]) > 0
    assert "throttled" in body["detail"].lower()
    # The whole tenant shares the rate; another tenant does not.
    assert bearer(teammate.token).get(TASKS).status_code == 429
    assert bearer(outsider.token).get(TASKS).status_code == 200


# --- Query counts ---------------------------------------------------------------------------------


def test_the_task_list_costs_the_same_queries_for_1_or_20_tasks(
    alice, owner, teammate, workstation
):
    TaskFactory(tenant=owner.tenant, owner=owner.user, node=workstation)

    def grow():
        for i in range(20):
            TaskFactory(tenant=owner.tenant, owner=teammate.user if i % 2 else None,
                        node=NodeFactory() if i % 3 else None)  # fmt: skip

    assert_constant_queries(alice, TASKS, grow)


def test_the_task_list_reads_only_the_columns_it_shows(alice, owner, workstation):
    TaskFactory(tenant=owner.tenant, owner=owner.user, node=workstation, env={"A": "1"})
    with CaptureQueriesContext(connection) as seen:
        assert alice.get(TASKS).json()["results"][0]["node"] == workstation.name
    (listing,) = [
        q["sql"] for q in seen if 'FROM "scheduling_task"' in q["sql"] and "ORDER BY" in q["sql"]
    ]
    for column in ("env", "spec", "command", "workdir"):
        assert f'"scheduling_task"."{column}"' not in listing
    assert '"auth_user"."password"' not in listing


def test_the_task_list_writes_each_task_as_its_serializer_does(alice, owner, workstation):
    """The list is built without DRF's field machinery (task_row): field for field the same."""
    now = timezone.now()
    TaskFactory(tenant=owner.tenant, owner=owner.user, node=workstation, state="running",
                started_at=now, gpu_memory_mb=4096)  # fmt: skip
    TaskFactory(tenant=owner.tenant, owner=None, state="failed", exit_code=3,
                started_at=now, finished_at=now, gpus_min=1, gpus_max=4)  # fmt: skip
    specs = [TaskSpec(name=f"whole-{i}", command="true", gpus_min=4, gpus_max=4) for i in range(3)]
    tasks_submit(tenant=owner.tenant, specs=specs, owner=owner.user)
    scheduler.schedule_pass()  # one takes the node, the others wait in line with their places
    listed = alice.get(TASKS).json()["results"]
    tasks = list(Task.objects.filter(tenant=owner.tenant))
    Task.attach_places(tasks)
    render = JSONRenderer().render
    one_by_one = {task.pk: json.loads(render(TaskOut(task).data)) for task in tasks}
    assert len(listed) == len(one_by_one) == 5
    for row in listed:
        assert row == one_by_one[row["id"]]
    assert sum("in line" in row["reason"] for row in listed) == 2


def test_the_event_list_costs_the_same_queries_for_1_or_20_events(alice, owner, teammate):
    task = TaskFactory(tenant=owner.tenant)
    TaskEventFactory(task=task, actor=owner.user)

    def grow():
        for i in range(20):
            TaskEventFactory(task=task, actor=teammate.user if i % 2 else None)

    assert_constant_queries(alice, task_url(task, "events"), grow)


def test_the_gpu_list_costs_the_same_queries_for_1_or_20_gpus(alice, owner, outsider):
    first = NodeFactory(name="solo")
    [gpu] = make_gpus(first, count=1)
    AllocationFactory(task=TaskFactory(tenant=owner.tenant), gpu=gpu)

    def grow():
        for node_no in range(5):
            node = NodeFactory(name=f"rack-{node_no}")
            for gpu in make_gpus(node, count=4):
                tenant = owner.tenant if gpu.index % 2 else outsider.tenant
                AllocationFactory(task=TaskFactory(tenant=tenant), gpu=gpu, memory_mb=1024)

    assert_constant_queries(alice, "/api/v1/gpus/", grow)
    mine = [g for g in alice.get("/api/v1/gpus/").json()["results"] if g["my_tasks"]]
    assert len(mine) == 11


def test_the_node_list_costs_the_same_queries_for_1_or_20_nodes(alice):
    make_gpus(NodeFactory(name="solo"), count=2)

    def grow():
        for i in range(20):
            make_gpus(NodeFactory(name=f"n{i}", pool=PoolFactory(name=f"p{i % 3}")), count=1)

    assert_constant_queries(alice, "/api/v1/nodes/", grow)


def test_the_pool_list_costs_the_same_queries_for_1_or_20_pools(alice):
    make_gpus(NodeFactory(name="solo"), count=1)

    def grow():
        for i in range(20):
            make_gpus(NodeFactory(name=f"n{i}", pool=PoolFactory(name=f"pool-{i}")), count=2)

    assert_constant_queries(alice, "/api/v1/pools/", grow)
    assert Pool.objects.count() == 21


def test_the_operator_task_list_costs_the_same_queries_for_1_or_20_tasks(operator, owner):
    TaskFactory(tenant=owner.tenant, owner=owner.user)

    def grow():
        for i in range(20):
            tenant = TenantFactory(name=f"team-{i % 4}")
            TaskFactory(tenant=tenant, owner=owner.user, node=NodeFactory())

    client = bearer(operator.token)
    assert_constant_queries(client, "/api/v1/operator/tasks/", grow)
    body = client.get("/api/v1/operator/tasks/", {"tenant": "vision-lab"}).json()
    assert [t["tenant"] for t in body["results"]] == ["vision-lab"]


def test_the_operator_task_list_filters_and_checks_state(operator, owner, outsider):
    TaskFactory(tenant=owner.tenant, state="running")
    TaskFactory(tenant=outsider.tenant, state="pending")
    client = bearer(operator.token)
    body = client.get("/api/v1/operator/tasks/", {"state": "running"}).json()
    assert [t["tenant"] for t in body["results"]] == ["vision-lab"]
    assert_error_shape(client.get("/api/v1/operator/tasks/", {"state": "bogus"}), 400, "state")


def test_gpus_show_reserved_and_free_memory(alice, owner, outsider, workstation):
    whole, shared, idle, foreign = GPU.objects.filter(node=workstation).order_by("index")
    held = TaskFactory(tenant=outsider.tenant)
    AllocationFactory(task=held, gpu=whole, exclusive=True, memory_mb=whole.memory_mb)
    AllocationFactory(task=TaskFactory(tenant=owner.tenant), gpu=shared, memory_mb=4096)
    GPU.objects.filter(pk=foreign.pk).update(foreign_memory_mb=1024)

    rows = {g["index"]: g for g in alice.get("/api/v1/gpus/").json()["results"]}

    memory = {i: (g["state"], g["reserved_mb"], g["free_mb"]) for i, g in rows.items()}
    assert memory == {
        0: ("available", 24576, 0),  # held whole: nothing left for anyone
        1: ("available", 4096, 20480),
        2: ("available", 0, 24576),
        3: ("available", 0, 23552),  # a process the platform did not start holds 1 GiB
    }


def test_gpus_show_only_the_callers_tasks(alice, owner, outsider, workstation):
    gpu = GPU.objects.filter(node=workstation).first()
    AllocationFactory(task=TaskFactory(tenant=owner.tenant, name="mine"), gpu=gpu, memory_mb=1024)
    AllocationFactory(
        task=TaskFactory(tenant=outsider.tenant, name="theirs"), gpu=gpu, memory_mb=2048
    )
    row = next(g for g in alice.get("/api/v1/gpus/").json()["results"] if g["id"] == gpu.pk)
    assert row["reserved_mb"] == 3072 and row["in_use"] is True
    assert [t["name"] for t in row["my_tasks"]] == ["mine"]
    viewer = make_actor(owner.tenant, "viewer", "vic")
    row = next(
        g for g in bearer(viewer.token).get("/api/v1/gpus/").json()["results"] if g["id"] == gpu.pk
    )
    assert [t["name"] for t in row["my_tasks"]] == ["mine"]


def test_a_submissions_answer_is_exactly_what_its_serializer_would_say(owner, workstation):
    specs = [
        TaskSpec(name="a", command="true"),
        TaskSpec(name="b", command="true", queue="q", gpus_min=1, gpus_max=4, gpu_memory_mb=1024),
    ]
    tasks = tasks_submit(tenant=owner.tenant, specs=specs, owner=owner.user)
    warnings = {tasks[1].pk: ["queue 'q' is new"]}

    def rendered(data) -> list[dict]:
        return json.loads(JSONRenderer().render(data))

    def serialized(tasks) -> list[dict]:
        return rendered(TaskSubmitted(tasks, many=True, context={"warnings": warnings}).data)

    assert rendered(submitted_data(tasks, warnings)) == serialized(tasks)
    assert [list(task) for task in submitted_data(tasks, warnings)] == [
        list(task) for task in serialized(tasks)
    ]
    # Later states too (a node, a start time), should it ever answer for older tasks.
    scheduler.schedule_pass()
    placed = list(Task.objects.filter(pk__in=[t.pk for t in tasks]).order_by("pk"))
    assert any(task.node_id for task in placed)
    assert rendered(submitted_data(placed, warnings)) == serialized(placed)
