"""The trace replay simulator: loading, qos mapping, the event loop, the checker, reporting.

No database: the simulator is pure. Most tests bring a small fake policy so that the expected
JCTs and waits can be worked out by hand.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from replay.checker import check_decision
from replay.common import PolicyViolation
from replay.report import compare, format_table, plot, run_policies
from replay.results import percentile
from replay.simulator import simulate
from replay.trace import TraceJob, load_trace
from scheduling.policy.model import (
    BATCH,
    ONLINE,
    Decision,
    GpuView,
    PendingView,
    Placement,
    PolicySettings,
    Preemption,
    RunningView,
    Snapshot,
)

HEADER = "job_id,tenant,qos,submit_time_s,duration_s,num_gpus,gpu_milli,status\n"
MEM = 24000  # MiB per simulated GPU: round numbers for hand-computed shares


def job(
    job_id: str,
    submit: float,
    duration: float,
    gpus: int = 1,
    milli: int = 1000,
    *,
    qos: str = "LS",
    tenant: str = "tenant-1",
) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        tenant=tenant,
        qos=qos,
        submit_s=submit,
        duration_s=duration,
        num_gpus=gpus,
        gpu_milli=milli,
    )


# --- fake policies --------------------------------------------------------------------------


def _fits(gpus: list[GpuView], used: dict[int, tuple[int, int, bool]], task: PendingView):
    """First fit on one node, given what this pass already placed: (holders, MiB, exclusive)."""
    by_node: dict[str, list[tuple[int, int]]] = {}
    for gpu in gpus:
        holders, mb, exclusive = used.get(gpu.id, (gpu.holders, gpu.reserved_mb, gpu.exclusive))
        if task.exclusive:
            ok = holders == 0
            reserve = gpu.memory_mb
        else:
            ok = not exclusive and gpu.memory_mb - mb >= (task.gpu_memory_mb or 0)
            reserve = task.gpu_memory_mb or 0
        if ok:
            by_node.setdefault(gpu.node, []).append((gpu.id, reserve))
    for node, free in by_node.items():
        if len(free) >= task.gpus_min:
            return node, tuple(free[: task.gpus_min])
    return None


def first_fit(snapshot: Snapshot) -> Decision:
    """Greedy: each pending task, in the order given (by submit time), on the first node it fits."""
    decision = Decision()
    used: dict[int, tuple[int, int, bool]] = {}
    gpus = list(snapshot.gpus)
    by_id = {gpu.id: gpu for gpu in gpus}
    for task in snapshot.pending:
        fit = _fits(gpus, used, task)
        if fit is None:
            decision.waiting[task.id] = "no room"
            continue
        node, chosen = fit
        for gpu_id, mb in chosen:
            gpu = by_id[gpu_id]
            holders, reserved, _ = used.get(gpu_id, (gpu.holders, gpu.reserved_mb, gpu.exclusive))
            used[gpu_id] = (holders + 1, reserved + mb, task.exclusive)
        decision.placements.append(Placement(task.id, node, chosen, task.exclusive))
    return decision


@dataclass
class Recorder:
    """Wraps a policy and keeps every snapshot it was shown."""

    policy: object
    snapshots: list[Snapshot] = field(default_factory=list)

    def __call__(self, snapshot: Snapshot) -> Decision:
        self.snapshots.append(snapshot)
        return self.policy(snapshot)


# --- loading --------------------------------------------------------------------------------


def test_it_loads_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        HEADER
        + "pod-1,tenant-1,LS,0,2083,1,1000,Running\n"
        + "pod-2,tenant-3,BE,10,60.5,1,250,Failed\n"
        + "pod-3,tenant-2,Burstable,20,100,8,1000,Succeeded\n"
    )
    jobs = load_trace(path)
    assert jobs == [
        TraceJob("pod-1", "tenant-1", "LS", 0.0, 2083.0, 1, 1000),
        TraceJob("pod-2", "tenant-3", "BE", 10.0, 60.5, 1, 250),
        TraceJob("pod-3", "tenant-2", "Burstable", 20.0, 100.0, 8, 1000),
    ]
    assert [j.job_id for j in load_trace(path, limit=2)] == ["pod-1", "pod-2"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("pod-2,tenant-1,LS,10,100,two,1000,Running", "line 3, column num_gpus: expected an int"),
        ("pod-2,tenant-1,XX,10,100,1,1000,Running", "line 3, column qos: unknown QoS 'XX'"),
        ("pod-2,tenant-1,LS,ten,100,1,1000,Running", "line 3, column submit_time_s: expected"),
        ("pod-2,tenant-1,LS,10,0,1,1000,Running", "line 3, column duration_s: must be more"),
        ("pod-2,tenant-1,LS,10,-5,1,1000,Running", "line 3, column duration_s: must be at least"),
        ("pod-2,tenant-1,LS,10,100,1,1500,Running", "line 3, column gpu_milli: must be at most"),
        ("pod-2,tenant-1,LS,10,100,0,1000,Running", "line 3, column num_gpus: must be at least"),
        ("pod-2,,LS,10,100,1,1000,Running", "line 3, column tenant: empty"),
    ],
)
def test_it_names_the_line_and_column_of_a_bad_row(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "pod-1,tenant-1,LS,0,100,1,1000,Running\n" + row + "\n")
    with pytest.raises(ValueError, match=message):
        load_trace(path)


def test_it_names_missing_columns(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("job_id,tenant,qos,submit_time_s\npod-1,tenant-1,LS,0\n")
    with pytest.raises(ValueError, match="missing column.*duration_s, num_gpus, gpu_milli"):
        load_trace(path)


@pytest.mark.parametrize(
    ("qos", "task_class", "priority", "preemptible"),
    [
        ("LS", ONLINE, 90, False),
        ("BE", BATCH, 10, True),
        ("Burstable", BATCH, 50, True),
        ("Guaranteed", BATCH, 50, True),
    ],
)
def test_it_maps_qos_to_class_priority_and_preemptibility(
    qos: str, task_class: str, priority: int, preemptible: bool
) -> None:
    recorder = Recorder(first_fit)
    simulate(
        [job("a", 0, 10, qos=qos), job("b", 5, 10, qos=qos)],
        nodes=1,
        gpus_per_node=1,
        gpu_memory_mb=MEM,
        policy=recorder,
    )
    at_5 = recorder.snapshots[1]
    (waiting,) = at_5.pending
    assert (waiting.task_class, waiting.priority) == (task_class, priority)
    (running,) = at_5.running
    assert (running.task_class, running.priority, running.preemptible) == (
        task_class,
        priority,
        preemptible,
    )


def test_a_fractional_job_asks_for_its_share_of_one_gpus_memory() -> None:
    assert job("a", 0, 1, milli=250).gpu_memory_mb(24576) == 6144
    assert job("a", 0, 1, milli=333).gpu_memory_mb(24576) == 333 * 24576 // 1000
    assert job("a", 0, 1, milli=1000).gpu_memory_mb(24576) is None
    assert job("a", 0, 1, gpus=4, milli=500).gpu_memory_mb(24576) is None  # whole GPUs

    recorder = Recorder(first_fit)
    simulate(
        [job("a", 0, 10, milli=250), job("b", 0, 10, gpus=2)],
        nodes=1,
        gpus_per_node=2,
        gpu_memory_mb=24576,
        policy=recorder,
    )
    a, b = recorder.snapshots[0].pending
    assert (a.gpu_memory_mb, a.exclusive, a.gpus_min, a.gpus_max) == (6144, False, 1, 1)
    assert (b.gpu_memory_mb, b.exclusive, b.gpus_min, b.gpus_max) == (None, True, 2, 2)


# --- the simulation -------------------------------------------------------------------------


def five_jobs() -> list[TraceJob]:
    # One node with two GPUs. Worked out by hand with first fit in submit order:
    #   a: 2 GPUs, runs 0-100.
    #   b, c, d queue behind it; at 100 b takes GPU 0 whole (100-150), c and d (half a card
    #   each) share GPU 1 (100-130 and 100-140).
    #   e: 2 GPUs at 200 on an idle cluster, 200-210.
    return [
        job("a", 0, 100, gpus=2),
        job("b", 10, 50),
        job("c", 20, 30, milli=500, tenant="tenant-2"),
        job("d", 30, 40, milli=500, tenant="tenant-2"),
        job("e", 200, 10, gpus=2),
    ]


def test_it_replays_five_jobs_with_hand_computed_jcts_and_waits() -> None:
    recorder = Recorder(first_fit)
    result = simulate(five_jobs(), nodes=1, gpus_per_node=2, gpu_memory_mb=MEM, policy=recorder)
    by_id = {r.job_id: r for r in result.records}
    assert {k: (r.first_start_s, r.end_s) for k, r in by_id.items()} == {
        "a": (0, 100),
        "b": (100, 150),
        "c": (100, 130),
        "d": (100, 140),
        "e": (200, 210),
    }
    assert {k: r.jct_s for k, r in by_id.items()} == {
        "a": 100,
        "b": 140,
        "c": 110,
        "d": 110,
        "e": 10,
    }
    assert {k: r.wait_s for k, r in by_id.items()} == {"a": 0, "b": 90, "c": 80, "d": 70, "e": 0}
    # The policy runs after each instant with events: 0, 10, 20, 30, 100, 130, 140, 150, 200, 210.
    assert [s.now for s in recorder.snapshots] == [0, 10, 20, 30, 100, 130, 140, 150, 200, 210]
    assert result.timeline == [
        (0, 2.0),
        (10, 2.0),
        (20, 2.0),
        (30, 2.0),
        (100, 2.0),
        (130, 1.5),
        (140, 1.0),
        (150, 0.0),
        (200, 2.0),
        (210, 0.0),
    ]


def test_the_policy_never_sees_durations_and_sees_original_submit_times() -> None:
    recorder = Recorder(first_fit)
    simulate(five_jobs(), nodes=1, gpus_per_node=2, gpu_memory_mb=MEM, policy=recorder)
    at_100 = next(s for s in recorder.snapshots if s.now == 100)
    assert [(p.id, p.submitted_at) for p in at_100.pending] == [(2, 10), (3, 20), (4, 30)]
    at_130 = next(s for s in recorder.snapshots if s.now == 130)
    assert {r.id: (r.started_at, r.timeout_s) for r in at_130.running} == {
        2: (100, None),
        4: (100, None),
    }
    shared = {g.id: (g.holders, g.reserved_mb, g.exclusive) for g in at_130.gpus}
    assert shared == {0: (1, MEM, True), 1: (1, MEM // 2, False)}


def test_tenant_usage_decays_with_the_half_life() -> None:
    half_life = 1000.0
    recorder = Recorder(first_fit)
    simulate(
        [
            job("long", 0, 10 * half_life, gpus=2, tenant="tenant-1"),
            job("probe", half_life, 1, milli=100, tenant="tenant-2"),
            job("probe2", 3 * half_life, 1, milli=100, tenant="tenant-2"),
        ],
        nodes=1,
        gpus_per_node=3,
        gpu_memory_mb=MEM,
        policy=recorder,
        half_life_s=half_life,
    )
    usage = {s.now: s.tenants["tenant-1"].recent_gpus for s in recorder.snapshots}
    # Two GPUs held since 0: average over the half-life window approaches 2 as 2 * (1 - 2^-t/h).
    assert usage[0] == 0
    assert usage[half_life] == pytest.approx(1.0)
    assert usage[3 * half_life] == pytest.approx(2 * (1 - 1 / 8))
    # tenant-2's probe held a tenth of a GPU for a second.
    probe = next(s for s in recorder.snapshots if s.now == half_life + 1)
    assert probe.tenants["tenant-2"].recent_gpus == pytest.approx(
        0.1 * math.log(2) / half_life, rel=1e-3
    )


def preempting(place_in_same_decision: bool):
    """Highest priority first; an online task that does not fit preempts the lowest batch one."""

    def policy(snapshot: Snapshot) -> Decision:
        ordered = sorted(snapshot.pending, key=lambda t: (-t.priority, t.submitted_at))
        decision = first_fit(
            Snapshot(snapshot.now, snapshot.gpus, snapshot.running, tuple(ordered))
        )
        for task_id in list(decision.waiting):
            task = next(t for t in ordered if t.id == task_id)
            victims = [r for r in snapshot.running if r.preemptible and r.priority < task.priority]
            if task.task_class != ONLINE or not victims:
                continue
            victim = min(victims, key=lambda r: r.priority)
            decision.preemptions.append(Preemption(victim.id, task.id, "online needs room"))
            if place_in_same_decision:
                decision.placements.append(Placement(task.id, victim.node, victim.gpus, True))
            break
        return decision

    return policy


@pytest.mark.parametrize("same_decision", [True, False])
def test_a_preempted_job_loses_its_progress_and_requeues(same_decision: bool) -> None:
    # One GPU. "batch" (BE) starts at 0 for 100 s; "online" (LS) arrives at 10 for 20 s and
    # preempts it. The batch job restarts from scratch at 30 and ends at 130.
    result = simulate(
        [job("batch", 0, 100, qos="BE"), job("online", 10, 20, qos="LS")],
        nodes=1,
        gpus_per_node=1,
        gpu_memory_mb=MEM,
        policy=preempting(same_decision),
    )
    batch, online = result.records
    assert (batch.first_start_s, batch.end_s, batch.preemptions) == (0, 130, 1)
    assert (batch.jct_s, batch.wait_s) == (130, 30)  # 20 s queued + 10 s of lost work
    assert (online.first_start_s, online.end_s, online.wait_s) == (10, 30, 0)
    summary = result.summary()
    assert summary["preemptions"] == 1
    assert result.preemption_log == [(10, "batch", "online", "online needs room")]
    assert summary["lost_gpu_hours"] == pytest.approx(10 / 3600)


def test_a_stale_completion_of_a_preempted_run_is_ignored() -> None:
    # The first run of "batch" would have ended at 100; it was preempted at 10 and restarted at
    # 30, so only the completion at 130 counts.
    result = simulate(
        [job("batch", 0, 100, qos="BE"), job("online", 10, 20, qos="LS")],
        nodes=1,
        gpus_per_node=1,
        gpu_memory_mb=MEM,
        policy=preempting(False),
    )
    assert [t for t, _ in result.timeline] == [0, 10, 30, 130]


# --- the decision checker -------------------------------------------------------------------


def gpu(gpu_id: int, node: str = "n1", **kwargs) -> GpuView:
    return GpuView(id=gpu_id, node=node, pool="default", gpu_type="sim", memory_mb=MEM, **kwargs)


def holder(**kwargs) -> RunningView:
    """Task 1, running exclusively on GPU 0 of node n1."""
    fields = {"id": 1, "tenant": "t", "node": "n1", "gpus": ((0, MEM),), "exclusive": True,
              "started_at": 0} | kwargs  # fmt: skip
    return RunningView(**fields)


def pending(task_id: int, gpus: int = 1, memory_mb: int | None = None) -> PendingView:
    return PendingView(
        id=task_id,
        tenant="t",
        priority=50,
        task_class=BATCH,
        submitted_at=0,
        gpus_min=gpus,
        gpus_max=gpus,
        gpu_memory_mb=memory_mb,
    )


def test_the_checker_catches_an_over_allocation() -> None:
    snapshot = Snapshot(
        now=5, gpus=(gpu(0, reserved_mb=20000, holders=1),), pending=(pending(1, memory_mb=8000),)
    )
    decision = Decision(placements=[Placement(1, "n1", ((0, 8000),), False)])
    with pytest.raises(PolicyViolation, match="no room on GPU 0: 8000 MiB asked, 4000 MiB free"):
        check_decision(snapshot, decision)


def test_the_checker_catches_two_placements_that_together_overfill_a_gpu() -> None:
    snapshot = Snapshot(
        now=0, gpus=(gpu(0),), pending=(pending(1, memory_mb=16000), pending(2, memory_mb=16000))
    )
    decision = Decision(
        placements=[
            Placement(1, "n1", ((0, 16000),), False),
            Placement(2, "n1", ((0, 16000),), False),
        ]
    )
    with pytest.raises(PolicyViolation, match="task 2.*no room on GPU 0"):
        check_decision(snapshot, decision)


@pytest.mark.parametrize(
    ("gpu_state", "task", "exclusive"),
    [
        # An exclusive task on a shared GPU.
        ({"reserved_mb": 1000, "holders": 1}, pending(1), True),
        # A shared task on a GPU held whole.
        ({"reserved_mb": MEM, "holders": 1, "exclusive": True}, pending(1, memory_mb=1000), False),
    ],
)
def test_the_checker_catches_an_exclusive_share(gpu_state: dict, task: PendingView, exclusive):
    snapshot = Snapshot(now=0, gpus=(gpu(0, **gpu_state),), pending=(task,))
    mb = MEM if exclusive else 1000
    decision = Decision(placements=[Placement(1, "n1", ((0, mb),), exclusive)])
    with pytest.raises(PolicyViolation, match="GPU 0"):
        check_decision(snapshot, decision)


def test_the_checker_catches_a_task_split_across_nodes() -> None:
    snapshot = Snapshot(now=0, gpus=(gpu(0, "n1"), gpu(1, "n2")), pending=(pending(1, gpus=2),))
    decision = Decision(placements=[Placement(1, "n1", ((0, MEM), (1, MEM)), True)])
    with pytest.raises(PolicyViolation, match="all GPUs of a task must be on one node"):
        check_decision(snapshot, decision)


def test_the_checker_catches_placing_a_task_that_is_not_pending() -> None:
    snapshot = Snapshot(now=0, gpus=(gpu(0),), pending=())
    decision = Decision(placements=[Placement(7, "n1", ((0, MEM),), True)])
    with pytest.raises(PolicyViolation, match="task 7.*not pending"):
        check_decision(snapshot, decision)


def test_the_checker_catches_preempting_an_online_task() -> None:
    running = holder(priority=90, task_class=ONLINE, preemptible=False)
    snapshot = Snapshot(
        now=0,
        gpus=(gpu(0, reserved_mb=MEM, holders=1, exclusive=True),),
        running=(running,),
        pending=(pending(2),),
    )
    decision = Decision(preemptions=[Preemption(1, 2, "greedy")])
    with pytest.raises(PolicyViolation, match="not preemptible"):
        check_decision(snapshot, decision)


SHARES = {ONLINE: 0.3, BATCH: 0.7}  # on 4 GPUs: online is guaranteed 1, batch 3


def services(count: int) -> tuple[RunningView, ...]:
    """Online services, not preemptible, on GPUs 0.. of node n1."""
    return tuple(
        holder(id=i + 1, priority=90, task_class=ONLINE, preemptible=False, gpus=((i, MEM),))
        for i in range(count)
    )


def test_the_checker_lets_batch_take_back_what_services_borrowed() -> None:
    snapshot = Snapshot(
        now=0,
        gpus=tuple(gpu(i, reserved_mb=MEM, holders=1, exclusive=True) for i in range(4)),
        running=services(4),
        pending=(pending(9),),
    )
    check_decision(snapshot, Decision(preemptions=[Preemption(4, 9, "reclaim")]), SHARES)
    three = Decision(preemptions=[Preemption(i, 9, "reclaim") for i in (2, 3, 4)])
    check_decision(snapshot, three, SHARES)  # online keeps its guaranteed GPU
    four = Decision(preemptions=[Preemption(i, 9, "reclaim") for i in (1, 2, 3, 4)])
    with pytest.raises(PolicyViolation, match="leaving online 0 GPUs.*guaranteed 1"):
        check_decision(snapshot, four, SHARES)


def test_the_checker_frees_a_victims_gpus_for_placements_in_the_same_decision() -> None:
    running = holder(priority=10, task_class=BATCH, preemptible=True)
    snapshot = Snapshot(
        now=0,
        gpus=(gpu(0, reserved_mb=MEM, holders=1, exclusive=True),),
        running=(running,),
        pending=(pending(2),),
    )
    check_decision(
        snapshot,
        Decision(
            placements=[Placement(2, "n1", ((0, MEM),), True)],
            preemptions=[Preemption(1, 2, "priority")],
        ),
    )


def test_batch_gets_its_guarantee_back_from_services_at_reclaim_after() -> None:
    """The scenario of issue 10: four services on four GPUs, then a batch job. It starts when
    it may reclaim (the replay wakes the policy then: nothing ends or arrives for a day), and
    online keeps its guaranteed GPU."""
    reclaim = PolicySettings().reclaim_after_s
    day = 86400.0
    jobs = [job(f"svc-{i}", i, day) for i in range(4)]
    jobs.append(job("batch", 10, 100, qos="BE"))
    ours = simulate(jobs, nodes=1, gpus_per_node=4, gpu_memory_mb=MEM)
    batch = ours.records[4]
    assert batch.first_start_s == 10 + reclaim
    assert ours.preemptions == 1  # one service from the three online borrowed
    assert all(r.end_s is not None for r in ours.records)

    fifo = simulate(jobs, nodes=1, gpus_per_node=4, gpu_memory_mb=MEM, policy="fifo")
    assert fifo.records[4].first_start_s == day  # without the guarantee: when one ends

    # The figure the replay reports for it: the longest a job waited within its class's share.
    assert ours.summary()["class_share_wait_max_s"] == {BATCH: reclaim, ONLINE: 0.0}
    assert fifo.summary()["class_share_wait_max_s"] == {BATCH: day - 10, ONLINE: 0.0}
    assert "longest wait within share, batch" in format_table(
        {"summaries": {"ours": ours.summary(), "fifo": fifo.summary()}}
    )


def test_a_replay_stops_when_the_policy_double_books_a_gpu() -> None:
    def greedy_on_gpu_zero(snapshot: Snapshot) -> Decision:
        return Decision(
            placements=[Placement(t.id, "node-1", ((0, MEM),), True) for t in snapshot.pending]
        )

    with pytest.raises(AssertionError, match="task 2 .*GPU 0 is held exclusively"):
        simulate(
            [job("a", 0, 10), job("b", 0, 10)],
            nodes=1,
            gpus_per_node=2,
            gpu_memory_mb=MEM,
            policy=greedy_on_gpu_zero,
        )


def test_a_replay_stops_when_the_policy_preempts_forever() -> None:
    # Two batch jobs on one GPU that take turns preempting each other at the same instant.
    def ping_pong(snapshot: Snapshot) -> Decision:
        decision = Decision()
        for running in snapshot.running:
            waiting = snapshot.pending[0]
            decision.preemptions.append(Preemption(running.id, waiting.id, "my turn"))
            decision.placements.append(Placement(waiting.id, running.node, running.gpus, True))
            return decision
        return first_fit(snapshot)

    with pytest.raises(PolicyViolation, match="preempted on 50 passes in a row.*livelock"):
        simulate(
            [job("a", 0, 10, qos="BE"), job("b", 5, 10, qos="BE")],
            nodes=1,
            gpus_per_node=1,
            gpu_memory_mb=MEM,
            policy=ping_pong,
        )


def test_a_replay_stops_when_the_policy_never_places_a_job() -> None:
    def idle(snapshot: Snapshot) -> Decision:
        decision = Decision()
        decision.waiting.update((t.id, "no") for t in snapshot.pending)
        return decision

    with pytest.raises(PolicyViolation, match="left 2 job.*pending on an idle cluster"):
        simulate(
            [job("a", 0, 10), job("b", 5, 10)],
            nodes=1,
            gpus_per_node=1,
            gpu_memory_mb=MEM,
            policy=idle,
        )


def test_it_rejects_a_job_larger_than_a_node() -> None:
    with pytest.raises(ValueError, match="needs 8 GPUs on one node; nodes have 4"):
        simulate(
            [job("a", 0, 10, gpus=8)], nodes=4, gpus_per_node=4, gpu_memory_mb=MEM, policy=first_fit
        )


# --- metrics and reporting ------------------------------------------------------------------


def test_percentiles_take_the_value_at_rank_n_times_q() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([0.0, 10.0], 50) == 10.0
    # Of 2,000 values the p99 is the 1,981st, as in the reference replay.
    assert percentile([float(i) for i in range(2000)], 99) == 1980.0
    assert percentile([float(i) for i in range(2000)], 100) == 1999.0


def test_the_summary_of_five_jobs() -> None:
    summary = simulate(
        five_jobs(), nodes=1, gpus_per_node=2, gpu_memory_mb=MEM, policy=first_fit
    ).summary()
    assert summary["jobs"] == 5
    assert summary["avg_jct_s"] == pytest.approx((100 + 140 + 110 + 110 + 10) / 5)
    assert summary["p50_jct_s"] == 110
    assert summary["avg_wait_s"] == pytest.approx((0 + 90 + 80 + 70 + 0) / 5)
    assert summary["p50_wait_s"] == 70
    assert summary["max_wait_s"] == 90
    assert summary["p99_wait_s"] == 90
    assert summary["multi_gpu_jobs"] == 2
    assert summary["avg_multi_gpu_jct_s"] == pytest.approx(55)
    assert summary["avg_multi_gpu_wait_s"] == 0
    # Busy GPU-seconds: a 200, b 50, c 15, d 20, e 20 = 305 over 2 GPUs x 210 s.
    assert summary["makespan_s"] == 210
    assert summary["gpu_utilisation"] == pytest.approx(305 / 420)
    assert summary["preemptions"] == 0
    assert summary["tenant_gpu_share"] == pytest.approx(
        {"tenant-1": 270 / 305, "tenant-2": 35 / 305}
    )
    assert summary["policy_passes"] == 10
    assert summary["policy_time_max_s"] <= summary["policy_time_total_s"]


def fake_comparison() -> dict:
    return run_policies(five_jobs(), [first_fit], nodes=1, gpus_per_node=2, gpu_memory_mb=MEM)


def test_format_table_shows_seconds_as_integers() -> None:
    comparison = fake_comparison()
    both = {
        "summaries": {
            "ours": comparison["summaries"]["first_fit"],
            "fifo": {**comparison["summaries"]["first_fit"], "avg_jct_s": 188.0},
        },
        "ratios": {},
    }
    table = format_table(both)
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "ours", "fifo", "ours/fifo"]
    avg_jct = next(line for line in lines if line.startswith("avg JCT"))
    assert avg_jct.split()[-3:] == ["94s", "188s", "0.50x"]
    assert "GPU utilisation" in table
    assert "GPU-hours share tenant-2" in table
    single = format_table(comparison)
    assert single.splitlines()[0].split() == ["metric", "first_fit"]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "replay.png"
    plot(fake_comparison(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the management command -----------------------------------------------------------------


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.csv"
    path.write_text(
        HEADER
        + "pod-1,tenant-1,LS,0,100,2,1000,Running\n"
        + "pod-2,tenant-2,BE,10,50,1,500,Running\n"
        + "pod-3,tenant-1,Burstable,20,30,1,1000,Running\n"
    )
    return path


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--nodes", "4by8", "--nodes: expected <nodes>x<gpus per node>"),
        ("--nodes", "0x8", "--nodes: expected"),
        ("--gpu-memory", "24", "--gpu-memory: needs a unit"),
        ("--half-life", "soon", "--half-life: expected a duration"),
        ("--limit", "zero", "--limit: expected a whole number"),
        ("--policy", "lifo", "--policy: expected both, ours or fifo"),
    ],
)
def test_the_command_names_a_bad_option(tiny_trace: Path, option, value, message) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("replay", str(tiny_trace), option, value)


def test_the_command_names_a_bad_trace_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "pod-1,tenant-1,LS,0,100,x,1000,Running\n")
    with pytest.raises(CommandError, match="line 2, column num_gpus"):
        call_command("replay", str(path))


def test_the_command_says_when_a_job_cannot_fit_a_node(tiny_trace: Path) -> None:
    with pytest.raises(CommandError, match="needs 2 GPUs on one node"):
        call_command("replay", str(tiny_trace), "--nodes", "4x1", "--policy", "fifo")


@pytest.fixture
def fake_core(monkeypatch):
    """Stand-ins for the core's two entry points, so the command's output is known."""
    monkeypatch.setattr(
        "scheduling.policy.schedule", lambda snapshot, settings: first_fit(snapshot), raising=False
    )
    monkeypatch.setattr("scheduling.policy.schedule_fifo", first_fit, raising=False)


def test_the_command_prints_json(tiny_trace: Path, fake_core, capsys) -> None:
    call_command("replay", str(tiny_trace), "--nodes", "1x2", "--half-life", "1h", "--json")
    payload = json.loads(capsys.readouterr().out)
    assert payload["cluster"] == {
        "nodes": 1,
        "gpus_per_node": 2,
        "gpu_memory_mb": 24576,
        "half_life_s": 3600,
    }
    ours, fifo = payload["summaries"]["ours"], payload["summaries"]["fifo"]
    # pod-1 holds both GPUs 0-100; pod-2 and pod-3 start at 100: JCTs 100, 140, 110.
    assert ours["jobs"] == 3
    assert ours["avg_jct_s"] == pytest.approx((100 + 140 + 110) / 3)
    assert ours["max_wait_s"] == 90
    assert ours == fifo | {
        "policy_time_total_s": ours["policy_time_total_s"],
        "policy_time_max_s": ours["policy_time_max_s"],
    }
    assert payload["ratios"] == {"avg_jct_s": 1.0, "p99_wait_s": 1.0, "max_wait_s": 1.0}


def test_the_command_prints_a_table(tiny_trace: Path, fake_core, capsys, tmp_path) -> None:
    png = tmp_path / "out.png"
    call_command("replay", str(tiny_trace), "--nodes", "1x2", "--limit", "2", "--plot", str(png))
    out = capsys.readouterr().out
    assert "2 jobs on 1x2 GPUs of 24576 MiB" in out
    avg_jct = next(line for line in out.splitlines() if line.startswith("avg JCT"))
    # pod-1 0-100, pod-2 (half a card) waits until 100: JCTs 100 and 140.
    assert avg_jct.split()[-3:] == ["120s", "120s", "1.00x"]
    assert png.exists()


def test_the_command_runs_one_policy(tiny_trace: Path, fake_core, capsys) -> None:
    call_command("replay", str(tiny_trace), "--nodes", "1x2", "--policy", "fifo")
    header = capsys.readouterr().out.splitlines()[1]
    assert header.split() == ["metric", "fifo"]


# --- with the real policy core --------------------------------------------------------------
# These call scheduling.policy.schedule / schedule_fifo through policy="ours" / "fifo": the
# simulator checks every decision, so a rule the core breaks fails here.


def synthetic_trace(count: int, seed: int = 7) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs, now = [], 0.0
    for i in range(count):
        now += rng.expovariate(1 / 200)
        gpus = rng.choices([1, 2, 4, 8], weights=[90, 4, 3, 3])[0]
        milli = rng.choice([100, 250, 500, 1000, 1000]) if gpus == 1 else 1000
        jobs.append(
            job(
                f"job-{i}",
                round(now),
                rng.randint(30, 5000),
                gpus,
                milli,
                qos=rng.choices(["LS", "BE", "Burstable"], weights=[6, 4, 1])[0],
                tenant=f"tenant-{rng.randint(1, 4)}",
            )
        )
    return jobs


def test_the_real_policies_replay_a_trace_without_breaking_a_rule() -> None:
    comparison = compare(synthetic_trace(400), nodes=2, gpus_per_node=8, gpu_memory_mb=24576)
    for summary in comparison["summaries"].values():
        assert summary["jobs"] == 400
    assert set(comparison["ratios"]) == {"avg_jct_s", "p99_wait_s", "max_wait_s"}


def test_the_command_prints_json_and_a_table_with_the_real_core(tiny_trace: Path, capsys) -> None:
    call_command("replay", str(tiny_trace), "--nodes", "1x2", "--json")
    payload = json.loads(capsys.readouterr().out)
    assert set(payload["summaries"]) == {"ours", "fifo"}
    assert [s["jobs"] for s in payload["summaries"].values()] == [3, 3]


# --- the expected start, against the real one --------------------------------------------------


def test_the_report_gives_the_expected_starts_error_on_a_tiny_trace() -> None:
    # One GPU. a runs 0-100: the only history of tenant-1 (100 s) once it ends. x (tenant-2)
    # arrives while a runs, before anything ended: nothing to go by, its estimate is unknown.
    # b runs 200-300; c arrives at 250, told 300 (b's typical 100 s), starts at 300: error 0.
    # d arrives at 260 behind c, told 400 (c's typical 100 s too), starts at 350: error 50.
    jobs = [
        job("a", 0, 100),
        job("x", 10, 5, tenant="tenant-2"),
        job("b", 200, 100),
        job("c", 250, 50),
        job("d", 260, 10),
    ]
    comparison = compare(jobs, nodes=1, gpus_per_node=1, gpu_memory_mb=MEM)
    by_id = {r.job_id: r for r in comparison["results"]["ours"].records}
    assert {k: (r.forecast_basis, r.expected_start_s) for k, r in by_id.items()} == {
        "a": (None, None),  # started at once
        "x": ("unknown", None),
        "b": (None, None),
        "c": ("tenant", 300),
        "d": ("tenant", 400),
    }
    summary = comparison["summaries"]["ours"]
    assert (summary["forecast_jobs"], summary["forecast_unknown"]) == (3, 1)
    assert (summary["p50_forecast_error_s"], summary["p90_forecast_error_s"]) == (50, 50)
    table = format_table(comparison)
    assert "jobs that waited on arrival" in table
    assert re.search(r"expected start error p50\s+50s", table), table
    assert re.search(r"of them no estimate \(unknown, later\)\s+1\b", table), table
