"""A backlog under quotas goes the bulk way, as an unlimited tenant's does: a pass lists the
tasks of a tenant at its quota as swaps, the node agents' hand-offs give them the GPUs their own
tenant's ended tasks free, and a handful of passes places the whole backlog, no quota ever
exceeded. Counted, not timed: the passes that placed something, and what each tenant holds
after every commit."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import Sum

from gpuplatform.procid import ProcessId
from nodeagent.launcher import lifecycle
from scheduling import controls, passes, quotas, scheduler
from scheduling.agentapi import handoff, reports
from scheduling.agentapi.messages import ExitReport, StartReport
from scheduling.models import Allocation, Successor, Task, TaskAttempt
from scheduling.shares import CardShare
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tenants.models import Quota
from tests.factories import NodeFactory, TenantFactory, make_gpus

GONE = ProcessId(4_194_303, 0.0)  # no such process: the fixture's clean-up kills nothing
NODES, PER_NODE = 4, 8
BACKLOG = 300
# Placing passes allowed for the whole backlog. The list asks for the next pass once half of
# it is taken, so a backlog that drains takes about log2(backlog / list) + a few; one pass per
# hand-off batch, as before swaps, would be BACKLOG / PER_NODE.
HANDFUL = 12


class Estate:
    """Four nodes of eight simulated GPUs where nothing really starts: the passes' launches
    are dropped and their attempts recorded by hand; every task ends with 0 as soon as it
    runs, through its node agent's hand-off (``reports.attempts_finished``), a node at a time."""

    def __init__(self, monkeypatch) -> None:
        self.nodes = [NodeFactory(name=f"node-{n}") for n in range(NODES)]
        for node in self.nodes:
            make_gpus(node, count=PER_NODE)
        monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
        self.queued: list = []
        monkeypatch.setattr(passes, "async_task", lambda *a, **kw: self.queued.append(kw))
        self.passes = 0
        self.placing_passes = 0
        self.handed = 0
        self.limits: dict[int, int] = {}  # tenant id -> its quota of GPUs
        self.most: Counter = Counter()  # tenant id -> the most GPUs it was seen holding
        self.shared = 0  # tasks handed on to share a GPU

    def run_pass(self) -> None:
        self.queued.clear()
        placed = scheduler.schedule_pass().placed
        self.passes += 1
        self.check()
        if not placed:
            return
        self.placing_passes += 1
        attempts = [
            TaskAttempt.objects.create(
                task=task, number=task.attempt, node=task.node, gpu_uuids=[], log_path=""
            )
            for task in Task.objects.filter(pk__in=placed)
        ]
        reports.attempts_started([StartReport(a.pk, GONE, GONE) for a in attempts])

    def end_running(self, node) -> None:
        ended = list(Task.objects.filter(node=node, state=TaskState.RUNNING))
        if not ended:
            return
        hand = handoff.HandOff(node.name, launcher=lifecycle)
        reports.attempts_finished([ExitReport(t.pk, t.attempt, 0) for t in ended], hand_off=hand)
        self.check()
        self.handed += len(hand.rest)
        self.shared += Allocation.objects.filter(
            task__in=[a.task_id for a in hand.rest], exclusive=False
        ).count()
        reports.attempts_started([StartReport(a.attempt_id, GONE, GONE) for a in hand.rest])

    def check(self) -> None:
        """No tenant holds more GPUs than its quota (a shared GPU counts its share), as
        committed now."""
        held = (
            Allocation.objects.filter(released_at__isnull=True)
            .values_list("task__tenant_id")
            .annotate(gpus=Sum(CardShare()))
        )
        for tenant_id, gpus in held:
            self.most[tenant_id] = max(self.most[tenant_id], round(gpus, 3))
            limit = self.limits.get(tenant_id)
            assert limit is None or gpus <= limit + 1e-9, f"tenant {tenant_id}: {gpus} > {limit}"

    def drain(self) -> None:
        """Ends node by node, each followed by a pass if one was asked for, until every task
        succeeded."""
        self.run_pass()
        for _ in range(10 * BACKLOG):
            if not Task.objects.exclude(state=TaskState.SUCCEEDED).exists():
                return
            if not Task.objects.filter(state=TaskState.RUNNING).exists():
                pytest.fail("tasks wait, none runs, and no pass was asked for")
            for node in self.nodes:
                self.end_running(node)
                if self.queued:
                    self.run_pass()
        pytest.fail("the backlog did not drain")


def backlog(tenant, count: int, mixed: bool = False) -> list[Task]:
    """``count`` tasks of one GPU; ``mixed``: every tenth of two GPUs and every tenth sharing
    a GPU by memory, as the throughput bench's tenants submit them."""

    def spec(i: int) -> TaskSpec:
        if mixed and i % 10 == 4:
            return TaskSpec(name=f"t{i}", command="true", gpus_min=2, gpus_max=2)
        if mixed and i % 10 == 9:
            return TaskSpec(name=f"t{i}", command="true", gpu_memory_mb=4096)
        return TaskSpec(name=f"t{i}", command="true")

    return [task_submit(tenant=tenant, spec=spec(i)) for i in range(count)]


@pytest.mark.parametrize(
    ("tenants", "quota", "mixed"),
    [
        (1, None, False),
        (1, NODES * PER_NODE, False),
        (4, NODES * PER_NODE // 4, False),
        (4, NODES * PER_NODE // 4, True),
    ],
    ids=[
        "one unlimited tenant",
        "one tenant under a 32-GPU quota",
        "four under 8-GPU quotas",
        "four under 8-GPU quotas, mixed sizes",
    ],
)
def test_a_quota_bound_backlog_is_placed_in_a_handful_of_passes(
    launcher, monkeypatch, tenants, quota, mixed
):
    estate = Estate(monkeypatch)
    labs = [TenantFactory(name=f"lab-{n}") for n in range(tenants)]
    for lab in labs:
        if quota is not None:
            Quota.objects.create(tenant=lab, max_gpus=quota)
            estate.limits[lab.pk] = quota
    for lab in labs:
        backlog(lab, BACKLOG // tenants, mixed)

    estate.drain()

    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == BACKLOG
    assert estate.placing_passes <= HANDFUL, (
        f"{estate.placing_passes} placing passes, {estate.handed} tasks handed on"
    )
    assert estate.handed > BACKLOG // 2, "most were handed on, not placed by passes"
    assert estate.shared or not mixed, "tasks sharing a GPU were handed on too"
    # Every tenant used all it may hold: a swap is not a GPU left idle.
    assert set(estate.most.values()) == {quota or NODES * PER_NODE}


def test_a_tenant_over_a_lowered_quota_starts_nothing_until_it_is_back_under(launcher, monkeypatch):
    estate = Estate(monkeypatch)
    lab = TenantFactory(name="lab")
    quota = Quota.objects.create(tenant=lab, max_gpus=NODES * PER_NODE)
    backlog(lab, 3 * NODES * PER_NODE)
    estate.run_pass()
    assert Successor.objects.filter(swap_tenant=lab.pk).count() == 2 * NODES * PER_NODE
    # Lowered below what it holds: its listed swaps go with the change, and passes list none
    # while it holds more than the new quota allows.
    quota.max_gpus = PER_NODE
    quotas.quota_set(quota=quota)
    assert not Successor.objects.exists()
    for node in estate.nodes[:2]:
        estate.end_running(node)
        estate.run_pass()
        assert not Successor.objects.exists()
    assert (estate.handed, estate.placing_passes) == (0, 1), "nothing started while over"
    estate.end_running(estate.nodes[2])  # eight left running: at its quota, so swaps again
    estate.run_pass()
    assert Successor.objects.filter(swap_tenant=lab.pk).count() == 2 * NODES * PER_NODE
    estate.end_running(estate.nodes[3])
    assert estate.handed == PER_NODE


@pytest.mark.parametrize(("running_tasks", "handed"), [(None, 2), (1, 1)],
                         ids=["a quota of GPUs", "a quota of GPUs and running tasks"])  # fmt: skip
def test_a_two_gpu_tasks_end_starts_two_one_gpu_tasks_of_its_tenant_at_its_quota(
    launcher, monkeypatch, running_tasks, handed
):
    """A tenant at its quota of GPUs whose two-GPU task ends: both GPUs go to its next
    one-GPU tasks in the same hand-off (it still holds two), not one of them to a pass later;
    one only where its quota also counts running tasks."""
    estate = Estate(monkeypatch)
    lab = TenantFactory(name="lab")
    Quota.objects.create(tenant=lab, max_gpus=2, max_running_tasks=running_tasks)
    estate.limits[lab.pk] = 2
    big = task_submit(tenant=lab, spec=TaskSpec(name="big", command="true", gpus_min=2, gpus_max=2))
    backlog(lab, 4)
    estate.run_pass()
    big.refresh_from_db()
    assert big.state == TaskState.RUNNING
    assert Successor.objects.filter(swap_tenant=lab.pk, one_for_one=running_tasks is not None)

    estate.end_running(big.node)

    assert estate.handed == handed
    running = Task.objects.filter(state=TaskState.RUNNING)
    assert running.count() == handed
    assert all(t.node_id == big.node_id for t in running)
