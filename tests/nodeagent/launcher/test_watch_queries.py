"""What a node agent reads every second stays with the node's running attempts, however many
it ran before."""

from __future__ import annotations

import pytest
from django.db import connection

from nodeagent.launcher.lifecycle import watched_supervisors
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
