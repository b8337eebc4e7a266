"""Issue 10, item 5, through the scheduling service: four services on four GPUs no longer
starve a batch task; it takes back one GPU of its class's share after ``reclaim_after``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from scheduling import estate
from scheduling.models import SchedulerState, Task
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tests.scheduling.conftest import SERVICE


def submit(tenant, spec: TaskSpec) -> Task:
    with transaction.atomic():
        return task_submit(tenant=tenant, spec=spec)


@pytest.mark.django_db
def test_a_batch_task_takes_back_its_share_from_four_services(lab, workstation, run_pass):
    services = [submit(lab, SERVICE) for _ in range(4)]
    assert len(run_pass().placed) == 4  # online borrows all of batch's idle share

    batch = submit(lab, TaskSpec(name="train", command="true", priority=10))
    result = run_pass()
    batch.refresh_from_db()
    assert batch.state == TaskState.PENDING
    reclaim_after = estate.config().scheduling.reclaim_after_s
    at = batch.submitted_at + timedelta(seconds=reclaim_after)
    # It names the time it may reclaim, and the pass books a wake-up for then.
    assert f"takes borrowed GPUs back from {at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" in (
        batch.reason
    )
    assert batch.wait["details"]["reclaim_at"] == at.timestamp()
    assert result.wake_at == at
    assert SchedulerState.objects.get().wake_at == at

    # As if reclaim_after had passed.
    Task.objects.filter(pk=batch.pk).update(
        submitted_at=batch.submitted_at - (at - batch.submitted_at)
    )
    result = run_pass()
    assert len(result.preempted) == 1  # one service: online keeps its guaranteed GPU
    victim = Task.objects.get(pk=result.preempted[0])
    assert victim.pk in {s.pk for s in services}
    assert victim.state == TaskState.PENDING  # never started: straight back to the queue
    preempted = victim.events.filter(to_state=TaskState.PREEMPTED).get()
    assert preempted.reason == (
        f"preempted for #{batch.pk} (batch, priority 10): "
        "online holds more than its guaranteed share"
    )

    result = run_pass()
    batch.refresh_from_db()
    assert batch.state == TaskState.SCHEDULED
    # The evicted service waits; it cannot take the GPU back by priority.
    assert not result.preempted
    victim.refresh_from_db()
    assert victim.state == TaskState.PENDING
    assert Task.objects.filter(task_class="online", state=TaskState.SCHEDULED).count() == 3


@pytest.mark.django_db
def test_services_keep_their_guaranteed_share(lab, workstation, run_pass):
    submit(lab, SERVICE)
    batch = [submit(lab, TaskSpec(name="train", command="true", priority=10)) for _ in range(3)]
    assert len(run_pass().placed) == 4
    late = submit(lab, TaskSpec(name="more", command="true", priority=10))
    Task.objects.filter(pk=late.pk).update(submitted_at=datetime(2020, 1, 1, tzinfo=UTC))
    result = run_pass()
    assert result.preempted == []  # batch holds its 3; online's 1 is not borrowed
    assert all(Task.objects.get(pk=t.pk).state == TaskState.SCHEDULED for t in batch)
