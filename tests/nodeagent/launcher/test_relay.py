"""Supervisors report through the node agent's relay, many reports per transaction; a report
the relay cannot vouch for is refused, and a supervisor that gets no answer writes it itself."""

from __future__ import annotations

import json
import os
import socket
import threading

import psycopg
import pytest
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext

from gpuplatform.dburl import current_database_url
from gpuplatform.procid import ProcessId
from nodeagent.launcher import relay, supervisor, wire
from scheduling import controls, passes, scheduler
from scheduling.agentapi import handoff, reports
from scheduling.agentapi.messages import Assignment, ExitReport, StartReport
from scheduling.models import PassRequest, Task, TaskAttempt, TaskEvent, TenantUsage
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tests.nodeagent.launcher.conftest import state_of, wait_for


def submit(lab, command: str, name: str = "t") -> Task:
    return task_submit(tenant=lab, spec=TaskSpec(name=name, command=command))


def test_supervisors_report_start_and_end_through_the_relay(listening, node, lab, monkeypatch):
    monkeypatch.setattr(relay, "GATHER_S", 0.3)  # wide enough to batch these few for sure
    monkeypatch.setattr(supervisor, "START_GRACE_S", 0)  # every start in a report of its own
    tasks = [submit(lab, "true", name=f"t{i}") for i in range(3)] + [submit(lab, "exit 3")]
    scheduler.schedule_pass()

    for task in tasks[:3]:
        wait_for(state_of(task, "succeeded"))
    wait_for(state_of(tasks[3], "failed"))
    # A start and an end each, none written by a supervisor itself (counted once answered).
    wait_for(lambda: listening.reports == 8, timeout=5)
    assert listening.batches < listening.reports  # some were written together
    for task in tasks:
        attempt = TaskAttempt.objects.get(task=task)
        assert attempt.supervisor_pid and attempt.pid and attempt.started_at
        path = list(
            TaskEvent.objects.filter(task=task).order_by("pk").values_list("to_state", flat=True)
        )
        assert path[-2:] == ["running", "succeeded" if task != tasks[3] else "failed"]
    assert tasks[3].exit_code == 3 and tasks[3].reason == "exited with 3"


def test_a_command_over_at_once_has_its_start_sent_with_its_end(listening, node, lab, monkeypatch):
    """One message per task, not two; the record is the same: both moves, both processes."""
    monkeypatch.setattr(supervisor, "START_GRACE_S", 5.0)  # forked supervisors inherit it
    written = []  # in the agent's thread: (starts, whether in a transaction) per statement
    attempts_started = reports.attempts_started

    def spy(starts):
        written.append((len(starts), connection.in_atomic_block))
        return attempts_started(starts)

    monkeypatch.setattr(reports, "attempts_started", spy)
    carried = []  # the attempts whose starts went with the plain ends, in their transaction
    plain_ends = handoff.plain_ends

    def spy_ends(plain, hand, *, first=None):
        carried.extend(first.params["ids"] if first is not None else [])
        return plain_ends(plain, hand, first=first)

    monkeypatch.setattr(handoff, "plain_ends", spy_ends)
    tasks = [submit(lab, "true", name=f"t{i}") for i in range(2)] + [submit(lab, "exit 3")]
    scheduler.schedule_pass()

    wait_for(lambda: listening.reports == 3, timeout=10)
    # A plain end's start is written in the end's transaction, which locks those same tasks;
    # any other end's before it, never in a transaction: holding the started tasks' locks while
    # the hand-off locked others deadlocked with the commits of passes and other agents.
    plain = TaskAttempt.objects.filter(task__in=tasks[:2]).values_list("pk", flat=True)
    assert sorted(carried) == sorted(plain)
    assert sum(n for n, _ in written) == 1 and not any(atomic for _, atomic in written)
    for task, end in zip(tasks, ("succeeded", "succeeded", "failed"), strict=True):
        task.refresh_from_db()
        assert task.state == end and task.started_at is not None
        attempt = TaskAttempt.objects.get(task=task)
        assert attempt.supervisor_pid and attempt.pid and attempt.started_at <= attempt.ended_at
        path = TaskEvent.objects.filter(task=task).order_by("pk").values_list("to_state", flat=True)
        assert list(path)[-2:] == ["running", end]


@pytest.mark.parametrize("grace", [0, 5.0])
def test_without_a_relay_the_supervisor_writes_its_reports_itself(
    launcher, node, lab, monkeypatch, grace
):
    monkeypatch.setattr(supervisor, "START_GRACE_S", grace)
    task = submit(lab, "true")
    scheduler.schedule_pass()
    wait_for(state_of(task, "succeeded"))
    attempt = TaskAttempt.objects.get(task=task)
    assert attempt.supervisor_pid is not None and attempt.pid is not None
    path = TaskEvent.objects.filter(task=task).order_by("pk").values_list("to_state", flat=True)
    assert list(path)[-2:] == ["running", "succeeded"]


def ask(node_name: str, message: dict) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(5)
        sock.connect(wire.address(node_name))
        sock.sendall(json.dumps(message).encode())
        return sock.recv(65536)


def test_a_report_from_anyone_but_the_supervisor_it_names_is_refused(listening, node, lab):
    """A task's process can reach the abstract socket: it cannot end another task. The pid is
    the kernel's (SO_PEERCRED), the signature needs the platform's secret key."""
    task = submit(lab, "sleep 30")
    scheduler.schedule_pass()
    wait_for(state_of(task, "running"))
    attempt = TaskAttempt.objects.get(task=task)
    finished = {
        "kind": "finished",
        "supervisor": attempt.supervisor_pid,
        "report": {"task_id": task.pk, "attempt_no": 1, "exit_code": 0, "timed_out": False,
                   "problem": "", "note": ""},
    }  # fmt: skip
    # Signed, but sent by this process, not by the supervisor it names.
    assert ask(node.name, {**finished, "sig": wire.signature(finished)}) == b""
    # Naming this process, but unsigned.
    assert ask(node.name, {**finished, "supervisor": os.getpid(), "sig": "0"}) == b""
    wait_for(lambda: listening.reports == 1, timeout=5)  # the start
    task.refresh_from_db()
    assert task.state == "running"
    # And the real thing, sent as the supervisor would (its pid is this process here).
    mine = {**finished, "supervisor": os.getpid()}
    assert json.loads(ask(node.name, {**mine, "sig": wire.signature(mine)})) == {
        "ok": True,
        "outcome": "succeeded",
    }


def placed_attempts(lab, node, count: int) -> tuple[list[Task], list[TaskAttempt]]:
    """``count`` tasks placed by a pass, each with its first attempt made (as a launch makes
    it); the supervisors' reports are then sent by hand."""
    tasks = [submit(lab, "true", name=f"p{i}") for i in range(count)]
    scheduler.schedule_pass()
    attempts = []
    for task in tasks:
        task.refresh_from_db()
        attempts.append(
            TaskAttempt.objects.create(task=task, number=1, node=node, gpu_uuids=[], log_path="")
        )
    return tasks, attempts


def test_a_batch_of_starts_and_ends_is_written_as_each_alone_would_be(
    launcher, node, lab, monkeypatch
):
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)  # reports by hand
    tasks, attempts = placed_attempts(lab, node, 4)
    TaskAttempt.objects.filter(pk=attempts[3].pk).update(stop_requested="cancel")
    gone = ProcessId(4_194_303, 0.0)  # no such process: the fixture's clean-up kills nothing

    fences = [{"kind": "fence", "report": {"attempt_id": a.pk}} for a in attempts]
    assert [r["wanted"] for r in relay.write_reports(fences)] == [True] * 4  # scheduled
    started = reports.attempts_started([StartReport(a.pk, gone, gone) for a in attempts])

    assert started == {a.pk: True for a in attempts[:3]} | {attempts[3].pk: False}
    assert [state_of(t, "running", "scheduled")() for t in tasks] == ["running"] * 3 + ["scheduled"]
    ends = [
        ExitReport(tasks[0].pk, 1, 0),
        ExitReport(tasks[1].pk, 1, 0, note="12 bytes of output were dropped"),
        ExitReport(tasks[2].pk, 1, 3),
        ExitReport(tasks[3].pk, 1, None, problem="cannot start the command"),
    ]

    outcomes = reports.attempts_finished(ends)
    assert reports.attempts_finished(ends) == outcomes  # a repeated report changes nothing

    assert outcomes == {
        (tasks[0].pk, 1): "succeeded",
        (tasks[1].pk, 1): "succeeded",
        (tasks[2].pk, 1): "failed",
        (tasks[3].pk, 1): "cancelled",
    }
    for task in tasks:
        task.refresh_from_db()
    assert [t.state for t in tasks] == [
        TaskState.SUCCEEDED,
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.CANCELLED,
    ]
    assert [r["wanted"] for r in relay.write_reports(fences)] == [False] * 4  # ended
    assert tasks[1].reason == "exited with 0; 12 bytes of output were dropped"
    assert not tasks[0].allocations.filter(released_at__isnull=True).exists()
    assert TaskEvent.objects.filter(task__in=tasks, to_state="succeeded").count() == 2


def test_a_batch_of_starts_and_plain_ends_takes_one_statement_each(
    launcher, node, lab, monkeypatch
):
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    monkeypatch.setattr(passes, "request_pass", lambda claimed=None: None)  # counted apart
    tasks, attempts = placed_attempts(lab, node, 3)
    me = ProcessId(os.getpid(), 123.5)
    child = ProcessId(4_194_303, 124.25)

    with CaptureQueriesContext(connection) as started_queries:
        started = reports.attempts_started([StartReport(a.pk, me, child) for a in attempts])
    with CaptureQueriesContext(connection) as ended_queries:
        outcomes = reports.attempts_finished(
            [ExitReport(t.pk, 1, 0, note="5 bytes of output were dropped") for t in tasks]
        )

    assert len(started_queries) == 1 and len(ended_queries) == 1
    assert started == {a.pk: True for a in attempts}
    assert outcomes == {(t.pk, 1): "succeeded" for t in tasks}
    for task, attempt in zip(tasks, attempts, strict=True):
        task.refresh_from_db()
        attempt.refresh_from_db()
        assert (attempt.supervisor_pid, attempt.supervisor_started) == (me.pid, me.started)
        assert (attempt.pid, attempt.pid_started) == (child.pid, child.started)
        assert attempt.started_at and attempt.ended_at and attempt.started_at <= attempt.ended_at
        assert (attempt.outcome, attempt.exit_code) == ("succeeded", 0)
        assert (task.state, task.exit_code, task.wait) == (TaskState.SUCCEEDED, 0, {})
        assert task.started_at and task.finished_at and task.started_at <= task.finished_at
        assert task.reason == "exited with 0; 5 bytes of output were dropped"
        assert not task.allocations.filter(released_at__isnull=True).exists()
        events = TaskEvent.objects.filter(task=task).order_by("pk")
        assert [(e.from_state, e.to_state, e.attempt) for e in events][-2:] == [
            ("scheduled", "running", 1),
            ("running", "succeeded", 1),
        ]
        assert events[len(events) - 2].reason == f"started on {node.name} (pid {child.pid})"
    # The released allocations reached the fair-share counters (the trigger's work).
    assert TenantUsage.objects.get(tenant=lab).closed > 0


def test_an_end_racing_a_requeue_waits_for_it_and_reports_what_it_decided(
    launcher, node, lab, monkeypatch
):
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    (task,), (attempt,) = placed_attempts(lab, node, 1)
    gone = ProcessId(4_194_303, 0.0)
    assert reports.attempts_started([StartReport(attempt.pk, gone, gone)]) == {attempt.pk: True}

    # Another session requeues the task (as requeue_lost does: task first, then its attempt)
    # and holds its locks while the exit report comes in.
    other = psycopg.connect(current_database_url(), autocommit=False)
    try:
        other.execute("SELECT id FROM scheduling_task WHERE id = %s FOR UPDATE", [task.pk])
        other.execute(
            "UPDATE scheduling_task SET state = 'pending', node_id = NULL WHERE id = %s", [task.pk]
        )
        other.execute(
            "UPDATE scheduling_taskattempt SET outcome = 'lost' WHERE id = %s", [attempt.pk]
        )
        result: dict = {}

        def report() -> None:
            try:
                result.update(reports.attempts_finished([ExitReport(task.pk, 1, 0)]))
            except Exception as exc:  # noqa: BLE001 - the assertion below shows it
                result["error"] = repr(exc)
            finally:
                connection.close()

        reporter = threading.Thread(target=report)
        reporter.start()
        wait_for(lambda: blocked_on_a_lock(other) or result, timeout=10)
        other.commit()
        reporter.join(timeout=10)
    finally:
        other.close()

    assert result == {(task.pk, 1): "lost"}, "the requeue's decision stands"
    task.refresh_from_db()
    assert task.state == TaskState.PENDING
    assert not TaskEvent.objects.filter(task=task, to_state="succeeded").exists()


def blocked_on_a_lock(other: psycopg.Connection) -> bool:
    """Whether some session waits for a lock ``other``'s transaction holds."""
    # Activity is read once per transaction unless the snapshot is cleared.
    (pid,) = other.execute("SELECT pg_backend_pid(), pg_stat_clear_snapshot()").fetchone()[:1]
    (waiting,) = other.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid]
    ).fetchone()
    return waiting > 0


def test_every_report_is_sent_as_dataclasses_asdict_would_give_it():
    import dataclasses

    from scheduling.agentapi.messages import FenceQuery

    for report in (
        StartReport(7, ProcessId(11, 1795000000.25), ProcessId(12, 1795000000.5)),
        StartReport(7, ProcessId(11, 1795000000.25), None),
        ExitReport(3, 2, 137, True, "killed", "bytes dropped"),
        ExitReport(3, 2, None),
        ExitReport(3, 2, 0, started=StartReport(7, ProcessId(11, 1.25), ProcessId(12, 1.5))),
        ExitReport(3, 2, 143, fenced_s=61),
        FenceQuery(9),
        Assignment(*(7, 3, 2, "n", "lab", "", "t", "true", "", "/l", 60), {"A": "1"}, {"pids": 5}),
    ):
        assert report.as_dict() == dataclasses.asdict(report)
        assert json.dumps(report.as_dict()) == json.dumps(dataclasses.asdict(report)), "same order"
        if isinstance(report, ExitReport):
            assert ExitReport.of(json.loads(json.dumps(report.as_dict()))) == report


def test_plain_ends_claim_the_pass_flag_in_their_own_statement(launcher, node, lab, monkeypatch):
    """The statement that frees the GPUs also asks for the pass that places them again: no
    request statement after it. In a caller's transaction the request follows the commit, and
    ends that free nothing (a repeated report) ask for nothing."""
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    queued = []
    monkeypatch.setattr(passes, "async_task", lambda *args, **kwargs: queued.append(kwargs))
    tasks, attempts = placed_attempts(lab, node, 4)
    gone = ProcessId(4_194_303, 0.0)
    reports.attempts_started([StartReport(a.pk, gone, gone) for a in attempts])

    def end(*ended: Task) -> list[str]:
        with CaptureQueriesContext(connection) as statements:
            reports.attempts_finished([ExitReport(t.pk, 1, 0) for t in ended])
        return [query["sql"] for query in statements.captured_queries]

    passes.mark_started()  # the pass that placed them has begun: the flag is clear
    queued.clear()  # (the one the submissions asked for)
    assert len(end(tasks[0])) == 1
    assert len(queued) == 1 and PassRequest.objects.get(pk=1).queued

    assert len(end(tasks[1])) == 1  # a pass is queued already
    assert len(queued) == 1

    passes.mark_started()
    end(tasks[1])  # a repeated report frees nothing (its outcome is read as before)
    assert len(queued) == 1 and not PassRequest.objects.get(pk=1).queued

    with transaction.atomic():
        linked = end(tasks[2])
        assert not queued[1:] and not PassRequest.objects.get(pk=1).queued
    assert len(linked) == 1 and len(queued) == 2  # asked for once the caller committed
    assert PassRequest.objects.get(pk=1).queued


def test_a_batch_rolled_back_for_a_deadlock_is_written_again(listening, node, lab, monkeypatch):
    """Not handed back to its supervisors, each of which would load Django to write it."""
    calls = []
    attempts_finished = reports.attempts_finished

    def deadlocked_once(*args, **kwargs):
        calls.append(connection.in_atomic_block)
        if len(calls) == 1:
            raise OperationalError("deadlock detected") from psycopg.errors.DeadlockDetected()
        return attempts_finished(*args, **kwargs)

    monkeypatch.setattr(reports, "attempts_finished", deadlocked_once)
    task = submit(lab, "true")
    scheduler.schedule_pass()
    wait_for(state_of(task, "succeeded"))
    assert calls == [False, False]  # in this process's relay thread: the agent wrote it, twice
