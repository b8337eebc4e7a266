"""The node's lease, piece by piece: what a supervisor does with fence answers (``Lease``), what
the database answers (``reports.fences``), and how a fenced attempt's end is recorded
(``reports.attempt_finished``). The whole, with real processes: ``test_partition``."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from nodeagent.launcher import lease as lease_module
from nodeagent.launcher.lease import Lease
from scheduling import scheduler, transitions
from scheduling.agentapi import reports
from scheduling.agentapi.messages import ExitReport
from scheduling.models import Node, TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tests.factories import NodeFactory, TenantFactory, make_gpus
from tests.nodeagent.launcher.conftest import wait_for

ESTATE = """
heartbeat: {interval: 1s, fence_after: 2s, lost_after: 10s}
nodes: [{name: node-a}]
"""


@pytest.fixture
def estate(settings, tmp_path):
    config = tmp_path / "estate.yaml"
    config.write_text(ESTATE)
    settings.GPUPLATFORM_CONFIG = str(config)
    settings.TASK_STOP_GRACE = 2


def asking(answers) -> Lease:
    """A lease whose command has run long enough to ask."""
    lease = Lease(answers, time.monotonic() - lease_module.FIRST_FENCE_S)
    lease.lapsed(time.monotonic())  # starts asking
    assert lease.asking() or lease.superseded
    return lease


class Answers:
    """What the fence query answers, as the test sets it; counts the questions."""

    def __init__(self, answer: dict | None) -> None:
        self.answer = answer
        self.asked = threading.Event()

    def __call__(self) -> dict | None:
        self.asked.set()
        return self.answer


def test_a_lease_renewed_by_fresh_heartbeats_never_lapses(estate):
    answers = Answers({"wanted": True, "age": 0.0})
    lease = asking(answers)
    try:
        wait_for(lambda: lease.fence_after == 2)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert not lease.lapsed(time.monotonic())
            time.sleep(0.1)
        assert not lease.superseded
    finally:
        lease.close()


def test_a_lease_nobody_answers_lapses_after_fence_after(estate):
    answers = Answers(None)  # neither the agent nor the database: a partition
    lease = asking(answers)
    try:
        wait_for(lambda: lease.lapsed(time.monotonic()), timeout=10)
        assert time.monotonic() - lease.started > 2
        assert not lease.superseded
    finally:
        lease.close()


def test_a_lease_runs_from_the_nodes_last_heartbeat_not_from_the_answer(estate):
    """The database answers, but the node's agent stopped heartbeating long ago: the scheduler
    counts from that heartbeat, so the lease does too."""
    lease = asking(Answers({"wanted": True, "age": 30.0}))
    try:
        wait_for(lambda: lease.lapsed(time.monotonic()), timeout=5)
    finally:
        lease.close()


def test_an_attempt_no_longer_wanted_is_superseded(estate):
    lease = asking(Answers({"wanted": False, "age": 0.0}))
    try:
        wait_for(lambda: lease.superseded)
    finally:
        lease.close()
    wait_for(lambda: not lease.asking())


def test_a_closed_lease_stops_asking(estate):
    answers = Answers({"wanted": True, "age": 0.0})
    lease = asking(answers)
    assert answers.asked.wait(5)
    lease.close()
    wait_for(lambda: not lease.asking())


def test_a_lease_given_fence_after_by_its_assignment_reads_no_configuration(settings, tmp_path):
    """The assignment carries ``heartbeat.fence_after``: with a configuration file the
    supervisor could not read, its lease still lapses when nobody answers."""
    broken = tmp_path / "estate.yaml"
    broken.write_text("heartbeat: [")
    settings.GPUPLATFORM_CONFIG = str(broken)
    lease = Lease(Answers(None), time.monotonic() - lease_module.FIRST_FENCE_S, fence_after=2)
    try:
        wait_for(lambda: lease.lapsed(time.monotonic()), timeout=10)
        assert time.monotonic() - lease.started > 2 and lease.fence_after == 2
    finally:
        lease.close()


def test_a_command_over_at_once_never_asks(estate):
    answers = Answers({"wanted": True, "age": 0.0})
    lease = Lease(answers, time.monotonic())
    assert not lease.lapsed(time.monotonic())
    lease.close()
    assert not lease.asking()
    assert not answers.asked.is_set()


# --- The database's side ---------------------------------------------------------------------


@pytest.fixture
def running(db):
    """A task running as attempt 1 on node-a, as the launcher leaves it."""
    node = NodeFactory(name="node-a")
    make_gpus(node, count=1)
    task = task_submit(tenant=TenantFactory(name="lab"), spec=TaskSpec(name="t", command="x"))
    scheduler.schedule_pass()
    task.refresh_from_db()
    transitions.task_transition(task=task, to_state=TaskState.RUNNING)
    attempt = TaskAttempt.objects.create(task=task, number=1, node=node)
    return task, attempt


def test_the_fence_answer_carries_the_age_of_the_nodes_heartbeat(running):
    task, attempt = running
    Node.objects.filter(pk=attempt.node_id).update(
        last_heartbeat=timezone.now() - timedelta(seconds=7)
    )

    answer = reports.fences([attempt.pk, 999999])

    assert answer[attempt.pk]["wanted"] is True
    assert 7 <= answer[attempt.pk]["age"] < 60
    assert answer[999999] == {"wanted": False, "age": None}


def test_a_fenced_end_of_a_running_attempt_requeues_its_task(running):
    task, attempt = running

    assert reports.attempt_finished(task.pk, 1, 143, fenced_s=3) == "lost"

    attempt.refresh_from_db()
    assert attempt.outcome == "lost"
    assert attempt.end_reason == {"code": "node_fenced", "params": {"node": "node-a", "seconds": 3}}
    assert attempt.end_reason_text == (
        "node node-a lost the database for 3 s: the attempt was stopped"
    )
    task.refresh_from_db()
    assert task.state == TaskState.PENDING  # requeued, not failed: no retry spent
    assert task.infra_requeues == 1
    assert "node node-a lost the database for 3 s" in task.reason


def test_a_late_fenced_report_never_revives_an_attempt_the_scheduler_marked_lost(running):
    from scheduling import controls, reasons

    task, attempt = running
    controls.requeue_lost(task, reasons.Reason("node_silent", {"node": "node-a"}))
    task.refresh_from_db()
    before = (task.state, task.attempt, task.infra_requeues, task.reason)

    report = ExitReport(task.pk, 1, 0, fenced_s=4)  # even one that exited 0 on SIGTERM
    assert reports.attempts_finished([report]) == {(task.pk, 1): "lost"}

    attempt.refresh_from_db()
    assert attempt.outcome == "lost"
    assert attempt.end_reason["code"] == "node_fenced"
    task.refresh_from_db()
    assert (task.state, task.attempt, task.infra_requeues, task.reason) == before
    # A plain late report of the same attempt changes nothing either.
    assert reports.attempt_finished(task.pk, 1, 0) == "lost"
    task.refresh_from_db()
    assert (task.state, task.attempt, task.infra_requeues, task.reason) == before


def test_a_question_that_fails_is_asked_again(estate):
    calls = []

    def ask():
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("wanted")  # a reply of another shape
        return {"wanted": False, "age": 0.0}

    lease = asking(ask)
    try:
        wait_for(lambda: lease.superseded, timeout=10)
    finally:
        lease.close()
