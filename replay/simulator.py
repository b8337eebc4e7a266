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

A job that the pass at its arrival leaves waiting is told when to expect its start, as a pass
tells a waiting task in production (``replay.forecasting``); the summary compares that with
when it really started.

Pure Python, no Django: the ``replay`` management command is the thin shell around it.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from replay.checker import SimGpu, check_decision
from replay.common import (
    GPU_TYPE,
    MAX_PASSES_PER_INSTANT,
    POLICIES,
    POOL,
    PolicyFn,
    PolicyViolation,
)
from replay.forecasting import History, estimate_arrivals
from replay.results import JobRecord, ReplayResult
from replay.trace import TraceJob
from scheduling.policy.model import (
    GpuView,
    PendingView,
    PolicySettings,
    RunningView,
    Snapshot,
    TenantView,
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
        self.gpu = {gpu_id: SimGpu() for gpu_id in self.node_of}
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
    history = History()  # runtimes of the jobs that ended, for the expected starts

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
        arrived: list[int] = []
        while events and events[0][0] == now:
            _, kind, task_id, run_no = heapq.heappop(events)
            if kind == _ARRIVE:
                cluster.pending[task_id] = waiting[task_id]
                arrived.append(task_id)
                changed = True
            elif kind == _WAKE:
                wake_ups.discard(now)
                changed = True
            elif run_no == runs[task_id] and task_id in cluster.running:
                occupied(cluster.stop(task_id), now)
                records[task_id - 1].end_s = now
                history.ended(jobs[task_id - 1].tenant, jobs[task_id - 1].duration_s)
                changed = True
        if not changed:  # only completions of runs that were preempted: nothing to decide
            continue

        for _ in range(MAX_PASSES_PER_INSTANT):
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
                f"t={now:g}: the policy preempted on {MAX_PASSES_PER_INSTANT} passes in a row "
                f"at the same instant (a livelock); the last preempted {last} and placed {placed}"
            )
        _track_share_waits(cluster, jobs, guarantee, within_share_since, result, now)
        # What a job that waits is told to expect, as the pass that left it waiting says.
        estimate_arrivals(snapshot, decision, arrived, history, records)
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
