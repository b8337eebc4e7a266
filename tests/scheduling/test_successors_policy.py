"""The policy's successors: who takes a finished task's GPUs before the next pass, and where."""

from __future__ import annotations

from dataclasses import replace

from scheduling.policy import (
    ONLINE,
    Freed,
    Limits,
    PolicySettings,
    Promise,
    Successor,
    TenantView,
    hand_on,
    schedule,
)

from .test_policy import NOW, gpus, running, snap, task


def full(cluster, tenant: str = "other", **kwargs):
    return [running(tenant, [gpu], **kwargs) for gpu in cluster]


def test_successors_take_turns_by_fair_share_as_if_each_had_started():
    cluster = gpus(nodes=2, per_node=2)
    vision = [task("vision") for _ in range(3)]
    nlp = [task("nlp") for _ in range(3)]
    # vision already used more than nlp: nlp goes first, then they alternate.
    tenants = [TenantView("vision", recent_gpus=1.5), TenantView("nlp", recent_gpus=0.0)]
    decision = schedule(snap(cluster, vision + nlp, full(cluster), tenants))
    assert not decision.placements
    order = [s.task_id for s in decision.successors]
    assert order == [nlp[0].id, nlp[1].id, vision[0].id, nlp[2].id, vision[1].id, vision[2].id]
    # The first holds the backfill reservation (the GPU that frees first), but needs one GPU:
    # it takes the first that frees, wherever, so the others may take every GPU too.
    assert decision.waits[nlp[0].id].code == "reserved"
    assert all(s.gpu_ids == tuple(g.id for g in cluster) for s in decision.successors)


def test_a_pass_lists_at_most_eight_successors_per_gpu():
    cluster = gpus(per_node=2)
    decision = schedule(snap(cluster, [task() for _ in range(20)], full(cluster)))
    assert len(decision.successors) == 16


def test_successors_never_add_up_past_a_quota_and_the_rest_swap():
    cluster = gpus(per_node=4)
    holders = [running("vision", [cluster[0]]), *full(cluster[1:], "nlp")]
    waiting = [task("vision"), task("vision"), task("nlp")]
    tenants = [TenantView("vision", limits=Limits(gpus=2))]
    decision = schedule(snap(cluster, waiting, holders, tenants))
    # vision holds 1 of 2: one more of its tasks may start on any GPU; the other only on a
    # GPU that a task of vision's own frees, which keeps vision at 2.
    listed = [(s.task_id, s.fenced, s.swap) for s in decision.successors]
    assert listed == [
        (waiting[0].id, True, False),
        (waiting[1].id, False, True),
        (waiting[2].id, False, False),
    ]


def test_a_tenant_at_its_quota_has_its_backlog_listed_as_swaps():
    cluster = gpus(per_node=4)
    holders = [*full(cluster[:2], "vision"), *full(cluster[2:], "nlp")]
    waiting = [task("vision") for _ in range(30)] + [task("nlp") for _ in range(3)]
    tenants = [TenantView("vision", limits=Limits(gpus=2))]
    decision = schedule(snap(cluster, waiting, holders, tenants))
    assert decision.waits[waiting[0].id].code == "quota"
    swaps = [s for s in decision.successors if s.swap]
    # Enough for the two GPUs vision holds to turn over eight times, in its order.
    assert [s.task_id for s in swaps] == [t.id for t in waiting[:16]]
    assert {s.tenant for s in swaps} == {"vision"}
    assert not any(s.fenced for s in swaps)
    others = [s.task_id for s in decision.successors if not s.swap]
    assert others == [t.id for t in waiting[30:]]


def test_a_tenant_over_its_quota_has_no_swaps():
    cluster = gpus(per_node=4)
    holders = full(cluster[:3], "vision")  # a quota lowered to 2 below the 3 it holds
    tenants = [TenantView("vision", limits=Limits(gpus=2))]
    decision = schedule(snap(cluster, [task("vision"), task("vision")], holders, tenants))
    assert decision.successors == []


def test_a_tenant_with_quotas_per_pool_has_its_tasks_listed_as_swaps():
    cluster = gpus(per_node=2)
    tenants = [TenantView("vision", pool_limits={"default": Limits(gpus=8)})]
    waiting = [task("vision"), task("vision")]
    decision = schedule(snap(cluster, waiting, full(cluster, "vision"), tenants))
    assert [(s.task_id, s.swap) for s in decision.successors] == [
        (waiting[0].id, True),
        (waiting[1].id, True),
    ]


def test_an_elastic_task_waiting_for_its_quota_stops_only_its_own_tenants_swaps():
    cluster = gpus(per_node=4)
    holders = [*full(cluster[:2], "vision"), *full(cluster[2:], "nlp")]
    waiting = [task("vision"), task("vision", gpus=(1, 2)), task("vision"), task("nlp")]
    tenants = [TenantView("vision", limits=Limits(gpus=2))]
    decision = schedule(snap(cluster, waiting, holders, tenants))
    # Once vision's tasks end, a pass places the elastic one before the one behind it.
    assert [(s.task_id, s.swap) for s in decision.successors] == [
        (waiting[0].id, True),
        (waiting[3].id, False),
    ]


def test_a_swap_takes_only_gpus_its_own_tenants_ended_tasks_freed_one_for_each():
    mine, again, other = (
        Successor(1, 1, (10, 11, 12), swap=True, tenant="vision"),
        Successor(2, 1, (10, 11, 12), swap=True, tenant="vision"),
        Successor(3, 1, (10, 11, 12), tenant="nlp"),
    )
    freed = [Freed(10, 24576, 24576), Freed(11, 24576, 24576), Freed(12, 24576, 24576)]
    # GPU 10 was nlp's; 11 and 12 were one two-GPU task of vision's: one task ended, one starts.
    owners = {10: "nlp", 11: "vision", 12: "vision"}
    placements, left = hand_on([mine, again, other], freed, "node-0", owners, {"vision": 1})
    assert [(p.task_id, p.gpus) for p in placements] == [(1, ((11, 24576),)), (3, ((10, 24576),))]
    assert left == [Freed(12, 24576, 24576)]
    # Without an end of its own tenant, a swap takes nothing.
    placements, _ = hand_on([mine], freed, "node-0", {10: "nlp"}, {"nlp": 1})
    assert placements == []


def test_swaps_replace_one_ended_task_each_only_where_the_quota_counts_running_tasks():
    cluster = gpus(per_node=4)
    holders = [*full(cluster[:2], "vision"), *full(cluster[2:], "nlp")]
    waiting = [task("vision"), task("nlp")]
    tenants = [
        TenantView("vision", limits=Limits(gpus=2)),
        TenantView("nlp", limits=Limits(gpus=2, running_tasks=2)),
    ]
    decision = schedule(snap(cluster, waiting, holders, tenants))
    assert [(s.tenant, s.swap, s.one_for_one) for s in decision.successors] == [
        ("vision", True, False),
        ("nlp", True, True),
    ]


def test_a_two_gpu_task_ending_hands_both_gpus_to_its_tenants_swaps_unless_tasks_are_counted():
    freed = [Freed(11, 24576, 24576), Freed(12, 24576, 24576)]
    owners = {11: "vision", 12: "vision"}  # one two-GPU task of vision's ended
    swaps = [
        Successor(n, 1, (11, 12), swap=True, tenant="vision", one_for_one=False) for n in (1, 2)
    ]
    placements, left = hand_on(swaps, freed, "node-0", owners, {"vision": 1})
    assert [(p.task_id, p.gpus) for p in placements] == [
        (1, ((11, 24576),)),
        (2, ((12, 24576),)),
    ]
    assert left == []
    # Its quota counts running tasks: one ended, one starts, and a GPU waits for a pass.
    counted = [replace(s, one_for_one=True) for s in swaps]
    placements, left = hand_on(counted, freed, "node-0", owners, {"vision": 1})
    assert [p.task_id for p in placements] == [1]
    assert left == [Freed(12, 24576, 24576)]


def test_no_successor_may_take_gpus_held_for_a_blocked_task_but_that_task():
    cluster = gpus(nodes=2, per_node=2)
    big, small = task("vision", gpus=2), task("nlp")
    decision = schedule(snap(cluster, [big, small], full(cluster)))
    assert decision.waits[big.id].code == "reserved"
    successors = {s.task_id: s for s in decision.successors}
    node = decision.waits[big.id].details["node"]
    held = {g.id for g in cluster if g.node == node}
    assert successors[big.id].gpus == 2
    assert set(successors[big.id].gpu_ids) == {g.id for g in cluster}
    assert successors[small.id].gpus == 1
    assert set(successors[small.id].gpu_ids) == {g.id for g in cluster} - held


def test_the_list_ends_at_a_task_only_a_pass_can_place():
    cluster = gpus(per_node=2)
    first = task("vision")
    elastic = task("vision", gpus=(1, 2))
    after = task("vision")
    decision = schedule(snap(cluster, [first, elastic, after], full(cluster)))
    assert [s.task_id for s in decision.successors] == [first.id]


def test_a_task_whose_node_has_too_few_matching_gpus_is_not_a_successor():
    cluster = gpus(nodes=2, per_node=2)
    too_big = task("vision", gpus=3)
    pinned = task("vision", node="node-1")
    decision = schedule(snap(cluster, [too_big, pinned], full(cluster)))
    assert [(s.task_id, s.gpu_ids) for s in decision.successors] == [(pinned.id, (100, 101))]


def test_nothing_is_nominated_while_a_class_may_take_back_borrowed_gpus():
    cluster = gpus(per_node=4)
    holders = full(cluster, "nlp", started_at=NOW - 10)
    online = task("vision", task_class=ONLINE, submitted_at=NOW - 600)
    decision = schedule(snap(cluster, [online], holders), PolicySettings(reclaim_after_s=60))
    assert decision.preemptions  # it takes back what batch borrowed
    assert decision.successors == []


def test_a_task_sharing_gpus_by_memory_is_listed_to_take_a_gpu_freed_whole():
    cluster = gpus(per_node=2)
    shared, whole = task("vision", gpu_memory_mb=4 * 1024), task("vision")
    decision = schedule(snap(cluster, [shared, whole], full(cluster)))
    assert [(s.task_id, s.memory_mb) for s in decision.successors] == [
        (shared.id, 4096),
        (whole.id, 0),
    ]
    first, second = (g.id for g in cluster)
    freed = [Freed(first, 24576, 24576), Freed(second, 24576, 24576)]
    placements, left = hand_on(decision.successors, freed, "node-0")
    assert [(p.task_id, p.gpus, p.exclusive) for p in placements] == [
        (shared.id, ((first, 4096),), False),
        (whole.id, ((second, 24576),), True),
    ]
    assert left == []


def test_tasks_sharing_gpus_split_what_ended_tasks_held_of_a_card_and_no_more():
    # GPU 10: an ended task held it whole. GPU 11: two ended tasks held 8 GiB of it, others
    # still share it. GPU 12: an ended task held 4 GiB of it, and nobody holds any of it now:
    # the rest was free before, a pass's to give, so it is not free whole here (``_FREED``).
    freed = [Freed(11, 0, 8192), Freed(12, 0, 4096), Freed(10, 24576, 24576)]
    sharing = [Successor(i, 1, (10, 11, 12), memory_mb=6144) for i in range(1, 7)]
    whole = Successor(7, 1, (10, 11, 12))
    placements, left = hand_on([*sharing, whole], freed, "node-0")
    assert [(p.task_id, p.gpus, p.exclusive) for p in placements] == [
        (1, ((11, 6144),), False),  # a card others share first: 2 GiB of it is left
        (2, ((10, 6144),), False),  # not GPU 12: its ended task held less than 6 GiB
        (3, ((10, 6144),), False),
        (4, ((10, 6144),), False),
        (5, ((10, 6144),), False),  # GPU 10 is full; the sixth fits nowhere
    ]
    assert left == [Freed(12, 0, 4096)]  # and the whole one takes no card others shared
    placements, left = hand_on([whole], [Freed(10, 24576, 24576)], "node-0")
    assert [(p.task_id, p.gpus, p.exclusive) for p in placements] == [(7, ((10, 24576),), True)]


def test_a_swap_shares_only_what_its_own_tenants_tasks_held_and_takes_whole_only_a_whole_one():
    owners = {10: "vision", 11: "vision"}
    # GPU 10: vision's task held 4 GiB of it, and it is free whole now; GPU 11: held whole.
    freed = [Freed(10, 24576, 4096), Freed(11, 24576, 24576)]
    whole = Successor(1, 1, (10,), swap=True, tenant="vision")
    placements, _ = hand_on([whole], freed, "node-0", owners, {"vision": 2})
    assert placements == []  # it would hold more than vision's ended task did
    sharing = [Successor(i, 1, (10, 11), swap=True, tenant="vision", memory_mb=4096)
               for i in (2, 3, 4)]  # fmt: skip
    placements, _ = hand_on(sharing, freed, "node-0", owners, {"vision": 2})
    # One ended task for one started: two of them, on what vision's tasks held.
    assert [(p.task_id, p.gpus) for p in placements] == [(2, ((10, 4096),)), (3, ((11, 4096),))]


def test_a_task_sharing_gpus_waiting_for_its_quota_is_a_swap():
    cluster = gpus(per_node=2)
    waiting = [task("vision", gpu_memory_mb=4 * 1024), task("vision")]
    tenants = [TenantView("vision", limits=Limits(gpus=2))]
    decision = schedule(snap(cluster, waiting, full(cluster, "vision"), tenants))
    assert [(s.task_id, s.swap, s.memory_mb) for s in decision.successors] == [
        (waiting[0].id, True, 4096),
        (waiting[1].id, True, 0),
    ]


def test_a_promised_successor_counts_as_started_once_whoever_places_it():
    """The last list's successor charged to its tenant's quota may start at any moment (a node
    agent's hand-off): a pass counts it as started while it is pending, and does not count its
    own placement of it again."""
    cluster = gpus(per_node=4)
    holders = [running("vision", [cluster[0]]), *full(cluster[1:3])]
    promised, behind = task("vision"), task("vision")
    tenants = [TenantView("vision", limits=Limits(gpus=2))]
    base = snap(cluster, [promised, behind], holders, tenants)
    promise = (Promise(promised.id, (cluster[3].id,)),)

    decision = schedule(replace(base, promised=promise))
    # One GPU free: the promised task takes it (its promise is its own room), not the one behind.
    assert [p.task_id for p in decision.placements] == [promised.id]
    assert decision.waits[behind.id].code == "quota"
    # Placed before the snapshot, it is no longer pending: its promise counts nothing.
    decision = schedule(replace(base, pending=(behind,), promised=promise))
    assert [p.task_id for p in decision.placements] == [behind.id]
    # Pending, but not placed by the pass (it leaves its tenant no room for the one behind).
    pinned = replace(promised, node="elsewhere")
    decision = schedule(replace(base, pending=(pinned, behind), promised=promise))
    assert decision.placements == []
    assert decision.waits[behind.id].code == "quota"
