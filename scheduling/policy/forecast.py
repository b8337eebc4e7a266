"""When will a waiting task start? A forward simulation of the line, as Slurm's ``squeue --start``.

Pure: the pass's snapshot and line in, an estimate per task out, no I/O. The running tasks end
and the tasks in line start, in line order, on the GPUs that free up: three times, once with
short runtimes, once with typical ones and once with long ones, which gives the estimate and
its bounds. A task's runtime comes from history (quantiles of its tenant's succeeded tasks
with the same command, else the tenant's, else the platform's; the caller looks them up),
capped by its timeout; else from its timeout alone (it may end at once, or at its timeout);
else it is unknown, and so is the start of every task that has to wait for its GPUs.

The simulation is deliberately simple: whole GPUs on one node (a shared task counts as its
GPUs), the tenant's GPU quota, tasks in line start in order (no backfill). Its work is bounded:
only the first ``limit`` tasks in line are estimated, each costing a few heap operations.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from scheduling.policy.model import PendingView, Placement, RunningView, Snapshot, occupied

INF = float("inf")
FORECAST_LIMIT = 200  # tasks in line estimated per pass; those after are "later"

# Where a runtime came from, weakest last: an estimate says the weakest it used.
BASIS_COMMAND = "command"  # the tenant's succeeded tasks with the same command
BASIS_TENANT = "tenant"  # the tenant's succeeded tasks
BASIS_PLATFORM = "platform"  # every tenant's succeeded tasks
BASIS_TIMEOUT = "timeout"  # its timeout only
BASIS_NOW = "now"  # GPUs that fit it are free now
BASES = (BASIS_NOW, BASIS_COMMAND, BASIS_TENANT, BASIS_PLATFORM, BASIS_TIMEOUT)


@dataclass(frozen=True, slots=True)
class Runtime:
    """Typical runtimes (seconds) from history: a short, a typical and a long one."""

    low: float
    mid: float
    high: float
    basis: str


@dataclass(frozen=True, slots=True)
class Estimate:
    """When a task is expected to start (snapshot clock), and between when; None: unknown."""

    at: float | None
    earliest: float | None
    latest: float | None
    basis: str  # the weakest source it rests on (BASES), or "unknown"

    def as_list(self) -> list:
        return [self.at, self.earliest, self.latest, self.basis]


UNKNOWN = Estimate(None, None, None, "unknown")


def _durations(
    task: RunningView | PendingView, history: Runtime | None
) -> tuple[tuple[float, float, float], str] | None:
    """(short, typical, long) runtimes of ``task`` and their basis, or None if unknown."""
    cap = INF if task.timeout_s is None else float(task.timeout_s)
    if history is not None:
        return (min(history.low, cap), min(history.mid, cap), min(history.high, cap)), (
            history.basis
        )
    if task.timeout_s is not None:
        return (0.0, cap, cap), BASIS_TIMEOUT
    return None


def forecast(
    snapshot: Snapshot,
    line: list[int],
    runtimes: Mapping[int, Runtime],
    *,
    placements: Iterable[Placement] = (),
    limit: int = FORECAST_LIMIT,
) -> dict[int, Estimate]:
    """An estimate for each of the first ``limit`` tasks of ``line`` (the pass's order of the
    tasks waiting for GPUs or quota). ``runtimes``: by task id, for running and waiting tasks
    alike, what history says; a task absent there is judged by its timeout alone.
    ``placements``: the pass's, which start now."""
    ids = line[:limit]
    if not ids:
        return {}
    snapshot = _with_placements(snapshot, list(placements))
    pending = {task.id: task for task in snapshot.pending}
    ahead = [pending[task_id] for task_id in ids if task_id in pending]
    nodes: dict[str, list] = {}  # node -> its schedulable GPUs (views)
    for gpu in snapshot.gpus:
        if gpu.schedulable:
            nodes.setdefault(gpu.node, []).append(gpu)
    # The nodes each task could ever run on, worked out once per kind of task (most tasks in
    # line ask alike), not once per task and scenario.
    kinds: dict[tuple, list[str]] = {}
    eligible = {}
    for task in ahead:
        kind = (task.gpu_type, task.pool, task.node, task.gpus_min)
        if kind not in kinds:
            kinds[kind] = [node for node, gpus in nodes.items() if _fits(task, gpus)]
        eligible[task.id] = kinds[kind]
    scenarios = [_simulate(snapshot, nodes, ahead, eligible, runtimes, which) for which in range(3)]
    estimates: dict[int, Estimate] = {}
    for task in ahead:
        low, mid, high = (scenario.get(task.id) for scenario in scenarios)
        if mid is None or mid[0] == INF:
            estimates[task.id] = UNKNOWN
            continue
        earliest = low[0] if low is not None else mid[0]
        latest = None if high is None or high[0] == INF else high[0]
        # The weakest basis of the three (a long scenario may rest on a timeout alone).
        bases = {s[1] for s in (low, mid, high) if s is not None}
        basis = max(bases, key=BASES.index)
        estimates[task.id] = Estimate(mid[0], min(earliest, mid[0]), latest, basis)
    return estimates


def _simulate(
    snapshot: Snapshot,
    nodes: Mapping[str, list],
    ahead: list[PendingView],
    eligible: Mapping[int, list[str]],
    runtimes: Mapping[int, Runtime],
    which: int,
) -> dict[int, tuple[float, str]]:
    """Start time and weakest basis of each task of ``ahead``, in order, with runtimes of kind
    ``which`` (0 short, 1 typical, 2 long). INF once a GPU it needs is held for good.
    ``nodes``: each node's schedulable GPUs; ``eligible``: by task, the nodes it fits."""
    now = snapshot.now
    free: dict[str, int] = defaultdict(int)
    for node, gpus in nodes.items():
        free[node] = sum(1 for gpu in gpus if gpu.idle)
    used: dict[str, int] = defaultdict(int)  # tenant -> whole GPUs held
    ends: list[tuple[float, int, str, str, int]] = []  # (end, seq, node, tenant, gpus)
    basis_by_end: dict[int, str] = {}
    seq = 0
    for task in snapshot.running:
        used[task.tenant] += task.gpu_count
        known = _durations(task, runtimes.get(task.id))
        end = INF if known is None else max(now, task.started_at + known[0][which])
        if known is not None:
            basis_by_end[seq] = known[1]
        if task.node in nodes:
            heapq.heappush(ends, (end, seq, task.node, task.tenant, task.gpu_count))
        seq += 1
    limits = {name: view.limits.gpus for name, view in snapshot.tenants.items()}

    result: dict[int, tuple[float, str]] = {}
    t = now
    weakest = BASIS_NOW
    for task in ahead:
        need = task.gpus_min
        limit = limits.get(task.tenant)
        fits = eligible[task.id]
        while True:
            quota_ok = limit is None or used[task.tenant] + need <= limit
            node = next((n for n in fits if free[n] >= need), None)
            if quota_ok and node is not None:
                break
            if not ends or ends[0][0] == INF or not fits:
                # Nothing that fits it will ever free up by what we know: neither it nor
                # anything after it (they start in order) has an estimate.
                for rest in ahead[ahead.index(task) :]:
                    result[rest.id] = (INF, "unknown")
                return result
            end, number, ended_on, tenant, gpus = heapq.heappop(ends)
            t = max(t, end)
            free[ended_on] += gpus
            used[tenant] -= gpus
            weakest = max(weakest, basis_by_end.get(number, BASIS_NOW), key=BASES.index)
        result[task.id] = (t, weakest)
        free[node] -= need
        used[task.tenant] += need
        known = _durations(task, runtimes.get(task.id))
        end = INF if known is None else t + known[0][which]
        if known is not None:
            basis_by_end[seq] = known[1]
        heapq.heappush(ends, (end, seq, node, task.tenant, need))
        seq += 1
    return result


def _with_placements(snapshot: Snapshot, placements: list[Placement]) -> Snapshot:
    """The snapshot as it is once ``placements`` have started (now)."""
    if not placements:
        return snapshot
    pending = {task.id: task for task in snapshot.pending}
    started = [
        RunningView(id=p.task_id, tenant=task.tenant, priority=task.priority,
                    task_class=task.task_class, preemptible=True, node=p.node, gpus=p.gpus,
                    exclusive=p.exclusive, started_at=snapshot.now, timeout_s=task.timeout_s)
        for p in placements
        if (task := pending.get(p.task_id)) is not None
    ]  # fmt: skip
    return replace(
        snapshot,
        gpus=occupied(snapshot.gpus, started),
        running=(*snapshot.running, *started),
    )


def _fits(task: PendingView, gpus: list) -> bool:
    """Whether a node with these GPUs could ever take ``task`` (its constraints and size)."""
    matching = [
        g
        for g in gpus
        if (not task.gpu_type or g.gpu_type == task.gpu_type)
        and (not task.pool or g.pool == task.pool)
        and (not task.node or g.node == task.node)
    ]
    return len(matching) >= task.gpus_min
