"""Time-based waits wake the scheduler when they are due, not at the next backstop."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from django_q.models import OrmQ, Schedule
from django_q.signing import SignedPackage

from gpuplatform.broker import NotifyingOrm
from scheduling import passes
from scheduling.models import SchedulerState, Task
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tests.nodeagent.launcher.conftest import state_of, wait_for
from tests.scheduling.conftest import SERVICE, shipped_config_with


def backing_off(tenant, seconds: float) -> Task:
    """A pending task whose retry backoff ends ``seconds`` from now (one transaction, as when
    an attempt fails: the pass it asks for sees the backoff)."""
    with transaction.atomic():
        task = task_submit(tenant=tenant, spec=TaskSpec(name="t", command="true"))
        not_before = timezone.now() + timedelta(seconds=seconds)
        Task.objects.filter(pk=task.pk).update(not_before=not_before)
    task.refresh_from_db()
    return task


def wake_ups() -> list[tuple[str, object]]:
    """The booked passes: (queue, the time the broker hands them out)."""
    rows = OrmQ.objects.order_by("lock")
    return [
        (row.key, row.lock)
        for row in rows
        if SignedPackage.loads(row.payload)["name"] == "scheduling-wake-up"
    ]


@pytest.mark.django_db
def test_a_pass_books_one_wake_up_for_the_earliest_backoff(lab, workstation, run_pass):
    later, sooner = backing_off(lab, 30), backing_off(lab, 9)
    result = run_pass()
    assert result.placed == []
    # The delayed pass is queued for the scheduler's cluster, handed out when the backoff ends.
    assert wake_ups() == [("gpuplatform", sooner.not_before)]
    assert SchedulerState.objects.get().wake_at == sooner.not_before
    sooner.refresh_from_db()
    assert sooner.reason == (
        f"retry backoff until {sooner.not_before.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    )  # a time, true until then, not a countdown frozen at the last pass

    run_pass()  # a booked wake-up at or before the time needed: nothing more
    assert len(wake_ups()) == 1

    soonest = backing_off(lab, 3)
    run_pass()  # an earlier time: booked as well
    assert [lock for _, lock in wake_ups()] == [soonest.not_before, sooner.not_before]
    assert later.not_before > sooner.not_before


@pytest.mark.django_db
def test_a_task_waiting_for_gpus_books_a_wake_up_for_when_it_starts_to_starve(
    lab, workstation, run_pass
):
    for _ in range(4):
        task_submit(tenant=lab, spec=TaskSpec(name="t", command="true"))
    run_pass()
    waiting = task_submit(tenant=lab, spec=TaskSpec(name="t", command="true"))
    result = run_pass()
    starves_at = waiting.submitted_at + timedelta(hours=2)  # starvation_after, shipped
    assert result.wake_at == starves_at
    assert wake_ups() == [("gpuplatform", starves_at)]


@pytest.mark.django_db
def test_time_based_passes_come_at_most_one_a_second(lab, workstation, run_pass):
    task = backing_off(lab, 0.5)
    result = run_pass()
    if result.placed:
        pytest.skip("the machine took over 0.5 s to start the pass; the backoff had ended")
    last_pass_at = SchedulerState.objects.get().last_pass_at
    # Not 0.5 s after the pass that books it but a second after, within a second of its time.
    assert task.not_before < last_pass_at + timedelta(seconds=1)
    assert result.wake_at == last_pass_at + timedelta(seconds=1)


@pytest.mark.django_db
def test_nothing_waiting_for_a_time_books_nothing(lab, workstation, run_pass):
    task_submit(tenant=lab, spec=TaskSpec(name="t", command="true"))
    assert run_pass().wake_at is None
    assert wake_ups() == []


@pytest.mark.django_db
def test_the_delayed_broker_hands_a_row_out_only_once_it_is_due():
    due = timezone.now() + timedelta(seconds=60)
    broker = passes.DelayedOrm(list_key="gpuplatform", due=due)
    broker.enqueue("payload")
    plain = NotifyingOrm(list_key="gpuplatform")
    assert plain.queue_size() == 0  # not yet
    OrmQ.objects.update(lock=timezone.now() - timedelta(seconds=1))
    assert plain.queue_size() == 1


# --- End to end, with the scheduler's real django-q2 cluster ----------------------------------


@pytest.fixture
def estate_config(settings, tmp_path):
    """The shipped configuration with a 3 s ``reclaim_after``, for this process and the
    scheduler cluster alike."""
    return shipped_config_with(settings, tmp_path, "  reclaim_after: 2h\n", "  reclaim_after: 3s\n")


def wait_until_placed(task: Task) -> None:
    wait_for(state_of(task, "scheduled", "running"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_3_s_backoff_starts_within_1_5_s_of_its_due_time_without_a_backstop(
    lab, workstation, scheduler_cluster
):
    Schedule.objects.all().delete()  # no backstop pass can be what starts it
    passes_before = SchedulerState.objects.get_or_create(pk=1)[0].passes
    task = backing_off(lab, 3)  # the pass it asks for (run inline here) books the wake-up
    task.refresh_from_db()
    assert task.reason.startswith("retry backoff until ")
    wait_until_placed(task)
    assert task.state == TaskState.SCHEDULED, task.reason
    late = (task.scheduled_at - task.not_before).total_seconds()
    assert 0 <= late <= 1.5, f"started {late:.2f} s after its backoff ended"
    state = SchedulerState.objects.get()
    assert state.passes == passes_before + 2  # the inline one, then the booked one: no other
    assert not Schedule.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_batch_task_reclaims_its_share_within_1_5_s_of_reclaim_after_without_a_backstop(
    lab, workstation, estate_config, scheduler_cluster
):
    Schedule.objects.all().delete()  # no backstop pass can be what starts it
    with transaction.atomic():
        services = [task_submit(tenant=lab, spec=SERVICE) for _ in range(4)]
    for task in services:
        wait_until_placed(task)
        assert task.state == TaskState.SCHEDULED
    with transaction.atomic():  # its pass (run by the cluster) books the reclaim wake-up
        batch = task_submit(tenant=lab, spec=TaskSpec(name="train", command="true", priority=10))
    reclaim_at = batch.submitted_at + timedelta(seconds=3)
    wait_until_placed(batch)
    assert batch.state == TaskState.SCHEDULED, batch.reason
    late = (batch.scheduled_at - reclaim_at).total_seconds()
    assert 0 <= late <= 1.5, f"started {late:.2f} s after it could reclaim"
    assert Task.objects.filter(task_class="online", state=TaskState.SCHEDULED).count() == 3
    assert not Schedule.objects.exists()
