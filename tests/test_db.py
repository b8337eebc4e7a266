"""gpuplatform.db: each row its own values in one statement, shared values prepared as a save."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gpuplatform.db import update_each
from scheduling.models import Task
from tests.factories import NodeFactory, TaskFactory

pytestmark = pytest.mark.django_db


def test_update_each_gives_each_row_its_value_and_every_row_the_shared_ones():
    node = NodeFactory(name="box")
    tasks = [TaskFactory(node=node, wait={"old": 1}) for _ in range(3)]
    now = timezone.now()
    with CaptureQueriesContext(connection) as seen:
        changed = update_each(
            Task,
            [task.pk for task in tasks[:2]],
            reason=("text", ["first", "second"]),
            same={"state": "running", "wait": {}, "node": None, "updated_at": now},
        )
    assert changed == 2
    assert len(seen.captured_queries) == 1
    rows = {t.pk: t for t in Task.objects.filter(pk__in=[t.pk for t in tasks])}
    assert [(rows[t.pk].reason, rows[t.pk].state) for t in tasks[:2]] == [
        ("first", "running"),
        ("second", "running"),
    ]
    assert all(rows[t.pk].wait == {} and rows[t.pk].node_id is None for t in tasks[:2])
    assert rows[tasks[0].pk].updated_at == now
    untouched = rows[tasks[2].pk]
    assert (untouched.wait, untouched.node_id) == ({"old": 1}, node.pk)
