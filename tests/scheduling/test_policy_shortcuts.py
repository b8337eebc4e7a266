"""The policy's shortcuts decide exactly what the plain search decides.

A pass answers a task like the one before it (same tenant, request and standing, nothing
changed since) without searching again, keeps a tenant's turn without heap work while it
stays ahead, and keeps the GPUs matching each node, pool and type asked for (and those other
tasks' reservations hold from each timeout) instead of gathering them for each search. They
are only worth having if no decision changes: this compares them with the plain search on
synthetic snapshots of every kind the policy benchmark builds.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import pytest

from bench.bench_policy import NOW, build_snapshot
from scheduling.policy import PolicySettings, Snapshot
from scheduling.policy.capacity import Capacity
from scheduling.policy.core import Pass


class CountingPass(Pass):
    """The pass under test, counting the tasks it searched for (the rest reused an answer)."""

    searched = 0

    def decide(self, task):
        self.searched += 1
        return super().decide(task)


class PlainCapacity(Capacity):
    """Every node's GPUs filtered for each search."""

    candidates = Capacity.matching


class PlainPass(Pass):
    """The same pass with every task searched for, the tenants' turns taken from the heap, the
    matching GPUs filtered and the reservations' GPUs gathered for each search."""

    def __init__(self, snapshot, settings) -> None:
        super().__init__(snapshot, settings)
        self.capacity = PlainCapacity(snapshot.gpus)

    reserved_for = Pass.reservations_for

    def consider(self, task) -> None:
        self.decide(task)

    def turns(self, by_tenant, dropped=frozenset()):
        queues = {name: iter(items) for name, items in by_tenant.items()}
        heads = {name: next(it) for name, it in queues.items()}
        heap = [(self.fair_key(n), h.submitted_at, h.id, n) for n, h in heads.items()]
        heapq.heapify(heap)
        while heap:
            key, _, _, name = heapq.heappop(heap)
            if name in dropped:
                continue
            current = self.fair_key(name)
            if current > key + 1e-12:
                head = heads[name]
                heapq.heappush(heap, (current, head.submitted_at, head.id, name))
                continue
            yield heads[name]
            following = next(queues[name], None)
            if following is not None:
                heads[name] = following
                item = (self.fair_key(name), following.submitted_at, following.id, name)
                heapq.heappush(heap, item)


def decided(decision) -> tuple:
    return (
        decision.placements,
        decision.preemptions,
        {task_id: (w.code, w.text, w.details) for task_id, w in decision.waits.items()},
        decision.line,
        decision.wake_at,
    )


SETTINGS = {
    "defaults": PolicySettings(),
    "reclaim soon": PolicySettings(reclaim_after_s=600, starvation_after_s=1800),
    "no backfill or preemption": PolicySettings(backfill=False, preemption=False),
    "online-heavy shares": PolicySettings(class_shares={"online": 0.7, "batch": 0.3}),
}


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize(
    ("pending", "gpu_count", "half_busy"),
    [(200, 16, False), (200, 16, True), (1_000, 64, True), (1_500, 32, False)],
)
def test_the_shortcuts_change_no_decision(pending, gpu_count, half_busy, settings):
    snapshot = build_snapshot(pending, gpu_count, half_busy=half_busy)
    counting = CountingPass(snapshot, settings)
    fast = counting.run()
    plain = PlainPass(snapshot, settings).run()
    assert decided(fast) == decided(plain)
    assert fast.placements or fast.waits  # the comparison saw a pass that did something
    assert counting.searched < len(snapshot.pending)  # and the shortcut answered some


def test_the_shortcuts_change_no_decision_for_tasks_that_waited_long():
    """Starving tasks (first in line) and tasks entitled to reclaim, mixed with fresh ones."""
    base = build_snapshot(1_000, 32, half_busy=True)
    aged = tuple(
        replace(task, submitted_at=NOW - (7200 + 37 * i if i % 3 == 0 else 10 * i))
        for i, task in enumerate(base.pending)
    )
    snapshot = Snapshot(now=NOW, gpus=base.gpus, running=base.running, pending=aged,
                        tenants=base.tenants)  # fmt: skip
    settings = PolicySettings(reclaim_after_s=3600)
    assert decided(Pass(snapshot, settings).run()) == decided(PlainPass(snapshot, settings).run())


def test_a_like_task_that_may_reclaim_is_not_given_the_answer_of_one_that_may_not():
    """Two batch tasks of one tenant asking the same: the first (older, but back from a retry
    backoff a moment ago) may not take back borrowed GPUs yet, the second may."""
    from tests.scheduling.test_policy import NOW, gpus, running, snap, task

    views = gpus(per_node=4)
    services = [running("web", [g], task_class="online", preemptible=False,
                        started_at=NOW - 9000, submitted_at=NOW - 9000) for g in views]  # fmt: skip
    backed_off = task("lab", submitted_at=NOW - 5000, not_before=NOW - 10)
    entitled = task("lab", submitted_at=NOW - 4000)
    snapshot = snap(views, [backed_off, entitled], services)
    # No backfill: the first would hold GPUs, and an answer that changed something is not reused.
    settings = PolicySettings(reclaim_after_s=3600, backfill=False)
    fast, plain = Pass(snapshot, settings).run(), PlainPass(snapshot, settings).run()
    assert decided(fast) == decided(plain)
    assert [p.for_task_id for p in fast.preemptions] == [entitled.id]


def test_the_kept_matching_gpus_change_no_decision_across_nodes_pools_and_types():
    """Tasks pinned to a node, a pool or a type, or to none, in one pass, on an estate of two
    pools and two GPU types: each search must see only the GPUs its constraints allow."""
    from scheduling.policy.model import GpuView, PendingView

    estate = [("a", "train", "rtx4090-24g"), ("b", "train", "a100-80g"), ("c", "serve", "a100-80g")]
    views = tuple(
        GpuView(id=10 * n + i, node=node, pool=pool, gpu_type=kind, memory_mb=81920)
        for n, (node, pool, kind) in enumerate(estate)
        for i in range(4)
    )
    asks = [{}, {"node": "b"}, {"pool": "serve"}, {"gpu_type": "rtx4090-24g"},
            {"pool": "train", "gpu_type": "a100-80g"}, {"node": "c", "pool": "train"}]  # fmt: skip
    pending = tuple(
        PendingView(id=i + 1, tenant=f"t{i % 3}", priority=50, task_class="batch",
                    submitted_at=NOW - 1000 + i, gpus_min=1 + i % 2, gpus_max=1 + i % 2,
                    gpu_memory_mb=None if i % 4 else 20480, **asks[i % len(asks)])
        for i in range(40)
    )  # fmt: skip
    snapshot = Snapshot(now=NOW, gpus=views, pending=pending)
    fast, plain = (
        Pass(snapshot, PolicySettings()).run(),
        PlainPass(snapshot, PolicySettings()).run(),
    )
    assert decided(fast) == decided(plain)
    placed = {p.task_id: p for p in fast.placements}
    by_id = {view.id: view for view in views}
    for task in pending:
        if task.id in placed:
            held = [by_id[gpu_id] for gpu_id, _ in placed[task.id].gpus]
            assert all(not task.node or g.node == task.node for g in held)
            assert all(not task.pool or g.pool == task.pool for g in held)
            assert all(not task.gpu_type or g.gpu_type == task.gpu_type for g in held)
    assert len(placed) > len(estate)  # tasks of several kinds were placed
    assert any(task.node == "c" and task.pool == "train" for task in pending)  # never fits
    assert not any(placed.get(t.id) for t in pending if t.node == "c" and t.pool == "train")
