"""Alerts read from samples: over temperature, ECC errors and lost GPUs (each tick, on the
node), and GPUs allocated but idle (every minute, centrally, from the minute rollups)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import Count, Max, Min
from django.utils import timezone

from monitoring import services as alert_services
from monitoring.models import Alert, AlertKind, Severity
from scheduling import controls, estate, reasons
from scheduling.models import GPU, Allocation, Node, Task
from scheduling.states import TaskState
from telemetry import policies
from telemetry.models import GpuRollupMinute, GpuSample

logger = logging.getLogger(__name__)


# The alerts a sampling tick opens and resolves itself.
SAMPLE_KINDS = (AlertKind.GPU_OVER_TEMPERATURE, AlertKind.GPU_ECC)


def check_samples(*, node: Node, rows: list[GpuSample], open_alerts: bool = True) -> None:
    """Open, refresh or resolve the node's temperature and ECC alerts from one tick.
    ``open_alerts``: False when the caller knows none of SAMPLE_KINDS is open on the node
    (``services.node_state``), so there is nothing to resolve: with all well, no query."""
    config = estate.config().telemetry
    if not rows:
        return
    flagged = [
        row
        for row in rows
        if row.lost
        or _reached(row.temperature_c, config.max_temperature_c)
        or _reached(row.ecc_uncorrected, config.ecc_uncorrected_errors)
    ]
    if not flagged and not open_alerts:
        return
    gpus: dict[int, GPU] = {}
    if flagged:
        gpus = {gpu.pk: gpu for gpu in GPU.objects.filter(node=node).select_related("node")}
    hot: set[tuple[int | None, int | None]] = set()
    ecc: set[tuple[int | None, int | None]] = set()
    for row in flagged:
        gpu = gpus.get(row.gpu_id)
        if gpu is None:
            continue
        note = " (simulated)" if row.simulated else ""
        if row.lost:
            policies.gpu_lost(gpu=gpu, simulated=row.simulated)
            continue
        if _reached(row.temperature_c, config.max_temperature_c):
            hot.add((gpu.pk, None))
            alert_services.alert_raise(
                kind=AlertKind.GPU_OVER_TEMPERATURE,
                severity=Severity.WARNING,
                message=f"GPU {gpu.index} of {node.name} at {row.temperature_c} °C "
                f"(limit {config.max_temperature_c} °C){note}",
                gpu=gpu,
            )
        if _reached(row.ecc_uncorrected, config.ecc_uncorrected_errors):
            ecc.add((gpu.pk, None))
            alert_services.alert_raise(
                kind=AlertKind.GPU_ECC,
                severity=Severity.CRITICAL,
                message=f"GPU {gpu.index} of {node.name}: {row.ecc_uncorrected} uncorrected "
                f"ECC error(s) since the driver loaded{note}",
                gpu=gpu,
            )
    alert_services.alerts_resolve_except_each(
        keep={AlertKind.GPU_OVER_TEMPERATURE: hot, AlertKind.GPU_ECC: ecc}, node=node
    )


def _reached(value: float | None, limit: float) -> bool:
    return value is not None and value >= limit


def check_idle(*, now=None) -> dict[str, int]:
    """GPUs held by a running task that stayed at or under the idle threshold for the whole
    window (by the minute rollups' maxima): warn the tenant; still idle ``grace`` after the
    warning and ``reclaim: true``: stop the task, which fails saying why."""
    config = estate.config().telemetry.idle
    now = now or timezone.now()
    since = now - timedelta(seconds=config.window_s)
    minutes = max(1, config.window_s // 60)
    # Allocations of running tasks that have been held for the whole window.
    allocations = list(
        Allocation.objects.filter(
            released_at__isnull=True, task__state=TaskState.RUNNING, started_at__lte=since
        ).select_related("gpu__node", "task")
    )
    idle: set[tuple[int | None, int | None]] = set()
    reclaimed = 0
    if allocations:
        stats = {
            (row["gpu_id"], row["task_id"]): row
            for row in GpuRollupMinute.objects.filter(
                start__gte=since, gpu_id__in={a.gpu_id for a in allocations}
            )
            .values("gpu_id", "task_id")
            .annotate(peak=Max("util_gpu_max"), buckets=Count("pk"), first=Min("start"))
        }
        for allocation in allocations:
            row = stats.get((allocation.gpu_id, allocation.task_id))
            # A window with missing minutes (agent down) says nothing about idleness.
            if row is None or row["buckets"] < minutes - 1 or row["peak"] is None:
                continue
            if row["peak"] > config.threshold:
                continue
            idle.add((allocation.gpu_id, allocation.task_id))
            alert = _warn_idle(allocation, config)
            if config.reclaim and alert.opened_at <= now - timedelta(seconds=config.grace_s):
                reclaimed += _reclaim(allocation.task, allocation.gpu, config)
    alert_services.alerts_resolve_except(kind=AlertKind.GPU_IDLE, keep=idle)
    return {"idle": len(idle), "reclaimed": reclaimed}


def _warn_idle(allocation: Allocation, config) -> Alert:
    gpu, task = allocation.gpu, allocation.task
    action = (
        f"it will be reclaimed {config.grace_s // 60} min after this warning"
        if config.reclaim
        else "please release it"
    )
    return alert_services.alert_raise(
        kind=AlertKind.GPU_IDLE,
        severity=Severity.WARNING,
        message=f"task {task.pk} ({task.name}) of {task.tenant.name} holds GPU {gpu.index} of "
        f"{gpu.node.name} at or under {config.threshold} % utilisation for "
        f"{config.window_s // 60} min; {action}",
        gpu=gpu,
        task=task,
    )


def _reclaim(task: Task, gpu: GPU, config) -> int:
    reason = reasons.Reason(
        "idle_reclaimed",
        {"gpu": gpu.index, "node": gpu.node.name, "threshold": config.threshold,
         "minutes": (config.window_s + config.grace_s) // 60},
    )  # fmt: skip
    if controls.task_stop_for_violation(task=task, reason=reason):
        logger.warning("task %s: %s", task.pk, reason.text)
        return 1
    return 0
