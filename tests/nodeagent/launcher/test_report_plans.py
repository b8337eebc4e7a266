"""What recording a start or a plain end reads: the reported tasks by their keys, not the other
tasks in the same state, whichever plan PostgreSQL uses (the one it makes for each call, or the
generic one it keeps once the arrays come through scalar subqueries), and with no statistics
yet (a young installation's first burst)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduling.agentapi import handoff, reports
from scheduling.agentapi.messages import ExitReport
from scheduling.models import Task, TaskAttempt
from tests.factories import NodeFactory, TenantFactory
from tests.plans import rows_visited

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
OTHERS = 10_000
TABLES = ["scheduling_task", "scheduling_taskattempt"]


def tasks_with_attempts(state: str) -> list[TaskAttempt]:
    node = NodeFactory(name="n")
    lab = TenantFactory(name="lab")
    tasks = Task.objects.bulk_create(
        Task(tenant=lab, name=f"t-{i}", command="true", state=state, attempt=1, node=node)
        for i in range(OTHERS)
    )
    started = state == "running"
    return TaskAttempt.objects.bulk_create(
        TaskAttempt(task=task, number=1, node=node, log_path="/dev/null",
                    supervisor_pid=1 if started else None, pid=2 if started else None)
        for task in tasks
    )  # fmt: skip


def test_a_start_reads_its_task_not_every_scheduled_one():
    attempts = tasks_with_attempts("scheduled")
    for generic, attempt in ((False, attempts[OTHERS // 2]), (True, attempts[OTHERS // 3])):
        params = {
            "ids": [attempt.pk],
            "spid": [10],
            "sst": [1.0],
            "pid": [11],
            "pst": [2.0],
            "now": NOW,
        }
        assert rows_visited(reports._STARTED, params, TABLES, generic=generic) <= 10, generic
        assert Task.objects.get(pk=attempt.task_id).state == "running"


def test_a_plain_end_reads_its_task_not_every_running_one():
    attempts = tasks_with_attempts("running")
    for generic, attempt in ((False, attempts[OTHERS // 2]), (True, attempts[OTHERS // 3])):
        report = ExitReport(attempt.task_id, 1, 0, False, "", "", False)
        params = handoff.succeeded_params([report], NOW, claim=False)
        assert rows_visited(handoff._SUCCEEDED, params, TABLES, generic=generic) <= 10, generic
        assert Task.objects.get(pk=attempt.task_id).state == "succeeded"
