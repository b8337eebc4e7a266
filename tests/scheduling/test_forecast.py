"""When a waiting task is expected to start: the pass's forecast (scheduling.policy.forecast),
from the running tasks' timeouts or their typical runtimes in history, shown by the API, the
portal and gpuctl (tests/cli/test_gpuctl.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling import forecasts
from scheduling.models import Task
from scheduling.policy import GpuView, PendingView, RunningView, Snapshot, occupied
from scheduling.policy.forecast import Runtime, forecast
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.api.conftest import bearer
from tests.portal.conftest import browser


@pytest.fixture(autouse=True)
def _no_remembered_history():
    forecasts.forget_history()
    yield
    forecasts.forget_history()


def submit(actor, name: str, command: str = "python train.py", **fields) -> Task:
    spec = TaskSpec(name=name, command=command, **fields)
    return task_submit(tenant=actor.tenant, spec=spec, owner=actor.user)


def two_gpus_running(**running) -> Snapshot:
    gpus = tuple(GpuView(id=i, node="a", pool="", gpu_type="x", memory_mb=100) for i in (1, 2))
    task = RunningView(id=1, tenant="lab", priority=50, task_class="batch", preemptible=True,
                       node="a", gpus=((1, 100), (2, 100)), exclusive=True, started_at=1000.0,
                       **running)  # fmt: skip
    waiting = PendingView(2, "lab", 50, "batch", 1100.0, 2, 2)
    return Snapshot(now=1200.0, gpus=occupied(gpus, [task]), running=(task,), pending=(waiting,))


def test_the_core_expects_a_start_when_the_running_task_times_out():
    (estimate,) = forecast(two_gpus_running(timeout_s=600), [2], {}).values()
    assert (estimate.at, estimate.latest, estimate.basis) == (1600.0, 1600.0, "timeout")
    assert estimate.earliest == 1200.0  # it may end at any moment


def test_the_core_expects_a_start_from_typical_runtimes():
    history = {1: Runtime(low=300.0, mid=500.0, high=900.0, basis="command")}
    (estimate,) = forecast(two_gpus_running(timeout_s=3600), [2], history).values()
    assert (estimate.at, estimate.earliest, estimate.latest) == (1500.0, 1300.0, 1900.0)
    assert estimate.basis == "command"


def test_the_core_says_unknown_with_nothing_to_go_by():
    (estimate,) = forecast(two_gpus_running(), [2], {}).values()
    assert (estimate.at, estimate.basis) == (None, "unknown")


def test_a_pass_stores_a_start_from_the_running_tasks_timeout(owner, workstation, run_pass):
    running = submit(owner, "big", gpus_min=4, gpus_max=4, timeout_s=3600)
    waiting = submit(owner, "next", gpus_min=4, gpus_max=4)
    run_pass()
    run_pass()  # the second sees it scheduled, from when it was (the first, from its pass)
    running.refresh_from_db()
    waiting = Task.objects.get(pk=waiting.pk)
    start = waiting.expected_start
    assert start["basis"] == "timeout"
    assert start["at"] == running.scheduled_at + timedelta(seconds=3600)
    assert start["text"].startswith("about ")
    assert "timeouts" in start["text"]


def test_a_pass_stores_a_start_from_the_tenants_history(owner, workstation, run_pass):
    now = timezone.now()
    for minutes in (10, 20, 30):  # succeeded runs of the same command: a median of 20 min
        Task.objects.create(
            tenant=owner.tenant, name="old", command="python train.py", state="succeeded",
            started_at=now - timedelta(hours=2),
            finished_at=now - timedelta(hours=2) + timedelta(minutes=minutes),
        )  # fmt: skip
    submit(owner, "big", gpus_min=4, gpus_max=4)  # no timeout: only history says anything
    waiting = submit(owner, "next", gpus_min=4, gpus_max=4)
    run_pass()
    start = Task.objects.get(pk=waiting.pk).expected_start
    assert start["basis"] == "command"
    expected = timezone.now() + timedelta(minutes=20)
    assert abs((start["at"] - expected).total_seconds()) < 120
    assert start["earliest"] < start["at"] < start["latest"]


def test_a_pass_says_unknown_with_nothing_to_go_by(owner, workstation, run_pass):
    submit(owner, "big", gpus_min=4, gpus_max=4)  # no timeout, no history
    waiting = submit(owner, "next", gpus_min=4, gpus_max=4)
    run_pass()
    start = Task.objects.get(pk=waiting.pk).expected_start
    assert (start["at"], start["basis"]) == (None, "unknown")
    assert start["text"].startswith("unknown: nothing to go by")


def test_the_api_shows_the_expected_start_and_its_bounds(owner, workstation, run_pass):
    submit(owner, "big", gpus_min=4, gpus_max=4, timeout_s=3600)
    waiting = submit(owner, "next", gpus_min=4, gpus_max=4)
    run_pass()
    body = bearer(owner.token).get(f"/api/v1/tasks/{waiting.pk}/").json()
    start = body["expected_start"]
    assert start["basis"] == "timeout"
    assert start["at"] is not None and start["earliest"] <= start["at"] <= start["latest"]
    assert start["text"] == Task.objects.get(pk=waiting.pk).expected_start["text"]


def test_the_portal_shows_the_expected_start(owner, workstation, run_pass):
    submit(owner, "big", gpus_min=4, gpus_max=4, timeout_s=3600)
    waiting = submit(owner, "next", gpus_min=4, gpus_max=4)
    run_pass()
    text = Task.objects.get(pk=waiting.pk).expected_start["text"]
    client = browser(owner)
    page = client.get(f"/portal/tasks/{waiting.pk}/").content.decode()
    assert 'id="expected-start"' in page and text in page
    assert text in client.get("/portal/").content.decode()
