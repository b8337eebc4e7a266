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
import math
from collections import defaultdict
from collections.abc import Container
from operator import attrgetter

from scheduling.policy.books import (
    INF,
    NO_LIMITS,
    SUCCESSORS_MAX,
    SUCCESSORS_PER_GPU,
    Books,
    Reservation,
    Usage,
    format_gib,
    format_utc,
    quota_problem_of,
    request_usage,
    within,
)
from scheduling.policy.capacity import Capacity
from scheduling.policy.model import (
    ONLINE,
    WAIT_BACKOFF,
    WAIT_CAPACITY,
    WAIT_QUEUE,
    WAIT_QUOTA,
    WAIT_RESERVED,
    Decision,
    PendingView,
    Placement,
    PolicySettings,
    Snapshot,
    Successor,
    TenantView,
    Wait,
)
from scheduling.policy.preemption import Preempting


class Pass(Preempting):
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
        self.promised = self.charge_promises(snapshot)
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
                    details = {"queue": task.queue, "behind": first, "running": True}
                    self.wait(task, Wait(WAIT_QUEUE, text, details))
                    continue
                if key in queue_heads:
                    first = queue_heads[key]
                    text = f"queue {task.queue}: waiting behind #{first}"
                    details = {"queue": task.queue, "behind": first, "running": False}
                    self.wait(task, Wait(WAIT_QUEUE, text, details))
                    continue
                queue_heads[key] = task.id
            if task.blocked:
                self.wait(task, Wait(task.blocked_code, task.blocked))
                continue
            if task.not_before is not None and task.not_before > self.now:
                left = int(task.not_before - self.now)
                details = {"not_before": task.not_before, "seconds_left": left}
                # A time, not a countdown: the text stays true until the pass booked for then.
                text = f"retry backoff until {format_utc(task.not_before)}"
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

    def ordered(self, tasks: list[PendingView], dropped: Container[str] = frozenset()):
        """Yield tasks by priority, then fair share (re-evaluated after each pick), then age.

        Tasks that waited past ``starvation_after_s`` come first of all, oldest first. A tenant
        the caller puts in ``dropped`` meanwhile gets no more turns (its starving tasks still
        come first).
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
            yield from self.turns(by_priority[priority], dropped)

    def turns(self, by_tenant: dict[str, list[PendingView]], dropped: Container[str] = frozenset()):
        """One priority's tasks, the tenant furthest below its fair share first (re-evaluated
        after each pick), each tenant's in submission order; none more of a tenant once it is
        in ``dropped``."""
        queues = {name: iter(items) for name, items in by_tenant.items()}
        heads = {name: next(it) for name, it in queues.items()}
        heap = [(self.fair_key(n), h.submitted_at, h.id, n) for n, h in heads.items()]
        heapq.heapify(heap)
        while heap:
            key, _, _, name = heapq.heappop(heap)
            if name in dropped:
                continue
            current = self.fair_key(name)
            if current > key + 1e-12:  # its share grew since it was queued: re-queue
                head = heads[name]
                heapq.heappush(heap, (current, head.submitted_at, head.id, name))
                continue
            head = heads[name]
            # The tenant keeps the turn while it stays ahead of every other head: the same
            # order as pushing each next task and popping again, without the heap work per
            # task (the pending tasks of a few tenants are long runs of one).
            while True:
                yield head
                if name in dropped:
                    break
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
                self.hold_quota(task, reservation)
                self.changes += 1
                when = reservation.start
                # A time, not a countdown frozen at this pass.
                eta = "when they free up" if when == INF else f"expected by {format_utc(when)}"
                details = {
                    **reason.details,
                    "required_node": reason.details["node"],  # "node" is where it is held
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

    def charge_promises(self, snapshot: Snapshot) -> dict[int, Usage]:
        """Charge the books for the last list's charged successors still pending (``Promise``):
        each may start while this pass runs, so it counts as started, once, whether this pass
        places it, lists it again or leaves it waiting. Returns what each added to its
        tenant's usage, by task id (its own quota check leaves that out: ``quota_problem``)."""
        views = {task.id: task for task in snapshot.pending}
        charged: dict[int, Usage] = {}
        for promise in snapshot.promised:
            task = views.get(promise.task_id)
            if task is None:
                continue  # placed before the snapshot (it runs, and counts), or gone
            charged[task.id] = self.charge_held(task, promise.gpu_ids)
        return charged

    def charge_held(self, task: PendingView, gpu_ids, *, in_class: bool = True) -> Usage:
        """Charge the books for ``task`` holding ``gpu_ids`` (whole, or its memory of each)."""
        shared = task.gpu_memory_mb or 0
        gpus = tuple((g, shared or self.books.gpu_memory.get(g, 0)) for g in gpu_ids)
        return self.books.charge(task.tenant, task.task_class, gpus, not shared, in_class=in_class)

    def hold_quota(self, task: PendingView, reservation: Reservation) -> None:
        """Count the task that GPUs are held for as started, in its tenant's quotas too, as a
        promise is (``promised``): its tenant's later tasks then cannot take the room it needs
        (they wait for their quota, listed as swaps). Without this a pass held a free GPU for
        a two-GPU task whose tenant's one-GPU tasks, placed after it, filled its quota: the GPU
        stood idle for a task that could not start, and the next pass did the same."""
        if task.id not in self.promised:  # a promise is charged already
            # Its tenant's, not its class's: a class's guarantee counts what runs (``lenders``).
            self.promised[task.id] = self.charge_held(
                task, sorted(reservation.gpu_ids), in_class=False
            )

    def place(self, task: PendingView, placement: Placement) -> None:
        self.changes += 1
        self.capacity.take(placement)
        if task.id not in self.promised:  # a promise is charged already
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
        extra = request_usage(task, placement, self.typical_gpu_mb)
        used = self.books.tenant[task.tenant]
        if (promised := self.promised.get(task.id)) is not None:
            used = used.less(promised)  # counted already as if started: not twice
        problem = quota_problem_of(task.tenant, view.limits, used, extra)
        if problem or not view.pool_limits:
            return problem
        pools = {task.pool} if task.pool else set(view.pool_limits)
        for pool in pools:
            limits = view.pool_limits.get(pool)
            if limits is None:
                continue
            used = self.books.tenant_pool[(task.tenant, pool)]
            problem = quota_problem_of(task.tenant, limits, used, extra, pool)
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
            what = f"{task.gpus_min} x {kind} with {format_gib(task.gpu_memory_mb or 0)} free"
        where = (
            f" on node {task.node}" if task.node else (" on one node" if task.gpus_min > 1 else "")
        )
        if task.pool:
            where += f" in pool {task.pool}"
        free = self.capacity.largest_fit(task)
        noun = "idle" if task.exclusive else "with enough memory"
        details = {
            "gpus": task.gpus_min,
            "gpus_max": task.gpus_max,
            "exclusive": task.exclusive,
            "gpu_type": task.gpu_type or None,
            "gpu_memory_mb": task.gpu_memory_mb,
            "node": task.node or None,
            "pool": task.pool or None,
            "fitting_now": free,
        }
        return Wait(WAIT_CAPACITY, f"needs {what}{where}; {free} {noun} now", details)

    # -- successors --

    def nominate(self, eligible: list[PendingView]) -> list[Successor]:
        """The tasks left waiting for GPUs or quota, in the order this policy would start them
        as GPUs free up, each with the GPUs it may take: at most ``SUCCESSORS_PER_GPU`` per
        schedulable GPU, and ``SUCCESSORS_MAX`` in all.

        The order is the pass's own (``ordered``: starving first, priority, fair share, age), with
        each successor charged to its tenant as if it had started, so quotas hold however many of
        them start before the next pass and fair share turns as they do. A task whose tenant has no
        room left in its quotas (or has quotas per pool, which depend on where a task lands) is
        listed as a ``swap``: it may take only GPUs its own tenant's ended tasks free (one ended
        task for one started where its quotas count running tasks: ``one_for_one``), which leaves
        the tenant holding what it held, so it is not charged; at most ``SUCCESSORS_PER_GPU`` per
        GPU its tenant holds, and none while it holds more than its quotas allow. No successor may
        take a GPU held for a blocked task (a backfill reservation, a preemption's victims) but its
        own. Called last: it charges the books. Nothing is nominated while a class may take back
        borrowed GPUs (that order is the lenders' and changes with every placement), and the list
        ends at the first task only a pass can place (an elastic one): none behind it may overtake
        it (of its own tenant only, when it waits for its quota). A task that shares GPUs by memory
        is listed to take GPUs freed whole: a pass would have placed it already on a card with that
        much memory to spare, had there been one."""
        if self.entitled:
            return []
        waits = self.decision.waits
        for_gpus = (WAIT_CAPACITY, WAIT_RESERVED)
        waiting: list[PendingView] = []
        quota_bound: set[int] = set()
        for task in eligible:
            why = waits.get(task.id)
            if why is None:
                continue
            if why.code == WAIT_QUOTA:
                quota_bound.add(task.id)
            elif why.code not in for_gpus:
                continue
            waiting.append(task)
        # The first task waiting for GPUs alone, in this order, is the one the reservation
        # exemption below is about.
        first = next(self.ordered([t for t in waiting if t.id not in quota_bound]), None)
        held: dict[int, int] = {}  # GPU id -> the task it is held for
        for reservation in self.reservations:
            # The first successor takes the first GPU it may take that frees up: held for it
            # alone, one GPU would only stand idle once it has started elsewhere.
            if first is not None and reservation.task_id == first.id and first.gpus_max == 1:
                continue
            held.update(dict.fromkeys(reservation.gpu_ids, reservation.task_id))
        holders = set(held.values())
        # What a task may take depends on its constraints and size, and on whether it holds a
        # reservation: worked out once per kind, not once per successor.
        kinds: dict[tuple, tuple[tuple[int, ...], tuple[tuple[int, int], ...]]] = {}
        successors: list[Successor] = []
        limit = min(SUCCESSORS_PER_GPU * len(self.capacity.gpus), SUCCESSORS_MAX)
        rooms: dict[str, int] = {}  # tenant -> how many swaps it may have
        swaps: dict[str, int] = defaultdict(int)
        dropped: set[str] = set()  # tenants none of whose later tasks may be listed
        for task in self.ordered(waiting, dropped):
            if len(successors) >= limit:
                break
            if task.tenant in dropped:
                continue  # a starving task of such a tenant
            bound = task.id in quota_bound
            if task.gpus_min != task.gpus_max or not task.gpus_min:
                if not bound:
                    break
                # A pass places it once its tenant's tasks end: none of theirs overtakes it.
                dropped.add(task.tenant)
                continue
            shared = task.gpu_memory_mb or 0  # it shares a freed GPU from then on
            view = self.tenant(task.tenant)
            swap = bound or bool(view.pool_limits) or self.quota_problem(task, None) is not None
            if swap:
                room = rooms.get(task.tenant)
                if room is None:
                    room = rooms[task.tenant] = self.swap_room(task.tenant)
                if swaps[task.tenant] >= room:
                    dropped.add(task.tenant)
                    continue
            holder = task.id if task.id in holders else None
            key = (task.node, task.pool, task.gpu_type, task.gpus_min, shared, holder)
            kind = kinds.get(key)
            if kind is None:
                by_node = [[g for g in matching
                            if not g.foreign_mb and held.get(g.id, task.id) == task.id
                            and g.memory_mb >= shared]
                           for _, matching in self.capacity.candidates(task)]  # fmt: skip
                usable = [gpus for gpus in by_node if len(gpus) >= task.gpus_min]
                ids = tuple(g.id for gpus in usable for g in gpus)
                some = (
                    tuple((g.id, shared or g.memory_mb) for g in usable[0][: task.gpus_min])
                    if usable
                    else ()
                )
                kind = kinds[key] = (ids, some)
            ids, some = kind
            if not ids:
                continue
            fenced = not swap and view.limits != NO_LIMITS
            one_for_one = swap and view.counts_tasks
            successors.append(
                Successor(
                    task.id, task.gpus_min, ids, fenced, swap, task.tenant, shared, one_for_one
                )
            )
            if swap:
                swaps[task.tenant] += 1
            elif task.id not in self.promised:  # a promise is charged already
                self.books.charge(task.tenant, task.task_class, some, not shared)
        return successors

    def swap_room(self, name: str) -> int:
        """How many of a tenant's tasks may be listed as swaps (``nominate``): enough for the
        GPUs it holds (the pass's placements and the successors charged so far included) to
        turn over ``SUCCESSORS_PER_GPU`` times, and none while it holds more than its quotas
        allow (a quota lowered below its use: only ends bring it back under)."""
        view = self.tenant(name)
        used = self.books.tenant[name]
        if not within(view.limits, used):
            return 0
        for pool, limits in view.pool_limits.items():
            if not within(limits, self.books.tenant_pool[(name, pool)]):
                return 0
        return SUCCESSORS_PER_GPU * math.ceil(used.gpus - 1e-9)

    # -- backfill reservation --


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
