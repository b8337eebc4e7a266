"""The pure policy core, one readable scenario per rule."""

from __future__ import annotations

import itertools
import time

from scheduling.policy import (
    BATCH,
    ONLINE,
    GpuView,
    Limits,
    PendingView,
    PolicySettings,
    RunningView,
    Snapshot,
    TenantView,
    occupied,
    schedule,
    schedule_fifo,
)
from scheduling.policy.model import wait_record

GIB = 1024
NOW = 10_000.0
_ids = itertools.count(1)


def gpus(nodes: int = 1, per_node: int = 4, memory_gib: int = 24, **kwargs) -> tuple[GpuView, ...]:
    return tuple(
        GpuView(
            id=n * 100 + i,
            node=f"node-{n}",
            pool=kwargs.get("pool", "default"),
            gpu_type=kwargs.get("gpu_type", "rtx4090-24g"),
            memory_mb=memory_gib * GIB,
        )
        for n in range(nodes)
        for i in range(per_node)
    )


def task(tenant: str = "vision", *, gpus: int | tuple[int, int] = 1, **kwargs) -> PendingView:
    low, high = gpus if isinstance(gpus, tuple) else (gpus, gpus)
    task_id = kwargs.pop("id", next(_ids))
    # Submitted a moment ago unless told otherwise: long waits change the order (starvation).
    fields = {"priority": 50, "task_class": BATCH, "submitted_at": NOW - 60 + task_id / 1000}
    fields |= kwargs
    return PendingView(id=task_id, tenant=tenant, gpus_min=low, gpus_max=high, **fields)


def running(
    tenant: str, gpu_list: list[GpuView], *, shared_mb: int | None = None, **kwargs
) -> RunningView:
    fields = {
        "priority": 50,
        "task_class": BATCH,
        "preemptible": True,
        "started_at": NOW - 100,
    } | kwargs
    reserved = tuple((g.id, shared_mb or g.memory_mb) for g in gpu_list)
    return RunningView(
        id=next(_ids),
        tenant=tenant,
        node=gpu_list[0].node,
        gpus=reserved,
        exclusive=shared_mb is None,
        **fields,
    )


def snap(gpu_views, pending=(), holders=(), tenants=None) -> Snapshot:
    return Snapshot(
        now=NOW,
        gpus=occupied(gpu_views, list(holders)),
        running=tuple(holders),
        pending=tuple(pending),
        tenants={t.name: t for t in (tenants or [])},
    )


def placed(decision) -> dict[int, tuple[int, ...]]:
    return {p.task_id: tuple(g for g, _ in p.gpus) for p in decision.placements}


# --- Placement -----------------------------------------------------------------------------------


def test_two_tenants_submitting_at_once_get_different_gpus():
    a, b = task("vision", submitted_at=NOW - 60 + 1.0), task("nlp", submitted_at=NOW - 60 + 1.0)
    decision = schedule(snap(gpus(per_node=2), [a, b]))
    assert set(placed(decision)) == {a.id, b.id}
    assert placed(decision)[a.id] != placed(decision)[b.id]


def test_a_multi_gpu_task_gets_all_its_gpus_on_one_node():
    cluster = gpus(nodes=2, per_node=4)
    # Node 0 has 2 idle GPUs, node 1 has 3: a 3-GPU task must go to node 1, never 2+1.
    holders = [running("other", [cluster[0], cluster[1]]), running("other", [cluster[4]])]
    t = task(gpus=3)
    decision = schedule(snap(cluster, [t], holders))
    assert {gid // 100 for gid in placed(decision)[t.id]} == {1}


def test_exclusive_tasks_never_share_and_shared_tasks_pack_best_fit():
    cluster = gpus(per_node=2)
    half = running("other", [cluster[0]], shared_mb=12 * GIB)
    small = task(gpu_memory_mb=10 * GIB)
    whole = task()
    decision = schedule(snap(cluster, [small, whole], [half]))
    # The shared task joins the half-used card, leaving the idle card whole for the other.
    assert placed(decision)[small.id] == (cluster[0].id,)
    assert placed(decision)[whole.id] == (cluster[1].id,)


def test_a_shared_task_never_joins_an_exclusive_one():
    cluster = gpus(per_node=1)
    holder = running("other", [cluster[0]])
    t = task(gpu_memory_mb=1 * GIB)
    decision = schedule(snap(cluster, [t], [holder]))
    assert not decision.placements
    assert "needs 1 x GPU with 1 GiB free" in decision.waiting[t.id]


def test_memory_held_by_foreign_processes_is_not_offered():
    card = GpuView(id=1, node="n", pool="default", gpu_type="t", memory_mb=24 * GIB,
                   foreign_mb=10 * GIB)  # fmt: skip
    too_big, fits = task(gpu_memory_mb=16 * GIB), task(gpu_memory_mb=14 * GIB)
    whole = task()
    decision = schedule(Snapshot(now=NOW, gpus=(card,), pending=(too_big, fits, whole)))
    assert set(placed(decision)) == {fits.id}


def test_gpu_type_pool_and_node_constraints_are_honoured():
    a = gpus(nodes=1, per_node=2, gpu_type="rtx4090-24g", pool="training")
    b = tuple(
        GpuView(id=500 + i, node="big", pool="inference", gpu_type="a6000-48g", memory_mb=48 * GIB)
        for i in range(2)
    )
    want_a6000 = task(gpu_type="a6000-48g")
    want_training = task(pool="training")
    want_node = task(node="big")
    nowhere = task(gpu_type="h100-80g")
    decision = schedule(
        Snapshot(NOW, a + b, pending=(want_a6000, want_training, want_node, nowhere))
    )
    where = placed(decision)
    assert where[want_a6000.id][0] >= 500
    assert where[want_training.id][0] < 500
    assert where[want_node.id][0] >= 500
    assert nowhere.id not in where
    assert "needs 1 x h100-80g" in decision.waiting[nowhere.id]


def test_unschedulable_gpus_get_no_work():
    cluster = tuple(
        GpuView(id=i, node="n", pool="p", gpu_type="t", memory_mb=GIB, schedulable=i == 0)
        for i in range(3)
    )
    tasks = [task(), task()]
    decision = schedule(Snapshot(NOW, cluster, pending=tuple(tasks)))
    assert list(placed(decision).values()) == [(0,)]


def test_an_elastic_task_takes_what_is_free_up_to_its_maximum():
    cluster = gpus(per_node=4)
    holder = running("other", [cluster[0]])
    elastic = task(gpus=(1, 4))
    decision = schedule(snap(cluster, [elastic], [holder]))
    assert len(placed(decision)[elastic.id]) == 3


def test_an_elastic_task_waits_below_its_minimum():
    cluster = gpus(per_node=4)
    holders = [running("other", cluster[:3])]
    elastic = task(gpus=(2, 4))
    decision = schedule(snap(cluster, [elastic], holders))
    assert not decision.placements
    assert "needs 2-4 x GPU on one node; 1 idle now" in decision.waiting[elastic.id]


def test_a_cpu_only_task_runs_without_gpus():
    t = task(gpus=0)
    decision = schedule(snap(gpus(), [t]))
    assert decision.placements[0].gpus == ()
    assert decision.placements[0].node == "node-0"


# --- Order, fairness, quotas ---------------------------------------------------------------------


def test_higher_priority_goes_first():
    low, high = (
        task(priority=10, submitted_at=NOW - 60 + 1.0),
        task(priority=90, submitted_at=NOW - 60 + 2.0),
    )
    decision = schedule(snap(gpus(per_node=1), [low, high]))
    assert set(placed(decision)) == {high.id}
    assert "1st of 1 in line" in decision.waiting[low.id]


def test_the_tenant_using_less_goes_first():
    busy = TenantView("busy", recent_gpus=3.0)
    idle = TenantView("idle", recent_gpus=0.0)
    first = task("busy", submitted_at=NOW - 60 + 1.0)
    later = task("idle", submitted_at=NOW - 60 + 2.0)
    decision = schedule(snap(gpus(per_node=1), [first, later], tenants=[busy, idle]))
    assert set(placed(decision)) == {later.id}


def test_fair_share_alternates_between_equal_tenants_within_a_pass():
    a = [task("a", submitted_at=NOW - 60 + i) for i in range(4)]
    b = [task("b", submitted_at=NOW - 60 + 10.0 + i) for i in range(4)]
    decision = schedule(snap(gpus(per_node=4), a + b))
    winners = placed(decision)
    assert sum(t.id in winners for t in a) == 2
    assert sum(t.id in winners for t in b) == 2


def test_weights_give_a_tenant_a_bigger_share():
    heavy, light = TenantView("heavy", weight=3.0), TenantView("light", weight=1.0)
    tasks = [task("heavy", submitted_at=NOW - 60 + i) for i in range(4)]
    tasks += [task("light", submitted_at=NOW - 60 + i) for i in range(4)]
    decision = schedule(snap(gpus(per_node=4), tasks, tenants=[heavy, light]))
    tenants = [t.tenant for t in tasks if t.id in placed(decision)]
    assert tenants.count("heavy") == 3
    assert tenants.count("light") == 1


def test_a_tenant_never_exceeds_its_gpu_quota():
    lab = TenantView("vision", limits=Limits(gpus=2))
    holder = running("vision", [gpus()[0]])
    tasks = [task(), task(), task()]
    decision = schedule(snap(gpus(), tasks, [holder], tenants=[lab]))
    assert len(decision.placements) == 1
    waiting = decision.waiting[tasks[1].id]
    assert "tenant vision has no room left in its quota of 2 GPUs" in waiting


def test_the_memory_quota_counts_reserved_memory():
    lab = TenantView("vision", limits=Limits(gpu_memory_mb=30 * GIB))
    shared = [task(gpu_memory_mb=12 * GIB) for _ in range(3)]
    decision = schedule(snap(gpus(), shared, tenants=[lab]))
    assert len(decision.placements) == 2
    assert "has no room left in its quota of 30 GiB GPU memory" in decision.waiting[shared[2].id]


def test_the_running_task_quota_counts_tasks():
    lab = TenantView("vision", limits=Limits(running_tasks=1))
    tasks = [task(gpu_memory_mb=GIB), task(gpu_memory_mb=GIB)]
    decision = schedule(snap(gpus(), tasks, tenants=[lab]))
    assert len(decision.placements) == 1
    assert "has no room left in its quota of 1 running tasks" in decision.waiting[tasks[1].id]


def test_a_pool_quota_limits_only_that_pool():
    training = gpus(nodes=1, per_node=2, pool="training")
    other = tuple(
        GpuView(id=900 + i, node="x", pool="inference", gpu_type="t", memory_mb=24 * GIB)
        for i in range(2)
    )
    lab = TenantView("vision", pool_limits={"training": Limits(gpus=1)})
    tasks = [task(pool="training"), task(pool="training"), task(pool="inference")]
    decision = schedule(Snapshot(NOW, training + other, pending=tuple(tasks),
                                 tenants={"vision": lab}))  # fmt: skip
    assert set(placed(decision)) == {tasks[0].id, tasks[2].id}
    waiting = decision.waiting[tasks[1].id]
    assert "in pool training has no room left in its quota of 1 GPUs" in waiting


def test_an_elastic_task_is_trimmed_to_the_quota():
    lab = TenantView("vision", limits=Limits(gpus=3))
    elastic = task(gpus=(1, 4))
    decision = schedule(snap(gpus(), [elastic], tenants=[lab]))
    assert len(placed(decision)[elastic.id]) == 3


# --- Serial queues, dependencies, backoff --------------------------------------------------------


def test_a_serial_queue_runs_one_at_a_time_in_submission_order():
    q = [task(queue="sft", submitted_at=NOW - 60 + i) for i in (3, 1, 2)]
    decision = schedule(snap(gpus(), q))
    first = min(q, key=lambda t: t.submitted_at)
    assert set(placed(decision)) == {first.id}
    others = [t for t in q if t is not first]
    assert all(f"queue sft: waiting behind #{first.id}" in decision.waiting[t.id] for t in others)


def test_a_serial_queue_waits_while_its_task_runs():
    cluster = gpus()
    holder = running("vision", [cluster[0]], queue="sft")
    nxt = task(queue="sft")
    other_tenant_same_name = task("nlp", queue="sft")
    decision = schedule(snap(cluster, [nxt, other_tenant_same_name], [holder]))
    assert set(placed(decision)) == {other_tenant_same_name.id}
    assert f"#{holder.id} runs first" in decision.waiting[nxt.id]


def test_a_blocked_queue_head_holds_back_its_queue():
    big = task(queue="q", gpus=8, submitted_at=NOW - 60 + 1.0)
    small = task(queue="q", submitted_at=NOW - 60 + 2.0)
    decision = schedule(snap(gpus(nodes=2, per_node=4), [big, small]))
    assert not decision.placements


def test_tasks_blocked_by_dependencies_or_backoff_wait_with_the_reason():
    deps = task(blocked="waiting for prep-data (running)")
    backoff = task(not_before=NOW + 30)
    decision = schedule(snap(gpus(), [deps, backoff]))
    assert not decision.placements
    assert decision.waiting[deps.id] == "waiting for prep-data (running)"
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(NOW + 30))
    assert decision.waiting[backoff.id] == f"retry backoff until {until} UTC"


# --- Backfill and reservations -------------------------------------------------------------------


def test_a_blocked_big_task_reserves_gpus_and_small_unbounded_tasks_cannot_take_them():
    cluster = gpus(nodes=1, per_node=8)
    holders = [running("other", [g], started_at=NOW - 10) for g in cluster[:4]]
    big = task("a", gpus=8, submitted_at=NOW - 60 + 1.0)
    smalls = [task("b", submitted_at=NOW - 60 + 2.0 + i) for i in range(4)]
    decision = schedule(snap(cluster, [big, *smalls], holders))
    assert not decision.placements  # the 4 idle GPUs are held for the big task
    assert "held for it" in decision.waiting[big.id]


def test_a_small_task_that_ends_before_the_reservation_may_backfill():
    cluster = gpus(nodes=1, per_node=4)
    holders = [running("other", cluster[:2], timeout_s=3600, started_at=NOW)]
    big = task("a", gpus=4, submitted_at=NOW - 60 + 1.0)
    quick = task("b", submitted_at=NOW - 60 + 2.0, timeout_s=600)
    slow = task("b", submitted_at=NOW - 60 + 3.0, timeout_s=7200)
    decision = schedule(snap(cluster, [big, quick, slow], holders))
    assert set(placed(decision)) == {quick.id}
    # The time the GPUs are expected back (NOW + 3600 s), not a countdown.
    assert "expected by 1970-01-01 03:46:40 UTC" in decision.waiting[big.id]


def test_backfill_uses_gpus_outside_the_reservation():
    cluster = gpus(nodes=2, per_node=4)
    holders = [running("other", cluster[:2]), running("other", cluster[4:6])]
    big = task("a", gpus=4, submitted_at=NOW - 60 + 1.0)
    small = task("b", submitted_at=NOW - 60 + 2.0)
    decision = schedule(snap(cluster, [big, small], holders))
    assert len(decision.placements) == 1
    reserved_node = 0 if "node-0" in decision.waiting[big.id] else 1
    assert placed(decision)[small.id][0] // 100 != reserved_node


def test_gpus_held_for_a_task_hold_its_tenants_quota_room_too():
    cluster = gpus(nodes=3, per_node=2)  # one GPU of each node idle: 1, 101, 201
    holders = [running("vision", [cluster[0]]), running("vision", [cluster[2]]),
               running("nlp", [cluster[4]])]  # fmt: skip
    big = task("vision", gpus=2, submitted_at=NOW - 60 + 1.0)
    smalls = [task("vision", submitted_at=NOW - 60 + 2.0 + i) for i in range(2)]
    other = task("nlp", submitted_at=NOW - 60 + 5.0)
    tenants = [
        TenantView("vision", limits=Limits(gpus=4)),
        TenantView("nlp", limits=Limits(gpus=2)),
    ]
    decision = schedule(snap(cluster, [big, *smalls, other], holders, tenants))
    # vision holds 2 of 4 and its two-GPU task needs the other 2: its one-GPU tasks wait for
    # that room, not fill it while a GPU stands idle, held for a task that then could not
    # start. nlp's task takes an idle GPU that is not held.
    assert "held for it" in decision.waiting[big.id]
    assert [decision.waits[t.id].code for t in smalls] == ["quota", "quota"]
    assert set(placed(decision)) == {other.id}


def test_without_backfill_setting_small_tasks_take_any_idle_gpu():
    cluster = gpus(nodes=1, per_node=8)
    holders = [running("other", [g]) for g in cluster[:4]]
    big = task("a", gpus=8, submitted_at=NOW - 60 + 1.0)
    small = task("b", submitted_at=NOW - 60 + 2.0)
    decision = schedule(snap(cluster, [big, small], holders), PolicySettings(backfill=False))
    assert set(placed(decision)) == {small.id}


# --- Preemption ----------------------------------------------------------------------------------


def test_a_higher_priority_task_preempts_the_victim_that_loses_least():
    cluster = gpus(per_node=2)
    old = running("other", [cluster[0]], priority=10, started_at=NOW - 3000)
    young = running("other", [cluster[1]], priority=10, started_at=NOW - 50)
    urgent = task("vision", priority=90)
    decision = schedule(snap(cluster, [urgent], [old, young]))
    assert [p.task_id for p in decision.preemptions] == [young.id]
    assert decision.preemptions[0].for_task_id == urgent.id
    assert "waiting for 1 preempted task(s) to stop" in decision.waiting[urgent.id]


def test_equal_priority_batch_work_is_never_preempted_for_batch():
    cluster = gpus(per_node=1)
    holder = running("other", [cluster[0]], priority=50)
    t = task(priority=50)
    decision = schedule(snap(cluster, [t], [holder]))
    assert not decision.preemptions


def test_online_and_non_preemptible_tasks_are_never_victims():
    cluster = gpus(per_node=2)
    service = running("other", [cluster[0]], priority=10, task_class=ONLINE, preemptible=False)
    pinned = running("other", [cluster[1]], priority=10, preemptible=False)
    urgent = task(priority=90)
    decision = schedule(snap(cluster, [urgent], [service, pinned]))
    assert not decision.preemptions


def test_online_reclaims_its_guaranteed_share_from_batch():
    cluster = gpus(per_node=4)
    batch = [running("other", [g], priority=50) for g in cluster]
    online = task("svc", priority=50, task_class=ONLINE)
    decision = schedule(snap(cluster, [online], batch))
    assert len(decision.preemptions) == 1


def test_online_beyond_its_share_does_not_preempt_equal_priority_batch():
    cluster = gpus(per_node=4)
    services = [running("svc", [g], priority=50, task_class=ONLINE, preemptible=False)
                for g in cluster[:2]]  # fmt: skip
    batch = [running("other", [g], priority=50) for g in cluster[2:]]
    online = task("svc", priority=50, task_class=ONLINE)
    decision = schedule(snap(cluster, [online], services + batch))
    assert not decision.preemptions  # online holds 2 of its guaranteed 1


def test_a_task_waits_for_victims_already_stopping_instead_of_preempting_more():
    cluster = gpus(per_node=2)
    stopping = running("other", [cluster[0]], priority=10, stopping=True)
    other = running("other", [cluster[1]], priority=10)
    urgent = task(priority=90)
    decision = schedule(snap(cluster, [urgent], [stopping, other]))
    assert not decision.preemptions
    assert "waiting for 1 preempted task(s) to stop" in decision.waiting[urgent.id]


def test_preemption_frees_a_whole_node_for_a_multi_gpu_task_at_least_cost():
    cluster = gpus(nodes=2, per_node=2)
    n0 = [running("o", [g], priority=10, started_at=NOW - 1000) for g in cluster[:2]]
    n1 = [running("o", [g], priority=10, started_at=NOW - 10) for g in cluster[2:]]
    urgent = task(priority=90, gpus=2)
    decision = schedule(snap(cluster, [urgent], n0 + n1))
    assert {p.task_id for p in decision.preemptions} == {r.id for r in n1}


def test_preemption_can_be_switched_off():
    cluster = gpus(per_node=1)
    holder = running("other", [cluster[0]], priority=10)
    decision = schedule(snap(cluster, [task(priority=90)], [holder]),
                        PolicySettings(preemption=False))  # fmt: skip
    assert not decision.preemptions


# --- Class shares --------------------------------------------------------------------------------


def test_guarantees_round_so_no_gpu_is_stranded():
    from scheduling.policy.core import _guarantees

    assert _guarantees(4, {ONLINE: 0.3, BATCH: 0.7}) == {ONLINE: 1, BATCH: 3}
    assert sum(_guarantees(7, {ONLINE: 0.5, BATCH: 0.5}).values()) == 7
    assert _guarantees(0, {ONLINE: 0.3, BATCH: 0.7}) == {ONLINE: 0, BATCH: 0}


def test_batch_may_borrow_every_gpu_when_online_leaves_them_idle():
    tasks = [task(submitted_at=NOW - 60 + i) for i in range(4)]
    decision = schedule(snap(gpus(per_node=4), tasks))
    assert len(decision.placements) == 4


# --- Reasons and the baseline --------------------------------------------------------------------


def test_every_waiting_task_gets_a_reason_and_a_place_in_line():
    cluster = gpus(per_node=1)
    tasks = [task(submitted_at=NOW - 60 + i) for i in range(4)]
    decision = schedule(snap(cluster, tasks))
    assert len(decision.placements) + len(decision.waiting) == 4
    assert "3rd of 3 in line" in decision.waiting[tasks[3].id]


def test_strict_fifo_blocks_everyone_behind_the_first_task_that_does_not_fit():
    cluster = gpus(per_node=4)
    holder = running("o", cluster[:2])
    big, small = task(gpus=4, submitted_at=NOW - 60 + 1.0), task(submitted_at=NOW - 60 + 2.0)
    decision = schedule_fifo(snap(cluster, [big, small], [holder]))
    assert not decision.placements
    assert decision.waiting[small.id] == f"behind #{big.id} (strict FIFO)"


# --- Starvation and the limits of preemption --------------------------------------------------


def test_a_task_waiting_past_the_starvation_limit_goes_first_whatever_its_priority():
    old_low = task(priority=10, submitted_at=NOW - 3 * 3600)
    fresh_high = task(priority=90)
    decision = schedule(snap(gpus(per_node=1), [fresh_high, old_low]))
    assert set(placed(decision)) == {old_low.id}


def test_a_starving_big_task_gets_the_reservation_ahead_of_higher_priority_work():
    cluster = gpus(per_node=4)
    holders = [running("o", [g]) for g in cluster[:2]]
    big = task(gpus=4, priority=10, submitted_at=NOW - 3 * 3600)
    urgent_small = task(priority=90)
    decision = schedule(snap(cluster, [urgent_small, big], holders))
    assert not decision.placements
    assert "held for it" in decision.waiting[big.id]


def test_a_task_that_ran_longer_than_the_limit_is_not_preempted():
    cluster = gpus(per_node=1)
    veteran = running("other", [cluster[0]], priority=10, started_at=NOW - 2 * 3600)
    decision = schedule(snap(cluster, [task(priority=90)], [veteran]))
    assert not decision.preemptions
    limit = PolicySettings(preempt_max_runtime_s=3 * 3600)
    assert schedule(snap(cluster, [task(priority=90)], [veteran]), limit).preemptions


def test_a_task_is_not_evicted_for_a_smaller_one():
    cluster = gpus(per_node=2)
    pair = running("other", cluster[:2], priority=10)
    decision = schedule(snap(cluster, [task(priority=90)], [pair]))
    assert not decision.preemptions
    assert schedule(snap(cluster, [task(priority=90, gpus=2)], [pair])).preemptions


def test_a_task_that_waited_past_the_starvation_limit_is_not_preempted_once_running():
    cluster = gpus(per_node=1)
    patient = running("o", [cluster[0]], priority=10, submitted_at=NOW - 4 * 3600)
    decision = schedule(snap(cluster, [task(priority=90)], [patient]))
    assert not decision.preemptions


def test_gpus_freed_by_preemption_are_held_for_the_task_that_asked():
    # The urgent 2-GPU task preempts one victim; the idle GPU beside it must not go to the
    # low-priority task later in the same pass, or the urgent task would preempt forever.
    cluster = gpus(per_node=2)
    victim = running("o", [cluster[0]], priority=10)
    urgent = task(priority=90, gpus=2)
    latecomer = task(priority=10)
    decision = schedule(snap(cluster, [urgent, latecomer], [victim]))
    assert [p.task_id for p in decision.preemptions] == [victim.id]
    assert not decision.placements


def wait_data(decision) -> dict[int, dict]:
    """Each wait as the API shows it (``wait_record``), placed in the decision's line."""
    place = {task_id: n for n, task_id in enumerate(decision.line, start=1)}
    return {
        task_id: wait_record(why.code, why.details, place.get(task_id), len(decision.line))
        for task_id, why in decision.waits.items()
    }


def test_every_reason_is_rendered_from_its_wait_data():
    big = task(gpus=8)
    blocked = task(gpus=8)
    deps = task(blocked="waiting for prep-data (running)")
    backoff = task(not_before=NOW + 30)
    over = task("capped")
    capped = TenantView("capped", limits=Limits(gpus=0))
    pending = [big, blocked, deps, backoff, over]
    decision = schedule(snap(gpus(nodes=1, per_node=8), pending, tenants=[capped]))
    data = wait_data(decision)
    assert set(decision.waits) == set(decision.waiting) == set(data)
    for task_id, why in decision.waits.items():
        place = data[task_id]
        assert decision.waiting[task_id] == why.render(place["position"], place["line"])
    # And the words themselves, not only their agreement with the data they are made from.
    assert "GPUs on node-0 are held for it" in decision.waiting[blocked.id]
    assert decision.waiting[blocked.id].endswith("of 2 in line")
    assert decision.waiting[deps.id] == "waiting for prep-data (running)"
    assert decision.waiting[backoff.id] == "retry backoff until 1970-01-01 02:47:10 UTC"
    over_quota = "tenant capped has no room left in its quota of 0 GPUs; "
    assert decision.waiting[over.id].startswith(over_quota)
    assert [data[t.id]["code"] for t in (blocked, deps, backoff, over)] == [
        "reserved",
        "dependencies",
        "backoff",
        "quota",
    ]
    assert sorted(data[t.id]["position"] for t in (blocked, over)) == [1, 2]
    assert {data[t.id]["line"] for t in (blocked, over)} == {2}
    assert (data[deps.id]["position"], data[deps.id]["line"]) == (None, None)
    assert data[backoff.id]["details"] == {"not_before": NOW + 30, "seconds_left": 30}
    assert data[over.id]["details"] == {
        "limit": "gpus",
        "of": 0,
        "pool": None,
        "tenant": "capped",
    }


# --- Class guarantees: each class with demand gets its share within reclaim_after -----------------

RECLAIM = PolicySettings().reclaim_after_s


def services_on(cluster, **kwargs):
    """Online services, never preemptible, one per GPU, running for a day."""
    fields = {"priority": 90, "task_class": ONLINE, "preemptible": False,
              "started_at": NOW - 86400} | kwargs  # fmt: skip
    return [running("svc", [g], **fields) for g in cluster]


def test_four_services_on_four_gpus_make_batch_wait_only_until_reclaim_after():
    cluster = gpus(per_node=4)  # online is guaranteed 1 GPU, batch 3
    services = services_on(cluster)
    fresh = task(priority=10, submitted_at=NOW - 60)
    decision = schedule(snap(cluster, [fresh], services))
    assert not decision.preemptions  # it has not waited long enough: the next end may do
    at = fresh.submitted_at + RECLAIM
    assert wait_data(decision)[fresh.id]["details"]["reclaim_at"] == at
    assert (
        "batch holds 0 of its guaranteed 3 GPUs: takes borrowed GPUs back from"
        in (decision.waiting[fresh.id])
    )  # a time, not a countdown
    assert decision.wake_at == at  # the caller looks again then

    waited = task(priority=10, submitted_at=NOW - RECLAIM)
    decision = schedule(snap(cluster, [waited], services))
    # Reclaimed from borrowed capacity: one service (not preemptible, but borrowing).
    assert [p.task_id for p in decision.preemptions] in [[s.id] for s in services]
    assert "waiting for 1 preempted task(s) to stop" in decision.waiting[waited.id]


def test_a_reclaim_never_takes_the_other_class_below_its_guarantee():
    cluster = gpus(per_node=4)
    services = services_on(cluster[:2])  # online borrows 1 beyond its guaranteed 1
    batch = [running("other", [g], priority=10) for g in cluster[2:]]
    waiting = [task(priority=10, submitted_at=NOW - RECLAIM - i) for i in range(3)]
    decision = schedule(snap(cluster, waiting, services + batch))
    assert len(decision.preemptions) == 1  # online keeps its guaranteed GPU


def test_a_reclaim_evicts_whole_gpus_that_lose_least_rather_than_an_old_shared_service():
    cluster = gpus(per_node=4)
    # Online is guaranteed 1 GPU and holds 1.5: a day-old service on half a card, a new one
    # on a whole card. Batch holds the other 2 of its guaranteed 3 and has a task waiting.
    old = running("svc", [cluster[0]], shared_mb=12 * GIB, priority=90, task_class=ONLINE,
                  preemptible=False, started_at=NOW - 86400)  # fmt: skip
    new = services_on([cluster[1]], started_at=NOW - 600)[0]
    batch = [running("other", [g], priority=10) for g in cluster[2:]]
    waiting = task(priority=10, gpu_memory_mb=16 * GIB, submitted_at=NOW - RECLAIM)
    decision = schedule(snap(cluster, [waiting], [old, new, *batch]))
    # Exactly what online borrowed (0.5) would allow evicting only the old service; whole
    # tasks cannot be evicted by halves, so online keeps more than its guarantee less 1.
    assert [p.task_id for p in decision.preemptions] == [new.id]


def test_priority_does_not_evict_batch_that_started_by_its_guarantee():
    # reclaim_after under starvation_after, and online under its share: only the guarantee
    # rule can spare the batch task that reclaimed its GPU (with the defaults, starvation and
    # online's borrowing spared it whatever the rule did).
    settings = PolicySettings(reclaim_after_s=600)
    cluster = gpus(nodes=2, per_node=2)  # online guaranteed 1 GPU, batch 3
    reclaimed = running("other", [cluster[0]], priority=10, started_at=NOW - 60,
                        submitted_at=NOW - 660)  # fmt: skip
    plain = running("other", [cluster[1]], priority=10, started_at=NOW - 600,
                    submitted_at=NOW - 700)  # fmt: skip
    far = running("other", [cluster[2]], priority=10, started_at=NOW - 600,
                  submitted_at=NOW - 700)  # fmt: skip
    urgent = task("svc", priority=90, task_class=ONLINE, node="node-0")
    decision = schedule(snap(cluster, [urgent], [reclaimed, plain, far]), settings)
    assert reclaimed.id not in {p.task_id for p in decision.preemptions}
    assert [p.task_id for p in decision.preemptions] == [plain.id]


def test_priority_takes_no_more_than_the_other_class_borrowed_for_a_borrower():
    cluster = gpus(per_node=4)
    services = services_on(cluster[:1])  # online holds its guaranteed GPU
    batch = [running("other", [g], priority=10) for g in cluster[1:]]  # batch its 3
    urgent = task("svc", priority=90, task_class=ONLINE)
    decision = schedule(snap(cluster, [urgent], services + batch))
    # Priority alone would stop a batch task, and batch would then take the GPU back.
    assert not decision.preemptions
    # Under its own share, online still takes it by priority (test above: it reclaims).
    everywhere = [running("other", [g], priority=10) for g in cluster]
    decision = schedule(snap(cluster, [urgent], everywhere))
    assert len(decision.preemptions) == 1


def test_gpus_that_free_up_go_to_the_class_reclaiming_them_first():
    cluster = gpus(per_node=4)
    services = services_on(cluster[:3])  # one GPU idle: online borrows 2 already
    online = task("svc", priority=90, task_class=ONLINE)
    lender = task(priority=10, submitted_at=NOW - RECLAIM - 1)
    decision = schedule(snap(cluster, [online, lender], services))
    assert [p.task_id for p in decision.placements] == [lender.id]
    assert not decision.preemptions


def test_a_borrower_still_gets_what_the_lender_cannot_use():
    cluster = gpus(nodes=2, per_node=2)
    services = services_on(cluster[:3])
    online = task("svc", priority=90, task_class=ONLINE)
    lender = task(priority=10, gpus=2, node="node-0", submitted_at=NOW - RECLAIM - 1)
    decision = schedule(snap(cluster, [online, lender], services))
    assert [p.task_id for p in decision.placements] == [online.id]


def test_the_guarantee_holds_in_bounded_time_on_a_cluster_full_of_services():
    """The invariant, stepped through passes as the scheduler runs them (at each wake-up, and
    again at once after preemptions): batch demand under its guarantee holds its share
    within reclaim_after, and online keeps its own."""
    cluster = gpus(per_node=4)
    holders = services_on(cluster)
    batch = [task(priority=10, submitted_at=NOW - 30 + i) for i in range(3)]
    now, pending = NOW, list(batch)
    by_id = {g.id: g for g in cluster}
    for _ in range(20):
        decision = schedule(
            Snapshot(
                now=now,
                gpus=occupied(cluster, holders),
                running=tuple(holders),
                pending=tuple(pending),
            )  # fmt: skip
        )
        gone = {p.task_id for p in decision.preemptions}
        holders = [h for h in holders if h.id not in gone]  # victims stop at once here
        for placement in decision.placements:
            gpu_list = [by_id[gpu_id] for gpu_id, _ in placement.gpus]
            holders.append(running("vision", gpu_list, priority=10, started_at=now))
        placed = {p.task_id for p in decision.placements}
        pending = [t for t in pending if t.id not in placed]
        if not pending:
            break
        if not gone:
            assert decision.wake_at is not None  # nothing else would wake it
            now = decision.wake_at
    assert not pending
    assert now <= batch[-1].submitted_at + RECLAIM  # within the bound
    assert sum(1 for h in holders if h.task_class == ONLINE) == 1  # online keeps its share


def test_a_pass_says_when_a_waiting_task_starts_to_starve():
    cluster = gpus(per_node=1)
    holder = running("other", cluster, priority=90)
    waiting = task(priority=10, submitted_at=NOW - 60)
    decision = schedule(snap(cluster, [waiting], [holder]))
    assert decision.wake_at == waiting.submitted_at + PolicySettings().starvation_after_s
