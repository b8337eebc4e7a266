"""The task API's rows built from columns, not through DRF: what ``TaskOut`` (and
``TaskSubmitted``) make of a task, field for field, for the task list's pages and a submission's
answer, where running each serializer field of each task was a real share of the CPU
(tests/api/test_tasks_api.py checks both answer exactly what the serializers would)."""

from __future__ import annotations

import json

from django.utils.translation import get_language
from rest_framework import serializers

from scheduling import reasons
from scheduling.models import SchedulerState, Task
from scheduling.states import TaskState

_MOMENT = serializers.DateTimeField()  # how DRF writes a datetime (ISO 8601, UTC as Z)


class _Answer:
    """What the rows of one answer share, each worked out once: the times written (the tasks of
    one submission share their submission time: DRF's conversion per task was a real share of a
    large POST), the reasons decoded and rendered (a page's tasks mostly share a few: each row's
    was a real share of a listing's CPU), and the active language."""

    def __init__(self) -> None:
        self.moments: dict = {}
        self.reasons: dict = {}
        self.language = get_language()

    def moment(self, value) -> str | None:
        """``value`` as DRF writes it."""
        if value is None:
            return None
        if value not in self.moments:
            self.moments[value] = _MOMENT.to_representation(value)
        return self.moments[value]

    def reason(self, reason: str, code: str, params) -> tuple[dict | None, str]:
        """(the reason's params as data, the reason rendered without a place in line). A raw
        row's jsonb comes as its text (Django's loader), which is the key; of a Task's dict,
        only an empty one (a submission's tasks: "submitted")."""
        if params and not isinstance(params, str):
            return params, reasons.render(code, params, reason)
        key = (reason, code, params or None)
        if key not in self.reasons:
            decoded = json.loads(params) if isinstance(params, str) else params
            self.reasons[key] = decoded, reasons.render(code, decoded, reason)
        return self.reasons[key]


def task_row(task: Task, answer: _Answer) -> dict:
    """What TaskOut makes of ``task``, field for field (tests/api compares the two), in
    ``answer``."""
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
        answer,
    )  # fmt: skip


def task_rows(rows: list[tuple]) -> list[dict]:
    """What TaskOut makes of each task, from its row (selectors.TASK_ROW): the places in
    line of those a pass assessed in one query, and no Task, Node or User built (the
    instances were a real share of a page's CPU)."""
    waiting = [row[0] for row in rows if row[2] == TaskState.PENDING and row[6] is not None]
    places = SchedulerState.places(waiting) if waiting else {}
    answer = _Answer()
    return [_row(row, places.get(row[0]), answer) for row in rows]


def _row(values: tuple, place: tuple[int, int] | None, answer: _Answer) -> dict:
    """TaskOut's fields from a task's row (selectors.TASK_ROW) and its place in line (None when
    it is not in line), in ``answer``."""
    (pk, name, state, reason, reason_code, reason_params, wait_code, queue, priority, task_class,
     gpus_min, gpus_max, memory, node, owner, attempt, exit_code, submitted_at, started_at,
     finished_at) = values  # fmt: skip
    reason_params, text = answer.reason(reason, reason_code, reason_params)
    if place is not None:
        text = reasons.in_line(text, *place, language=answer.language)
    return {
        "id": pk,
        "name": name,
        "state": str(state),
        "reason": text,
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
        "submitted_at": answer.moment(submitted_at),
        "started_at": answer.moment(started_at),
        "finished_at": answer.moment(finished_at),
    }


def submitted_data(tasks: list[Task], warnings: dict[int, list[str]]) -> list[dict]:
    """``TaskSubmitted(tasks, many=True).data`` for tasks just created, built directly
    (``task_row``): DRF builds a ModelSerializer's fields from the model for every response
    and then runs each field of each task, a noticeable share of a submission's CPU. The
    serializer remains the schema; tests/api/test_tasks_api.py checks that
    this answers exactly what it would."""
    answer = _Answer()
    return [{**task_row(task, answer), "warnings": warnings.get(task.pk, [])} for task in tasks]


def gpus_range(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"
