"""Recording GPU samples, and acting on what they say (XIDs, lost GPUs).

``record_samples`` is the one call a node agent makes with each tick's samples; whatever else
wants every sample (the live dashboard's publishing) hooks in there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils import timezone

from scheduling.inventory.base import GpuSample as Reading
from scheduling.inventory.base import XidEvent
from scheduling.models import GPU, Allocation, Node
from scheduling.states import HOLDS_GPUS
from telemetry.models import FaultKind, GpuSample, SimulatedFault

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    """Who holds a GPU now: the GPU's row, and the task with the largest reservation on it."""

    gpu_id: int
    task_id: int | None = None
    tenant_id: int | None = None
    reserved_mb: int = 0  # by every task on the GPU together
    tenant_ids: frozenset[int] = frozenset()  # of every task on the GPU (the live plane's groups)


def gpu_holders(*, node: Node) -> dict[str, Holder]:
    """GPU UUID -> Holder for every GPU of the node, in two queries."""
    holders = {
        uuid: Holder(gpu_id=pk)
        for pk, uuid in GPU.objects.filter(node=node).values_list("pk", "uuid")
    }
    best: dict[str, int] = {}
    for uuid, task_id, tenant_id, memory_mb in (
        Allocation.objects.filter(
            gpu__node=node, released_at__isnull=True, task__state__in=HOLDS_GPUS
        )
        .order_by("gpu_id", "task_id")
        .values_list("gpu__uuid", "task_id", "task__tenant_id", "memory_mb")
    ):
        current = holders.get(uuid)
        if current is None:
            continue
        reserved = current.reserved_mb + memory_mb
        tenants = current.tenant_ids | {tenant_id}
        if memory_mb > best.get(uuid, -1):
            best[uuid] = memory_mb
            holders[uuid] = Holder(current.gpu_id, task_id, tenant_id, reserved, tenants)
        else:
            holders[uuid] = Holder(
                current.gpu_id, current.task_id, current.tenant_id, reserved, tenants
            )
    return holders


def record_samples(
    *, node: Node, samples: list[Reading], holders: Mapping[str, Holder] | None = None
) -> list[GpuSample]:
    """Store one tick's samples of a node in one INSERT and return the rows written.

    Samples of GPUs the database does not know (yet) are dropped: registration runs on the
    heartbeat and catches up. ``holders`` is ``gpu_holders(node=node)`` when the caller already
    has it (the sampler needs it to sample a simulation).
    """
    if holders is None:
        holders = gpu_holders(node=node)
    rows = []
    for sample in samples:
        holder = holders.get(sample.gpu_uuid)
        if holder is None:
            continue
        rows.append(
            GpuSample(
                gpu_id=holder.gpu_id,
                at=datetime.fromtimestamp(sample.at, tz=UTC),
                task_id=holder.task_id,
                tenant_id=holder.tenant_id,
                simulated=sample.simulated,
                lost=sample.lost,
                util_gpu=sample.util_gpu,
                util_memory=sample.util_memory,
                memory_used_mb=sample.memory_used_mb,
                memory_total_mb=sample.memory_total_mb,
                temperature_c=sample.temperature_c,
                power_w=sample.power_w,
                power_limit_w=sample.power_limit_w,
                sm_clock_mhz=sample.sm_clock_mhz,
                fan_pct=sample.fan_pct,
                ecc_corrected=sample.ecc_corrected,
                ecc_uncorrected=sample.ecc_uncorrected,
                throttle_reasons=sample.throttle_reasons,
                processes=[list(p) for p in sample.processes] or None,
            )
        )
    if rows:
        # A tick repeated after a clock step back must not fail the whole batch.
        GpuSample.objects.bulk_create(rows, ignore_conflicts=True)
    return rows


def fault_inject(*, gpu: GPU, kind: str, value: int | None = None) -> SimulatedFault:
    """Queue a fault for a simulated GPU; its node agent applies it at its next sample."""
    if kind not in FaultKind.values:
        raise ValueError(f"unknown fault kind {kind!r}; expected one of {FaultKind.values}")
    if kind in (FaultKind.TEMPERATURE, FaultKind.XID) and value is None:
        raise ValueError(f"a {kind} fault needs a value")
    return SimulatedFault.objects.create(gpu=gpu, kind=kind, value=value)


def faults_apply(*, node: Node, backend: object) -> int:
    """Hand the node's pending injected faults to its simulated backend; returns how many.

    Claimed with a conditional UPDATE, so a fault is applied once even if two agents ran.
    """
    pending = list(
        SimulatedFault.objects.filter(gpu__node=node, applied_at__isnull=True)
        .order_by("pk")
        .values_list("pk", "gpu__index", "kind", "value")
    )
    if not pending:
        return 0
    claimed = SimulatedFault.objects.filter(
        pk__in=[row[0] for row in pending], applied_at__isnull=True
    ).update(applied_at=timezone.now())
    if not claimed:
        return 0
    for _, index, kind, value in pending:
        _apply(backend, index, kind, value)
    return len(pending)


def _apply(backend: object, index: int, kind: str, value: int | None) -> None:
    temperatures = getattr(backend, "temperatures", None)
    if temperatures is None:  # a real GPU: nothing to pretend
        return
    if kind == FaultKind.TEMPERATURE:
        temperatures[index] = value
    elif kind == FaultKind.XID:
        backend.pending_xids.append((index, value))  # type: ignore[attr-defined]
    elif kind == FaultKind.LOST:
        backend.lost.add(index)  # type: ignore[attr-defined]
    elif kind == FaultKind.CLEAR:
        temperatures.pop(index, None)
        backend.lost.discard(index)  # type: ignore[attr-defined]


def xids_handle(*, node: Node, events: Iterable[XidEvent], simulated: bool = False) -> list:
    """Record each XID and apply the configured policy (telemetry.policies)."""
    from telemetry import policies

    return [policies.xid_apply(node=node, event=event, simulated=simulated) for event in events]
