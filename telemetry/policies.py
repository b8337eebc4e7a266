"""What the node agent does when a GPU reports an XID or falls off the bus.

Runs in the node agent's sampler, on the node that holds the tasks, so stopping a task is a
signal to its supervisor, not a round trip through django-q2.

* ``drain`` XIDs (and a lost GPU): the GPU becomes ``failed`` (only an operator returns it to
  service) and each task on it is stopped. Its attempt then ends on a failed GPU, which the
  launcher already books as the infrastructure's fault: the task is requeued without spending
  its retries (``scheduling.agentapi.reports._broken_gpu``), and nothing new is placed on the
  GPU meanwhile. A task whose supervisor is already gone is settled at once by reconciliation.
* ``fail_task`` XIDs: the application's fault. Its task is stopped and fails with the XID as
  the reason (no retry: it would fail again); the GPU stays in service.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db import transaction

from monitoring import services as alerts
from monitoring.models import AlertKind, Severity
from scheduling import controls, estate
from scheduling.agentapi.messages import XidEvent
from scheduling.models import GPU, GpuState, Node, Task
from scheduling.states import HOLDS_GPUS
from telemetry.models import XidRecord

logger = logging.getLogger(__name__)

XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapping failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    154: "GPU recovery action changed",
}


def describe_xid(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def holding_tasks(gpu: GPU) -> list[Task]:
    return list(
        Task.objects.filter(
            allocations__gpu=gpu, allocations__released_at__isnull=True, state__in=HOLDS_GPUS
        )
        .select_related("node")
        .distinct()
    )


def xid_apply(*, node: Node, event: XidEvent, simulated: bool = False) -> XidRecord | None:
    gpu = GPU.objects.filter(node=node, uuid=event.gpu_uuid).first()
    if gpu is None:
        logger.warning("node %s: XID %s on unknown GPU %s", node, event.xid, event.gpu_uuid)
        return None
    action = estate.config().telemetry.xid_action(event.xid) or "none"
    tasks = holding_tasks(gpu)
    what = f"{describe_xid(event.xid)} on GPU {gpu.index} of {node.name}"
    record = XidRecord.objects.create(
        gpu=gpu,
        xid=event.xid,
        at=datetime.fromtimestamp(event.at, tz=UTC),
        task=tasks[0] if tasks else None,
        action=action,
        simulated=simulated,
    )
    logger.warning("node %s: %s; policy: %s", node.name, what, action)
    alerts.alert_raise(
        kind=AlertKind.GPU_XID,
        severity=Severity.CRITICAL if action == "drain" else Severity.WARNING,
        message=f"{what}; policy: {action}" + (" (simulated)" if simulated else ""),
        gpu=gpu,
    )
    if action == "drain":
        gpu_fail(gpu=gpu, reason=f"{what}: drained, its tasks requeued", tasks=tasks)
    elif action == "fail_task":
        for task in tasks:
            controls.task_stop_for_violation(
                task=task, reason=f"{what}: the application's fault; the GPU stays in service"
            )
    return record


def gpu_fail(*, gpu: GPU, reason: str, tasks: list[Task] | None = None) -> bool:
    """Mark the GPU failed and stop what runs on it (requeued as infrastructure failures).

    Returns False if it was already failed (each tick of a lost GPU says so again)."""
    with transaction.atomic():
        changed = (
            GPU.objects.filter(pk=gpu.pk)
            .exclude(state=GpuState.FAILED)
            .update(state=GpuState.FAILED, state_reason=reason[:500], resume_state="")
        )
    if not changed:
        return False
    logger.error("GPU %s failed: %s", gpu.uuid, reason)
    for task in tasks if tasks is not None else holding_tasks(gpu):
        if task.attempt:
            controls.stop_attempt(task)  # its supervisor, on the task's node
    return True


def gpu_lost(*, gpu: GPU, simulated: bool = False) -> bool:
    """A GPU that answers "lost": as XID 79, whatever the XID table says."""
    what = f"GPU {gpu.index} of {gpu.node.name} is lost (fallen off the bus)"
    if not gpu_fail(gpu=gpu, reason=f"{what}: drained, its tasks requeued"):
        return False
    alerts.alert_raise(
        kind=AlertKind.GPU_FAILED,
        severity=Severity.CRITICAL,
        message=what + (" (simulated)" if simulated else ""),
        gpu=gpu,
    )
    return True
