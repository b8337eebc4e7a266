"""The scheduling policy: which pending task runs where, and why the others wait.

Pure: a Snapshot in, a Decision out, no I/O. One pass:

1. Tasks that cannot start for reasons outside capacity wait with that reason: unmet
   dependencies (decided by the caller), retry backoff, a busy serial queue.
2. The rest are taken in order: priority, then weighted fair share between tenants (the tenant
   using least, relative to its weight, goes first; its share grows as the pass places its
   tasks), then submission time.
3. Each task must fit its tenant's quotas, then is placed best-fit on one node.
4. The first task that does not fit gets a reservation: the GPUs that free up soonest on its
   best node. Later tasks may only use reserved GPUs if their timeout ends before then (a task
   without a timeout never can), so a big task is never starved by a stream of small ones.
5. A blocked task that is online (while online is under its guaranteed share) or of higher
   priority may preempt preemptible lower-priority work, choosing the victims that lose least.

Class guarantees. Each class (online, batch) has a guaranteed share of the schedulable GPUs
(``class_shares``, rounded to whole GPUs) and may borrow what the other leaves idle. The
invariant: a class that has demand gets at least its guaranteed share within a bounded time.
These rules keep it:

- A task whose class, with it, stays within its guarantee and that has waited
  ``reclaim_after_s`` may take back what the other class borrowed: it preempts tasks of that
  class, whatever their priority, preemptibility or run time (borrowed capacity is lent, not
  given; services borrow too), but only what that class holds beyond its own guarantee,
  rounded up to whole GPUs (``lendable``): it keeps more than its guarantee less one GPU.
- A task whose class would hold more than its guarantee with it (a borrower) preempts tasks
  of the other class, by priority too, only from what that class borrowed: a class pushed
  below its guarantee would only reclaim it back. Tasks that started by the right to reclaim
  are not evicted across classes while their class holds no more than its guarantee.
- While a class may reclaim, the other class's tasks that would borrow more are considered
  after its own in each pass, so GPUs freed for the lender (by a reclaim or by tasks ending)
  go to it, not back to the borrower.

So a task that fits in its class's unused guarantee starts, or has its victims chosen, at most
``reclaim_after_s`` after it began to wait, unless its quota, its constraints (pool, type,
node) or placement on one node stop it, not the other class. Each pass tells the caller when
the next time-based change is due (``Decision.wake_at``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from operator import attrgetter

from scheduling.policy.capacity import Capacity
from scheduling.policy.model import (
    BATCH,
    ONLINE,
    WAIT_BACKOFF,
    WAIT_CAPACITY,
    WAIT_PREEMPTING,
    WAIT_QUEUE,
    WAIT_QUOTA,
    WAIT_RESERVED,
    Decision,
    Limits,
    PendingView,
    Placement,
    PolicySettings,
    Preemption,
    RunningView,
    Snapshot,
    Successor,
    TenantView,
    Wait,
    card_share,
)

INF = math.inf
PREEMPT = "preempt"  # the usual rules allow it
RECLAIM = "reclaim"  # only as capacity borrowed beyond its class's guarantee
NO_LIMITS = Limits()
# How many successors a pass lists (``Pass.nominate``): enough for the GPUs to turn over several
# times before the next pass, which is asked for once half are taken. With one per GPU, the
# list ran out before that pass came (a pass with 1,000 waiting took 100-400 ms under load):
# 383 of 1,968 freed GPUs waited for one, 59 GPU-seconds of 308 (throughput bench); with four,
# 72 waited, 34 GPU-seconds of 406, most of them in bursts when the list ran out.
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


@dataclass(slots=True)
class Books:
    gpu_memory: dict[int, int]
    gpu_pool: dict[int, str]
    tenant: dict[str, Usage] = field(default_factory=lambda: defaultdict(Usage))
    tenant_pool: dict[tuple[str, str], Usage] = field(default_factory=lambda: defaultdict(Usage))
    by_class: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def charge(
        self, tenant: str, task_class: str, gpus: tuple[tuple[int, int], ...], exclusive: bool
    ) -> None:
        pools: dict[str, Usage] = defaultdict(Usage)
        total = Usage()
        for gpu_id, memory_mb in gpus:
            capacity = self.gpu_memory.get(gpu_id, memory_mb)
            share = card_share(exclusive=exclusive, memory_mb=memory_mb, card_memory_mb=capacity)
            total.add(share, memory_mb, 0)
            pools[self.gpu_pool.get(gpu_id, "")].add(share, memory_mb, 0)
        self.tenant[tenant].add(total.gpus, total.memory_mb)
        for pool, usage in pools.items():
            self.tenant_pool[(tenant, pool)].add(usage.gpus, usage.memory_mb)
        self.by_class[task_class] += total.gpus


def _request(task: PendingView, placement: Placement | None, gpu_memory_mb: int) -> Usage:
    """What the task would add to its tenant's usage (its minimum if not yet placed)."""
    count = len(placement.gpus) if placement else task.gpus_min
    memory_mb = gpu_memory_mb if task.exclusive else task.gpu_memory_mb or 0
    share = card_share(exclusive=task.exclusive, memory_mb=memory_mb, card_memory_mb=gpu_memory_mb)
    return Usage(count * share, count * memory_mb, 1)


def _quota_problem(
    name: str, limits: Limits, used: Usage, extra: Usage, pool: str = ""
) -> Wait | None:
    scope = f"tenant {name}" + (f" in pool {pool}" if pool else "")

    def over(limit: str, text: str, in_use: float, of: int) -> Wait:
        details = {"limit": limit, "in_use": round(in_use, 3), "of": of, "pool": pool or None}
        return Wait(WAIT_QUOTA, f"{scope} {text}", details)

    if limits.gpus is not None and used.gpus + extra.gpus > limits.gpus + 1e-9:
        text = f"uses {_num(used.gpus)} of its {limits.gpus} GPUs"
        return over("gpus", text, used.gpus, limits.gpus)
    if limits.gpu_memory_mb is not None and used.memory_mb + extra.memory_mb > limits.gpu_memory_mb:
        text = f"uses {_gib(used.memory_mb)} of its {_gib(limits.gpu_memory_mb)} GPU memory"
        return over("gpu_memory_mb", text, used.memory_mb, limits.gpu_memory_mb)
    if limits.running_tasks is not None and used.tasks + 1 > limits.running_tasks:
        text = f"runs {used.tasks} of its {limits.running_tasks} tasks"
        return over("running_tasks", text, used.tasks, limits.running_tasks)
    return None


# --- The pass ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Reservation:
    task_id: int
    gpu_ids: frozenset[int]
    start: float  # when the reserved GPUs are expected to be free (inf: unknown)
    node: str

    def allows(self, task: PendingView, now: float) -> bool:
        return task.timeout_s is not None and now + task.timeout_s <= self.start


class Pass:
    def __init__(self, snapshot: Snapshot, settings: PolicySettings) -> None:
        self.snap = snapshot
        self.settings = settings
        self.now = snapshot.now
        self.capacity = Capacity(snapshot.gpus)
        self.decision = Decision()
        self.books = Books(
            gpu_memory={g.id: g.memory_mb for g in snapshot.gpus},
            gpu_pool={g.id: g.pool for g in snapshot.gpus},
        )
        self.tenants = dict(snapshot.tenants)
        self.typical_gpu_mb = max((g.memory_mb for g in snapshot.gpus), default=0)
        for task in snapshot.running:
            self.books.charge(task.tenant, task.task_class, task.gpus, task.exclusive)
        self.busy_queues = {(t.tenant, t.queue): t.id for t in snapshot.running if t.queue}
        # GPUs held for blocked tasks: at most one backfill reservation (the first blocked task)
        # plus one per task waiting for its preemption victims to stop.
        self.reservations: list[Reservation] = []
        self.backfill_reserved = False
        self.removed: set[int] = set()  # running tasks this pass chose to preempt
        self.blocked_shapes: dict[tuple, Wait] = {}
        # Placements, reservations and preemptions made so far; an answer given to a task is
        # reused for a like task only while this has not moved (``consider``).
        self.changes = 0
        self.answers: dict[tuple, tuple[int, Wait]] = {}
        self.lowest_preemptible = min(
            (r.priority for r in snapshot.running if r.preemptible and r.task_class != ONLINE),
            default=None,
        )
        self.guarantee = _guarantees(len(self.capacity.gpus), settings.class_shares)
        # Per class, the GPUs held by tasks that are stopping or that this pass preempts: they
        # are on their way out and count for neither class's guarantee.
        self.leaving: dict[str, float] = defaultdict(float)
        for task in snapshot.running:
            if task.stopping:
                self.leaving[task.task_class] += self.share_of(task)
        self.wake_at = INF  # the earliest time a wait ends by itself
        # (class, GPUs, memory) -> ``lender`` (and ``defer``), until a placement or preemption
        # changes what each class holds, or a class's last claim is considered: asked for
        # nearly every waiting task, and the same for many.
        self.lenders: dict[tuple, bool] = {}
        self.entitled: set[int] = set()  # set by ``run``
        # (timeout, reservations so far) -> ``reserved_for``'s answer.
        self.reserved: dict[tuple, tuple[tuple[bool, ...], frozenset[int]]] = {}

    # -- ordering --

    def gate(self) -> list[PendingView]:
        """Drop tasks that wait for reasons other than capacity; return the rest."""
        eligible: list[PendingView] = []
        queue_heads: dict[tuple[str, str], int] = {}
        for task in sorted(self.snap.pending, key=attrgetter("submitted_at", "id")):
            key = (task.tenant, task.queue)
            if task.queue:
                if key in self.busy_queues:
                    first = self.busy_queues[key]
                    text = f"queue {task.queue}: #{first} runs first"
                    self.wait(task, Wait(WAIT_QUEUE, text, {"queue": task.queue, "behind": first}))
                    continue
                if key in queue_heads:
                    first = queue_heads[key]
                    text = f"queue {task.queue}: waiting behind #{first}"
                    self.wait(task, Wait(WAIT_QUEUE, text, {"queue": task.queue, "behind": first}))
                    continue
                queue_heads[key] = task.id
            if task.blocked:
                self.wait(task, Wait(task.blocked_code, task.blocked))
                continue
            if task.not_before is not None and task.not_before > self.now:
                left = int(task.not_before - self.now)
                details = {"not_before": task.not_before, "seconds_left": left}
                # A time, not a countdown: the text stays true until the pass booked for then.
                text = f"retry backoff until {_utc(task.not_before)}"
                self.wait(task, Wait(WAIT_BACKOFF, text, details))
                self.wake(task.not_before)
                continue
            eligible.append(task)
        return eligible

    def tenant(self, name: str) -> TenantView:
        view = self.tenants.get(name)
        if view is None:
            view = self.tenants[name] = TenantView(name=name)
        return view

    def fair_key(self, name: str) -> float:
        view = self.tenant(name)
        return (view.recent_gpus + self.books.tenant[name].gpus) / max(view.weight, 1e-9)

    def ordered(self, tasks: list[PendingView]):
        """Yield tasks by priority, then fair share (re-evaluated after each pick), then age.

        Tasks that waited past ``starvation_after_s`` come first of all, oldest first.
        """
        cutoff = self.now - self.settings.starvation_after_s
        by_priority: dict[int, dict[str, list[PendingView]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for task in tasks:  # already in submission order
            if task.submitted_at <= cutoff:
                yield task
            else:
                by_priority[task.priority][task.tenant].append(task)
        for priority in sorted(by_priority, reverse=True):
            yield from self.turns(by_priority[priority])

    def turns(self, by_tenant: dict[str, list[PendingView]]):
        """One priority's tasks, the tenant furthest below its fair share first (re-evaluated
        after each pick), each tenant's in submission order."""
        queues = {name: iter(items) for name, items in by_tenant.items()}
        heads = {name: next(it) for name, it in queues.items()}
        heap = [(self.fair_key(n), h.submitted_at, h.id, n) for n, h in heads.items()]
        heapq.heapify(heap)
        while heap:
            key, _, _, name = heapq.heappop(heap)
            current = self.fair_key(name)
            if current > key + 1e-12:  # its share grew since it was queued: re-queue
                head = heads[name]
                heapq.heappush(heap, (current, head.submitted_at, head.id, name))
                continue
            head = heads[name]
            # The tenant keeps the turn while it stays ahead of every other head: the same
            # order as pushing each next task and popping again, without the heap work per
            # task (10,000 pending tasks of a few tenants are long runs of one).
            while True:
                yield head
                head = next(queues[name], None)
                if head is None:
                    break
                if not heap:
                    continue  # the last tenant of this priority: its turn goes on
                item = (self.fair_key(name), head.submitted_at, head.id, name)
                if heap[0] < item:
                    heads[name] = head
                    heapq.heappush(heap, item)
                    break

    # -- one task --

    def run(self) -> Decision:
        eligible = self.gate()
        # Tasks that may reclaim, per class, not yet considered in this pass.
        claims: dict[str, int] = defaultdict(int)
        # Tasks that may take back borrowed GPUs (their reclaim time has come): asked of
        # nearly every task more than once, so decided once.
        self.entitled = entitled = {
            task.id for task in eligible if self.now >= self.reclaim_at(task)
        }
        for task in eligible:
            if task.id in entitled:
                claims[task.task_class] += 1
        deferred: list[PendingView] = []
        for task in self.ordered(eligible):
            if self.defer(task, claims):
                deferred.append(task)
                continue
            self.consider(task)
            if task.id in entitled:
                claims[task.task_class] -= 1
                if not claims[task.task_class]:
                    self.lenders.clear()
                    self.changes += 1  # lenders and deferrals may answer differently now
        # What the lenders left (GPUs they cannot use: wrong node, type, size) is still lent.
        for task in deferred:
            self.consider(task)
        self.decision.wake_at = None if self.wake_at == INF else self.wake_at
        self.decision.successors = self.nominate(eligible)
        return self.decision

    def wake(self, at: float) -> None:
        """A wait ends by itself at ``at``: the caller should run a pass then."""
        if self.now < at < self.wake_at:
            self.wake_at = at

    def consider(self, task: PendingView) -> None:
        # A task asking what an earlier one of its tenant asked for, with nothing placed,
        # preempted, reserved or reclaimed since, meets the same answer: quota use, capacity,
        # running tasks and reservations are all as they were. Reused instead of searched
        # again; only the note about when it may reclaim is its own.
        memo_key = (task.tenant, task.priority, task.task_class, task.gpus_min,
                    task.gpus_max, task.gpu_memory_mb, task.gpu_type, task.pool, task.node,
                    task.timeout_s, task.id in self.entitled)  # fmt: skip
        known = self.answers.get(memo_key)
        if known is not None and known[0] == self.changes:
            _, why, noted = known
            self.wait(task, self.reclaim_note(task, why) if noted else why, in_line=True)
            return
        changes = self.changes
        answer = self.decide(task)
        if answer is not None and self.changes == changes:
            self.answers[memo_key] = (changes, *answer)

    def decide(self, task: PendingView) -> tuple[Wait, bool] | None:
        """Place the task, or have it wait; returns why it waits before any reclaim note, and
        whether it gets one (None: it was placed, or stopped others, or had GPUs held)."""
        problem = self.quota_problem(task, None)
        if problem:
            self.wait(task, problem, in_line=True)
            return problem, False
        allowed, held = self.reserved_for(task)
        # Whether it may reclaim is part of the shape: a like task that may not, blocked
        # before it, says nothing about the GPUs it may take back.
        may_reclaim = task.id in self.entitled
        shape = (task.exclusive, task.gpus_min, task.gpu_memory_mb, task.gpu_type, task.pool,
                 task.node, task.task_class, allowed, may_reclaim)  # fmt: skip
        if shape in self.blocked_shapes:  # capacity only shrinks within a pass
            why = self.blocked_shapes[shape]
            self.wait(task, self.reclaim_note(task, why), in_line=True)
            return why, True
        placement = self.capacity.find(task, held)
        if placement is not None and task.gpus_max > task.gpus_min:
            placement = self.trim_to_quota(task, placement)
        if placement is not None:
            self.place(task, placement)
            return None
        reason = self.capacity_reason(task)
        if self.settings.preemption and self.could_preempt(task) and self.try_preempt(task):
            return None
        if not self.backfill_reserved and self.settings.backfill:
            reservation = self.reserve(task)
            if reservation is not None:
                self.backfill_reserved = True
                self.reservations.append(reservation)
                self.changes += 1
                when = reservation.start
                # A time, not a countdown frozen at this pass.
                eta = "when they free up" if when == INF else f"expected by {_utc(when)}"
                details = {
                    **reason.details,
                    "node": reservation.node,
                    "expected_at": None if when == INF else when,
                }
                text = f"{reason.text}; next to start: GPUs on {reservation.node} are held for it"
                why = Wait(WAIT_RESERVED, f"{text}, {eta}", details)
                self.wait(task, self.reclaim_note(task, why), in_line=True)
                return None
        self.blocked_shapes[shape] = reason
        self.wait(task, self.reclaim_note(task, reason), in_line=True)
        return reason, True

    def reserved_for(self, task: PendingView) -> tuple[tuple[bool, ...], frozenset[int]]:
        """``reservations_for``, asked once per timeout: it depends on the task's timeout alone,
        and reservations are only ever added, so asked again with as many, the answer stands."""
        key = (task.timeout_s, len(self.reservations))
        known = self.reserved.get(key)
        if known is None:
            known = self.reserved[key] = self.reservations_for(task)
        return known

    def reservations_for(self, task: PendingView) -> tuple[tuple[bool, ...], frozenset[int]]:
        """Which reservations let the task use their GPUs (it ends before they are needed),
        and the GPUs the others hold."""
        allowed = tuple(r.allows(task, self.now) for r in self.reservations)
        held = frozenset().union(
            *(r.gpu_ids for r, ok in zip(self.reservations, allowed, strict=True) if not ok)
        )
        return allowed, held

    def place(self, task: PendingView, placement: Placement) -> None:
        self.changes += 1
        self.capacity.take(placement)
        self.books.charge(task.tenant, task.task_class, placement.gpus, placement.exclusive)
        self.lenders.clear()  # what each class holds changed
        if task.queue:
            self.busy_queues[(task.tenant, task.queue)] = task.id
        self.decision.placements.append(placement)

    def wait(self, task: PendingView, why: Wait, in_line: bool = False) -> None:
        self.decision.waits[task.id] = why
        if in_line:
            self.decision.line.append(task.id)
            # Past the starvation limit it goes to the front of the line: look again then.
            self.wake(task.submitted_at + self.settings.starvation_after_s)

    # -- quotas --

    def quota_problem(self, task: PendingView, placement: Placement | None) -> Wait | None:
        view = self.tenant(task.tenant)
        if view.limits == NO_LIMITS and not view.pool_limits:
            return None
        extra = _request(task, placement, self.typical_gpu_mb)
        problem = _quota_problem(task.tenant, view.limits, self.books.tenant[task.tenant], extra)
        if problem or not view.pool_limits:
            return problem
        pools = {task.pool} if task.pool else set(view.pool_limits)
        for pool in pools:
            limits = view.pool_limits.get(pool)
            if limits is None:
                continue
            used = self.books.tenant_pool[(task.tenant, pool)]
            problem = _quota_problem(task.tenant, limits, used, extra, pool)
            if problem:
                return problem
        return None

    def trim_to_quota(self, task: PendingView, placement: Placement) -> Placement | None:
        """An elastic task takes only as many GPUs as its tenant's quota leaves."""
        gpus = placement.gpus
        while len(gpus) >= task.gpus_min:
            candidate = Placement(placement.task_id, placement.node, gpus, placement.exclusive)
            if self.quota_problem(task, candidate) is None:
                return candidate
            gpus = gpus[:-1]
        return None

    # -- reasons --

    def capacity_reason(self, task: PendingView) -> Wait:
        kind = task.gpu_type or "GPU"
        if task.exclusive:
            what = f"{task.gpus_min} x {kind}"
            if task.gpus_max > task.gpus_min:
                what = f"{task.gpus_min}-{task.gpus_max} x {kind}"
        else:
            what = f"{task.gpus_min} x {kind} with {_gib(task.gpu_memory_mb or 0)} free"
        where = (
            f" on node {task.node}" if task.node else (" on one node" if task.gpus_min > 1 else "")
        )
        if task.pool:
            where += f" in pool {task.pool}"
        free = self.capacity.largest_fit(task)
        noun = "idle" if task.exclusive else "with enough memory"
        details = {
            "gpus": task.gpus_min,
            "gpu_type": task.gpu_type or None,
            "gpu_memory_mb": task.gpu_memory_mb,
            "node": task.node or None,
            "pool": task.pool or None,
            "fitting_now": free,
        }
        return Wait(WAIT_CAPACITY, f"needs {what}{where}; {free} {noun} now", details)

    # -- successors --

    def nominate(self, eligible: list[PendingView]) -> list[Successor]:
        """The tasks left waiting for GPUs, in the order this policy would start them as GPUs
        free up, each with the GPUs it may take: at most ``SUCCESSORS_PER_GPU`` per schedulable
        GPU, and ``SUCCESSORS_MAX`` in all.

        The order is the pass's own (``ordered``: starving first, priority, fair share, age),
        with each successor charged to its tenant as if it had started, so quotas hold however
        many of them start before the next pass and fair share turns as they do. No successor
        may take a GPU held for a blocked task (a backfill reservation, a preemption's victims)
        but its own. Called last: it charges the books. Nothing is nominated while a class may
        take back borrowed GPUs (that order is the lenders' and changes with every placement),
        and the list ends at the first task only a pass can place (an elastic or a shared one):
        none behind it may overtake it."""
        if self.entitled:
            return []
        waits = self.decision.waits
        for_gpus = (WAIT_CAPACITY, WAIT_RESERVED)
        waiting = [t for t in eligible if t.id in waits and waits[t.id].code in for_gpus]
        order = self.ordered(waiting)
        first = next(order, None)
        held: dict[int, int] = {}  # GPU id -> the task it is held for
        for reservation in self.reservations:
            # The first successor takes the first GPU it may take that frees up: held for it
            # alone, one GPU would only stand idle once it has started elsewhere.
            if first is not None and reservation.task_id == first.id and first.gpus_max == 1:
                continue
            held.update(dict.fromkeys(reservation.gpu_ids, reservation.task_id))
        holders = set(held.values())
        # What a task may take depends on its constraints and size, and on whether it holds a
        # reservation: worked out once per kind (256 successors on 256 GPUs took 15 ms apart).
        kinds: dict[tuple, tuple[tuple[int, ...], tuple[tuple[int, int], ...]]] = {}
        successors: list[Successor] = []
        limit = min(SUCCESSORS_PER_GPU * len(self.capacity.gpus), SUCCESSORS_MAX)
        for task in itertools.chain([first] if first is not None else [], order):
            if len(successors) >= limit:
                break
            if not task.exclusive or task.gpus_min != task.gpus_max or not task.gpus_min:
                break
            view = self.tenant(task.tenant)
            if view.pool_limits or self.quota_problem(task, None):
                continue  # pool quotas depend on where it lands: a pass decides
            holder = task.id if task.id in holders else None
            key = (task.node, task.pool, task.gpu_type, task.gpus_min, holder)
            kind = kinds.get(key)
            if kind is None:
                by_node = [[g for g in matching
                            if not g.foreign_mb and held.get(g.id, task.id) == task.id]
                           for _, matching in self.capacity.candidates(task)]  # fmt: skip
                usable = [gpus for gpus in by_node if len(gpus) >= task.gpus_min]
                ids = tuple(g.id for gpus in usable for g in gpus)
                some = (
                    tuple((g.id, g.memory_mb) for g in usable[0][: task.gpus_min]) if usable else ()
                )
                kind = kinds[key] = (ids, some)
            ids, some = kind
            if not ids:
                continue
            successors.append(Successor(task.id, task.gpus_min, ids, view.limits != NO_LIMITS))
            self.books.charge(task.tenant, task.task_class, some, True)
        return successors

    # -- backfill reservation --

    def reserve(self, task: PendingView) -> Reservation | None:
        """Hold the GPUs that free up soonest for ``task`` (the first one blocked), on one node.

        A task with a timeout frees its GPUs by then. For one without, nothing is promised, but
        to choose *where* to wait, a task that has run for t is guessed to run about t more
        (old jobs tend to be long ones), so a big task does not queue behind a week-long job.
        """
        options = self.reservation_options(task)
        if not options:
            return None
        _, node, gpu_ids, start = min(options)
        return Reservation(task.id, frozenset(gpu_ids), start, node)

    def reservation_options(self, task: PendingView) -> list[tuple[tuple, str, list[int], float]]:
        """Per candidate node: (rank, node, the GPUs to hold, promised start)."""
        free_at: dict[int, float] = {}  # promised: backfill may rely on it
        guess_at: dict[int, float] = {}  # estimated: only ranks the candidates
        for running in self.snap.running:
            if running.stopping or running.id in self.removed:
                end = guess = self.now
            else:
                end = running.expected_end
                guess = end if end != INF else self.now + (self.now - running.started_at)
            for gpu_id, _ in running.gpus:
                free_at[gpu_id] = max(free_at.get(gpu_id, self.now), end)
                guess_at[gpu_id] = max(guess_at.get(gpu_id, self.now), guess)
        options = []
        need = task.gpu_memory_mb or 0
        for node, matching in self.capacity.candidates(task):
            usable = [g for g in matching if task.exclusive or g.memory_mb - g.foreign_mb >= need]
            if len(usable) < task.gpus_min:
                continue
            ranked = sorted(usable, key=lambda g: (guess_at.get(g.id, self.now), g.id))
            chosen = ranked[: task.gpus_min]
            start = max(free_at.get(g.id, self.now) for g in chosen)
            rank = (max(guess_at.get(g.id, self.now) for g in chosen), start, node)
            options.append((rank, node, [g.id for g in chosen], start))
        return options

    # -- preemption --

    def may_preempt(self, task: PendingView, victim: RunningView, reclaiming: bool) -> str:
        """Why ``victim`` may be stopped for ``task``: ``PREEMPT`` (the usual rules),
        ``RECLAIM`` (its class borrowed what ``task``'s class takes back; ``try_preempt``
        takes no more than was borrowed) or "" (it may not)."""
        if self.preemptible_for(task, victim):
            return PREEMPT
        if reclaiming and victim.task_class != task.task_class:
            return RECLAIM
        return ""

    def preemptible_for(self, task: PendingView, victim: RunningView) -> bool:
        if not victim.preemptible or victim.task_class == ONLINE:
            return False
        if (
            victim.task_class != task.task_class
            and victim.submitted_at is not None
            and victim.started_at - victim.submitted_at >= self.settings.reclaim_after_s
            and self.borrowed(victim.task_class) <= 1e-9
        ):
            # It started by its class's right to its guarantee, which it does not exceed:
            # evicting it across classes would only start the reclaim over again.
            return False
        if (
            victim.submitted_at is not None
            and victim.started_at - victim.submitted_at >= self.settings.starvation_after_s
        ):
            return False  # it waited its turn past the starvation limit: let it run
        if self.now - victim.started_at > self.settings.preempt_max_runtime_s:
            return False
        if victim.gpu_count > max(1, task.gpus_min):
            return False  # a big task evicted for a smaller one struggles to come back
        if victim.priority < task.priority:
            return True
        return (
            task.task_class == ONLINE
            and victim.task_class == BATCH
            and self.under_guarantee(ONLINE, task)
        )

    # -- class guarantees --

    def share_of(self, running: RunningView) -> float:
        """The GPUs a running task holds, a shared card counting as its share."""
        return sum(
            card_share(exclusive=running.exclusive, memory_mb=mb,
                       card_memory_mb=self.books.gpu_memory.get(gpu_id, mb))
            for gpu_id, mb in running.gpus
        )  # fmt: skip

    def held(self, task_class: str) -> float:
        """The GPUs a class holds and keeps: placed this pass included, leaving excluded."""
        return self.books.by_class[task_class] - self.leaving[task_class]

    def borrowed(self, task_class: str) -> float:
        """What a class holds beyond its guarantee: all that may be taken from it."""
        return max(0.0, self.held(task_class) - self.guarantee.get(task_class, 0))

    def lendable(self, task_class: str) -> float:
        """What a reclaim may take from a class: what it borrowed, rounded up to whole GPUs.

        A task holds whole cards or a share of one, and cannot be evicted by halves: with
        exactly what was borrowed as the limit, a class 0.9 GPUs over its guarantee could give
        up only shared-card tasks, however long they have run, while newer whole-card ones are
        spared (on the trace, one 11-day service was evicted five times that way before the
        borrower rule; README). Rounded up, it keeps more than its guarantee less one GPU, and
        the reclaim evicts what loses least."""
        extra = self.borrowed(task_class)
        return float(math.ceil(extra - 1e-9)) if extra > 1e-9 else 0.0

    def under_guarantee(self, task_class: str, task: PendingView) -> bool:
        need = task.gpus_min  # whole cards; a shared task counts its share of a typical one
        if task.gpu_memory_mb is not None:
            need *= task.gpu_memory_mb / (self.typical_gpu_mb or 1)
        return self.held(task_class) + need <= self.guarantee.get(task_class, 0) + 1e-9

    def reclaim_at(self, task: PendingView) -> float:
        """When the task may take back borrowed GPUs: ``reclaim_after_s`` after it began to
        wait (its submission, or the end of its retry backoff)."""
        since = max(task.submitted_at, task.not_before or task.submitted_at)
        return since + self.settings.reclaim_after_s

    def lender(self, task: PendingView) -> bool:
        """Its class, with it, stays within its guarantee, and another class borrows."""
        key = (task.task_class, task.gpus_min, task.gpu_memory_mb)
        known = self.lenders.get(key)
        if known is None:
            borrows = any(
                self.borrowed(name) > 1e-9 for name in self.guarantee if name != task.task_class
            )
            known = self.lenders[key] = borrows and self.under_guarantee(task.task_class, task)
        return known

    def reclaiming(self, task: PendingView) -> bool:
        return self.lender(task) and task.id in self.entitled

    def defer(self, task: PendingView, claims: dict[str, int]) -> bool:
        """Whether a task that would borrow waits until the tasks that may reclaim have had
        their turn: GPUs freed for them (by a reclaim, or by tasks ending) must go to them, not
        back to the class that borrowed, or a reclaim would never end. Within a class the
        order stays as it was."""
        key = ("defer", task.task_class, task.gpus_min, task.gpu_memory_mb)
        known = self.lenders.get(key)
        if known is None:
            known = self.lenders[key] = self._defer(task, claims)
        return known

    def _defer(self, task: PendingView, claims: dict[str, int]) -> bool:
        if not any(
            count > 0 and self.held(name) < self.guarantee.get(name, 0) - 1e-9
            for name, count in claims.items()
            if name != task.task_class
        ):
            return False
        return not self.under_guarantee(task.task_class, task)

    def reclaim_note(self, task: PendingView, why: Wait) -> Wait:
        """A lender not yet allowed to reclaim: say from when it may, and look again then."""
        if not self.settings.preemption or not self.lender(task):
            return why
        at = self.reclaim_at(task)
        if at <= self.now:
            return why
        self.wake(at)
        guarantee = self.guarantee.get(task.task_class, 0)
        text = (
            f"{why.text}; {task.task_class} holds {_num(self.held(task.task_class))} of its "
            f"guaranteed {guarantee} GPUs: takes borrowed GPUs back from {_utc(at)}"
        )
        return Wait(why.code, text, {**why.details, "reclaim_at": at})

    def could_preempt(self, task: PendingView) -> bool:
        """Cheap test before the search: is any running task a possible victim?"""
        if self.reclaiming(task):
            return True
        if self.lowest_preemptible is None:
            return any(r.stopping for r in self.snap.running)
        return self.lowest_preemptible < task.priority or (
            task.task_class == ONLINE and self.under_guarantee(ONLINE, task)
        )

    def try_preempt(self, task: PendingView) -> bool:
        """Choose victims on one node that free enough for ``task`` at the least lost work."""
        by_node: dict[str, list[RunningView]] = defaultdict(list)
        reclaiming = self.reclaiming(task)
        # A task whose class would then hold more than its guarantee takes from the other
        # class only what that class borrowed, by priority as by reclaim: taking more would
        # make the other class a lender that reclaims it back.
        borrowing = not self.under_guarantee(task.task_class, task)
        reclaims: set[int] = set()  # victims allowed only as borrowed capacity
        for running in self.snap.running:
            if running.id in self.removed:
                continue
            if running.stopping:
                by_node[running.node].append(running)
                continue
            why = self.may_preempt(task, running, reclaiming)
            if why:
                by_node[running.node].append(running)
                if why == RECLAIM or (borrowing and running.task_class != task.task_class):
                    reclaims.add(running.id)
        best: tuple[float, str, list[RunningView], list] | None = None
        _, held = self.reserved_for(task)
        for node, members in self.capacity.candidates(task):
            # GPUs held for an earlier task are not this task's to free.
            matching = [g for g in members if g.id not in held]
            candidates = by_node.get(node)
            if not candidates:
                continue
            candidates.sort(key=lambda r: (self.lost_work(r), r.id))
            chosen: list[RunningView] = []
            # Reclaimed from another class: only what it borrowed (see ``lendable``).
            lendable = {name: self.lendable(name) for name in self.guarantee}
            for victim in candidates:
                if victim.id in reclaims:
                    cost = self.share_of(victim)
                    if cost > lendable.get(victim.task_class, INF) + 1e-9:
                        continue
                    lendable[victim.task_class] = lendable.get(victim.task_class, INF) - cost
                chosen.append(victim)
                if self.fits_without(task, matching, chosen):
                    break
            else:
                continue
            chosen = self.prune(task, matching, chosen)
            cost = sum(self.lost_work(v) for v in chosen)
            if best is None or (cost, node) < (best[0], best[1]):
                best = (cost, node, chosen, matching)
        if best is None:
            return False
        cost, node, victims, matching = best
        stopping = [v for v in victims if v.stopping]
        fresh = [v for v in victims if not v.stopping]
        self.changes += 1
        for victim in victims:
            self.removed.add(victim.id)
        for victim in fresh:
            self.leaving[victim.task_class] += self.share_of(victim)
            self.lenders.clear()
            reason = f"preempted for #{task.id} ({task.task_class}, priority {task.priority})"
            if victim.id in reclaims:
                reason += f": {victim.task_class} holds more than its guaranteed share"
            self.decision.preemptions.append(
                Preemption(task_id=victim.id, for_task_id=task.id, reason=reason)
            )
        count = len(fresh) + len(stopping)
        text = f"waiting for {count} preempted task(s) to stop on {node}"
        details = {"node": node, "victims": sorted(v.id for v in victims)}
        self.wait(task, Wait(WAIT_PREEMPTING, text, details), in_line=True)
        # What the victims free, and the idle GPUs it needs beside them, are this task's until
        # it starts: nobody later in this pass may take them.
        held = frozenset(self.usable_without(task, matching, victims))
        self.reservations.append(Reservation(task.id, held, self.now, node))
        return True

    def lost_work(self, running: RunningView) -> float:
        if running.stopping:
            return 0.0
        return max(0.0, self.now - running.started_at) * max(1, running.gpu_count)

    def fits_without(self, task: PendingView, matching, victims: list[RunningView]) -> bool:
        return len(self.usable_without(task, matching, victims)) >= task.gpus_min

    def usable_without(self, task: PendingView, matching, victims: list[RunningView]) -> list[int]:
        """The GPUs the task could use once ``victims`` have stopped."""
        freed_mb: dict[int, int] = defaultdict(int)
        freed_holders: dict[int, int] = defaultdict(int)
        freed_exclusive: set[int] = set()
        for victim in victims:
            for gpu_id, memory_mb in victim.gpus:
                freed_mb[gpu_id] += memory_mb
                freed_holders[gpu_id] += 1
                if victim.exclusive:
                    freed_exclusive.add(gpu_id)
        usable = []
        for gpu in matching:
            holders = gpu.holders - freed_holders[gpu.id]
            exclusive = gpu.exclusive and gpu.id not in freed_exclusive
            if task.exclusive:
                ok = holders == 0 and gpu.foreign_mb == 0
            else:
                free = gpu.memory_mb - gpu.foreign_mb if gpu.id in freed_exclusive else (
                    gpu.free_mb + freed_mb[gpu.id])  # fmt: skip
                ok = not exclusive and free >= (task.gpu_memory_mb or 0)
            if ok:
                usable.append(gpu.id)
        return usable

    def prune(self, task: PendingView, matching, victims: list[RunningView]) -> list[RunningView]:
        """Drop victims that turned out unnecessary, the costliest first."""
        kept = list(victims)
        for victim in sorted(victims, key=self.lost_work, reverse=True):
            trial = [v for v in kept if v is not victim]
            if self.fits_without(task, matching, trial):
                kept = trial
        return kept


def _guarantees(total: int, shares: dict[str, float]) -> dict[str, int]:
    """Whole-GPU guarantees by largest remainder, so rounding never strands a GPU."""
    weight = sum(shares.values()) or 1.0
    exact = {name: total * share / weight for name, share in shares.items()}
    result = {name: int(value) for name, value in exact.items()}
    leftover = total - sum(result.values())
    for name in sorted(exact, key=lambda n: (-(exact[n] - result[n]), n))[:leftover]:
        result[name] += 1
    return result


def schedule(snapshot: Snapshot, settings: PolicySettings | None = None) -> Decision:
    return Pass(snapshot, settings or PolicySettings()).run()


def schedule_fifo(snapshot: Snapshot) -> Decision:
    """Strict first-come-first-served: the first task that does not fit blocks all behind it.

    The baseline for benchmarks: same placement, no priorities, fair share, backfill or
    preemption.
    """
    capacity = Capacity(snapshot.gpus)
    decision = Decision()
    blocker: int | None = None
    for task in sorted(snapshot.pending, key=lambda t: (t.submitted_at, t.id)):
        if blocker is not None:
            decision.waiting[task.id] = f"behind #{blocker} (strict FIFO)"
            continue
        placement = None
        if task.not_before is None or task.not_before <= snapshot.now:
            placement = capacity.find(task)
        if placement is None:
            blocker = task.id
            decision.waiting[task.id] = "first in line (strict FIFO): waiting for GPUs"
            continue
        capacity.take(placement)
        decision.placements.append(placement)
    return decision


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _gib(mb: int) -> str:
    return f"{mb / 1024:.0f} GiB" if mb % 1024 == 0 else f"{mb / 1024:.1f} GiB"


def _num(value: float) -> str:
    return str(int(value)) if abs(value - round(value)) < 1e-9 else f"{value:.2f}"
