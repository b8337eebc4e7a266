"""What a supervisor reports to the database: its command started, whether it is still
wanted (fencing), how its attempt ended; and the requeue of an attempt lost to the platform.

Kept apart from ``lifecycle`` so the dependency runs one way: the supervisor imports this
module only, ``lifecycle`` (which starts supervisors) imports both.
"""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuplatform import events
from gpuplatform.db import Query, server_bound_cursor
from scheduling import agent_notes, controls, reasons, transitions
from scheduling.agentapi import handoff
from scheduling.agentapi.handoff import HandOff
from scheduling.agentapi.messages import ExitReport, StartReport
from scheduling.models import GPU, GpuState, StopRequest, Task, TaskAttempt
from scheduling.states import HOLDS_GPUS, TaskState

USER_FAILURES = ("failed", "timed_out")


# --- Reports from the supervisor -----------------------------------------------------------------


def attempts_started(reports: list[StartReport]) -> dict[int, bool]:
    """Commands that run: record each one's supervisor and process and move its task to
    running, in one statement (``_STARTED``). Returns, per attempt id, whether it may go on:
    False when its task was cancelled or moved on meanwhile (the supervisor then stops at
    once), or when the attempt is unknown or was reported started already.

    Never in a transaction that goes on to lock other tasks: it locks its tasks until the
    commit, and held before the ends of a node agent's hand-off (``handoff.plain_ends``) they
    deadlocked with the commits of passes and other agents (never in a statement of its
    own). The exception is ``started_query``'s for the starts that the ends of the same
    transaction carry: it locks no task the ends do not."""
    query = started_query(reports)
    with server_bound_cursor() as cursor:
        cursor.execute(query.sql, query.params)
        moved = cursor.fetchall()
    return record_started(reports, moved)


def started_query(reports: list[StartReport]) -> Query:
    """``_STARTED`` for these reports: run by ``attempts_started``, or sent with the plain ends
    that carry them (``handoff.plain_ends``), whose rows then go to ``record_started``."""
    return Query(
        _STARTED,
        {
            "ids": [r.attempt_id for r in reports],
            "spid": [r.supervisor.pid for r in reports],
            "sst": [r.supervisor.started for r in reports],
            "pid": [r.pid.pid for r in reports],
            "pst": [r.pid.started for r in reports],
            "now": timezone.now(),
        },
    )


def record_started(reports: list[StartReport], moved: list[tuple]) -> dict[int, bool]:
    """The tasks ``started_query`` moved, published; per attempt id, whether it may go on."""
    events.publish(events.TASKS, _row_tasks(moved, TaskState.RUNNING))
    started = dict.fromkeys((report.attempt_id for report in reports), False)
    started.update((row[0], True) for row in moved)
    return started


# The node agent writes these for every task, so each is one statement, not the dozen round
# trips of Django's ORM (locks, reads, updates, an insert, BEGIN and COMMIT, which Django
# would compile for every batch). The tasks are locked first, in id order, as
# task_cancel and requeue_lost lock them, so nothing changes a task between the check and the
# update; every condition that picks a row is evaluated again on the row as locked.
# Each returns the moved tasks as (attempt id, task id, tenant id, name, reason, node id, reason
# code, reason params).
_STARTING = transitions.moved(
    "k",
    TaskState.SCHEDULED,
    TaskState.RUNNING,
    source="a JOIN scheduling_node n ON n.id = a.node_id",
    where="k.id = a.task_id AND k.attempt = a.number AND a.stop_requested = ''",
    reason="'started on ' || n.name || ' (pid ' || a.pid || ')'",
    code="'started'",
    params="jsonb_build_object('node', n.name, 'pid', a.pid)",
    returning="a.id AS attempt_id, k.tenant_id, k.name, k.reason, k.node_id",
)
# The arrays through scalar subqueries, and the attempts matched by key with ANY, as in
# ``handoff._SUCCEEDED`` (and for the same reason).
_STARTED = f"""
    WITH r AS (SELECT * FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(spid)s::integer[]),
                                    (SELECT %(sst)s::float8[]), (SELECT %(pid)s::integer[]),
                                    (SELECT %(pst)s::float8[]))
                          AS r(id, spid, sst, pid, pst)),
    locked AS (SELECT k.id FROM scheduling_task k
                 JOIN scheduling_taskattempt a ON a.task_id = k.id JOIN r ON r.id = a.id
                WHERE a.id = ANY((SELECT %(ids)s::bigint[])::bigint[])
                -- NO KEY: other transactions' foreign keys to these tasks (a pass's commit)
                -- pass; FOR UPDATE held them until our commit, and deadlocked with them.
                ORDER BY k.id FOR NO KEY UPDATE OF k),
    a AS (UPDATE scheduling_taskattempt a
             SET supervisor_pid = r.spid, supervisor_started = r.sst, pid = r.pid,
                 pid_started = r.pst, started_at = %(now)s
            FROM r, locked
           WHERE a.id = r.id AND locked.id = a.task_id AND a.pid IS NULL
       RETURNING a.id, a.task_id, a.number, a.node_id, a.stop_requested, a.pid),
    {_STARTING}
    SELECT attempt_id, id, tenant_id, name, reason, node_id, event_code, event_params FROM k
"""  # noqa: S608 - constant text


def _row_tasks(rows: list[tuple], state: TaskState) -> list[SimpleNamespace]:
    """What subscribers of ``events.TASKS`` read of a task, from the rows of the statements."""
    return [
        SimpleNamespace(
            pk=pk,
            tenant_id=tenant,
            name=name,
            state=state,
            reason=reason,
            node_id=node,
            reason_code=code,
            reason_params=json.loads(params) if isinstance(params, str) else params,
        )
        for _, pk, tenant, name, reason, node, code, params in rows
    ]


def fences(attempt_ids: list[int]) -> dict[int, dict]:
    """Fencing. Per attempt: ``wanted``, False once its task moved on (lost, requeued,
    cancelled: it must stop), and ``age``, the seconds since its node's
    last heartbeat, by this host's clock (the agent's host wrote it): a wanted attempt's
    lease runs from that heartbeat (``launcher.lease.Lease``), as the scheduler's ``lost_after``
    does. ``age`` is None where the node never heartbeated."""
    rows = TaskAttempt.objects.filter(pk__in=attempt_ids).values(
        "pk", "number", "outcome", "task__attempt", "task__state", "node__last_heartbeat"
    )
    now = timezone.now()
    answers = {pk: {"wanted": False, "age": None} for pk in attempt_ids}
    for row in rows:
        beat = row["node__last_heartbeat"]
        answers[row["pk"]] = {
            "wanted": (
                not row["outcome"]
                and row["task__attempt"] == row["number"]
                and row["task__state"] in HOLDS_GPUS
            ),
            "age": None if beat is None else max(0.0, (now - beat).total_seconds()),
        }
    return answers


def attempts_finished(
    reports: list[ExitReport], *, hand_off: HandOff | None = None
) -> dict[tuple[int, int], str]:
    """``attempt_finished`` for many attempts: the common case, a running task that exited
    with 0, in one statement for all of them (``_SUCCEEDED``); any other end one by one.
    ``hand_off`` (a node agent's, whose supervisors these are): their GPUs are handed to the
    last pass's successors in the same transaction (``handoff``). Returns each outcome by
    (task id, attempt number)."""
    plain, rest = [], []
    for r in reports:
        ok = r.exit_code == 0 and not (r.timed_out or r.problem or r.unhealthy)
        (plain if ok and r.fenced_s is None else rest).append(r)
    # Starts carried by ends (``ExitReport.started``) are written first: those of the plain
    # ends in the ends' own transaction and round trip (``handoff.plain_ends``: the same tasks,
    # so it locks nothing more, and one transaction fewer per batch), any other in a statement
    # of its own.
    carried = [r.started for r in plain if r.started is not None]
    if starts := [r.started for r in rest if r.started is not None]:
        attempts_started(starts)
    outcomes: dict[tuple[int, int], str] = {}
    if plain:
        first = started_query(carried) if carried else None
        moved, done = handoff.plain_ends(plain, hand_off, first=first)
        if carried:
            record_started(carried, moved)
        if done:
            events.publish(events.TASKS, _row_tasks(done, TaskState.SUCCEEDED))
        numbers = {report.task_id: report.attempt_no for report in plain}
        outcomes.update(((row[1], numbers[row[1]]), "succeeded") for row in done)
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
                unhealthy=report.unhealthy,
                fenced_s=report.fenced_s,
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
    unhealthy: str = "",
    fenced_s: int | None = None,
) -> str:
    """Record how an attempt ended and move the task on: done, retried, requeued or failed.

    ``note`` is something the user should know that did not change the outcome (output dropped
    on a full log disk, a limit hit); it ends the task's reason and its event's. Idempotent: the
    first report wins (the supervisor's, or reconciliation's from the exit file). Returns the
    outcome. ``unhealthy``: a service its supervisor stopped for failing its health check (what
    the last check said): a failure of the user's, retried as one.

    ``fenced_s``: its supervisor stopped it, its node having been cut off from the database
    that long (the lease lapsed). The attempt is lost with that reason: its task is requeued if
    the scheduler has not done so already, and an attempt it already marked lost keeps its
    outcome and gains the reason, so a late report never revives it.
    """
    with transaction.atomic():
        attempt = (
            TaskAttempt.objects.select_for_update()
            .filter(task_id=task_id, number=attempt_no)
            .first()
        )
        if attempt is None:
            return "unknown"
        if fenced_s is not None:
            return _fenced(attempt, exit_code, fenced_s)
        if attempt.outcome:
            return attempt.outcome
        task = Task.objects.select_for_update().get(pk=task_id)
        if attempt.stop_requested == StopRequest.VIOLATION and not problem:
            problem = _violation(task)
        outcome = _outcome(attempt, exit_code, timed_out, problem or unhealthy)
        broken = _broken_gpu(attempt) if outcome == "failed" and not problem else None
        if broken is not None:
            outcome = "lost"  # the GPU failed under it: not the user's fault
        attempt.exit_code, attempt.outcome, attempt.ended_at = exit_code, outcome, timezone.now()
        attempt.save(update_fields=["exit_code", "outcome", "ended_at"])
        if task.attempt == attempt_no and task.state in HOLDS_GPUS:
            if broken is not None:
                controls.requeue_lost(
                    task,
                    reasons.Reason(
                        "gpu_broken",
                        {
                            "gpu": str(broken),
                            "state": reasons.Reason(f"gpu_state_{broken.state}").as_data(),
                            "exit_code": exit_code,
                        },
                    ),
                )
            else:
                if outcome == "succeeded" and task.state == TaskState.SCHEDULED:
                    # It ran, but the report that carried its start never arrived (the
                    # supervisor died after its exit record): the record says it ran.
                    transitions.task_transition(
                        task=task,
                        to_state=TaskState.RUNNING,
                        reason=reasons.Reason("started_seen_at_end"),
                    )
                _move_on(task, attempt, outcome, exit_code, problem, note, unhealthy)
    return outcome


def _fenced(attempt: TaskAttempt, exit_code: int | None, fenced_s: int) -> str:
    """``attempt_finished`` of an attempt stopped by its supervisor's lease (locked)."""
    reason = reasons.Reason("node_fenced", {"node": attempt.node.name, "seconds": fenced_s})
    if attempt.outcome not in ("", "lost"):
        return attempt.outcome  # it ended otherwise first (its exit file, a cancel)
    if not attempt.outcome:
        attempt.exit_code, attempt.outcome = exit_code, "lost"
        attempt.ended_at = timezone.now()
    attempt.end_reason = reason.as_data()
    attempt.save(update_fields=["exit_code", "outcome", "ended_at", "end_reason"])
    task = Task.objects.select_for_update().get(pk=attempt.task_id)
    if task.attempt == attempt.number and task.state in HOLDS_GPUS:
        controls.requeue_lost(task, reason)
    return "lost"


def _broken_gpu(attempt: TaskAttempt) -> GPU | None:
    """A GPU of the attempt that failed or dropped off the node: the exit is the hardware's."""
    return (
        GPU.objects.filter(
            uuid__in=attempt.gpu_uuids, state__in=[GpuState.FAILED, GpuState.OFFLINE]
        )
        .select_related("node")
        .first()
    )


def _violation(task: Task) -> reasons.Reason | str:
    """Why a task was stopped for breaking a limit (``task_stop_for_violation``): its reason,
    as data where it is."""
    try:
        return reasons.Reason(task.reason_code, task.reason_params)
    except ValueError:  # no code, or one this version does not know
        return task.reason


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


def _noted(reason: reasons.Reason | str, note: str) -> reasons.Reason:
    """``reason`` ending with the node agent's ``note`` (its English read back as reasons,
    ``agent_notes``)."""
    return reasons.of(reason).noted(*agent_notes.of_note(note))


def _cancelled(task: Task) -> reasons.Reason | str:
    """What ``task_cancel`` said (who cancelled), without its "stopping": it has stopped."""
    if task.reason_code in ("cancelled", "cancelled_by"):
        return reasons.Reason(task.reason_code, task.reason_params).without_notes()
    return task.reason.removesuffix(controls.STOPPING) or reasons.Reason("cancelled")


def _move_on(
    task: Task,
    attempt: TaskAttempt,
    outcome: str,
    exit_code: int | None,
    problem: str,
    note: str = "",
    unhealthy: str = "",
) -> None:
    if outcome == "succeeded":
        transitions.task_transition(
            task=task,
            to_state=TaskState.SUCCEEDED,
            exit_code=0,
            reason=_noted(reasons.Reason("exited", {"exit_code": 0}), note),
        )
    elif outcome == "cancelled":
        # task_cancel said who cancelled and that it was stopping; now it has stopped.
        transitions.task_transition(
            task=task,
            to_state=TaskState.CANCELLED,
            exit_code=exit_code,
            reason=_noted(_cancelled(task), note),
        )
    elif outcome == "preempted":
        if task.state != TaskState.PREEMPTED:
            transitions.task_transition(
                task=task, to_state=TaskState.PREEMPTED, reason=reasons.Reason("preempted")
            )
        transitions.task_transition(
            task=task,
            to_state=TaskState.PENDING,
            reason=_noted(reasons.Reason("requeued_after_preemption"), note),
        )
    else:
        _fail_or_retry(task, outcome, exit_code, problem, note, unhealthy)


def _fail_or_retry(
    task: Task,
    outcome: str,
    exit_code: int | None,
    problem: reasons.Reason | str,
    note: str = "",
    unhealthy: str = "",
) -> None:
    if isinstance(problem, str):
        problem = agent_notes.of_problem(problem) if problem else ""
    what = (
        problem
        if problem
        else (
            reasons.Reason("timed_out", {"seconds": task.timeout_s})
            if outcome == "timed_out"
            else reasons.Reason("service_restarted", {"detail": unhealthy})
            if unhealthy
            else reasons.Reason("exited", {"exit_code": exit_code})
        )
    )
    what = _noted(what, note)
    failures = TaskAttempt.objects.filter(task=task, outcome__in=USER_FAILURES).count()
    if failures <= task.retries and not problem:
        delay = min(3600, settings.RETRY_BACKOFF * 2 ** (failures - 1))
        retry = {"failure": failures, "retries": task.retries, "delay": delay}
        transitions.task_transition(
            task=task,
            to_state=TaskState.PENDING,
            reason=what.noted(reasons.Reason("retry", retry)),
            exit_code=exit_code,
            not_before=timezone.now() + timedelta(seconds=delay),
        )
        return
    final = TaskState.TIMED_OUT if outcome == "timed_out" else TaskState.FAILED
    transitions.task_transition(task=task, to_state=final, exit_code=exit_code, reason=what)
