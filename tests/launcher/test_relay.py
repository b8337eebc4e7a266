"""Supervisors report through the node agent's relay, many reports per transaction; a report
the relay cannot vouch for is refused, and a supervisor that gets no answer writes it itself."""

from __future__ import annotations

import json
import os
import socket

from scheduling import scheduler
from scheduling.launcher import lifecycle, relay, reports
from scheduling.launcher.messages import ExitReport, StartReport
from scheduling.launcher.procs import ProcessId
from scheduling.models import Task, TaskAttempt, TaskEvent
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tests.launcher.conftest import state_of, wait_for


def submit(lab, command: str, name: str = "t") -> Task:
    return task_submit(tenant=lab, spec=TaskSpec(name=name, command=command))


def test_supervisors_report_start_and_end_through_the_relay(listening, node, lab, monkeypatch):
    monkeypatch.setattr(relay, "GATHER_S", 0.3)  # wide enough to batch these few for sure
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


def test_without_a_relay_the_supervisor_writes_its_reports_itself(launcher, node, lab):
    task = submit(lab, "true")
    scheduler.schedule_pass()
    wait_for(state_of(task, "succeeded"))
    assert TaskAttempt.objects.get(task=task).supervisor_pid is not None


def ask(node_name: str, message: dict) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(5)
        sock.connect(relay.address(node_name))
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
    assert ask(node.name, {**finished, "sig": relay.signature(finished)}) == b""
    # Naming this process, but unsigned.
    assert ask(node.name, {**finished, "supervisor": os.getpid(), "sig": "0"}) == b""
    wait_for(lambda: listening.reports == 1, timeout=5)  # the start
    task.refresh_from_db()
    assert task.state == "running"
    # And the real thing, sent as the supervisor would (its pid is this process here).
    mine = {**finished, "supervisor": os.getpid()}
    assert json.loads(ask(node.name, {**mine, "sig": relay.signature(mine)})) == {
        "ok": True,
        "outcome": "succeeded",
    }


def test_a_batch_of_starts_and_ends_is_written_as_each_alone_would_be(
    launcher, node, lab, monkeypatch
):
    monkeypatch.setattr(lifecycle, "dispatch_launches", lambda placed: None)  # reports by hand
    tasks = [submit(lab, "true", name=f"b{i}") for i in range(4)]
    scheduler.schedule_pass()
    attempts = []
    for task in tasks:
        task.refresh_from_db()
        attempts.append(
            TaskAttempt.objects.create(task=task, number=1, node=node, gpu_uuids=[], log_path="")
        )
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
