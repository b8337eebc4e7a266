"""The task API's rows built from columns, not through DRF: what ``TaskOut`` (and
``TaskSubmitted``) make of a task, field for field, for the task list's pages and a submission's
answer, where running each serializer field of each task was a real share of the CPU
(tests/api/test_tasks_api.py checks both answer exactly what the serializers would)."""

from __future__ import annotations

import json

from rest_framework import serializers

from scheduling.models import SchedulerState, Task
from scheduling.states import TaskState

_MOMENT = serializers.DateTimeField()  # how DRF writes a datetime (ISO 8601, UTC as Z)


def _moment(value, written: dict) -> str | None:
    """``value`` as DRF writes it, once per value in ``written`` (the tasks of one submission
    share their submission time: DRF's conversion per task was a real share of a large POST)."""
    if value is None:
        return None
    if value not in written:
        written[value] = _MOMENT.to_representation(value)
    return written[value]


def task_row(task: Task, written: dict) -> dict:
    """What TaskOut makes of ``task``, field for field (tests/api compares the two).
    ``written``: the times already written for the same answer (``_moment``)."""
    return _row(
        (
            task.pk, task.name, task.state, task.reason, task.reason_code, task.reason_params,
            task.wait.get("code", "") if task.wait else None, task.queue, task.priority,
            task.task_class, task.gpus_min, task.gpus_max, task.gpu_memory_mb,
            task.node.name if task.node_id is not None else None,
            task.owner.username if task.owner_id is not None else None,
            task.attempt, task.exit_code, task.submitted_at, task.started_at, task.finished_at,
        ),
        task.place if task.wait else None,
        written,
    )  # fmt: skip


def task_rows(rows: list[tuple]) -> list[dict]:
    """What TaskOut makes of each task, from its row (selectors.TASK_ROW): the places in
    line of those a pass assessed in one query, and no Task, Node or User built (the
    instances were a real share of a page's CPU)."""
    waiting = [row[0] for row in rows if row[2] == TaskState.PENDING and row[6] is not None]
    places = SchedulerState.places(waiting) if waiting else {}
    written: dict = {}
    return [_row(row, places.get(row[0]), written) for row in rows]


def _row(values: tuple, place: tuple[int, int] | None, written: dict) -> dict:
    """TaskOut's fields from a task's row (selectors.TASK_ROW), its place in line (None when
    it is not in line) and ``written`` (``_moment``)."""
    (pk, name, state, reason, reason_code, reason_params, wait_code, queue, priority, task_class,
     gpus_min, gpus_max, memory, node, owner, attempt, exit_code, submitted_at, started_at,
     finished_at) = values  # fmt: skip
    if isinstance(reason_params, str):  # a raw row's jsonb comes as its text (Django's loader)
        reason_params = json.loads(reason_params)
    return {
        "id": pk,
        "name": name,
        "state": str(state),
        "reason": Task.reason_in_line(reason, place, reason_code, reason_params),
        "reason_code": reason_code,
        "reason_params": reason_params,
        "queue": queue,
        "priority": priority,
        "task_class": str(task_class),
        "gpus": gpus_range(gpus_min, gpus_max),
        "gpu_memory_mb": memory,
        "node": node,
        "owner": owner,
        "attempt": attempt,
        "exit_code": exit_code,
        "submitted_at": _moment(submitted_at, written),
        "started_at": _moment(started_at, written),
        "finished_at": _moment(finished_at, written),
    }


def submitted_data(tasks: list[Task], warnings: dict[int, list[str]]) -> list[dict]:
    """``TaskSubmitted(tasks, many=True).data`` for tasks just created, built directly
    (``task_row``): DRF builds a ModelSerializer's fields from the model for every response
    and then runs each field of each task, a noticeable share of a submission's CPU. The
    serializer remains the schema; tests/api/test_tasks_api.py checks that
    this answers exactly what it would."""
    written: dict = {}
    return [{**task_row(task, written), "warnings": warnings.get(task.pk, [])} for task in tasks]


def gpus_range(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"
