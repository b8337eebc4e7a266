"""Recording GPU samples, and acting on what they say (XIDs, lost GPUs).

``record_samples`` is the one call a node agent makes with each tick's samples; whatever else
wants every sample (the live dashboard's publishing) hooks in there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils import timezone

from gpuplatform.db import server_bound_cursor
from scheduling.agentapi.messages import GpuSample as Reading
from scheduling.agentapi.messages import XidEvent
from scheduling.models import GPU, Node
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
    """GPU UUID -> Holder for every GPU of the node, in one query."""
    state = node_state(node_id=node.pk)
    return state.holders if state is not None else {}


@dataclass(frozen=True)
class NodeState:
    """What a sampling tick reads of its node before it samples, in one query."""

    node_id: int
    holders: dict[str, Holder]
    faults_pending: bool  # injected faults (simulated GPUs) not applied yet
    alerts_open: bool  # over-temperature or ECC alerts open on the node or its GPUs


# The node, each of its GPUs with every task holding it (largest reservation first), and two
# flags that spare the tick a query each when, as nearly always, they are false. Plain SQL,
# bound on the server: the ORM's four queries were most of a tick's CPU (cProfile).
_NODE_STATE = """
    SELECT n.id, g.id, g.uuid, h.task_id, h.tenant_id, h.memory_mb,
           EXISTS (SELECT 1 FROM telemetry_simulatedfault f
                     JOIN scheduling_gpu fg ON fg.id = f.gpu_id
                    WHERE fg.node_id = n.id AND f.applied_at IS NULL),
           EXISTS (SELECT 1 FROM monitoring_alert x
                     LEFT JOIN scheduling_gpu xg ON xg.id = x.gpu_id
                    WHERE x.resolved_at IS NULL AND x.kind = ANY(%(kinds)s::text[])
                      AND (x.node_id = n.id OR xg.node_id = n.id))
      FROM scheduling_node n
      LEFT JOIN scheduling_gpu g ON g.node_id = n.id
      LEFT JOIN (SELECT a.gpu_id, a.task_id, t.tenant_id, a.memory_mb
                   FROM scheduling_allocation a JOIN scheduling_task t ON t.id = a.task_id
                  WHERE a.released_at IS NULL AND t.state = ANY(%(holding)s::text[])) h
             ON h.gpu_id = g.id
     WHERE n.id = %(id)s OR n.name = %(name)s
     ORDER BY g.id, h.memory_mb DESC, h.task_id
"""


def node_state(*, node_id: int | None = None, node_name: str = "") -> NodeState | None:
    """The node's ``NodeState`` by id or name; None when it is not registered."""
    from telemetry.alerts import SAMPLE_KINDS

    with server_bound_cursor() as cursor:
        cursor.execute(
            _NODE_STATE,
            {
                "id": node_id,
                "name": node_name,
                "kinds": list(SAMPLE_KINDS),
                "holding": sorted(HOLDS_GPUS),
            },
        )
        rows = cursor.fetchall()
    if not rows:
        return None
    holders: dict[str, Holder] = {}
    for _, gpu_id, uuid, task_id, tenant_id, memory_mb, _, _ in rows:
        if gpu_id is None:
            continue  # a node without GPUs
        current = holders.get(uuid)
        if current is None:  # no holder, or the largest reservation: it names the holder
            holders[uuid] = Holder(
                gpu_id,
                task_id,
                tenant_id,
                memory_mb or 0,
                frozenset() if task_id is None else frozenset({tenant_id}),
            )
        else:
            holders[uuid] = Holder(
                gpu_id,
                current.task_id,
                current.tenant_id,
                current.reserved_mb + memory_mb,
                current.tenant_ids | {tenant_id},
            )
    node, _, _, _, _, _, faults, alerts = rows[0]
    return NodeState(node, holders, faults, alerts)


# GpuSample's columns (attnames: the ids of GPU, task and tenant) with their array types, in the
# order record_samples passes them; ``processes`` comes last, as JSON text.
_SAMPLE_COLUMNS = (
    ("gpu_id", "bigint"), ("at", "timestamptz"), ("task_id", "bigint"), ("tenant_id", "bigint"),
    ("simulated", "bool"), ("lost", "bool"), ("util_gpu", "int2"), ("util_memory", "int2"),
    ("memory_used_mb", "int4"), ("memory_total_mb", "int4"), ("temperature_c", "int2"),
    ("power_w", "float8"), ("power_limit_w", "float8"), ("sm_clock_mhz", "int4"),
    ("fan_pct", "int2"), ("ecc_corrected", "int8"), ("ecc_uncorrected", "int8"),
    ("throttle_reasons", "int8"),
)  # fmt: skip
# Built from the constants above; the values are bound parameters.
_INSERT_SAMPLES = (
    f"INSERT INTO telemetry_gpusample ({', '.join(name for name, _ in _SAMPLE_COLUMNS)}, "  # noqa: S608
    f"processes) SELECT * FROM unnest("
    f"{', '.join(f'%s::{kind}[]' for _, kind in _SAMPLE_COLUMNS)}, %s::text[]::jsonb[]) "
    "ON CONFLICT DO NOTHING"
)


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
        # One statement of column arrays, bound on the server (Django's bulk_create compiled
        # and quoted 19 values a row in Python). A tick repeated after a clock step back must
        # not fail the whole batch: a duplicate (GPU, time) is skipped.
        columns = [[getattr(row, name) for row in rows] for name, _ in _SAMPLE_COLUMNS]
        processes = [None if row.processes is None else json.dumps(row.processes) for row in rows]
        with server_bound_cursor() as cursor:
            cursor.execute(_INSERT_SAMPLES, [*columns, processes])
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
