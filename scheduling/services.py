"""Writes to the GPU estate and to tasks, except their state: every change of a task's state goes
through ``scheduling.transitions``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, NullIf
from django.utils import timezone

from gpuplatform import events
from scheduling import passes, reasons, states
from scheduling.agentapi.messages import GpuInfo
from scheduling.models import GPU, GpuState, Node, NodeState, Pool, Task, TaskEvent
from scheduling.spec import SpecError, parse_priority
from scheduling.states import TaskState
from scheduling.submission import priority_problem
from tenants.models import Quota

logger = logging.getLogger(__name__)

# Reasons the platform writes itself. A state set with one of these is undone automatically
# when the cause goes away, back to the `resume_state` saved beside it (so a node an operator
# drained is still draining after an outage); a state an operator set is left to an operator.
VANISHED = "not found by the node agent's last GPU discovery"
NODE_SILENT = "node agent stopped heartbeating"


class ChangeRefused(SpecError):
    """A change the platform's rules refuse, as ``{field: [reasons]}`` (a 400 naming the field,
    an error message in the admin)."""


# --- Tasks -----------------------------------------------------------------------------------


@transaction.atomic
def task_set_priority(
    *, task: Task, priority: int | str, by: AbstractBaseUser | None = None
) -> Task:
    """Change the priority of a task that has not ended, within its tenant's quota, as a
    submission would have been held to. Recorded as a TaskEvent that keeps the state."""
    try:
        value = parse_priority(priority)
    except ValueError as exc:
        raise ChangeRefused({"priority": [str(exc)]}) from None
    task = Task.objects.select_for_update().get(pk=task.pk)
    if task.state in states.TERMINAL:
        raise ChangeRefused(
            {"state": [f"the task is {task.state}: a task that ended keeps the priority it had"]}
        )
    quota = Quota.objects.filter(tenant_id=task.tenant_id, pool__isnull=True).first()
    if problem := priority_problem(value, quota):
        raise ChangeRefused({"priority": [problem]})
    if value == task.priority:
        return task
    change = {"old": task.priority, "new": value}
    if by is None:
        reason = reasons.Reason("priority", change)
    else:
        reason = reasons.Reason("priority_by", {**change, "by": by.get_username()})
    Task.objects.filter(pk=task.pk).update(priority=value, updated_at=timezone.now())
    task.priority = value
    TaskEvent.objects.create(
        task=task,
        from_state=task.state,
        to_state=task.state,
        reason=reason.text,
        reason_code=reason.code,
        reason_params=reason.params,
        attempt=task.attempt,
        actor=by,
    )
    events.publish(events.TASKS, [task])
    if task.state == TaskState.PENDING:
        passes.request_pass()  # its place in line changed
    return task


# --- Pools and nodes ---------------------------------------------------------------------------


def pool_ensure(*, name: str, description: str = "") -> Pool:
    pool, created = Pool.objects.get_or_create(name=name, defaults={"description": description})
    if not created and description and pool.description != description:
        pool.description = description
        pool.save(update_fields=["description"])
    return pool


@transaction.atomic
def node_register(
    *,
    name: str,
    pool_name: str,
    hostname: str,
    backend: str,
    gpus: Iterable[GpuInfo],
    pool_description: str = "",
    isolation: str = "",
    process_tracking: str = "",
    advertise_address: str | None = None,
) -> Node:
    """Record a node and the GPUs its agent discovered. Idempotent: safe on every restart.

    GPUs are matched by UUID, never by index, so a restart never duplicates one. GPUs of this
    node that discovery no longer finds become offline (they keep their history).
    """
    now = timezone.now()
    pool = pool_ensure(name=pool_name, description=pool_description)
    node, created = Node.objects.select_for_update().get_or_create(
        name=name,
        defaults={
            "pool": pool,
            "hostname": hostname,
            "backend": backend,
            "last_heartbeat": now,
            "isolation": isolation,
            "process_tracking": process_tracking,
            "advertise_address": advertise_address or "",
        },
    )
    if not created:
        node.pool, node.hostname, node.backend, node.last_heartbeat = pool, hostname, backend, now
        node.isolation, node.process_tracking = isolation, process_tracking
        if advertise_address is not None:  # None: not serving now (``node_agent --once``)
            node.advertise_address = advertise_address
        if node.state == NodeState.OFFLINE and node.state_reason == NODE_SILENT:
            _resume(node, NodeState.AVAILABLE)
        node.save()

    found = {info.uuid: info for info in gpus}
    GPU.objects.filter(node=node).exclude(uuid__in=found).exclude(state=GpuState.OFFLINE).update(
        resume_state=F("state"), state=GpuState.OFFLINE, state_reason=VANISHED
    )
    known = {gpu.uuid: gpu for gpu in GPU.objects.select_for_update().filter(uuid__in=found)}
    # Park GPUs whose index changes as offline first: the per-node unique index ignores offline
    # rows, so two GPUs can swap indices without colliding halfway.
    moving = [g for g in known.values() if g.node_id != node.pk or g.index != found[g.uuid].index]
    GPU.objects.filter(pk__in=[g.pk for g in moving]).update(state=GpuState.OFFLINE)
    for uuid, info in found.items():
        gpu = known.get(uuid) or GPU(uuid=uuid, first_seen_at=now)
        gpu.node = node
        gpu.index = info.index
        gpu.model = info.model
        gpu.gpu_type = info.gpu_type
        gpu.memory_mb = info.memory_mb
        gpu.pci_bus_id = info.pci_bus_id
        gpu.last_seen_at = now
        if gpu.state == GpuState.OFFLINE and gpu.state_reason in (VANISHED, NODE_SILENT):
            _resume(gpu, GpuState.AVAILABLE)
        gpu.save()
    events.publish(events.NODES, [node])
    events.publish(events.GPUS, GPU.objects.filter(node=node))
    passes.request_pass()
    return node


# A heartbeat of a node that was not marked silent: one statement, no transaction of its own.
_BEAT = """
    UPDATE scheduling_node SET last_heartbeat = %s
     WHERE name = %s AND NOT (state = %s AND state_reason = %s)
 RETURNING id, state, state_reason
"""


def node_heartbeat(*, name: str) -> bool:
    """Record that the node's agent is alive. False if the node is unknown (re-register)."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(_BEAT, [now, name, NodeState.OFFLINE, NODE_SILENT])
        beat = cursor.fetchone()
    if beat is not None:
        node_id, state, reason = beat
        node = Node(pk=node_id, name=name, state=state, state_reason=reason, last_heartbeat=now)
        events.publish(events.NODES, [node])
        return True
    # Unknown, or back after being marked silent: what it was brought back from, under its lock.
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            return False
        node.last_heartbeat = now
        if node.state == NodeState.OFFLINE and node.state_reason == NODE_SILENT:
            _resume(node, NodeState.AVAILABLE)
            GPU.objects.filter(node=node, state=GpuState.OFFLINE, state_reason=NODE_SILENT).update(
                state=Coalesce(NullIf("resume_state", Value("")), Value(GpuState.AVAILABLE)),
                state_reason="",
                resume_state="",
            )
            logger.info("node %s is back: heartbeat resumed", name)
            passes.request_pass()
            events.publish(events.GPUS, GPU.objects.filter(node=node))
        node.save(update_fields=["last_heartbeat", "state", "state_reason", "resume_state"])
        events.publish(events.NODES, [node])
    return True


@transaction.atomic
def nodes_mark_silent(*, offline_after: timedelta, now: datetime | None = None) -> list[str]:
    """Mark nodes whose agent has not heartbeated for ``offline_after`` as offline.

    Returns the names of the nodes it marked. Their available GPUs go offline with them, so
    nothing new is placed there; what happens to tasks running there is the launcher's
    reconciliation. A drained or failed GPU keeps its state: it already gets no new work, and
    only an operator may undo it, which a NODE_SILENT reason would let the next heartbeat do.
    """
    now = now or timezone.now()
    silent = list(
        Node.objects.select_for_update(skip_locked=True)
        .filter(last_heartbeat__lt=now - offline_after)
        .exclude(state=NodeState.OFFLINE)
    )
    for node in silent:
        node.resume_state = node.state
        node.state, node.state_reason = NodeState.OFFLINE, NODE_SILENT
        node.save(update_fields=["state", "state_reason", "resume_state"])
        GPU.objects.filter(node=node, state=GpuState.AVAILABLE).update(
            state=GpuState.OFFLINE, state_reason=NODE_SILENT, resume_state=GpuState.AVAILABLE
        )
        logger.warning("node %s marked offline: no heartbeat since %s", node, node.last_heartbeat)
    if silent:
        events.publish(events.NODES, silent)
        events.publish(events.GPUS, GPU.objects.filter(node__in=silent))
    return [node.name for node in silent]


def _resume(obj: Node | GPU, default: str) -> None:
    """End an automatic offline: back to the state saved when it began."""
    obj.state, obj.state_reason, obj.resume_state = obj.resume_state or default, "", ""


# --- Operator actions ---------------------------------------------------------------------------


def _drained_reason(actor: AbstractBaseUser | None) -> str:
    by = f" by {actor.get_username()}" if actor is not None else ""
    return f"drained{by} at {timezone.now():%Y-%m-%d %H:%M %Z}"


def gpus_drain(*, gpus: Iterable[GPU], actor: AbstractBaseUser | None = None) -> int:
    """Let running work finish on these GPUs but place nothing new. Returns how many changed."""
    ids = [gpu.pk for gpu in gpus]
    count = GPU.objects.filter(pk__in=ids, state=GpuState.AVAILABLE).update(
        state=GpuState.DRAINING, state_reason=_drained_reason(actor)
    )
    if count:
        events.publish(events.GPUS, GPU.objects.filter(pk__in=ids))
    return count


def gpus_undrain(*, gpus: Iterable[GPU], actor: AbstractBaseUser | None = None) -> int:
    """Return drained or failed GPUs to service (a failed GPU comes back only this way)."""
    ids = [gpu.pk for gpu in gpus]
    count = GPU.objects.filter(pk__in=ids, state__in=[GpuState.DRAINING, GpuState.FAILED]).update(
        state=GpuState.AVAILABLE, state_reason=""
    )
    if count:
        events.publish(events.GPUS, GPU.objects.filter(pk__in=ids))
        passes.request_pass()
    return count


def nodes_drain(*, nodes: Iterable[Node], actor: AbstractBaseUser | None = None) -> int:
    ids = [node.pk for node in nodes]
    count = Node.objects.filter(pk__in=ids, state=NodeState.AVAILABLE).update(
        state=NodeState.DRAINING, state_reason=_drained_reason(actor)
    )
    if count:
        events.publish(events.NODES, Node.objects.filter(pk__in=ids))
    return count


def nodes_undrain(*, nodes: Iterable[Node], actor: AbstractBaseUser | None = None) -> int:
    ids = [node.pk for node in nodes]
    count = Node.objects.filter(pk__in=ids, state=NodeState.DRAINING).update(
        state=NodeState.AVAILABLE, state_reason=""
    )
    if count:
        events.publish(events.NODES, Node.objects.filter(pk__in=ids))
        passes.request_pass()
    return count
