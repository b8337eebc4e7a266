"""The task state machine: every legal move works and writes an event; every other is refused."""

from itertools import product

import pytest

from scheduling import states, transitions
from scheduling.models import Allocation, Task, TaskEvent
from scheduling.states import IllegalTransition, TaskState
from tests.factories import TaskFactory

ALL_PAIRS = list(product(TaskState, TaskState))
LEGAL = [(a, b) for a, b in ALL_PAIRS if b in states.TRANSITIONS[a]]
ILLEGAL = [(a, b) for a, b in ALL_PAIRS if b not in states.TRANSITIONS[a]]


def test_the_table_names_every_state():
    assert set(states.TRANSITIONS) == set(TaskState)


def test_success_is_final_and_other_terminal_states_only_allow_a_retry():
    assert states.TRANSITIONS[TaskState.SUCCEEDED] == frozenset()
    for state in states.TERMINAL - {TaskState.SUCCEEDED}:
        assert states.TRANSITIONS[state] == {TaskState.PENDING}


def test_the_main_road_is_legal():
    road = ["pending", "scheduled", "running", "succeeded"]
    for a, b in zip(road, road[1:], strict=False):
        assert states.is_legal(a, b)


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL, ids=lambda s: str(s))
def test_it_refuses_every_illegal_transition(db, from_state, to_state):
    task = TaskFactory(state=from_state)
    said = (
        f"the task is already {from_state}"  # staying put is refused as such
        if from_state == to_state
        else f"cannot go from {from_state} to {to_state}"
    )
    with pytest.raises(IllegalTransition, match=said):
        transitions.task_transition(task=task, to_state=to_state, reason="test")
    task.refresh_from_db()
    assert task.state == from_state
    assert not TaskEvent.objects.filter(task=task).exists()


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL, ids=lambda s: str(s))
def test_it_performs_every_legal_transition_and_writes_an_event(db, from_state, to_state):
    task = TaskFactory(state=from_state)
    transitions.task_transition(task=task, to_state=to_state, reason="because")
    task.refresh_from_db()
    assert task.state == to_state
    event = TaskEvent.objects.get(task=task)
    assert (event.from_state, event.to_state, event.reason) == (from_state, to_state, "because")


def test_unknown_states_are_illegal():
    assert not states.is_legal("pending", "exploded")
    assert not states.is_legal("exploded", "pending")


def test_it_refuses_a_move_from_a_state_the_task_has_left(db):
    task = TaskFactory(state=TaskState.PENDING)
    stale_copy = Task.objects.get(pk=task.pk)
    transitions.task_transition(task=task, to_state=TaskState.CANCELLED, reason="user")
    with pytest.raises(transitions.StaleTask):
        transitions.task_transition(task=stale_copy, to_state=TaskState.SCHEDULED)
    assert Task.objects.get(pk=task.pk).state == TaskState.CANCELLED
    assert TaskEvent.objects.filter(task=task).count() == 1


def test_it_stamps_the_times_of_the_main_road(db):
    task = TaskFactory()
    transitions.task_transition(task=task, to_state="scheduled")
    transitions.task_transition(task=task, to_state="running")
    transitions.task_transition(task=task, to_state="succeeded", exit_code=0)
    task.refresh_from_db()
    assert task.scheduled_at <= task.started_at <= task.finished_at
    assert task.exit_code == 0


def test_leaving_the_gpus_releases_the_allocations(db, workstation):
    task = TaskFactory()
    transitions.task_transition(task=task, to_state="scheduled")
    gpu = workstation.gpus.first()
    Allocation.objects.create(task=task, attempt=1, gpu=gpu, memory_mb=gpu.memory_mb)
    transitions.task_transition(task=task, to_state="running")
    assert Allocation.objects.filter(task=task, released_at__isnull=True).count() == 1
    transitions.task_transition(task=task, to_state="failed", exit_code=3)
    assert Allocation.objects.filter(task=task, released_at__isnull=True).count() == 0


def test_a_requeue_clears_the_placement(db, workstation):
    task = TaskFactory()
    transitions.task_transition(task=task, to_state="scheduled", node=workstation)
    transitions.task_transition(task=task, to_state="lost", reason="node silent")
    transitions.task_transition(task=task, to_state="pending", reason="requeued")
    task.refresh_from_db()
    assert task.node is None
    assert task.scheduled_at is None
    assert list(task.events.values_list("to_state", flat=True)) == ["scheduled", "lost", "pending"]
