"""What the policy core sees and what it decides. Plain data, no Django.

The scheduling service builds a Snapshot from PostgreSQL; the trace replay simulator builds one
from its simulated cluster. Both call ``scheduling.policy.schedule(snapshot, settings)`` and
apply the Decision. Times are seconds (floats) on whatever clock the caller uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import NamedTuple

BATCH = "batch"
ONLINE = "online"


def free_memory_mb(*, memory_mb: int, reserved_mb: int, foreign_mb: int, exclusive: bool) -> int:
    """What a new task could still reserve on a GPU: nothing while one task holds it whole,
    else what neither the platform's tasks nor foreign processes hold."""
    if exclusive:
        return 0
    return max(0, memory_mb - reserved_mb - foreign_mb)


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU and what is reserved on it now."""

    id: int
    node: str
    pool: str
    gpu_type: str
    memory_mb: int
    reserved_mb: int = 0  # by the platform's active allocations
    foreign_mb: int = 0  # used by processes the platform did not start: never offered
    holders: int = 0  # active allocations
    exclusive: bool = False  # held whole by one task
    schedulable: bool = True  # GPU and its node available (not draining/offline/failed)

    @property
    def free_mb(self) -> int:
        return free_memory_mb(
            memory_mb=self.memory_mb,
            reserved_mb=self.reserved_mb,
            foreign_mb=self.foreign_mb,
            exclusive=self.exclusive,
        )

    @property
    def idle(self) -> bool:
        """Free for an exclusive task: nobody holds it and no foreign process uses it."""
        return self.holders == 0 and self.foreign_mb == 0


@dataclass(frozen=True, slots=True)
class RunningView:
    """A task holding GPUs (scheduled, running, paused, or preempted and still stopping)."""

    id: int
    tenant: str
    priority: int
    task_class: str
    preemptible: bool
    node: str
    gpus: tuple[tuple[int, int], ...]  # (gpu id, reserved MiB)
    exclusive: bool
    started_at: float
    timeout_s: float | None = None  # None: unbounded
    queue: str = ""
    stopping: bool = False  # preempted, waiting for its processes to end
    submitted_at: float | None = None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def expected_end(self) -> float:
        return float("inf") if self.timeout_s is None else self.started_at + self.timeout_s


# Not frozen: a pass builds one per pending task (10,000 and more), and a frozen dataclass's
# __init__ (object.__setattr__ per field) costs several times as much. Nothing writes to one
# after it is built.
@dataclass(slots=True)
class PendingView:
    id: int
    tenant: str
    priority: int
    task_class: str
    submitted_at: float
    gpus_min: int = 1
    gpus_max: int = 1
    gpu_memory_mb: int | None = None  # per GPU; None: whole GPUs, exclusive
    gpu_type: str = ""
    pool: str = ""
    node: str = ""
    queue: str = ""
    timeout_s: float | None = None
    not_before: float | None = None  # retry backoff
    blocked: str = ""  # a reason decided outside the core (dependencies); non-empty: wait
    blocked_code: str = "dependencies"  # what ``blocked`` is about (``Wait.code``)

    @property
    def exclusive(self) -> bool:
        return self.gpu_memory_mb is None


@dataclass(frozen=True, slots=True)
class Limits:
    """A quota: None means no limit. ``pool`` empty: cluster-wide."""

    gpus: int | None = None
    gpu_memory_mb: int | None = None
    running_tasks: int | None = None


@dataclass(frozen=True, slots=True)
class TenantView:
    name: str
    weight: float = 1.0
    recent_gpus: float = 0.0  # decayed usage expressed as average GPUs over the half-life
    limits: Limits = field(default_factory=Limits)
    pool_limits: dict[str, Limits] = field(default_factory=dict)

    @property
    def counts_tasks(self) -> bool:
        """Whether one of its quotas limits how many tasks it runs."""
        return any(
            limits.running_tasks is not None for limits in (self.limits, *self.pool_limits.values())
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    gpus: tuple[GpuView, ...]
    running: tuple[RunningView, ...] = ()
    pending: tuple[PendingView, ...] = ()
    tenants: dict[str, TenantView] = field(default_factory=dict)
    promised: tuple[Promise, ...] = ()


@dataclass(frozen=True, slots=True)
class Promise:
    """A pending task that the last pass listed as a successor charged to its tenant's quota
    (``Successor.fenced``), with the GPUs it would take first: a node agent may start it at any
    moment, this pass's own included, so a pass counts it as started, as the pass that listed
    it did, for as long as it is pending in the pass's snapshot."""

    task_id: int
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PolicySettings:
    # Guaranteed share of all schedulable GPUs per class; each may borrow what the other leaves
    # idle. The invariant: a class with demand gets at least its guaranteed share within a
    # bounded time (``reclaim_after_s``, plus the time its victims take to stop).
    class_shares: dict[str, float] = field(default_factory=lambda: {ONLINE: 0.3, BATCH: 0.7})
    # How long a task of a class under its guarantee waits before it may take back GPUs the
    # other class borrowed beyond its own guarantee, preempting whatever runs there (online
    # or not preemptible included: borrowed capacity is lent, not given). The bound of the
    # invariant. 2 h did best on the trace replay (shorter ones evicted more long-running
    # services for demand that finishing tasks would soon have met; docs/scheduling.md).
    reclaim_after_s: float = 2 * 3600
    backfill: bool = True
    preemption: bool = True
    # A task waiting this long goes to the front of the line, whatever its priority: it is
    # placed first or gets the backfill reservation, so no stream of work can starve it.
    starvation_after_s: float = 2 * 3600
    # Never preempt a task that has run longer than this: its lost work would outweigh what
    # the waiting task gains (the scheduler cannot know either task's duration).
    preempt_max_runtime_s: float = 3600


@dataclass(frozen=True, slots=True)
class Placement:
    task_id: int
    node: str
    gpus: tuple[tuple[int, int], ...]  # (gpu id, reserved MiB)
    exclusive: bool


@dataclass(frozen=True, slots=True)
class Preemption:
    task_id: int
    for_task_id: int
    reason: str
    # What the reason says, as data: the class and priority of the task it makes room for,
    # and the victim's class where it is taken back as borrowed (``reclaimed``).
    details: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Successor:
    """A waiting task that would start as soon as GPUs it may take free up, before the next
    pass (``Decision.successors``): ``gpus`` GPUs on one node, among ``gpu_ids``, freed whole
    (``memory_mb``: what it reserves on each, sharing the card from then on; 0: held whole).
    ``fenced``: charged to its tenant's quota as if it had started, which the next pass does
    too while it is pending (``Promise``). ``swap``: its tenant has no room left in
    its quotas for it, so it takes only what its own tenant's ended tasks free (``hand_on``):
    its tenant then holds what it held, and no pass can count that wrong, so it needs no fence.
    ``one_for_one``: a swap whose tenant's quotas count running tasks, which replaces one ended
    task; otherwise every GPU its tenant's ended tasks free may go to a swap (two one-GPU
    tasks for an ended two-GPU one), since only the count of tasks would grow."""

    task_id: int
    gpus: int
    gpu_ids: tuple[int, ...]
    fenced: bool = False
    swap: bool = False
    tenant: str = ""
    memory_mb: int = 0
    one_for_one: bool = True


class Freed(NamedTuple):
    """A GPU an agent's batch of ends freed, as ``hand_on`` may give it: ``whole_mb``, its
    memory, when an ended task held it whole (0 otherwise: tasks shared it, and may still),
    and ``shares_mb``, what the ended tasks held of it, which shares of it may take (never
    free in a pass's snapshot: held until the transaction that hands it on)."""

    gpu: int
    whole_mb: int
    shares_mb: int


def hand_on(
    successors: Iterable,
    freed: list[Freed],
    node: str,
    owners: Mapping[int, object] | None = None,
    ends: Mapping[object, int] | None = None,
) -> tuple[list[Placement], list[Freed]]:
    """Freed GPUs of ``node`` (in the order to take them) given to ``successors`` (each with
    ``task_id``, ``gpus``, ``gpu_ids``, ``memory_mb`` and ``swap``, as a ``Successor`` has), in
    their order: each takes the first freed GPUs it may take, if enough are left for it. One
    that holds its GPUs whole takes GPUs freed whole (``Freed.whole_mb``); one that shares them
    by memory (``memory_mb``) takes that much of what the ended tasks held on each
    (``Freed.shares_mb``), several of them one card, which is then no longer free whole.
    Returns the placements and the GPUs nobody took any of.

    A successor that ``swap``s (its tenant has no room in its quotas) takes only what ended
    tasks of its own tenant freed (``owners``: GPU id -> the tenant of the tasks that freed
    it, as the successor's ``tenant`` names it; whole, only a GPU they held whole), and, if
    it is ``one_for_one`` (its tenant's quotas count running tasks), only while ``ends``
    (tenant -> how many of its tasks ended and were not yet replaced) has one left for it: its
    tenant then holds no more GPUs, memory or (where they count) tasks than it did, whatever
    its quotas count."""
    whole = {f.gpu: f.whole_mb for f in freed if f.whole_mb}
    shares = {f.gpu: f.shares_mb for f in freed}
    order = [f.gpu for f in freed]
    spare = dict(ends or {})
    placements = []
    for successor in successors:
        mine = None
        if successor.swap:
            mine = successor.tenant
            if successor.one_for_one and spare.get(mine, 0) < 1:
                continue
        need = successor.memory_mb
        fits = []
        for gpu in order:
            if gpu not in successor.gpu_ids or (
                mine is not None and (owners or {}).get(gpu) != mine
            ):
                continue
            if need:
                fit = shares.get(gpu, 0) >= need
            else:  # a swap takes a GPU whole only if its tenant's tasks held all of it
                fit = gpu in whole and (mine is None or shares[gpu] >= whole[gpu])
            if fit:
                fits.append(gpu)
                if len(fits) == successor.gpus:
                    break
        if len(fits) < successor.gpus:
            continue
        if mine is not None and successor.one_for_one:
            spare[mine] -= 1
        gpus = tuple((gpu, need or whole[gpu]) for gpu in fits)
        placements.append(Placement(successor.task_id, node, gpus, exclusive=not need))
        for gpu in fits:
            whole.pop(gpu, None)  # taken, or shared from now on
            shares[gpu] = shares[gpu] - need if need else 0
        if not whole and not any(shares.values()):
            break
    taken = {gpu for p in placements for gpu, _ in p.gpus}
    return placements, [f for f in freed if f.gpu not in taken]


# Why a task waits, in one word (``Wait.code``).
WAIT_QUEUE = "queue"  # its serial queue runs or holds an earlier task
WAIT_HELD = "held"  # held for a person (repeated infrastructure failures)
WAIT_DEPENDENCIES = "dependencies"  # a dependency has not succeeded yet
WAIT_BACKOFF = "backoff"  # retry backoff
WAIT_QUOTA = "quota"  # its tenant's quota is used up
WAIT_CAPACITY = "capacity"  # no GPUs fit it now
WAIT_RESERVED = "reserved"  # no GPUs fit it now; the first to free up are held for it
WAIT_PREEMPTING = "preempting"  # the tasks preempted for it are stopping


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a task waits, as data; the reason people read is rendered from it (``render``).

    One Wait may stand for many tasks (all those of one shape blocked in one pass): its place
    in line is the task's own, kept by the Decision (``line``), not here."""

    code: str
    text: str  # the reason without the place in line
    details: dict = field(default_factory=dict)

    def render(self, position: int | None = None, line: int | None = None) -> str:
        if position is None:
            return self.text
        return f"{self.text}; {ordinal(position)} of {line} in line"


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass
class Decision:
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    # task id -> why it waits, as data, for policies that give it (``schedule`` does for every
    # waiting task; baselines and test policies give text only, in ``waiting``).
    waits: dict[int, Wait] = field(default_factory=dict)
    # The tasks that wait for GPUs or quota, in the order they would start: their place in line.
    line: list[int] = field(default_factory=list)
    # The earliest time (snapshot clock) at which a wait ends by time alone (a retry backoff,
    # starvation, a class's right to reclaim): the caller runs the policy again then, so no
    # time-based wait depends on some unrelated event (or the backstop) to be noticed.
    wake_at: float | None = None
    # Waiting tasks in the order they would start as GPUs free up, each with the GPUs it may
    # take, quotas counted as if every one before it had started: the caller may hand a
    # finished task's GPUs to the first that fits before it runs the policy again
    # (``Pass.nominate``). Empty where the policy cannot promise that order.
    successors: list[Successor] = field(default_factory=list)

    @cached_property
    def waiting(self) -> dict[int, str]:
        """Task id -> the reason it waits as people read it, place in line included.

        Rendered on first use, not by the pass: the scheduling service stores the data
        (``waits``, ``line``) and renders a reason only when someone reads it. Text-only
        policies fill this dict themselves."""
        total = len(self.line)
        texts = {task_id: why.text for task_id, why in self.waits.items()}
        for position, task_id in enumerate(self.line, start=1):
            texts[task_id] = self.waits[task_id].render(position, total)
        return texts


def wait_record(code: str, details: dict, position: int | None, line: int) -> dict:
    """Why a task waits as the API shows it (``Task.wait`` stores it without the place in
    line, which changes with every placement ahead of it; see ``SchedulerState.line``)."""
    return {
        "code": code,
        "position": position,
        "line": line if position is not None else None,
        "details": details,
    }


def card_share(*, exclusive: bool, memory_mb: int, card_memory_mb: int) -> float:
    """The share of a card a task holds there: all of it when exclusive, else its reserved
    memory over the card's. The one formula; ``scheduling.shares`` is its SQL twin (quota use,
    fair share and usage reports), and a test keeps the two in agreement."""
    if exclusive:
        return 1.0
    return memory_mb / (card_memory_mb or 1)


def occupied(gpus: Iterable[GpuView], running: Iterable[RunningView]) -> tuple[GpuView, ...]:
    """The GPUs as the running tasks leave them: reserved memory, holders, exclusive use.

    What the service reads from its allocations, for callers that build snapshots by hand
    (benchmarks, tests)."""
    reserved: dict[int, int] = {}
    holders: dict[int, int] = {}
    exclusive: set[int] = set()
    for task in running:
        for gpu_id, mb in task.gpus:
            reserved[gpu_id] = reserved.get(gpu_id, 0) + mb
            holders[gpu_id] = holders.get(gpu_id, 0) + 1
            if task.exclusive:
                exclusive.add(gpu_id)
    return tuple(
        replace(
            gpu,
            reserved_mb=gpu.reserved_mb + reserved.get(gpu.id, 0),
            holders=gpu.holders + holders.get(gpu.id, 0),
            exclusive=gpu.exclusive or gpu.id in exclusive,
        )
        for gpu in gpus
    )
