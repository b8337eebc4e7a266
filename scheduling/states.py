"""The task state machine: which transitions are legal. Pure Python, no Django.

    pending -> scheduled -> running -> succeeded | failed | cancelled | timed_out
    side roads: paused (and back), preempted (back to pending), lost (requeued or failed)

Every change of a task's state goes through ``scheduling.transitions`` (one task, or many in one
statement), which checks the move against ``TRANSITIONS`` and writes a TaskEvent. The database
refuses a move this table does not allow (the trigger of migration 0022, which holds a copy of
it: a change here needs a new migration).
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    PAUSED = "paused"
    PREEMPTED = "preempted"
    LOST = "lost"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


S = TaskState

TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT})
# States in which a task holds GPUs (an active Allocation). A preempted task keeps them until
# its processes have stopped, so nothing new lands on a GPU that is still busy.
HOLDS_GPUS = frozenset({S.SCHEDULED, S.RUNNING, S.PAUSED, S.PREEMPTED})

TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    # Waiting: placed by the scheduler, cancelled by a person, or failed before it ever ran
    # (a dependency failed, the request became unsatisfiable).
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED}),
    # Placed, launch in flight: the launcher starts it, or the launch fails and it goes back.
    S.SCHEDULED: frozenset(
        {S.RUNNING, S.PENDING, S.CANCELLED, S.FAILED, S.PREEMPTED, S.LOST, S.TIMED_OUT}
    ),
    # Running -> pending is a retry after a user failure or an infrastructure requeue.
    S.RUNNING: frozenset(
        {
            S.SUCCEEDED,
            S.FAILED,
            S.CANCELLED,
            S.TIMED_OUT,
            S.PAUSED,
            S.PREEMPTED,
            S.LOST,
            S.PENDING,
        }
    ),
    S.PAUSED: frozenset({S.RUNNING, S.CANCELLED, S.TIMED_OUT, S.PREEMPTED, S.LOST, S.FAILED}),
    # Side roads end back in the queue, or for good.
    S.PREEMPTED: frozenset({S.PENDING, S.CANCELLED}),
    S.LOST: frozenset({S.PENDING, S.FAILED, S.CANCELLED}),
    # A person may retry a task that did not succeed; success is final.
    S.FAILED: frozenset({S.PENDING}),
    S.CANCELLED: frozenset({S.PENDING}),
    S.TIMED_OUT: frozenset({S.PENDING}),
    S.SUCCEEDED: frozenset(),
}


class IllegalTransition(Exception):
    def __init__(self, from_state: str, to_state: str) -> None:
        self.from_state = from_state
        self.to_state = to_state
        known = from_state in TaskState._value2member_map_
        allowed = ", ".join(sorted(TRANSITIONS[TaskState(from_state)])) if known else ""
        allowed = allowed or "none"
        if from_state == to_state:  # cancelling twice: say so, not the table
            super().__init__(f"the task is already {from_state}")
            return
        super().__init__(
            f"a task cannot go from {from_state} to {to_state} (allowed from {from_state}: "
            f"{allowed})"
        )


def is_legal(from_state: str, to_state: str) -> bool:
    try:
        return TaskState(to_state) in TRANSITIONS[TaskState(from_state)]
    except ValueError:
        return False


def check(from_state: str, to_state: str) -> None:
    if not is_legal(from_state, to_state):
        raise IllegalTransition(from_state, to_state)
