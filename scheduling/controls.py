"""Task controls: what a person (or the scheduler) asks of a task, and how the node hears of it.

Every control a person can use (cancel, pause, resume, retry, requeue) goes through
:func:`tasks_control`, from the API, the portal, the admin and the dashboard alike. A control
changes the task's row here; what must happen on the task's node (signal its supervisor, start
it) is dispatched to that node's own django-q2 cluster, which the node agent runs
(``nodeagent.launcher.tasks``): by name, so the control plane never imports the node agent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django_q.conf import Conf
from django_q.tasks import async_task

from gpuplatform.broker import QueueBatch
from scheduling import passes, reasons, transitions
from scheduling.models import StopRequest, Task, TaskAttempt
from scheduling.states import HOLDS_GPUS, TERMINAL, IllegalTransition, TaskState

# What a control may be refused with: the task's state does not allow it, or it changed meanwhile.
Refused = (IllegalTransition, transitions.StaleTask)

# Ends the reason of a task whose cancel is under way (see task_cancel).
STOPPING = "; stopping"

# The django-q2 functions the node agent's cluster runs.
NODE_TASKS = "nodeagent.launcher.tasks"


# --- Dispatch to the task's node ---------------------------------------------------------------


def dispatch(func: str, task: Task, *args: object) -> None:
    """Hand work to the task's node: its queue, which its agent takes (``launcher.jobs``)."""
    if not settings.LAUNCH_TASKS or task.node is None:
        return
    async_task(f"{NODE_TASKS}.{func}", task.pk, *args, cluster=task.node.name)


def dispatch_launches(placed: list[tuple[int, int, str]]) -> None:
    """One launch job per node for what a pass placed there, not one per task: ``placed``
    holds (task id, attempt number, node name) as the pass wrote them. A task cancelled since
    is skipped by the launch itself, so nothing is read here.

    The jobs are queued in the caller's transaction (the pass's: an outbox), so each job
    becomes visible at the commit, with the placements, or never; a scheduler that dies
    between a commit and a later queueing would leave placed tasks to reconciliation. A queue
    that runs its jobs inline (``sync``, in tests) runs them once the transaction committed."""
    if not settings.LAUNCH_TASKS:
        return
    if Conf.SYNC:
        transaction.on_commit(lambda: _queue_launches(placed))
    else:
        _queue_launches(placed)


def _queue_launches(placed: list[tuple[int, int, str]]) -> None:
    by_node: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for task_id, attempt_no, node_name in placed:
        by_node[node_name].append((task_id, attempt_no))
    batch = QueueBatch()  # all the nodes' jobs in one statement
    for node_name, pairs in by_node.items():
        async_task(
            f"{NODE_TASKS}.launch_many", pairs, cluster=node_name, broker=batch.broker(node_name)
        )
    batch.send()


def stop_attempt(task: Task, action: str = "stop") -> None:
    """Ask the task's node to signal its current attempt's supervisor (``stop``, ``pause``,
    ``resume``) once the transaction commits."""
    attempt_no = task.attempt
    transaction.on_commit(lambda: dispatch("control", task, attempt_no, action))


# --- The controls --------------------------------------------------------------------------------


_by = reasons.by  # "cancelled", or "cancelled by alice": as data (scheduling.reasons)


def current_attempt(task: Task) -> TaskAttempt | None:
    return TaskAttempt.objects.filter(task=task, number=task.attempt).first()


def task_cancel(*, task: Task, by: AbstractBaseUser | None = None) -> Task:
    """Cancel now if nothing runs; otherwise ask the supervisor to stop (SIGTERM, grace, KILL).
    Cancelling a service (the first of its replicas) cancels its other replicas too."""
    cancelled = _cancel_one(task, by)
    replicas = Task.objects.filter(replica_of=task.pk).exclude(state__in=TERMINAL)
    for replica in replicas.order_by("id"):
        try:
            _cancel_one(replica, by)
        except Refused:
            continue  # it ended meanwhile: nothing to cancel
    return cancelled


def _cancel_one(task: Task, by: AbstractBaseUser | None) -> Task:
    with transaction.atomic():
        task = Task.objects.select_for_update(of=("self",)).select_related("node").get(pk=task.pk)
        reason = _by("cancelled", by)
        attempt = current_attempt(task) if task.state in HOLDS_GPUS else None
        if attempt is None or attempt.outcome:
            return transitions.task_transition(
                task=task, to_state=TaskState.CANCELLED, reason=reason, actor=by
            )
        TaskAttempt.objects.filter(pk=attempt.pk).update(stop_requested=StopRequest.CANCEL)
        text, code, params = reasons.stored(reason.noted(reasons.Reason("stopping")))
        Task.objects.filter(pk=task.pk).update(
            reason=text, reason_code=code, reason_params=params
        )  # (text ends with STOPPING)
        stop_attempt(task)
    task.refresh_from_db()
    return task


def task_preempt(*, task: Task, reason: reasons.Reason | str) -> None:
    """Called by the scheduler: stop a victim so a more important task can start."""
    transitions.task_transition(
        task=task, to_state=TaskState.PREEMPTED, reason=reason, wake_scheduler=False
    )
    attempt = current_attempt(task)
    if attempt is None or attempt.outcome:
        # Never started: nothing to stop, straight back to the queue.
        transitions.task_transition(
            task=task,
            to_state=TaskState.PENDING,
            reason=reasons.of(reason).noted(reasons.Reason("requeued")),
        )
        return
    TaskAttempt.objects.filter(pk=attempt.pk).update(stop_requested=StopRequest.PREEMPT)
    stop_attempt(task)


def task_stop_for_violation(*, task: Task, reason: reasons.Reason | str) -> bool:
    """Stop a task that broke a limit; it fails with ``reason`` (no retry: it would again)."""
    text, code, params = reasons.stored(reason)
    with transaction.atomic():
        attempt = current_attempt(task)
        if attempt is None or attempt.outcome or attempt.stop_requested:
            return False
        TaskAttempt.objects.filter(pk=attempt.pk).update(stop_requested=StopRequest.VIOLATION)
        Task.objects.filter(pk=task.pk).update(reason=text, reason_code=code, reason_params=params)
        stop_attempt(task)
    return True


def task_pause(*, task: Task, by: AbstractBaseUser | None = None) -> Task:
    task = transitions.task_transition(
        task=task, to_state=TaskState.PAUSED, actor=by, reason=_by("paused", by)
    )
    stop_attempt(task, "pause")
    return task


def task_resume(*, task: Task, by: AbstractBaseUser | None = None) -> Task:
    if task.state != TaskState.PAUSED:  # scheduled -> running is the launcher's move, not ours
        raise IllegalTransition(task.state, "resumed (only a paused task can be)")
    task = transitions.task_transition(
        task=task, to_state=TaskState.RUNNING, actor=by, reason=_by("resumed", by)
    )
    stop_attempt(task, "resume")
    return task


def task_retry(*, task: Task, by: AbstractBaseUser | None = None) -> Task:
    """Run a task that ended without success again, or release one held after repeated
    infrastructure failures."""
    if task.state == TaskState.PENDING and task.hold_reason:
        text, code, params = reasons.stored(_by("released", by))
        Task.objects.filter(pk=task.pk).update(
            hold_reason="",
            infra_requeues=0,
            reason=text,
            reason_code=code,
            reason_params=params,
            wait={},
            wait_digest=0,
        )
        passes.request_pass()
        task.refresh_from_db()
        return task
    return transitions.task_transition(
        task=task,
        to_state=TaskState.PENDING,
        actor=by,
        reason=_by("retried", by),
        not_before=None,
        hold_reason="",
        infra_requeues=0,
        exit_code=None,
    )


def task_requeue(*, task: Task, by: AbstractBaseUser | None = None) -> Task:
    """Put a task back in the queue: one that holds GPUs is stopped and requeued as a
    preemption would (it keeps its attempt count), one that ended is retried."""
    if task.state in TERMINAL:
        return task_retry(task=task, by=by)
    if task.state not in HOLDS_GPUS:
        raise IllegalTransition(task.state, "requeued (it is not running nor ended)")
    with transaction.atomic():
        task_preempt(task=task, reason=_by("requeued", by))
    task.refresh_from_db()
    return task


CONTROLS: dict[str, Callable[..., Task]] = {
    "cancel": task_cancel,
    "pause": task_pause,
    "resume": task_resume,
    "retry": task_retry,
    "requeue": task_requeue,
}


# What a tenant may ask of its own tasks (requeue is an operator's, from the dashboard).
TENANT_ACTIONS = ("cancel", "pause", "resume", "retry")


@dataclass
class Controlled:
    """What :func:`tasks_control` did: the tasks it changed (as they are now) and those it
    refused, each with the reason."""

    done: list[Task] = field(default_factory=list)
    refused: list[tuple[Task, str]] = field(default_factory=list)


def tasks_control(
    *, tasks: Iterable[Task], action: str, by: AbstractBaseUser | None = None
) -> Controlled:
    """Apply one control (a key of ``CONTROLS``) to each task, in the given order; a task whose
    state does not allow it is refused with the reason, and the others go on."""
    act = CONTROLS.get(action)
    if act is None:
        raise ValueError(f"action: {action!r} is not one of {', '.join(CONTROLS)}")
    result = Controlled()
    for task in tasks:
        try:
            result.done.append(act(task=task, by=by))
        except Refused as exc:
            result.refused.append((task, str(exc)))
    return result


def requeue_tasks_of_silent_nodes(lost_after: timedelta) -> list[int]:
    """Tasks on nodes silent for ``lost_after`` are lost and requeued."""
    cutoff = timezone.now() - lost_after
    lost = []
    for task in Task.objects.filter(
        state__in=HOLDS_GPUS, node__state="offline", node__last_heartbeat__lt=cutoff
    ).select_related("node"):
        requeue_lost(task, reasons.Reason("node_silent", {"node": task.node.name}))
        lost.append(task.pk)
    return lost


# --- Infrastructure failures ----------------------------------------------------------------------


def requeue_lost(task: Task, reason: reasons.Reason | str) -> None:
    """The node or the supervisor is gone: mark the attempt lost and requeue the task, without
    spending the user's retries, until INFRA_REQUEUE_LIMIT; then hold it for a person."""
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.state not in HOLDS_GPUS:
            return
        TaskAttempt.objects.filter(task=task, number=task.attempt, outcome="").update(
            outcome="lost", ended_at=timezone.now()
        )  # (an attempt already settled, e.g. lost to a failed GPU, keeps its record)
        reason = reasons.of(reason)
        transitions.task_transition(task=task, to_state=TaskState.LOST, reason=reason)
        requeues = task.infra_requeues + 1
        hold = None
        if requeues > settings.INFRA_REQUEUE_LIMIT:
            hold = reasons.Reason(
                "held_after_requeues", {"requeues": requeues - 1, "reason": reason.as_data()}
            )
        transitions.task_transition(
            task=task,
            to_state=TaskState.PENDING,
            reason=hold or reasons.Reason("lost_requeued", {"reason": reason.as_data()}),
            infra_requeues=requeues,
            hold_reason=hold.text if hold else "",
        )
