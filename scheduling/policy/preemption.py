"""Making room for a blocked task: reservations of the GPUs that free up soonest, and
preemption under the class guarantees (lending, borrowing and reclaiming; ``core`` explains the
rules). A mixin of ``core.Pass``: it uses the pass's state and books."""

from __future__ import annotations

import math
from collections import defaultdict

from scheduling.policy.books import (
    INF,
    PREEMPT,
    RECLAIM,
    Reservation,
    format_num,
    format_utc,
)
from scheduling.policy.model import (
    BATCH,
    ONLINE,
    WAIT_PREEMPTING,
    PendingView,
    Preemption,
    RunningView,
    Wait,
    card_share,
)


class Preempting:
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
        spared. Rounded up, it keeps more than its guarantee less one GPU, and the reclaim
        evicts what loses least."""
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
        held = self.held(task.task_class)
        text = (
            f"{why.text}; {task.task_class} holds {format_num(held)} of its "
            f"guaranteed {guarantee} GPUs: takes borrowed GPUs back from {format_utc(at)}"
        )
        details = {**why.details, "reclaim_at": at, "task_class": task.task_class,
                   "class_holds": held, "class_guarantee": guarantee}  # fmt: skip
        return Wait(why.code, text, details)

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
            details = {"task_class": task.task_class, "priority": task.priority, "reclaimed": None}
            if victim.id in reclaims:
                reason += f": {victim.task_class} holds more than its guaranteed share"
                details["reclaimed"] = victim.task_class
            self.decision.preemptions.append(
                Preemption(task_id=victim.id, for_task_id=task.id, reason=reason, details=details)
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
