"""What a pass reads: the snapshot of GPUs, running and pending tasks and tenants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduling.models import Node
from scheduling.policy.model import GpuView, Limits, PendingView, RunningView
from scheduling.snapshot import build_snapshot
from tests.factories import (
    AllocationFactory,
    NodeFactory,
    PoolFactory,
    QuotaFactory,
    TaskFactory,
    TenantFactory,
    make_gpus,
)
from tests.plans import rows_visited

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_the_snapshot_holds_every_field_the_policy_reads():
    big = PoolFactory(name="big")
    a100 = NodeFactory(name="b-a100", pool=big)
    plain = NodeFactory(name="a-plain", pool=PoolFactory(name="default"), state="draining")
    g0, g1, g2 = make_gpus(a100, count=3, memory_mb=40960)
    g1.foreign_memory_mb = 512
    g1.save()
    g2.state = "offline"
    g2.save()
    (p0,) = make_gpus(plain, count=1)
    vision, nlp = TenantFactory(name="vision"), TenantFactory(name="nlp")
    QuotaFactory(tenant=vision, max_gpus=6, max_running_tasks=3, fair_share_weight=2.0)
    QuotaFactory(tenant=vision, pool=big, max_gpus=2, max_gpu_memory_mb=None)

    started = NOW - timedelta(hours=1)
    submitted = started - timedelta(minutes=5)
    running = TaskFactory(tenant=vision, state="running", node=a100, priority=70,
                          task_class="online", preemptible=False, queue="q", timeout_s=7200,
                          submitted_at=submitted, started_at=started)  # fmt: skip
    AllocationFactory(task=running, gpu=g0, memory_mb=40960, exclusive=True, started_at=started)
    shared = TaskFactory(tenant=nlp, state="preempted", node=a100,
                         submitted_at=started, scheduled_at=started)  # fmt: skip
    AllocationFactory(task=shared, gpu=g1, memory_mb=4096, started_at=started)
    AllocationFactory(task=shared, gpu=p0, memory_mb=2048, started_at=started - timedelta(1))
    AllocationFactory(task=shared, gpu=p0, memory_mb=1024, started_at=started,
                      released_at=started)  # fmt: skip
    placed = TaskFactory(tenant=nlp, state="scheduled", node=plain, submitted_at=started)
    dep = TaskFactory(tenant=vision, name="prep", state="running", submitted_at=started)
    pending = TaskFactory(tenant=vision, state="pending", priority=90, task_class="online",
                          gpus_min=2, gpus_max=4, gpu_memory_mb=8192, gpu_type="a100",
                          pool=big, required_node="b-a100", queue="q", timeout_s=60,
                          submitted_at=NOW - timedelta(seconds=30),
                          not_before=NOW + timedelta(seconds=10))  # fmt: skip
    pending.depends_on.add(dep)
    held = TaskFactory(tenant=nlp, state="pending", hold_reason="held by an operator",
                       submitted_at=NOW)  # fmt: skip
    digests: dict[int, int] = {}

    snapshot = build_snapshot(NOW, digests)

    assert snapshot.now == NOW.timestamp()
    assert snapshot.gpus == (
        GpuView(id=p0.pk, node="a-plain", pool="default", gpu_type="rtx4090-24g",
                memory_mb=24576, reserved_mb=2048, holders=1, schedulable=False),
        GpuView(id=g0.pk, node="b-a100", pool="big", gpu_type="rtx4090-24g",
                memory_mb=40960, reserved_mb=40960, holders=1, exclusive=True),
        GpuView(id=g1.pk, node="b-a100", pool="big", gpu_type="rtx4090-24g",
                memory_mb=40960, reserved_mb=4096, foreign_mb=512, holders=1),
    )  # fmt: skip
    by_id = {view.id: view for view in snapshot.running}
    assert [view.id for view in snapshot.running] == sorted(by_id, reverse=True)
    assert by_id[running.pk] == RunningView(
        id=running.pk, tenant="vision", priority=70, task_class="online", preemptible=False,
        node="b-a100", gpus=((g0.pk, 40960),), exclusive=True, started_at=started.timestamp(),
        timeout_s=7200, queue="q", submitted_at=submitted.timestamp(),
    )  # fmt: skip
    assert by_id[shared.pk].gpus == ((g1.pk, 4096), (p0.pk, 2048)), "latest first, open only"
    assert by_id[shared.pk].stopping and not by_id[shared.pk].exclusive
    assert by_id[shared.pk].started_at == started.timestamp(), "scheduled_at when not started"
    assert by_id[placed.pk].gpus == () and by_id[placed.pk].exclusive
    assert by_id[placed.pk].started_at == NOW.timestamp(), "now when neither is set"
    assert by_id[placed.pk].node == "a-plain" and by_id[dep.pk].node == ""

    assert {view.id: view for view in snapshot.pending} == {
        pending.pk: PendingView(
            id=pending.pk, tenant="vision", priority=90, task_class="online",
            submitted_at=(NOW - timedelta(seconds=30)).timestamp(), gpus_min=2, gpus_max=4,
            gpu_memory_mb=8192, gpu_type="a100", pool="big", node="b-a100", queue="q",
            timeout_s=60, not_before=(NOW + timedelta(seconds=10)).timestamp(),
            blocked=f"waiting for prep (#{dep.pk}, running)", blocked_code="dependencies",
        ),
        held.pk: PendingView(
            id=held.pk, tenant="nlp", priority=held.priority, task_class="batch",
            submitted_at=NOW.timestamp(), blocked="held by an operator", blocked_code="held",
        ),
    }  # fmt: skip
    assert set(digests) == {pending.pk, held.pk}

    assert list(snapshot.tenants) == ["nlp", "vision"], "by name"
    assert snapshot.tenants["vision"].weight == 2.0
    assert snapshot.tenants["vision"].limits == Limits(gpus=6, running_tasks=3)
    assert snapshot.tenants["vision"].pool_limits == {"big": Limits(gpus=2)}
    assert snapshot.tenants["nlp"].weight == 1.0 and snapshot.tenants["nlp"].limits == Limits()
    assert snapshot.tenants["nlp"].recent_gpus > 0, "it holds GPUs now"
    assert Node.objects.count() == 2


def test_a_pass_reads_the_active_tasks_not_the_finished_history():
    """The reads of a pass that touch tasks and allocations (its dependency links, the running
    tasks with their open allocations) visit rows in proportion to the active tasks, whatever
    the finished history. With one pending dependency and a never-analysed dependency table,
    the links' plain join hashed every task not succeeded (all of them here), failing. The
    running tasks' read, given its states as a parameter, was as a prepared statement's generic
    plan a scan of the whole task table; the misplan its join removes (a per-task subquery
    walking every open allocation, under stale statistics of a partial index) does not show on
    a fresh test database."""
    from django.db import connection

    from scheduling.models import Allocation, Task
    from scheduling.snapshot import _RUNNING
    from scheduling.snapshot import LINKS as _LINKS

    node = NodeFactory(name="n")
    gpus = make_gpus(node, count=8)
    lab = TenantFactory(name="lab")
    Task.objects.bulk_create(
        Task(tenant=lab, name=f"old-{i}", command="true", state=("failed", "cancelled")[i % 2])
        for i in range(3_000)
    )  # fmt: skip
    running = [TaskFactory(tenant=lab, state="running", node=node, started_at=NOW)
               for _ in gpus]  # fmt: skip
    Allocation.objects.bulk_create(
        Allocation(task=task, attempt=1, gpu=gpu, memory_mb=1024, exclusive=True, started_at=NOW)
        for task, gpu in zip(running, gpus, strict=True)
    )
    # A few percent of the table, as where there is history: with a quarter of it pending
    # (1,000 of 4,010), reading the whole table was a plan as cheap as the state index's, and
    # one full `make test` in three took it (4,010 rows), likely by how earlier tests left pages.
    Task.objects.bulk_create(
        Task(tenant=lab, name=f"wait-{i}", command="true", state="pending") for i in range(100)
    )
    TaskFactory(tenant=lab, state="pending", name="after").depends_on.add(running[0])
    active = 101 + len(running)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduling_task")  # as autovacuum would; the links never were
    tables = ["scheduling_task", "scheduling_allocation"]
    for sql, params in ((_LINKS, None), (_RUNNING, {"now": NOW})):
        assert rows_visited(sql, params, tables) <= 2 * active, sql
    # Prepared after its fifth run, a statement may get a generic plan: with the states passed
    # as a parameter, the running tasks' read scanned the whole task table (4,017 rows here).
    assert rows_visited(_RUNNING, {"now": NOW}, tables, generic=True) <= 2 * active


def test_a_node_silent_past_offline_after_is_offline_to_the_pass_before_it_is_marked():
    """Its row still says available until the every-minute schedule marks it; the pass
    already places nothing there."""
    silent = NodeFactory(name="silent", last_heartbeat=NOW - timedelta(seconds=31))
    beating = NodeFactory(name="beating", last_heartbeat=NOW - timedelta(seconds=5))
    never = NodeFactory(name="never", last_heartbeat=None)  # registered, no heartbeat yet
    for node in (silent, beating, never):
        make_gpus(node, count=1)

    snapshot = build_snapshot(NOW)

    assert Node.objects.get(name="silent").state == "available"
    assert {gpu.node: gpu.schedulable for gpu in snapshot.gpus} == {
        "silent": False, "beating": True, "never": True,
    }  # fmt: skip
