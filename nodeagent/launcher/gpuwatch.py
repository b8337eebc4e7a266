"""The node agent's watch on GPU memory: who uses what, against what they reserved.

Memory held by processes the platform did not start is written to ``GPU.foreign_memory_mb``,
which the scheduler never offers. A task holding more than it reserved raises a
``gpu_memory_overuse`` alert and, where ``scheduling.gpu_memory_overuse: kill``, is stopped
and fails with the reason.
"""

from __future__ import annotations

import logging

from gpuplatform.procid import ProcessId
from monitoring import services as alerts
from monitoring.models import AlertKind, Severity
from nodeagent.gpumem import gpu_memory_report, owners_from_tree
from nodeagent.inventory import GpuBackend
from scheduling import controls, estate, passes, reasons
from scheduling.models import GPU, Allocation, Node, Task, TaskAttempt
from scheduling.states import HOLDS_GPUS

logger = logging.getLogger(__name__)


def check_gpu_memory(node_name: str, backend: GpuBackend) -> dict:
    """Record foreign memory, alert on (and by policy stop) overuse."""
    return MemoryWatch(node_name, backend).check()


class MemoryWatch:
    """``check_gpu_memory`` for the agent's heartbeat: when no process holds GPU memory now and
    none did at its last check, nothing can have changed (that check recorded no foreign memory
    and resolved every overuse alert, and nothing else writes either), so the database is not
    read, unless ``again`` (the agent's backstop, with each reconciliation)."""

    def __init__(self, node_name: str, backend: GpuBackend) -> None:
        self.node_name = node_name
        self.backend = backend
        self.clean = False  # what the last full check found: no process, every GPU listed

    def check(self, *, again: bool = True) -> dict:
        processes = self.backend.processes()
        problems = getattr(self.backend, "process_problems", ())
        for problem in problems:
            logger.warning("node %s: %s (its GPU memory is not checked this time)",
                           self.node_name, problem)  # fmt: skip
        clean = not processes and not problems and not getattr(self.backend, "unlisted_gpus", ())
        if clean and self.clean and not again:
            return {"foreign_changed": 0, "overuses": 0}
        self.clean = False  # until this check is done
        result = _check(self.node_name, self.backend, processes)
        self.clean = clean
        return result


def _check(node_name: str, backend: GpuBackend, processes: list) -> dict:
    node = Node.objects.get(name=node_name)
    gpus = {gpu.uuid: gpu for gpu in GPU.objects.filter(node=node).exclude(state="offline")}
    readable = set(gpus) - set(getattr(backend, "unlisted_gpus", ()))
    owners, reserved = _owners_and_reservations(node) if processes else ({}, {})
    report = gpu_memory_report(processes, owners, reserved, gpus=readable)

    changed = 0
    for uuid, foreign in report.foreign_mb.items():
        gpu = gpus.get(uuid)
        if gpu is None:
            continue
        foreign = min(foreign, gpu.memory_mb)
        if gpu.foreign_memory_mb != foreign:
            changed += GPU.objects.filter(pk=gpu.pk).update(foreign_memory_mb=foreign)
    if changed:
        passes.request_pass()  # memory freed (or taken) outside the platform

    policy = estate.config().scheduling.gpu_memory_overuse
    keep = set()
    for overuse in report.overuses:
        gpu, task = gpus.get(overuse.gpu_uuid), Task.objects.filter(pk=overuse.task_id).first()
        if gpu is None or task is None:
            continue
        why = reasons.Reason(
            "gpu_memory_overuse",
            {"task": task.pk, "used_mb": overuse.used_mb, "gpu": str(gpu),
             "reserved_mb": overuse.reserved_mb},
        )  # fmt: skip
        message = why.text
        alerts.alert_raise(
            kind=AlertKind.GPU_MEMORY_OVERUSE,
            severity=Severity.WARNING,
            message=message,
            gpu=gpu,
            task=task,
        )
        keep.add((gpu.pk, task.pk))
        if policy == "kill" and controls.task_stop_for_violation(task=task, reason=why):
            logger.warning("stopping %s: %s", task, message)
    alerts.alerts_resolve_except(kind=AlertKind.GPU_MEMORY_OVERUSE, keep=keep, node=node)
    return {"foreign_changed": changed, "overuses": len(report.overuses)}


def _owners_and_reservations(node: Node) -> tuple[dict[int, int], dict[tuple[int, str], int]]:
    """Which task each pid on this node belongs to (its supervisor's process tree), and what
    each task reserved on each GPU. Only needed when some process holds GPU memory: with none
    (simulated GPUs, an idle host) every GPU's foreign memory is 0 and nobody overuses, and a
    heartbeat spares the two queries and the walk of every supervisor's tree."""
    attempts = TaskAttempt.objects.filter(
        node=node, outcome="", task__state__in=HOLDS_GPUS
    ).values_list("task_id", "number", "supervisor_pid", "supervisor_started", "task__attempt")
    supervisors = [
        (task_id, ProcessId(pid, started) if pid and started else None)
        for task_id, number, pid, started, current in attempts
        if number == current
    ]
    reserved = {
        (task_id, uuid): mb
        for task_id, uuid, mb in Allocation.objects.filter(
            released_at__isnull=True, gpu__node=node
        ).values_list("task_id", "gpu__uuid", "memory_mb")
    }
    return owners_from_tree(supervisors), reserved
