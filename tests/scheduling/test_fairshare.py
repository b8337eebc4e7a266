"""Decayed fair-share usage as counters equals the full scan of the history it replaces."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling import fairshare
from scheduling.models import Allocation, SchedulerState, TenantUsage
from tests.factories import TaskFactory, TenantFactory

HALF_LIFE = 3600.0


def record_history(gpus, tenants, now, rng: random.Random, count: int = 300) -> None:
    """Finished allocations in every way the platform makes them: inserted already released
    (bulk), released later by an UPDATE, released out of time order; and a few still open.

    The capacity trigger is off while the history is written (these allocations overlap in
    time on four GPUs as they would on a large estate); the test's rollback turns it back on."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE scheduling_allocation DISABLE TRIGGER USER")
        cursor.execute(
            "ALTER TABLE scheduling_allocation ENABLE TRIGGER scheduling_allocation_released"
        )
        cursor.execute(
            "ALTER TABLE scheduling_allocation "
            "ENABLE TRIGGER scheduling_allocation_inserted_released"
        )
    later = []
    for i in range(count):
        gpu = rng.choice(gpus)
        started = now - timedelta(seconds=rng.uniform(60, 12 * HALF_LIFE))
        released = min(
            started + timedelta(seconds=rng.uniform(1, 3 * HALF_LIFE)),
            now - timedelta(seconds=1),
        )
        exclusive = rng.random() < 0.5
        row = Allocation.objects.create(
            task=TaskFactory(tenant=rng.choice(tenants)),
            attempt=1,
            gpu=gpu,
            memory_mb=gpu.memory_mb if exclusive else rng.randint(1024, gpu.memory_mb),
            exclusive=exclusive,
            started_at=started,
            released_at=released if i % 3 == 0 else None,
        )
        if row.released_at is None:
            later.append((row.pk, released))
    rng.shuffle(later)  # released in an order unrelated to their times
    for pk, released in later[:-4]:  # four stay running
        Allocation.objects.filter(pk=pk).update(released_at=released)
    committed()


def committed() -> None:
    """The counters as a commit leaves them: their triggers run at the commit (migration
    0019), and the test's transaction never commits."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


@pytest.fixture
def estate(workstation):
    return list(workstation.gpus.order_by("index")), [
        TenantFactory(name="vision-lab"),
        TenantFactory(name="nlp-lab"),
        TenantFactory(name="speech-lab"),
    ]


def test_the_counters_equal_a_scan_of_the_whole_history(estate):
    gpus, tenants = estate
    now = timezone.now()
    fairshare.keep_counters_for(now - timedelta(days=2), HALF_LIFE)  # kept before the history
    record_history(gpus, tenants, now, random.Random(7))
    kept = fairshare.usage(now, HALF_LIFE)
    scanned = fairshare.usage_by_scan(now, HALF_LIFE)
    assert set(kept) == set(scanned) == {t.pk for t in tenants}
    for tenant_id, value in scanned.items():
        assert kept[tenant_id] == pytest.approx(value, rel=1e-9, abs=1e-12)
    assert TenantUsage.objects.count() == 3


def test_a_new_half_life_rebuilds_the_counters_once(estate):
    gpus, tenants = estate
    now = timezone.now()
    record_history(gpus, tenants, now, random.Random(11))
    assert fairshare.keep_counters_for(now, 2 * HALF_LIFE)
    assert not fairshare.keep_counters_for(now, 2 * HALF_LIFE)
    assert SchedulerState.objects.get(pk=1).fair_share_half_life_s == 2 * HALF_LIFE
    later = now + timedelta(minutes=30)
    kept = fairshare.usage(later, 2 * HALF_LIFE)
    for tenant_id, value in fairshare.usage_by_scan(later, 2 * HALF_LIFE).items():
        assert kept[tenant_id] == pytest.approx(value, rel=1e-9, abs=1e-12)
    # Asked for another half-life than the counters keep, it answers from the scan.
    assert fairshare.usage(later, HALF_LIFE) == fairshare.usage_by_scan(later, HALF_LIFE)


def test_reading_the_counters_does_not_read_the_history(estate):
    gpus, tenants = estate
    now = timezone.now()
    fairshare.keep_counters_for(now - timedelta(days=2), HALF_LIFE)
    record_history(gpus, tenants, now, random.Random(3))
    with CaptureQueriesContext(connection) as queries:
        fairshare.usage(now, HALF_LIFE)
    history = [q["sql"] for q in queries if "released_at IS NOT NULL" in q["sql"]]
    assert len(queries) == 3 and not history
    assert all("released_at >" not in q["sql"] for q in queries)


def test_an_allocation_deleted_before_the_commit_that_released_it_is_not_counted(estate):
    gpus, tenants = estate
    now = timezone.now()
    fairshare.keep_counters_for(now - timedelta(days=2), HALF_LIFE)
    task = TaskFactory(tenant=tenants[0])
    allocation = Allocation.objects.create(
        task=task, attempt=1, gpu=gpus[0], memory_mb=gpus[0].memory_mb,
        started_at=now - timedelta(hours=1),
    )  # fmt: skip
    Allocation.objects.filter(pk=allocation.pk).update(released_at=now)
    task.delete()  # its allocations with it, in the same transaction
    committed()  # the counters' triggers run now, as at a commit, and find them gone
    assert not TenantUsage.objects.filter(tenant=tenants[0]).exists()
    assert fairshare.usage_by_scan(now, HALF_LIFE) == {}


def test_counters_kept_per_node_add_up_to_the_scan(estate):
    from tests.factories import NodeFactory, make_gpus

    gpus, tenants = estate
    gpus += make_gpus(NodeFactory(name="ws-2"), count=4)
    now = timezone.now()
    fairshare.keep_counters_for(now - timedelta(days=2), HALF_LIFE)
    record_history(gpus, tenants, now, random.Random(5))
    kept = fairshare.usage(now, HALF_LIFE)
    for tenant_id, value in fairshare.usage_by_scan(now, HALF_LIFE).items():
        assert kept[tenant_id] == pytest.approx(value, rel=1e-9, abs=1e-12)
    shards = set(TenantUsage.objects.values_list("tenant", "shard"))
    assert shards == {(t.pk, g.node_id) for t in tenants for g in (gpus[0], gpus[-1])}
    # Rebuilt from the history (a new half-life), the rows are the same per tenant and node.
    assert fairshare.keep_counters_for(now, 2 * HALF_LIFE)
    assert set(TenantUsage.objects.values_list("tenant", "shard")) == shards
