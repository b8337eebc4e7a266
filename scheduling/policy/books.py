"""What a pass counts as it goes: the GPUs and memory each tenant holds, per pool, against its
quota; the reservation a blocked task holds; and how reasons write amounts."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from scheduling.policy.model import (
    WAIT_QUOTA,
    Limits,
    PendingView,
    Placement,
    Wait,
    card_share,
)

INF = math.inf
PREEMPT = "preempt"  # the usual rules allow it
RECLAIM = "reclaim"  # only as capacity borrowed beyond its class's guarantee
NO_LIMITS = Limits()
# How many successors a pass lists (``Pass.nominate``): enough for the GPUs to turn over several
# times before the next pass, which is asked for once half are taken. With fewer, the list ran
# out under load before that pass came, and freed GPUs waited for it.
SUCCESSORS_PER_GPU = 8
SUCCESSORS_MAX = 256


# --- Usage bookkeeping --------------------------------------------------------------------------


@dataclass(slots=True)
class Usage:
    """What a tenant (or a tenant within one pool) holds, in the units quotas count."""

    gpus: float = 0.0  # a shared allocation counts as its fraction of the card
    memory_mb: int = 0
    tasks: int = 0

    def add(self, gpus: float, memory_mb: int, tasks: int = 1) -> None:
        self.gpus += gpus
        self.memory_mb += memory_mb
        self.tasks += tasks

    def less(self, other: Usage) -> Usage:
        return Usage(self.gpus - other.gpus, self.memory_mb - other.memory_mb,
                     self.tasks - other.tasks)  # fmt: skip


@dataclass(slots=True)
class Books:
    gpu_memory: dict[int, int]
    gpu_pool: dict[int, str]
    tenant: dict[str, Usage] = field(default_factory=lambda: defaultdict(Usage))
    tenant_pool: dict[tuple[str, str], Usage] = field(default_factory=lambda: defaultdict(Usage))
    by_class: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def charge(
        self,
        tenant: str,
        task_class: str,
        gpus: tuple[tuple[int, int], ...],
        exclusive: bool,
        *,
        in_class: bool = True,
    ) -> Usage:
        """Count a task holding ``gpus`` (GPU id, MiB) to its tenant and (``in_class``) its
        class; returns what it added to its tenant's usage."""
        pools: dict[str, Usage] = defaultdict(Usage)
        total = Usage(tasks=1)
        for gpu_id, memory_mb in gpus:
            capacity = self.gpu_memory.get(gpu_id, memory_mb)
            share = card_share(exclusive=exclusive, memory_mb=memory_mb, card_memory_mb=capacity)
            total.add(share, memory_mb, 0)
            pools[self.gpu_pool.get(gpu_id, "")].add(share, memory_mb, 0)
        self.tenant[tenant].add(total.gpus, total.memory_mb)
        for pool, usage in pools.items():
            self.tenant_pool[(tenant, pool)].add(usage.gpus, usage.memory_mb)
        if in_class:
            self.by_class[task_class] += total.gpus
        return total


def request_usage(task: PendingView, placement: Placement | None, gpu_memory_mb: int) -> Usage:
    """What the task would add to its tenant's usage (its minimum if not yet placed)."""
    count = len(placement.gpus) if placement else task.gpus_min
    memory_mb = gpu_memory_mb if task.exclusive else task.gpu_memory_mb or 0
    share = card_share(exclusive=task.exclusive, memory_mb=memory_mb, card_memory_mb=gpu_memory_mb)
    return Usage(count * share, count * memory_mb, 1)


def quota_problem_of(
    name: str, limits: Limits, used: Usage, extra: Usage, pool: str = ""
) -> Wait | None:
    scope = f"tenant {name}" + (f" in pool {pool}" if pool else "")

    # The wait names the quota, not what the tenant uses now: that moves with every task of
    # the tenant that starts or ends (by a fraction, with GPUs shared by memory), and a wait
    # that changes is written again to every waiting task of the tenant at the next pass
    # (``scheduler.update_reasons``). What it uses is the quota's own figure (``Usage``; the
    # API's ``GET /api/v1/tenant/``, ``gpuctl quota``, the portal's overview).
    def over(limit: str, of: int, text: str) -> Wait:
        details = {"limit": limit, "of": of, "pool": pool or None, "tenant": name}
        return Wait(WAIT_QUOTA, f"{scope} has no room left in its quota of {text}", details)

    if limits.gpus is not None and used.gpus + extra.gpus > limits.gpus + 1e-9:
        return over("gpus", limits.gpus, f"{limits.gpus} GPUs")
    if limits.gpu_memory_mb is not None and used.memory_mb + extra.memory_mb > limits.gpu_memory_mb:
        text = f"{format_gib(limits.gpu_memory_mb)} GPU memory"
        return over("gpu_memory_mb", limits.gpu_memory_mb, text)
    if limits.running_tasks is not None and used.tasks + 1 > limits.running_tasks:
        return over("running_tasks", limits.running_tasks, f"{limits.running_tasks} running tasks")
    return None


def within(limits: Limits, used: Usage) -> bool:
    """Whether ``used`` is within ``limits`` (no more than they allow, which a quota lowered
    below a tenant's use is not)."""
    return (
        (limits.gpus is None or used.gpus <= limits.gpus + 1e-9)
        and (limits.gpu_memory_mb is None or used.memory_mb <= limits.gpu_memory_mb)
        and (limits.running_tasks is None or used.tasks <= limits.running_tasks)
    )


# --- The pass ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Reservation:
    task_id: int
    gpu_ids: frozenset[int]
    start: float  # when the reserved GPUs are expected to be free (inf: unknown)
    node: str

    def allows(self, task: PendingView, now: float) -> bool:
        return task.timeout_s is not None and now + task.timeout_s <= self.start


def format_utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def format_gib(mb: int) -> str:
    return f"{mb / 1024:.0f} GiB" if mb % 1024 == 0 else f"{mb / 1024:.1f} GiB"


def format_num(value: float) -> str:
    return str(int(value)) if abs(value - round(value)) < 1e-9 else f"{value:.2f}"
