"""What a supervisor reports to the database: its command started, whether it is still
wanted (fencing), how its attempt ended; and the requeue of an attempt lost to the platform.

Kept apart from ``lifecycle`` so the dependency runs one way: the supervisor imports this
module only, ``lifecycle`` (which starts supervisors) imports both.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuplatform.db import update_each
from scheduling import services
from scheduling.launcher.messages import ExitReport, StartReport
from scheduling.models import GPU, GpuState, StopRequest, Task, TaskAttempt
from scheduling.states import HOLDS_GPUS, TaskState

# Ends the reason of a task whose cancel is under way (see lifecycle.task_cancel).
STOPPING = "; stopping"

USER_FAILURES = ("failed", "timed_out")


# --- Reports from the supervisor -----------------------------------------------------------------


def attempts_started(reports: list[StartReport]) -> dict[int, bool]:
    """Commands that run: record each one's supervisor and process and move its task to
    running, all in one transaction. Returns, per attempt id, whether it may go on: False when
    its task was cancelled or moved on meanwhile (the supervisor then stops at once)."""
    started: dict[int, bool] = {report.attempt_id: False for report in reports}
    with transaction.atomic():
        attempts = {
            attempt.pk: attempt
            for attempt in TaskAttempt.objects.select_for_update(of=("self",))
            .select_related("node")
            .filter(pk__in=started)
            .order_by("pk")
        }
        tasks = Task.objects.select_for_update().filter(
            pk__in={attempt.task_id for attempt in attempts.values()}
        )
        tasks = {task.pk: task for task in tasks.order_by("pk")}
        now = timezone.now()
        moves, reported = [], []
        for report in reports:
            attempt = attempts.get(report.attempt_id)
            if attempt is None or attempt.pid is not None:
                continue  # unknown, or a repeated report: the first one counted
            reported.append(attempt)
            attempt.supervisor_pid = report.supervisor.pid
            attempt.supervisor_started = report.supervisor.started
            attempt.pid, attempt.pid_started = report.pid.pid, report.pid.started
            attempt.started_at = now
            task = tasks[attempt.task_id]
            if attempt.stop_requested or task.attempt != attempt.number:
                continue
            if task.state != TaskState.SCHEDULED:
                continue
            started[attempt.pk] = True
            moves.append((task, f"started on {attempt.node.name} (pid {report.pid.pid})"))
        update_each(
            TaskAttempt,
            [a.pk for a in reported],
            supervisor_pid=("integer", [a.supervisor_pid for a in reported]),
            supervisor_started=("float8", [a.supervisor_started for a in reported]),
            pid=("integer", [a.pid for a in reported]),
            pid_started=("float8", [a.pid_started for a in reported]),
            started_at=("timestamptz", [now] * len(reported)),
        )
        services.task_transitions(moves, to_state=TaskState.RUNNING)
    return started


def still_wanted(attempt_ids: list[int]) -> dict[int, bool]:
    """Fencing: an attempt whose task moved on (lost, requeued, cancelled) must stop."""
    rows = TaskAttempt.objects.filter(pk__in=attempt_ids).values(
        "pk", "number", "outcome", "task__attempt", "task__state"
    )
    wanted = dict.fromkeys(attempt_ids, False)
    for row in rows:
        wanted[row["pk"]] = (
            not row["outcome"]
            and row["task__attempt"] == row["number"]
            and row["task__state"] in HOLDS_GPUS
        )
    return wanted


def attempts_finished(reports: list[ExitReport]) -> dict[tuple[int, int], str]:
    """``attempt_finished`` for many attempts in one transaction; the common case, a running
    task that exited with 0, in a few statements for all of them. Returns each outcome by
    (task id, attempt number)."""
    outcomes: dict[tuple[int, int], str] = {}
    with transaction.atomic():
        keys = {(report.task_id, report.attempt_no) for report in reports}
        attempts = {
            (attempt.task_id, attempt.number): attempt
            for attempt in TaskAttempt.objects.select_for_update()
            .filter(task_id__in={task_id for task_id, _ in keys})
            .order_by("pk")
            if (attempt.task_id, attempt.number) in keys
        }
        tasks = Task.objects.select_for_update().filter(pk__in={t for t, _ in keys})
        tasks = {task.pk: task for task in tasks.order_by("pk")}
        now = timezone.now()
        succeeded, moves = [], []
        for report in reports:
            key = (report.task_id, report.attempt_no)
            attempt, task = attempts.get(key), tasks.get(report.task_id)
            if key in outcomes or attempt is None or attempt.outcome:
                continue  # the general path below answers these
            plain = not (report.timed_out or report.problem or attempt.stop_requested)
            if (
                plain
                and report.exit_code == 0
                and task.attempt == attempt.number
                and task.state == TaskState.RUNNING
            ):
                succeeded.append(attempt.pk)
                moves.append((task, "; ".join(filter(None, ["exited with 0", report.note]))))
                outcomes[key] = "succeeded"
        TaskAttempt.objects.filter(pk__in=succeeded).update(
            exit_code=0, outcome="succeeded", ended_at=now
        )
        services.task_transitions(moves, to_state=TaskState.SUCCEEDED, exit_code=0)
        for report in reports:
            key = (report.task_id, report.attempt_no)
            if key not in outcomes:
                outcomes[key] = attempt_finished(
                    report.task_id,
                    report.attempt_no,
                    report.exit_code,
                    timed_out=report.timed_out,
                    problem=report.problem,
                    note=report.note,
                )
    return outcomes


def attempt_finished(
    task_id: int,
    attempt_no: int,
    exit_code: int | None,
    *,
    timed_out: bool = False,
    problem: str = "",
    note: str = "",
) -> str:
    """Record how an attempt ended and move the task on: done, retried, requeued or failed.

    ``note`` is something the user should know that did not change the outcome (output dropped
    on a full log disk); it ends the task's reason. Idempotent: the first report wins (the
    supervisor's, or reconciliation's from the exit file). Returns the outcome.
    """
    with transaction.atomic():
        attempt = (
            TaskAttempt.objects.select_for_update()
            .filter(task_id=task_id, number=attempt_no)
            .first()
        )
        if attempt is None:
            return "unknown"
        if attempt.outcome:
            return attempt.outcome
        task = Task.objects.select_for_update().get(pk=task_id)
        if attempt.stop_requested == StopRequest.VIOLATION:
            problem = problem or task.reason
        outcome = _outcome(attempt, exit_code, timed_out, problem)
        broken = _broken_gpu(attempt) if outcome == "failed" and not problem else None
        if broken is not None:
            outcome = "lost"  # the GPU failed under it: not the user's fault
        attempt.exit_code, attempt.outcome, attempt.ended_at = exit_code, outcome, timezone.now()
        attempt.save(update_fields=["exit_code", "outcome", "ended_at"])
        if task.attempt == attempt_no and task.state in HOLDS_GPUS:
            if broken is not None:
                requeue_lost(
                    task,
                    f"GPU {broken} became {broken.state} during the attempt (exit {exit_code})",
                )
            else:
                _move_on(task, attempt, outcome, exit_code, problem)
                if note:
                    Task.objects.filter(pk=task.pk).update(reason=f"{task.reason}; {note}")
    return outcome


def _broken_gpu(attempt: TaskAttempt) -> GPU | None:
    """A GPU of the attempt that failed or dropped off the node: the exit is the hardware's."""
    return (
        GPU.objects.filter(
            uuid__in=attempt.gpu_uuids, state__in=[GpuState.FAILED, GpuState.OFFLINE]
        )
        .select_related("node")
        .first()
    )


def _outcome(attempt: TaskAttempt, exit_code: int | None, timed_out: bool, problem: str) -> str:
    if attempt.stop_requested == StopRequest.CANCEL:
        return "cancelled"
    if attempt.stop_requested == StopRequest.PREEMPT:
        return "preempted"
    if timed_out:
        return "timed_out"
    if problem:
        return "failed"
    return "succeeded" if exit_code == 0 else "failed"


def _move_on(
    task: Task, attempt: TaskAttempt, outcome: str, exit_code: int | None, problem: str
) -> None:
    if outcome == "succeeded":
        services.task_transition(
            task=task, to_state=TaskState.SUCCEEDED, exit_code=0, reason="exited with 0"
        )
    elif outcome == "cancelled":
        # task_cancel said who cancelled and that it was stopping; now it has stopped.
        services.task_transition(
            task=task,
            to_state=TaskState.CANCELLED,
            exit_code=exit_code,
            reason=task.reason.removesuffix(STOPPING) or "cancelled",
        )
    elif outcome == "preempted":
        if task.state != TaskState.PREEMPTED:
            services.task_transition(task=task, to_state=TaskState.PREEMPTED, reason="preempted")
        services.task_transition(
            task=task, to_state=TaskState.PENDING, reason="requeued after preemption"
        )
    else:
        _fail_or_retry(task, outcome, exit_code, problem)


def _fail_or_retry(task: Task, outcome: str, exit_code: int | None, problem: str) -> None:
    what = problem or (
        f"timed out after {task.timeout_s} s"
        if outcome == "timed_out"
        else f"exited with {exit_code}"
    )
    failures = TaskAttempt.objects.filter(task=task, outcome__in=USER_FAILURES).count()
    if failures <= task.retries and not problem:
        delay = min(3600, settings.RETRY_BACKOFF * 2 ** (failures - 1))
        services.task_transition(
            task=task,
            to_state=TaskState.PENDING,
            reason=f"{what}; retry {failures} of {task.retries} in {delay} s",
            exit_code=exit_code,
            not_before=timezone.now() + timedelta(seconds=delay),
        )
        return
    final = TaskState.TIMED_OUT if outcome == "timed_out" else TaskState.FAILED
    services.task_transition(task=task, to_state=final, exit_code=exit_code, reason=what)


# --- Infrastructure failures ----------------------------------------------------------------------


def requeue_lost(task: Task, reason: str) -> None:
    """The node or the supervisor is gone: mark the attempt lost and requeue the task, without
    spending the user's retries, until INFRA_REQUEUE_LIMIT; then hold it for a person."""
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.state not in HOLDS_GPUS:
            return
        TaskAttempt.objects.filter(task=task, number=task.attempt, outcome="").update(
            outcome="lost", ended_at=timezone.now()
        )  # (an attempt already settled, e.g. lost to a failed GPU, keeps its record)
        services.task_transition(task=task, to_state=TaskState.LOST, reason=reason)
        requeues = task.infra_requeues + 1
        hold = ""
        if requeues > settings.INFRA_REQUEUE_LIMIT:
            hold = f"held after {requeues - 1} infrastructure requeues; last: {reason}"
        services.task_transition(
            task=task,
            to_state=TaskState.PENDING,
            reason=hold or f"requeued: {reason}",
            infra_requeues=requeues,
            hold_reason=hold,
        )
