"""A pass and the node agents never wait for each other's task locks in a way that closes a
circle (PostgreSQL breaks such a deadlock only after its deadlock_timeout, a second).

Two halves of the circles the throughput bench found, each tested on its own against a second,
real connection holding the lock as an agent's transaction would:
- an agent placing a waiting task holds it until its hand-off commits: the pass's reason
  update skips it rather than waiting;
- an agent recording its tasks' ends holds them until the commit: the lock it takes lets the
  foreign-key checks of other transactions (a pass's commit inserts rows naming tasks) through.
A lock wait in this connection fails the statement at once (``lock_timeout``), so a test that
would wait fails instead of hanging.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from gpuplatform.procid import ProcessId
from scheduling import scheduler, transitions
from scheduling.agentapi import handoff, reports
from scheduling.agentapi.messages import ExitReport, StartReport
from scheduling.models import Task, TaskAttempt, TaskEvent
from scheduling.spec import parse_spec
from scheduling.states import TaskState
from scheduling.submission import tasks_submit
from tests.factories import NodeFactory, TenantFactory, make_gpus

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def other_transaction() -> Iterator[psycopg.Cursor]:
    """A second connection to the test database, in a transaction rolled back at the end."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=False) as other, other.cursor() as cursor:
        try:
            yield cursor
        finally:
            other.rollback()


@contextmanager
def no_lock_waits() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '1ms'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


@pytest.fixture
def placed_and_waiting() -> tuple[Task, list[Task]]:
    """A task placed on a 1-GPU node, and three that wait for its GPU, their reasons written."""
    tenant = TenantFactory(name="lab")
    make_gpus(NodeFactory(name="ws-1"), count=1)
    specs = [parse_spec({"name": f"t{i}", "command": "true"}) for i in range(4)]
    placed, *waiting = tasks_submit(tenant=tenant, specs=specs)
    scheduler.schedule_pass()
    assert Task.objects.get(pk=placed.pk).state == TaskState.SCHEDULED
    assert all(t.reason for t in Task.objects.filter(pk__in=[t.pk for t in waiting]))
    Task.objects.update(wait_digest=0)  # as if their reasons changed: the next pass writes them
    return Task.objects.get(pk=placed.pk), waiting


def test_a_pass_skips_the_reason_of_a_task_an_agent_holds(placed_and_waiting):
    held, *others = placed_and_waiting[1]
    with other_transaction() as agent:
        agent.execute("SELECT id FROM scheduling_task WHERE id = %s FOR NO KEY UPDATE", [held.pk])
        with no_lock_waits():
            scheduler.schedule_pass()
        digests = dict(Task.objects.values_list("pk", "wait_digest"))
    assert digests[held.pk] == 0  # skipped, not waited for
    assert all(digests[task.pk] != 0 for task in others)
    scheduler.schedule_pass()  # the lock is gone: the next pass writes it
    assert Task.objects.get(pk=held.pk).wait_digest != 0


@pytest.mark.parametrize("carried", [False, True])
def test_an_agent_recording_ends_lets_foreign_keys_to_its_tasks_through(
    placed_and_waiting, carried
):
    """``carried``: the end carries its start, written first in the same transaction."""
    task = placed_and_waiting[0]
    attempt = TaskAttempt.objects.create(task=task, number=task.attempt, node=task.node)
    end = ExitReport(task_id=task.pk, attempt_no=task.attempt, exit_code=0)
    with other_transaction() as agent:
        if carried:
            gone = ProcessId(4_194_303, 0.0)  # no such process
            start = reports.started_query([StartReport(attempt.pk, gone, gone)])
            agent.execute(start.sql, start.params)
            assert agent.fetchall()  # it started the task
        else:
            transitions.task_transition(task=task, to_state=TaskState.RUNNING, reason="test")
        agent.execute(
            handoff._SUCCEEDED, handoff.succeeded_params([end], timezone.now(), claim=False)
        )
        assert agent.fetchall()  # it ended the task, and holds it until its commit
        with no_lock_waits(), connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the check a commit would make
            TaskEvent.objects.create(task=task, from_state="running", to_state="running")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def test_agents_of_two_nodes_recording_one_tenants_ends_never_wait_for_each_others_counter():
    """The fair-share counter a released allocation adds to is its tenant's on the GPU's node
    (migration 0031): one tenant's ends on two nodes commit without waiting for each other."""
    from datetime import timedelta

    from scheduling import fairshare
    from scheduling.models import Allocation, TenantUsage
    from tests.factories import TaskFactory

    tenant = TenantFactory(name="lab")
    (gpu_1,), (gpu_2,) = (make_gpus(NodeFactory(name=f"ws-{n}"), count=1) for n in (1, 2))
    now = timezone.now()
    with transaction.atomic():  # as a pass keeps them, under its lock
        fairshare.keep_counters_for(now - timedelta(days=1), 3600.0)
    first, second = (
        Allocation.objects.create(
            task=TaskFactory(tenant=tenant), attempt=1, gpu=gpu, memory_mb=gpu.memory_mb,
            started_at=now - timedelta(minutes=10),
        )
        for gpu in (gpu_1, gpu_2)
    )  # fmt: skip
    with other_transaction() as agent:
        # The first node's agent records its end; its commit's trigger has run, holding the row.
        agent.execute(
            "UPDATE scheduling_allocation SET released_at = now() WHERE id = %s", [first.pk]
        )
        agent.execute("SET CONSTRAINTS ALL IMMEDIATE")
        with no_lock_waits():
            Allocation.objects.filter(pk=second.pk).update(released_at=timezone.now())
    rows = TenantUsage.objects.filter(tenant=tenant)
    assert list(rows.values_list("shard", flat=True)) == [gpu_2.node_id]
    assert rows.get().closed > 0
