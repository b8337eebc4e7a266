"""What placing a task reads: the placed tasks by their keys, not the backlog around them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduling.models import Task
from scheduling.policy import Placement
from scheduling.scheduler import place_query
from tests.factories import NodeFactory, TenantFactory, make_gpus
from tests.plans import rows_visited

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("generic", [False, True])
def test_placing_one_task_reads_that_task_not_every_pending_one(generic):
    """A node agent's hand-off places one or two tasks at a time: matched on their state
    through its index, the statement read every pending task for them (1,804 of 1,804 in the
    throughput bench, where no ANALYZE had run), here 3,001."""
    node = NodeFactory(name="n")
    (gpu,) = make_gpus(node, count=1)
    lab = TenantFactory(name="lab")
    waiting = Task.objects.bulk_create(
        Task(tenant=lab, name=f"t-{i}", command="true", state="pending") for i in range(3_000)
    )
    task = waiting[1_500]
    query = place_query([Placement(task.pk, node.name, ((gpu.pk, gpu.memory_mb),), True)], NOW)
    assert rows_visited(query.sql, query.params, ["scheduling_task"], generic=generic) <= 5
    task.refresh_from_db()
    assert (task.state, task.node_id, task.attempt) == ("scheduled", node.pk, 1)
