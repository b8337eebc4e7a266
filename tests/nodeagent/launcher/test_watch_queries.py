"""What a node agent reads to watch its supervisors stays with the node's running attempts,
however many it ran before, and it reads it only when it may have changed: an idle node's
agent looks at its supervisors' processes every second without a query."""

from __future__ import annotations

import subprocess

import pytest
from django.db import connection

from gpuplatform.procid import ProcessId
from nodeagent.launcher import lifecycle
from nodeagent.launcher.lifecycle import SupervisorWatch, watched_supervisors
from scheduling.models import Task, TaskAttempt
from tests.factories import NodeFactory, TenantFactory
from tests.plans import rows_visited

pytestmark = pytest.mark.django_db


def test_the_watch_reads_the_running_attempts_not_the_nodes_history():
    """Through the node's index alone it read every attempt the node ever had (3,008 here)."""
    node, other = NodeFactory(name="n"), NodeFactory(name="m")
    lab = TenantFactory(name="lab")
    finished = Task.objects.bulk_create(
        Task(tenant=lab, name=f"old-{i}", command="true", state="succeeded", attempt=1)
        for i in range(3_000)
    )
    running = Task.objects.bulk_create(
        Task(tenant=lab, name=f"run-{i}", command="true", state="running", attempt=1)
        for i in range(8)
    )
    TaskAttempt.objects.bulk_create(
        TaskAttempt(task=task, number=1, node=node, outcome="succeeded", supervisor_pid=1)
        for task in finished
    )
    TaskAttempt.objects.bulk_create(
        TaskAttempt(task=task, number=1, node=node if i % 2 else other, supervisor_pid=1,
                    supervisor_started=0.0)
        for i, task in enumerate(running)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduling_taskattempt")
        cursor.execute("ANALYZE scheduling_task")
    rows = watched_supervisors(node.name)
    assert len(rows) == 4
    sql, params = rows.query.sql_with_params()
    assert rows_visited(sql, params, ["scheduling_taskattempt", "scheduling_task"]) <= 50


@pytest.fixture
def watched(monkeypatch):
    """A node running one attempt whose 'supervisor' is a process of this test, and the
    attempts the watch settles (recorded, not reconciled)."""
    node = NodeFactory(name="n")
    task = Task.objects.create(tenant=TenantFactory(name="lab"), name="t", command="true",
                               state="running", attempt=1, node=node)  # fmt: skip
    proc = subprocess.Popen(["sleep", "60"])  # noqa: S603, S607
    started = ProcessId.of(proc.pid)
    attempt = TaskAttempt.objects.create(task=task, number=1, node=node, supervisor_pid=proc.pid,
                                         supervisor_started=started.started)  # fmt: skip
    settled = []
    monkeypatch.setattr(lifecycle, "reconcile_attempt", lambda a: settled.append(a.pk))
    yield node, proc, attempt, settled
    proc.kill()
    proc.wait()


def test_an_idle_watch_reads_the_database_once_not_at_every_look(
    watched, django_assert_num_queries
):
    node, _, _, settled = watched
    watch = SupervisorWatch(node.name)
    with django_assert_num_queries(1):
        watch.look()
    with django_assert_num_queries(0):
        for _ in range(5):  # five seconds of the agent's loop
            watch.look()
    watch.changed()  # a launch, a report, a reconciliation
    with django_assert_num_queries(1):
        watch.look()
    assert settled == [] and watch.reads == 2


def test_a_supervisor_that_dies_is_settled_at_the_next_look_with_nothing_else_said(watched):
    node, proc, attempt, settled = watched
    watch = SupervisorWatch(node.name)
    watch.look()
    proc.kill()
    proc.wait()
    assert watch.look() == 1
    assert settled == [attempt.pk]


def test_a_dead_supervisor_no_longer_watched_is_not_settled(watched):
    """The list it looked at may be out of date: it reads it again before settling."""
    node, proc, attempt, settled = watched
    watch = SupervisorWatch(node.name)
    watch.look()
    TaskAttempt.objects.filter(pk=attempt.pk).update(outcome="succeeded")  # reported meanwhile
    proc.kill()
    proc.wait()
    assert watch.look() == 0
    assert settled == []
