"""While tasks wait, no GPU is idle and the last pass's successors are still listed, a requested
pass waits for ``busy_pass_gap_ms`` after the last one ended (``passes.defer_while_busy``): a
pass can place nothing new then, and ends hand their GPUs to the listed successors."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from scheduling import passes, tasks
from scheduling.models import SchedulerState, Successor
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tests.nodeagent.launcher.conftest import wait_for
from tests.scheduling.conftest import shipped_config_with

GAP_MS = 100  # the shipped scheduling.busy_pass_gap_ms


def deferred() -> list[tuple[str, object]]:
    """The passes queued for later: (queue, the time the broker hands them out)."""
    return [
        (row.key, row.lock)
        for row in OrmQ.objects.order_by("lock")
        if SignedPackage.loads(row.payload)["name"] == "scheduling-deferred"
    ]


@pytest.fixture
def through_the_broker(monkeypatch):
    """Jobs queued, not run inline, as in the scheduler's cluster (tests run them in sync)."""
    monkeypatch.setattr(Conf, "SYNC", False)


def submit(tenant, count: int) -> None:
    for _ in range(count):
        task_submit(tenant=tenant, spec=TaskSpec(name="t", command="sleep 600"))


@pytest.mark.django_db
def test_a_pass_records_the_gpus_it_left_idle(lab, workstation, run_pass):
    submit(lab, 3)
    result = run_pass()
    assert (len(result.placed), result.idle_gpus, result.waiting) == (3, 1, 0)
    assert SchedulerState.objects.get().last_idle_gpus == 1
    submit(lab, 2)
    result = run_pass()
    assert (len(result.placed), result.idle_gpus, result.waiting) == (1, 0, 1)
    assert SchedulerState.objects.get().last_idle_gpus == 0


@pytest.mark.django_db
def test_a_pass_soon_after_one_that_left_tasks_waiting_and_no_gpu_idle_waits(
    lab, workstation, run_pass, through_the_broker
):
    submit(lab, 5)
    run_pass()  # 4 placed, one waits
    last = SchedulerState.objects.get()
    submit(lab, 1)

    answer = tasks.run_pass()

    due = last.last_pass_at + timedelta(milliseconds=last.last_pass_ms + GAP_MS)
    assert answer == {"deferred_to": due.isoformat()}
    assert deferred() == [("gpuplatform", due)]  # the scheduler's queue, handed out at `due`
    assert SchedulerState.objects.get().passes == last.passes  # no pass ran


@pytest.mark.django_db
def test_a_pass_runs_at_once_once_the_gap_has_passed(
    lab, workstation, run_pass, through_the_broker
):
    submit(lab, 5)
    run_pass()
    SchedulerState.objects.update(last_pass_at=timezone.now() - timedelta(seconds=1))

    answer = tasks.run_pass()

    assert "deferred_to" not in answer
    assert deferred() == []
    assert SchedulerState.objects.get().passes == 2


@pytest.mark.django_db
def test_a_pass_runs_at_once_while_a_gpu_is_idle(lab, workstation, run_pass, through_the_broker):
    submit(lab, 3)
    run_pass()  # one GPU idle: a new task may start at once
    submit(lab, 1)

    assert "deferred_to" not in tasks.run_pass()
    assert deferred() == []


@pytest.mark.django_db
def test_a_pass_runs_at_once_when_nothing_was_left_waiting(
    lab, workstation, run_pass, through_the_broker
):
    submit(lab, 4)
    run_pass()  # every GPU taken, nothing waits: a new task's pass lists it at once

    assert "deferred_to" not in tasks.run_pass()


@pytest.mark.django_db
def test_a_pass_runs_at_once_once_its_successors_are_handed_out(
    lab, workstation, run_pass, through_the_broker
):
    submit(lab, 5)
    run_pass()
    assert Successor.objects.exists()  # the waiting task, listed for the next GPU to come free
    Successor.objects.all().delete()  # as an agent's hand-off deletes what it took

    assert "deferred_to" not in tasks.run_pass()
    assert deferred() == []


@pytest.mark.django_db
def test_a_gap_of_zero_never_defers(lab, workstation, run_pass, through_the_broker):
    submit(lab, 5)
    run_pass()

    assert passes.defer_while_busy(0) is None
    assert passes.defer_while_busy(GAP_MS) is not None  # what the same state does with a gap
    assert len(deferred()) == 1


@pytest.mark.django_db
def test_inline_jobs_never_defer(lab, workstation, run_pass):
    submit(lab, 5)
    run_pass()
    assert Conf.SYNC  # tests' settings: a deferred pass would never run

    assert "deferred_to" not in tasks.run_pass()


# --- End to end, with the scheduler's real django-q2 cluster ----------------------------------

SLOW_GAP_MS = 3_000  # long enough to tell the deferred pass from one run at once


@pytest.fixture
def slow_gap_config(settings, tmp_path):
    """The shipped configuration with a 3 s ``busy_pass_gap_ms``, for this process and the
    scheduler cluster alike."""
    return shipped_config_with(
        settings, tmp_path, "  busy_pass_gap_ms: 100\n", f"  busy_pass_gap_ms: {SLOW_GAP_MS}\n"
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_deferred_pass_is_run_by_the_schedulers_cluster_when_the_gap_has_passed(
    lab, workstation, slow_gap_config, scheduler_cluster, monkeypatch
):
    Schedule.objects.all().delete()  # no backstop pass can be what runs it
    # Requests go to the broker, as the web's do, not inline as in tests.
    monkeypatch.setattr(passes, "async_task", functools.partial(async_task, sync=False))
    with transaction.atomic():
        submit(lab, 5)
    full = wait_for(lambda: SchedulerState.objects.filter(last_placed=4, last_waiting=1).first())
    assert full.last_idle_gpus == 0
    due = full.last_pass_at + timedelta(milliseconds=full.last_pass_ms + SLOW_GAP_MS)
    assert timezone.now() < due - timedelta(seconds=1), "the first pass took over 2 s to report"

    with transaction.atomic():
        late = task_submit(tenant=lab, spec=TaskSpec(name="late", command="sleep 600"))

    ran = wait_for(lambda: SchedulerState.objects.filter(passes__gt=full.passes).first(), 10)
    assert ran.passes == full.passes + 1  # one pass: the deferred one
    assert due <= ran.last_pass_at <= due + timedelta(seconds=1.5)
    assert ran.last_waiting == 2
    late.refresh_from_db()
    assert late.state == TaskState.PENDING and late.reason, late.reason
