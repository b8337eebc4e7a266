"""Trace replay: run a scheduling policy against a recorded GPU workload on a simulated clock.

A discrete-event simulation of a cluster of identical nodes. Events are job arrivals and
completions, and the times the policy asks to look again (``Decision.wake_at``: a wait that
ends by time alone, as the scheduler books a pass for it); after every instant that had events
the simulator builds a ``Snapshot`` of the simulated cluster, calls the pure policy core and
applies its ``Decision``. Every decision is checked first (``check_decision``), so a replay
doubles as a checker for the core: a policy that over-allocates a GPU, shares an exclusive one,
splits a task across nodes or evicts a task that is not preemptible from its class's guaranteed
share stops the replay with ``PolicyViolation``.

Replay rules (``/work/shared/traces/README.md``): the scheduler is never told a job's duration,
only the simulator uses it to end the job; multi-GPU jobs need all their GPUs on one node; a
fractional job asks for ``gpu_milli/1000`` of one GPU's memory. A preempted job loses all its
progress and goes back to the queue with its original submit time.

Pure Python, no Django: the ``replay`` management command is the thin shell around it.
"""

from __future__ import annotations

import csv
import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from scheduling.policy.model import (
    BATCH,
    ONLINE,
    Decision,
    GpuView,
    PendingView,
    PolicySettings,
    RunningView,
    Snapshot,
    TenantView,
)

PolicyFn = Callable[[Snapshot], Decision]

POLICIES = ("ours", "fifo")

TRACE_COLUMNS = ("job_id", "tenant", "qos", "submit_time_s", "duration_s", "num_gpus", "gpu_milli")

# qos -> (task class, priority, preemptible). Batch work is preemptible by default on the
# platform; latency-sensitive online work never is.
QOS_CLASSES: dict[str, tuple[str, int, bool]] = {
    "LS": (ONLINE, 90, False),
    "BE": (BATCH, 10, True),
    "Burstable": (BATCH, 50, True),
    "Guaranteed": (BATCH, 50, True),
}

POOL = "default"
GPU_TYPE = "sim"

# A policy that preempts may place the preemptor only on the next pass; the simulator reruns the
# policy at the same instant after preemptions. A policy that preempts on every pass would spin.
_MAX_PASSES_PER_INSTANT = 50


class PolicyViolation(AssertionError):
    """The policy returned a decision that breaks a placement rule, or never placed a job."""


# --- the trace ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    tenant: str
    qos: str
    submit_s: float
    duration_s: float
    num_gpus: int
    gpu_milli: int

    @property
    def task_class(self) -> str:
        return QOS_CLASSES[self.qos][0]

    @property
    def priority(self) -> int:
        return QOS_CLASSES[self.qos][1]

    @property
    def preemptible(self) -> bool:
        return QOS_CLASSES[self.qos][2]

    @property
    def fractional(self) -> bool:
        return self.num_gpus == 1 and self.gpu_milli < 1000

    @property
    def gpu_weight(self) -> float:
        """GPUs this job keeps busy: a fractional job counts its share of one card."""
        return self.gpu_milli / 1000 if self.fractional else float(self.num_gpus)

    def gpu_memory_mb(self, node_gpu_memory_mb: int) -> int | None:
        """Per-GPU memory request; None asks for whole GPUs (exclusive)."""
        if not self.fractional:
            return None
        return max(1, self.gpu_milli * node_gpu_memory_mb // 1000)


def load_trace(path: str | Path, *, limit: int | None = None) -> list[TraceJob]:
    """Read a trace CSV (columns ``TRACE_COLUMNS``; extra columns such as ``status`` ignored).

    Raises ValueError naming the file, the line and the column of the first bad value.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    path = Path(path)
    jobs: list[TraceJob] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
        for row in reader:
            if limit is not None and len(jobs) >= limit:
                break
            jobs.append(_parse_row(row, where=f"{path}: line {reader.line_num}"))
    return jobs


def _parse_row(row: dict[str, Any], *, where: str) -> TraceJob:
    def text(column: str) -> str:
        value = (row.get(column) or "").strip()
        if not value:
            raise ValueError(f"{where}, column {column}: empty")
        return value

    def number(column: str, *, minimum: float, integer: bool = False) -> float:
        raw = text(column)
        try:
            value = int(raw) if integer else float(raw)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise ValueError(f"{where}, column {column}: expected {kind}, got {raw!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise ValueError(f"{where}, column {column}: must be at least {minimum}, got {raw!r}")
        return value

    qos = text("qos")
    if qos not in QOS_CLASSES:
        known = ", ".join(QOS_CLASSES)
        raise ValueError(f"{where}, column qos: unknown QoS {qos!r} (expected one of {known})")
    gpu_milli = int(number("gpu_milli", minimum=1, integer=True))
    if gpu_milli > 1000:
        raise ValueError(f"{where}, column gpu_milli: must be at most 1000, got {gpu_milli}")
    duration = number("duration_s", minimum=0)
    if duration <= 0:
        raise ValueError(f"{where}, column duration_s: must be more than zero, got {duration}")
    return TraceJob(
        job_id=text("job_id"),
        tenant=text("tenant"),
        qos=qos,
        submit_s=number("submit_time_s", minimum=0),
        duration_s=duration,
        num_gpus=int(number("num_gpus", minimum=1, integer=True)),
        gpu_milli=gpu_milli,
    )


# --- results --------------------------------------------------------------------------------


@dataclass(slots=True)
class JobRecord:
    job_id: str
    tenant: str
    qos: str
    submit_s: float
    duration_s: float
    gpus: int
    gpu_milli: int
    first_start_s: float | None = None
    end_s: float | None = None
    preemptions: int = 0

    @property
    def jct_s(self) -> float:
        if self.end_s is None:
            raise ValueError(f"job {self.job_id} has not finished")
        return self.end_s - self.submit_s

    @property
    def wait_s(self) -> float:
        """All time not making progress: queueing plus work lost to preemption."""
        return self.jct_s - self.duration_s


@dataclass(slots=True)
class ReplayResult:
    policy: str
    total_gpus: int
    records: list[JobRecord]
    timeline: list[tuple[float, float]]  # (time, GPUs busy from then on), fractional jobs weighted
    busy_gpu_s: float = 0.0  # including work later lost to preemption
    lost_gpu_s: float = 0.0
    tenant_gpu_s: dict[str, float] = field(default_factory=dict)
    class_gpu_s: dict[str, float] = field(default_factory=lambda: {ONLINE: 0.0, BATCH: 0.0})
    # Per class, the longest a job of it waited while it would have fitted within its class's
    # unused guaranteed share (``_track_share_waits``): what the class guarantee bounds.
    class_share_wait_max_s: dict[str, float] = field(
        default_factory=lambda: {ONLINE: 0.0, BATCH: 0.0}
    )
    preemptions: int = 0
    # (time, victim job id, job id it made room for, the policy's reason)
    preemption_log: list[tuple[float, str, str, str]] = field(default_factory=list)
    passes: int = 0
    policy_time_total_s: float = 0.0
    policy_time_max_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        done = self.records
        jcts = [r.jct_s for r in done]
        waits = [r.wait_s for r in done]
        multi = [r for r in done if r.gpus > 1]
        start = min((r.submit_s for r in done), default=0.0)
        end = max((r.end_s or 0.0 for r in done), default=0.0)
        makespan = end - start
        capacity = self.total_gpus * makespan
        tenant_total = sum(self.tenant_gpu_s.values())
        return {
            "jobs": len(done),
            **_stats("jct", jcts),
            **_stats("wait", waits),
            "multi_gpu_jobs": len(multi),
            **_stats("multi_gpu_jct", [r.jct_s for r in multi]),
            **_stats("multi_gpu_wait", [r.wait_s for r in multi]),
            "max_wait_s": max(waits, default=None),
            "makespan_s": makespan,
            "gpu_utilisation": self.busy_gpu_s / capacity if capacity else None,
            "preemptions": self.preemptions,
            "lost_gpu_hours": self.lost_gpu_s / 3600,
            "tenant_gpu_share": {
                tenant: (seconds / tenant_total if tenant_total else 0.0)
                for tenant, seconds in sorted(self.tenant_gpu_s.items())
            },
            "class_gpu_share": {
                name: (seconds / tenant_total if tenant_total else 0.0)
                for name, seconds in sorted(self.class_gpu_s.items())
            },
            "class_share_wait_max_s": dict(sorted(self.class_share_wait_max_s.items())),
            "policy_passes": self.passes,
            "policy_time_total_s": self.policy_time_total_s,
            "policy_time_max_s": self.policy_time_max_s,
        }


def _stats(name: str, values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {
        f"avg_{name}_s": sum(ordered) / len(ordered) if ordered else None,
        f"p50_{name}_s": percentile(ordered, 50),
        f"p99_{name}_s": percentile(ordered, 99),
    }


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The value at rank ``floor(n * q / 100)`` of sorted values (no interpolation).

    The same definition as the reference replay in the traces README, so that the strict FIFO
    figures can be checked against it (its p99 wait is the 1,981st of 2,000 waits).
    """
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


# --- the decision checker -------------------------------------------------------------------


@dataclass(slots=True)
class _GpuState:
    reserved_mb: int = 0
    holders: int = 0
    exclusive: bool = False


def check_decision(
    snapshot: Snapshot, decision: Decision, class_shares: dict[str, float] | None = None
) -> None:
    """Raise PolicyViolation if applying ``decision`` to ``snapshot`` would break a rule.

    Preemptions are applied first (a victim's GPUs are free for placements in the same
    decision), then placements one by one, each against what the ones before it took.

    With ``class_shares`` (the policy's class guarantees), a task that is not preemptible may
    still be preempted by a task of another class, to give back what its own class borrowed:
    its class keeps more than its guarantee less one GPU (``_check_guarantees``); without
    them, never.
    """
    gpus = {gpu.id: gpu for gpu in snapshot.gpus}
    state = {
        gpu.id: _GpuState(gpu.reserved_mb, gpu.holders, gpu.exclusive) for gpu in snapshot.gpus
    }
    running = {task.id: task for task in snapshot.running}
    pending = {task.id: task for task in snapshot.pending}

    def fail(problem: str) -> NoReturn:
        raise PolicyViolation(f"t={snapshot.now:g}: {problem}")

    victims: set[int] = set()
    for preemption in decision.preemptions:
        victim = running.get(preemption.task_id)
        if victim is None:
            fail(f"preempts task {preemption.task_id}, which is not running")
        if preemption.task_id in victims:
            fail(f"preempts task {victim.id} twice")
        if victim.stopping:
            fail(f"preempts task {victim.id}, which is already stopping")
        if preemption.for_task_id not in pending:
            fail(f"preempts task {victim.id} for task {preemption.for_task_id}, not pending")
        reclaim = (
            class_shares is not None
            and pending[preemption.for_task_id].task_class != victim.task_class
        )
        if not victim.preemptible and not reclaim:
            fail(f"preempts task {victim.id} ({victim.task_class}), which is not preemptible")
        victims.add(victim.id)
        for gpu_id, mb in victim.gpus:
            gpu_state = state[gpu_id]
            gpu_state.holders -= 1
            gpu_state.reserved_mb -= mb
            if victim.exclusive:
                gpu_state.exclusive = False

    if class_shares is not None:
        _check_guarantees(snapshot, decision, class_shares, fail)

    placed: set[int] = set()
    for placement in decision.placements:
        task = pending.get(placement.task_id)
        where = f"placement of task {placement.task_id} on {placement.node} {placement.gpus}"
        if task is None:
            fail(f"{where}: the task is not pending")
        if task.id in placed:
            fail(f"{where}: the task is placed twice")
        placed.add(task.id)
        if task.blocked:
            fail(f"{where}: the task is blocked ({task.blocked})")
        if task.not_before is not None and task.not_before > snapshot.now:
            fail(f"{where}: the task may not start before {task.not_before:g}")
        if not task.gpus_min <= len(placement.gpus) <= task.gpus_max:
            fail(
                f"{where}: {len(placement.gpus)} GPU(s), task asks {task.gpus_min}..{task.gpus_max}"
            )
        if placement.exclusive != task.exclusive:
            fail(f"{where}: exclusive={placement.exclusive}, task asks exclusive={task.exclusive}")
        ids = [gpu_id for gpu_id, _ in placement.gpus]
        if len(set(ids)) != len(ids):
            fail(f"{where}: the same GPU twice")
        if task.node and placement.node != task.node:
            fail(f"{where}: the task asks for node {task.node}")
        for gpu_id, mb in placement.gpus:
            gpu = gpus.get(gpu_id)
            if gpu is None:
                fail(f"{where}: no GPU {gpu_id}")
            _check_gpu(fail, where, task, gpu, state[gpu_id], placement.node, mb)
            gpu_state = state[gpu_id]
            gpu_state.holders += 1
            gpu_state.reserved_mb += mb
            gpu_state.exclusive = placement.exclusive


def _check_guarantees(
    snapshot: Snapshot,
    decision: Decision,
    class_shares: dict[str, float],
    fail: Callable[[str], NoReturn],
) -> None:
    """Tasks that are not preemptible (online ones included) are preempted only as capacity
    their class borrowed: their class keeps more than its guaranteed share less one GPU (a
    task cannot be evicted by halves; counted over schedulable GPUs, stopping tasks not
    counted)."""
    from scheduling.policy.core import _guarantees

    schedulable = sum(1 for gpu in snapshot.gpus if gpu.schedulable)
    guarantee = _guarantees(schedulable, class_shares)
    memory = {gpu.id: gpu.memory_mb for gpu in snapshot.gpus}

    def share(task: RunningView) -> float:
        if task.exclusive:
            return float(len(task.gpus))
        return sum(mb / (memory.get(gpu_id) or 1) for gpu_id, mb in task.gpus)

    held: dict[str, float] = {}
    for task in snapshot.running:
        if not task.stopping:
            held[task.task_class] = held.get(task.task_class, 0.0) + share(task)
    running = {task.id: task for task in snapshot.running}
    for preemption in decision.preemptions:
        victim = running[preemption.task_id]
        held[victim.task_class] -= share(victim)
    for preemption in decision.preemptions:
        victim = running[preemption.task_id]
        if victim.preemptible and victim.task_class != ONLINE:
            continue  # the usual rules, checked by the caller
        kept = held[victim.task_class]
        if kept <= guarantee.get(victim.task_class, 0) - 1 + 1e-9:
            fail(
                f"preempts task {victim.id} ({victim.task_class}), which is not preemptible, "
                f"for task {preemption.for_task_id}, leaving {victim.task_class} {kept:g} GPUs, "
                f"a whole GPU below its guaranteed {guarantee.get(victim.task_class, 0)}"
            )


def _check_gpu(
    fail: Callable[[str], NoReturn],
    where: str,
    task: PendingView,
    gpu: GpuView,
    now: _GpuState,
    node: str,
    mb: int,
) -> None:
    if gpu.node != node:
        fail(f"{where}: GPU {gpu.id} is on {gpu.node}; all GPUs of a task must be on one node")
    if not gpu.schedulable:
        fail(f"{where}: GPU {gpu.id} is not schedulable")
    if task.pool and gpu.pool != task.pool:
        fail(f"{where}: GPU {gpu.id} is in pool {gpu.pool}, task asks {task.pool}")
    if task.gpu_type and gpu.gpu_type != task.gpu_type:
        fail(f"{where}: GPU {gpu.id} is {gpu.gpu_type}, task asks {task.gpu_type}")
    if mb < 0:
        fail(f"{where}: negative reservation on GPU {gpu.id}")
    if now.exclusive:
        fail(f"{where}: GPU {gpu.id} is held exclusively by another task")
    if task.exclusive:
        if now.holders or gpu.foreign_mb:
            fail(
                f"{where}: exclusive task on GPU {gpu.id}, which is shared "
                f"({now.holders} holder(s), {now.reserved_mb} MiB reserved, "
                f"{gpu.foreign_mb} MiB foreign)"
            )
        return
    asked = task.gpu_memory_mb or 0  # not exclusive, so set
    if mb < asked:
        fail(f"{where}: reserves {mb} MiB on GPU {gpu.id}, task asks {asked} MiB")
    free = gpu.memory_mb - now.reserved_mb - gpu.foreign_mb
    if mb > free:
        fail(
            f"{where}: no room on GPU {gpu.id}: {mb} MiB asked, {free} MiB free "
            f"of {gpu.memory_mb} MiB ({now.reserved_mb} reserved, {gpu.foreign_mb} foreign)"
        )


# --- the simulation -------------------------------------------------------------------------

_DONE = 0  # completions sort before arrivals at the same instant (order within an instant
_ARRIVE = 1  # does not matter: the policy runs once all of them are applied)
_WAKE = 2  # a time the policy asked to look again at (``Decision.wake_at``)


@dataclass(slots=True)
class _Run:
    task: RunningView
    weight: float
    run: int  # which run of the job this is; completions of earlier runs are stale


class _Cluster:
    """The simulated cluster's mutable state, and its Snapshot."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        *,
        nodes: int,
        gpus_per_node: int,
        gpu_memory_mb: int,
        half_life_s: float,
    ) -> None:
        self.memory_mb = gpu_memory_mb
        self.decay = math.log(2) / half_life_s
        self.node_of = {
            n * gpus_per_node + g: f"node-{n + 1}"
            for n in range(nodes)
            for g in range(gpus_per_node)
        }
        self.gpu = {gpu_id: _GpuState() for gpu_id in self.node_of}
        self.running: dict[int, _Run] = {}
        self.pending: dict[int, PendingView] = {}
        # Decayed GPU-seconds per tenant as of self.usage_at, and GPUs each tenant holds now.
        self.usage = {job.tenant: 0.0 for job in jobs}
        self.holding = dict.fromkeys(self.usage, 0.0)
        self.usage_at = 0.0

    def snapshot(self, now: float) -> Snapshot:
        gpus = tuple(
            GpuView(
                id=gpu_id,
                node=self.node_of[gpu_id],
                pool=POOL,
                gpu_type=GPU_TYPE,
                memory_mb=self.memory_mb,
                reserved_mb=state.reserved_mb,
                holders=state.holders,
                exclusive=state.exclusive,
            )
            for gpu_id, state in self.gpu.items()
        )
        pending = tuple(sorted(self.pending.values(), key=lambda t: (t.submitted_at, t.id)))
        tenants = {
            # Decayed GPU-seconds over the mean lifetime (half-life / ln 2): average GPUs.
            name: TenantView(name=name, recent_gpus=usage * self.decay)
            for name, usage in self.usage.items()
        }
        return Snapshot(
            now=now,
            gpus=gpus,
            running=tuple(run.task for run in self.running.values()),
            pending=pending,
            tenants=tenants,
        )

    def advance_usage(self, now: float) -> None:
        """Decay usage up to ``now``; call before changing what anyone holds at ``now``."""
        # Between events each tenant holds a constant number of GPUs, so integrating the
        # exponentially weighted usage over the gap is exact.
        elapsed = now - self.usage_at
        if elapsed <= 0:
            return
        keep = math.exp(-self.decay * elapsed)
        gained = (1 - keep) / self.decay
        for tenant, usage in self.usage.items():
            self.usage[tenant] = usage * keep + self.holding[tenant] * gained
        self.usage_at = now

    def start(self, task: RunningView, weight: float, run: int) -> None:
        self.running[task.id] = _Run(task, weight, run)
        self.holding[task.tenant] += weight
        for gpu_id, mb in task.gpus:
            state = self.gpu[gpu_id]
            state.holders += 1
            state.reserved_mb += mb
            state.exclusive = task.exclusive

    def stop(self, task_id: int) -> _Run:
        run = self.running.pop(task_id)
        self.holding[run.task.tenant] -= run.weight
        for gpu_id, mb in run.task.gpus:
            state = self.gpu[gpu_id]
            state.holders -= 1
            state.reserved_mb -= mb
            state.exclusive = False
        return run

    def busy_gpus(self) -> float:
        return sum(run.weight for run in self.running.values())


def simulate(
    jobs: Sequence[TraceJob],
    *,
    nodes: int,
    gpus_per_node: int,
    gpu_memory_mb: int,
    policy: str | PolicyFn = "ours",
    settings: PolicySettings | None = None,
    half_life_s: float = 86400,
) -> ReplayResult:
    """Replay ``jobs`` on ``nodes`` x ``gpus_per_node`` GPUs of ``gpu_memory_mb`` MiB each.

    ``policy``: "ours" (``scheduling.policy.schedule`` with ``settings``), "fifo"
    (``scheduling.policy.schedule_fifo``) or any callable taking a Snapshot (tests).
    """
    if nodes < 1 or gpus_per_node < 1 or gpu_memory_mb < 1:
        raise ValueError("nodes, gpus_per_node and gpu_memory_mb must be at least 1")
    if half_life_s <= 0:
        raise ValueError(f"half_life_s must be more than zero, got {half_life_s}")
    for job in jobs:
        if job.num_gpus > gpus_per_node:
            raise ValueError(
                f"job {job.job_id} needs {job.num_gpus} GPUs on one node; "
                f"nodes have {gpus_per_node}"
            )
    name, decide = _policy_function(policy, settings)
    # The policy's own guarantees, for the checker: only our core promises them.
    shares = (settings or PolicySettings()).class_shares if policy == "ours" else None
    cluster = _Cluster(
        jobs,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu_memory_mb=gpu_memory_mb,
        half_life_s=half_life_s,
    )
    records = [
        JobRecord(
            job_id=job.job_id,
            tenant=job.tenant,
            qos=job.qos,
            submit_s=job.submit_s,
            duration_s=job.duration_s,
            gpus=job.num_gpus,
            gpu_milli=job.gpu_milli,
        )
        for job in jobs
    ]
    # Task ids are 1-based positions in `jobs`; a job's PendingView never changes.
    waiting = {
        i + 1: PendingView(
            id=i + 1,
            tenant=job.tenant,
            priority=job.priority,
            task_class=job.task_class,
            submitted_at=job.submit_s,
            gpus_min=job.num_gpus,
            gpus_max=job.num_gpus,
            gpu_memory_mb=job.gpu_memory_mb(gpu_memory_mb),
        )
        for i, job in enumerate(jobs)
    }
    result = ReplayResult(
        policy=name,
        total_gpus=nodes * gpus_per_node,
        records=records,
        timeline=[],
        tenant_gpu_s=dict.fromkeys(cluster.usage, 0.0),
    )
    runs = [0] * (len(jobs) + 1)
    events: list[tuple[float, int, int, int]] = [
        (job.submit_s, _ARRIVE, i + 1, 0) for i, job in enumerate(jobs)
    ]
    heapq.heapify(events)
    wake_ups: set[float] = set()  # booked, as the scheduler books one delayed pass each
    guarantee = _class_guarantees(nodes * gpus_per_node, settings)
    within_share_since: dict[int, float] = {}  # pending job -> since when it fits the share

    def occupied(run: _Run, until: float) -> float:
        gpu_s = run.weight * (until - run.task.started_at)
        result.busy_gpu_s += gpu_s
        result.tenant_gpu_s[run.task.tenant] += gpu_s
        result.class_gpu_s[run.task.task_class] = (
            result.class_gpu_s.get(run.task.task_class, 0.0) + gpu_s
        )
        return gpu_s

    while events:
        now = events[0][0]
        cluster.advance_usage(now)
        changed = False
        while events and events[0][0] == now:
            _, kind, task_id, run_no = heapq.heappop(events)
            if kind == _ARRIVE:
                cluster.pending[task_id] = waiting[task_id]
                changed = True
            elif kind == _WAKE:
                wake_ups.discard(now)
                changed = True
            elif run_no == runs[task_id] and task_id in cluster.running:
                occupied(cluster.stop(task_id), now)
                records[task_id - 1].end_s = now
                changed = True
        if not changed:  # only completions of runs that were preempted: nothing to decide
            continue

        for _ in range(_MAX_PASSES_PER_INSTANT):
            snapshot = cluster.snapshot(now)
            began = time.perf_counter()
            decision = decide(snapshot)
            spent = time.perf_counter() - began
            result.passes += 1
            result.policy_time_total_s += spent
            result.policy_time_max_s = max(result.policy_time_max_s, spent)
            check_decision(snapshot, decision, shares)

            for preemption in decision.preemptions:
                run = cluster.stop(preemption.task_id)
                result.lost_gpu_s += occupied(run, now)
                cluster.pending[preemption.task_id] = waiting[preemption.task_id]
                records[preemption.task_id - 1].preemptions += 1
                result.preemptions += 1
                result.preemption_log.append(
                    (
                        now,
                        jobs[preemption.task_id - 1].job_id,
                        jobs[preemption.for_task_id - 1].job_id,
                        preemption.reason,
                    )
                )
            for placement in decision.placements:
                task_id = placement.task_id
                job = jobs[task_id - 1]
                del cluster.pending[task_id]
                runs[task_id] += 1
                cluster.start(
                    RunningView(
                        id=task_id,
                        tenant=job.tenant,
                        priority=job.priority,
                        task_class=job.task_class,
                        preemptible=job.preemptible,
                        node=placement.node,
                        gpus=tuple(placement.gpus),
                        exclusive=placement.exclusive,
                        started_at=now,
                        submitted_at=job.submit_s,
                    ),
                    job.gpu_weight,
                    runs[task_id],
                )
                record = records[task_id - 1]
                if record.first_start_s is None:
                    record.first_start_s = now
                heapq.heappush(events, (now + job.duration_s, _DONE, task_id, runs[task_id]))
            # Preemptions freed GPUs the policy may only use on its next look.
            if not decision.preemptions or not cluster.pending:
                break
        else:
            last = ", ".join(f"#{p.task_id} for #{p.for_task_id}" for p in decision.preemptions)
            placed = ", ".join(f"#{p.task_id}" for p in decision.placements) or "nothing"
            raise PolicyViolation(
                f"t={now:g}: the policy preempted on {_MAX_PASSES_PER_INSTANT} passes in a row "
                f"at the same instant (a livelock); the last preempted {last} and placed {placed}"
            )
        _track_share_waits(cluster, jobs, guarantee, within_share_since, result, now)
        # A wait that ends by time alone gets its pass then, not at the next arrival or end.
        if decision.wake_at is not None and decision.wake_at > now:
            if decision.wake_at not in wake_ups:
                wake_ups.add(decision.wake_at)
                heapq.heappush(events, (decision.wake_at, _WAKE, 0, 0))
        result.timeline.append((now, cluster.busy_gpus()))

    if cluster.pending:
        stuck = sorted(cluster.pending)[:10]
        raise PolicyViolation(
            f"the policy left {len(cluster.pending)} job(s) pending on an idle cluster "
            f"(task ids {stuck}, e.g. {jobs[stuck[0] - 1].job_id})"
        )
    return result


def _class_guarantees(total_gpus: int, settings: PolicySettings | None) -> dict[str, int]:
    from scheduling.policy.core import _guarantees

    return _guarantees(total_gpus, (settings or PolicySettings()).class_shares)


def _track_share_waits(
    cluster: _Cluster,
    jobs: Sequence[TraceJob],
    guarantee: dict[str, int],
    since: dict[int, float],
    result: ReplayResult,
    now: float,
) -> None:
    """Note when each pending job starts or stops fitting within its class's unused guaranteed
    share (its class's GPUs plus its own at most the share), and when it starts. Measured the
    same way for every policy, so FIFO's figure shows what is at stake."""
    held: dict[str, float] = {}
    for run in cluster.running.values():
        held[run.task.task_class] = held.get(run.task.task_class, 0.0) + run.weight
    longest = result.class_share_wait_max_s

    def close(task_id: int) -> None:
        name = jobs[task_id - 1].task_class
        longest[name] = max(longest.get(name, 0.0), now - since.pop(task_id))

    for task_id in [t for t in since if t not in cluster.pending]:
        close(task_id)  # it started (or was placed) now
    for task_id, task in cluster.pending.items():
        weight = jobs[task_id - 1].gpu_weight
        share = guarantee.get(task.task_class, 0)
        if held.get(task.task_class, 0.0) + weight <= share + 1e-9:
            since.setdefault(task_id, now)
        elif task_id in since:
            close(task_id)


def _policy_function(
    policy: str | PolicyFn, settings: PolicySettings | None
) -> tuple[str, PolicyFn]:
    if callable(policy):
        return getattr(policy, "__name__", "custom"), policy
    # Imported here, not at module level: the policy core is optional for loading traces and
    # for tests that bring their own policy.
    if policy == "ours":
        from scheduling.policy import schedule

        chosen = settings or PolicySettings()
        return policy, lambda snapshot: schedule(snapshot, chosen)
    if policy == "fifo":
        from scheduling.policy import schedule_fifo

        return policy, schedule_fifo
    raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")


# --- comparing and reporting ----------------------------------------------------------------


def run_policies(
    jobs: Sequence[TraceJob], policies: Iterable[str | PolicyFn], **options: Any
) -> dict[str, Any]:
    """Replay ``jobs`` under each policy. Returns a comparison dict (see ``compare``)."""
    results: dict[str, ReplayResult] = {}
    for policy in policies:
        result = simulate(jobs, policy=policy, **options)
        results[result.policy] = result
    summaries = {name: result.summary() for name, result in results.items()}
    ratios: dict[str, float | None] = {}
    if "ours" in summaries and "fifo" in summaries:
        for key in ("avg_jct_s", "p99_wait_s", "max_wait_s"):
            ratios[key] = _ratio(summaries["ours"][key], summaries["fifo"][key])
    return {"summaries": summaries, "ratios": ratios, "results": results}


def compare(jobs: Sequence[TraceJob], **options: Any) -> dict[str, Any]:
    """Replay ``jobs`` under "ours" and "fifo" (same options as ``simulate``).

    Returns ``{"summaries": {policy: summary}, "ratios": {metric: ours / fifo}, "results":
    {policy: ReplayResult}}``; everything but "results" is plain JSON-able data.
    """
    return run_policies(jobs, POLICIES, **options)


def _ratio(ours: float | None, fifo: float | None) -> float | None:
    if ours is None or not fifo:
        return None
    return ours / fifo


# (label, summary key, how to show it); "count" rows get no ratio.
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "count"),
    ("avg JCT", "avg_jct_s", "s"),
    ("p50 JCT", "p50_jct_s", "s"),
    ("p99 JCT", "p99_jct_s", "s"),
    ("avg wait", "avg_wait_s", "s"),
    ("p50 wait", "p50_wait_s", "s"),
    ("p99 wait", "p99_wait_s", "s"),
    ("max wait", "max_wait_s", "s"),
    ("multi-GPU jobs", "multi_gpu_jobs", "count"),
    ("multi-GPU avg JCT", "avg_multi_gpu_jct_s", "s"),
    ("multi-GPU p99 JCT", "p99_multi_gpu_jct_s", "s"),
    ("multi-GPU avg wait", "avg_multi_gpu_wait_s", "s"),
    ("multi-GPU p99 wait", "p99_multi_gpu_wait_s", "s"),
    ("makespan", "makespan_s", "s"),
    ("GPU utilisation", "gpu_utilisation", "pct"),
    ("preemptions", "preemptions", "int"),
    ("lost GPU-hours", "lost_gpu_hours", "float"),
    ("policy passes", "policy_passes", "int"),
    ("policy time total", "policy_time_total_s", "ms"),
    ("policy time max/pass", "policy_time_max_s", "ms"),
)


def format_table(comparison: dict[str, Any]) -> str:
    """A text table: one row per metric, one column per policy, and ours/fifo when both ran."""
    summaries: dict[str, dict[str, Any]] = comparison["summaries"]
    names = list(summaries)
    with_ratio = "ours" in summaries and "fifo" in summaries
    rows: list[list[str]] = [["metric", *names, *(["ours/fifo"] if with_ratio else [])]]

    def add(label: str, values: list[Any], kind: str) -> None:
        row = [label, *(_show(value, kind) for value in values)]
        if with_ratio:
            ours, fifo = values[names.index("ours")], values[names.index("fifo")]
            ratio = None if kind == "count" else _ratio(ours, fifo)
            row.append("-" if ratio is None else f"{ratio:.2f}x")
        rows.append(row)

    for label, key, kind in _ROWS:
        add(label, [summaries[name].get(key) for name in names], kind)
    tenants = sorted({t for s in summaries.values() for t in s.get("tenant_gpu_share", {})})
    for tenant in tenants:
        values = [summaries[name]["tenant_gpu_share"].get(tenant) for name in names]
        add(f"GPU-hours share {tenant}", values, "pct")
    classes = sorted({c for s in summaries.values() for c in s.get("class_gpu_share", {})})
    for name_ in classes:
        values = [summaries[name]["class_gpu_share"].get(name_) for name in names]
        add(f"GPU-hours share {name_}", values, "pct")
    for name_ in classes:
        values = [summaries[name]["class_share_wait_max_s"].get(name_) for name in names]
        add(f"longest wait within share, {name_}", values, "s")

    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _show(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "s":
        return f"{round(value):,}s"
    if kind in ("int", "count"):
        return f"{value:,}"
    if kind == "pct":
        return f"{value * 100:.1f}%"
    if kind == "ms":
        return f"{value * 1000:,.1f} ms"
    return f"{value:,.2f}"


def plot(comparison: dict[str, Any], path: str | Path) -> None:
    """Write a PNG: CDF of wait per policy (log x) and GPUs busy over time per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results: dict[str, ReplayResult] = comparison["results"]
    figure, (cdf, busy) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, result in results.items():
        # A log axis has no zero: waits under a second are drawn at one second.
        waits = sorted(max(1.0, r.wait_s) for r in result.records)
        fractions = [(i + 1) / len(waits) for i in range(len(waits))]
        cdf.step(waits, fractions, where="post", label=name)
        times = [t / 3600 for t, _ in result.timeline]
        busy.step(times, [b for _, b in result.timeline], where="post", label=name, linewidth=0.8)
    cdf.set_xscale("log")
    cdf.set_xlabel("wait (s, log; under 1 s drawn at 1 s)")
    cdf.set_ylabel("fraction of jobs")
    cdf.set_title("Wait CDF")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend()
    if results:
        total = max(result.total_gpus for result in results.values())
        busy.axhline(total, color="grey", linestyle="--", linewidth=0.8, label="capacity")
    busy.set_xlabel("time (h)")
    busy.set_ylabel("GPUs busy")
    busy.set_title("GPUs busy over time")
    busy.grid(True, alpha=0.3)
    busy.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
