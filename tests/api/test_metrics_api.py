"""The metrics API: a task's GPUs during its allocations, raw or rollups chosen by the step,
ranges checked with 400s that name the field, and usage measured from samples."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.states import TaskState
from telemetry import jobs
from telemetry.models import GpuSample
from tests.api.conftest import assert_error_shape, bearer
from tests.factories import AllocationFactory, TaskFactory


@pytest.fixture
def history(workstation, owner, teammate):
    """Alice's task held GPU 0 for the last 10 minutes at 1 Hz (util 80); Bob's task held
    GPU 1 (util 0: idle) over the same time; GPU 2 ran nothing."""
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(minutes=10)
    gpus = list(workstation.gpus.order_by("index"))
    tasks = {}
    for who, gpu, util in ((owner, gpus[0], 80), (teammate, gpus[1], 0)):
        task = TaskFactory(
            tenant=owner.tenant, owner=who.user, state=TaskState.RUNNING, node=workstation
        )
        AllocationFactory(task=task, gpu=gpu, started_at=start, exclusive=True)
        GpuSample.objects.bulk_create(
            GpuSample(
                gpu=gpu,
                at=start + timedelta(seconds=s),
                task=task,
                tenant=owner.tenant,
                util_gpu=util,
                memory_used_mb=1000,
                temperature_c=60,
                power_w=300.0,
            )
            for s in range(600)
        )
        tasks[who.user.username] = task
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpus[2], at=start + timedelta(seconds=s), util_gpu=0) for s in range(600)
    )
    jobs.rollup_minutes(start=start, end=now)
    jobs.rollup_hours(start=start - timedelta(hours=1), end=now)
    return tasks, start, now


def test_a_task_reads_only_its_own_gpus_raw_at_a_short_step(history, owner):
    tasks, start, now = history
    task = tasks["alice"]

    response = bearer(owner.token).get(
        f"/api/v1/tasks/{task.pk}/metrics/", {"since": "5m", "step": "10s"}
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["source"] == "raw" and body["step"] == 10
    [series] = body["series"]
    assert series["index"] == 0 and series["node"] == "workstation-1"
    assert body["columns"][:2] == ["time", "util_gpu"]
    time, util = series["values"][:2]
    assert set(util) == {80.0}
    assert 29 <= len(time) <= 31


def test_a_long_step_reads_the_rollups_with_the_same_means(history, owner):
    tasks, start, now = history
    client = bearer(owner.token)
    url = f"/api/v1/tasks/{tasks['alice'].pk}/metrics/"

    minutes = client.get(url, {"step": "5m"}).json()
    hours = client.get(url, {"step": "1h", "since": "2h"}).json()

    assert minutes["source"] == "1m" and hours["source"] == "1h"
    assert set(minutes["series"][0]["values"][1]) == {80.0}
    assert sum(hours["series"][0]["values"][-1]) == 600  # every sample counted


def test_the_default_range_is_the_tasks_whole_run(history, owner):
    tasks, start, now = history
    body = bearer(owner.token).get(f"/api/v1/tasks/{tasks['alice'].pk}/metrics/").json()
    assert body["start"] == start.isoformat()
    assert sum(body["series"][0]["values"][-1]) == 600


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"step": "fast"}, "step"),
        ({"step": "1s", "since": "30d"}, "step"),
        ({"start": "yesterday"}, "start"),
        ({"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "start"),
        ({"since": "-5m"}, "since"),
    ],
)
def test_a_bad_range_is_a_400_naming_the_field(history, owner, params, field):
    tasks, *_ = history
    response = bearer(owner.token).get(f"/api/v1/tasks/{tasks['alice'].pk}/metrics/", params)
    assert_error_shape(response, 400, field)


def test_operators_read_a_node_and_a_gpu(history, operator, workstation):
    client = bearer(operator.token)
    node = client.get("/api/v1/operator/nodes/workstation-1/metrics/", {"since": "15m"}).json()
    assert sorted(s["index"] for s in node["series"]) == [0, 1, 2]
    gpu = workstation.gpus.get(index=2)
    one = client.get(f"/api/v1/operator/gpus/{gpu.pk}/metrics/", {"since": "15m"}).json()
    assert [s["index"] for s in one["series"]] == [2]


def test_sampled_usage_counts_held_used_and_idle_gpu_hours_per_member(history, owner):
    body = bearer(owner.token).get("/api/v1/usage/sampled/", {"days": "2"}).json()

    rows = {row["member"]: row for row in body["rows"]}
    assert set(rows) == {"alice", "bob"}
    assert sum(r["allocated_gpu_hours"] for r in body["rows"] if r["member"] == "alice") == (
        pytest.approx(600 / 3600, abs=1e-3)
    )
    alice = [r for r in body["rows"] if r["member"] == "alice"]
    bob = [r for r in body["rows"] if r["member"] == "bob"]
    assert sum(r["used_gpu_hours"] for r in alice) == pytest.approx(0.8 * 600 / 3600, abs=1e-3)
    assert sum(r["idle_gpu_hours"] or 0 for r in alice) == 0
    assert sum(r["idle_gpu_hours"] for r in bob) == pytest.approx(600 / 3600, abs=1e-3)
    assert sum(r["used_gpu_hours"] for r in bob) == 0


def test_live_gpus_show_the_callers_own_task(history, owner, teammate):
    gpus = bearer(owner.token).get("/api/v1/gpus/live/").json()
    assert [g["tenant"] for g in gpus] == ["vision-lab", "vision-lab", None, None]
    assert gpus[0]["task"] == history[0]["alice"].pk and gpus[0]["util_gpu"] == 80


def test_a_tenant_sees_the_alerts_about_its_tasks_and_operators_see_all(
    history, owner, operator, workstation
):
    from monitoring import services as alert_services

    tasks, *_ = history
    gpu = workstation.gpus.get(index=0)
    alert_services.alert_raise(
        kind="gpu_idle", severity="warning", message="idle", gpu=gpu, task=tasks["alice"]
    )
    alert_services.alert_raise(kind="gpu_over_temperature", severity="warning", message="hot",
                               gpu=gpu)  # fmt: skip

    mine = bearer(owner.token).get("/api/v1/alerts/", {"open": "1"}).json()["results"]
    assert [(a["kind"], a["task"], a["node"]) for a in mine] == [
        ("gpu_idle", tasks["alice"].pk, "workstation-1")
    ]
    every = bearer(operator.token).get("/api/v1/operator/alerts/").json()["results"]
    assert {a["kind"] for a in every} == {"gpu_idle", "gpu_over_temperature"}


def test_a_one_second_step_gives_every_raw_sample(history, owner):
    tasks, start, now = history
    # A fixed range, not "since": the samples stop at the fixture's now, not the request's.
    iso = "%Y-%m-%dT%H:%M:%SZ"
    params = {"start": (now - timedelta(minutes=2)).strftime(iso), "end": now.strftime(iso)}
    body = (
        bearer(owner.token)
        .get(f"/api/v1/tasks/{tasks['alice'].pk}/metrics/", {**params, "step": "1s"})
        .json()
    )
    values = dict(zip(body["columns"], body["series"][0]["values"], strict=True))
    time = values["time"]
    assert body["source"] == "raw" and len(time) == 120
    assert time[0] == int((now - timedelta(minutes=2)).timestamp()) and values["util_gpu"][0] == 80
    assert values["util_gpu_max"] == values["util_gpu"] and set(values["samples"]) == {1}
    assert time == sorted(time)
