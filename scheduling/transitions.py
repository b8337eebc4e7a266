"""Every change of a task's state, and the only module that writes ``scheduling_task.state``.

A move is checked against the table of legal moves (``states.TRANSITIONS``), writes the same
columns whichever path makes it (``_stamps``), releases the task's GPUs when it leaves the
states that hold them, and records a ``TaskEvent``. Two ways in:

- ``task_transition``: one task, through the ORM, conditional on the state the caller read;
- ``moved``: the SQL of a bulk move (a pass's placements, the agents' starts and plain ends),
  as common table expressions that the caller composes into its one statement, so those paths
  keep their single round trip. Each is checked against the table when its caller's module
  loads and builds its statement.

The database refuses any other move, raw SQL included (the trigger of migration 0022), and
``tests/scheduling/test_one_state_machine.py`` fails if another module writes a task's state.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from gpuplatform import events
from scheduling import passes, reasons, states
from scheduling.models import Allocation, Task, TaskEvent
from scheduling.states import TaskState


class StaleTask(Exception):
    """The task changed state under us: another process got there first."""


# --- What a move writes ------------------------------------------------------------------------

NOW, NULL = "now", None  # the stamps' values: the move's time, or cleared


def _stamps(from_state: TaskState, to_state: TaskState) -> dict[str, str | None]:
    """The columns a move stamps besides the state and the reason: a new state makes the last
    pass's assessment stale (the next pass writes a fresh one), and the times say when the task
    was placed, started and ended (all cleared when it goes back to the queue)."""
    stamps: dict[str, str | None] = {"updated_at": NOW}
    if to_state == TaskState.SCHEDULED:
        stamps["scheduled_at"] = NOW
    elif to_state == TaskState.RUNNING and from_state == TaskState.SCHEDULED:
        stamps["started_at"] = NOW
    elif to_state in states.TERMINAL:
        stamps["finished_at"] = NOW
    elif to_state == TaskState.PENDING:
        stamps.update(node_id=NULL, scheduled_at=NULL, started_at=NULL, finished_at=NULL)
    return stamps


def _releases(from_state: TaskState, to_state: TaskState) -> bool:
    """Whether the move ends the task's hold on its GPUs."""
    return from_state in states.HOLDS_GPUS and to_state not in states.HOLDS_GPUS


# --- One task ----------------------------------------------------------------------------------


@transaction.atomic
def task_transition(
    *,
    task: Task,
    to_state: TaskState | str,
    reason: reasons.Reason | str = "",
    actor: AbstractBaseUser | None = None,
    wake_scheduler: bool = True,
    **fields: Any,
) -> Task:
    """Move ``task`` to ``to_state`` if legal, record a TaskEvent, and return the task.

    The UPDATE is conditional on the state the caller read, so two processes racing to move
    the same task cannot both succeed: the loser gets StaleTask and must re-read. Leaving the
    states that hold GPUs releases the task's allocations in the same transaction.
    ``reason`` as data (``reasons.Reason``) is stored as its English text, code and parameters;
    plain text as text alone.
    """
    from_state = TaskState(task.state)
    to_state = TaskState(to_state)
    states.check(from_state, to_state)
    now = timezone.now()
    text, code, params = reasons.stored(reason)
    updates: dict[str, Any] = {
        "state": to_state,
        "reason": text,
        "reason_code": code,
        "reason_params": params,
        "wait": {},
        "wait_digest": 0,
    }
    updates.update(fields)
    updates.update(
        (column, now if value == NOW else None)
        for column, value in _stamps(from_state, to_state).items()
    )
    changed = Task.objects.filter(pk=task.pk, state=from_state).update(**updates)
    if not changed:
        raise StaleTask(f"task {task.pk} is no longer {from_state}")
    if _releases(from_state, to_state):
        Allocation.objects.filter(task_id=task.pk, released_at__isnull=True).update(released_at=now)
    for name, value in updates.items():
        setattr(task, name, value)
    TaskEvent.objects.create(
        task=task,
        at=now,
        from_state=from_state,
        to_state=to_state,
        reason=text,
        reason_code=code,
        reason_params=params,
        attempt=task.attempt,
        actor=actor,
    )
    events.publish(events.TASKS, [task])
    # Freed GPUs, a task back in the queue, or a serial queue's head gone: the next may start.
    if wake_scheduler and (
        _releases(from_state, to_state)
        or to_state in states.TERMINAL
        or to_state == TaskState.PENDING
    ):
        passes.request_pass()
    return task


# --- Many tasks in one statement ---------------------------------------------------------------


def moved(
    name: str,
    from_state: TaskState,
    to_state: TaskState,
    *,
    source: str,
    where: str,
    now: str = "%(now)s",
    reason: str = "''",
    event_reason: str | None = None,
    code: str = "''",
    params: str = "'{}'::jsonb",
    event_code: str | None = None,
    event_params: str | None = None,
    sets: str = "",
    returning: str = "",
) -> str:
    """Common table expressions that move the tasks ``source`` picks from ``from_state`` to
    ``to_state``, for a statement that names them after ``WITH`` (their text, for the caller to
    compose): ``name`` (``UPDATE scheduling_task AS name ... FROM source WHERE where``) returns
    each moved task's ``id``, ``attempt`` and ``event_reason``, then ``returning``'s columns;
    ``name_events`` records their TaskEvents; and ``name_freed`` releases their GPUs when the
    move ends the hold on them. ``reason`` is the tasks' new reason (SQL), ``event_reason`` the
    events' (the new reason by default), ``code`` and ``params`` the reason as data (SQL: text
    and jsonb, ``scheduling.reasons``), ``event_code`` and ``event_params`` the events' (the
    tasks' by default), ``sets`` more assignments,
    ``now`` the time's
    placeholder. Only tasks still in ``from_state`` move: that is checked with ``IS NOT
    DISTINCT FROM``, which no index serves, so the planner finds the tasks by ``where``'s keys
    and never by the state's index (see ``scheduler._PLACE``)."""
    states.check(from_state, to_state)
    stamps = [
        f"{column} = {now if value == NOW else 'NULL'}"
        for column, value in _stamps(from_state, to_state).items()
    ]
    also = ", ".join([*stamps, sets] if sets else stamps)
    event_reason = event_reason or f"{name}.reason"
    event_code = event_code or f"{name}.reason_code"
    event_params = event_params or f"{name}.reason_params"
    extra = f", {returning}" if returning else ""
    ctes = [
        f"""{name} AS (UPDATE scheduling_task AS {name}
             SET state = '{to_state.value}', reason = {reason}, wait = '{{}}', wait_digest = 0,
                 reason_code = {code}, reason_params = {params}, {also}
            FROM {source}
           WHERE ({where}) AND {name}.state IS NOT DISTINCT FROM '{from_state.value}'
       RETURNING {name}.id, {name}.attempt, {event_reason} AS event_reason,
                 {event_code} AS event_code, {event_params} AS event_params{extra})""",  # noqa: S608 - the callers' constant text
        f"""{name}_events AS (INSERT INTO scheduling_taskevent
                             (task_id, at, from_state, to_state, reason, reason_code,
                              reason_params, attempt)
          SELECT id, {now}, '{from_state.value}', '{to_state.value}', event_reason, event_code,
                 event_params, attempt
            FROM {name})""",  # noqa: S608 - constant text
    ]
    if _releases(from_state, to_state):
        ctes.append(
            f"""{name}_freed AS (UPDATE scheduling_allocation f SET released_at = {now}
                FROM {name} WHERE f.task_id = {name}.id AND f.released_at IS NULL)"""  # noqa: S608 - constant text
        )
    return ",\n    ".join(ctes)
