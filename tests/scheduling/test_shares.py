"""One formula for the share of a card a task holds: the pure core's ``card_share`` and its SQL
twin in ``scheduling.shares`` (quota use, fair share, usage reports) agree."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from scheduling import snapshot, usage
from scheduling.models import Allocation
from scheduling.policy import card_share
from scheduling.policy.books import Books
from scheduling.shares import CardShare, allocation_share_sql
from tests.factories import AllocationFactory, NodeFactory, TaskFactory, TenantFactory, make_gpus

# (exclusive, reserved MiB, card MiB)
CASES = [
    (True, 24576, 24576),
    (True, 1024, 24576),  # exclusive counts the whole card, whatever it reserved
    (False, 8192, 24576),
    (False, 24576, 24576),
    (False, 30000, 81920),
    (False, 1, 81920),
]


@pytest.fixture
def held(db):
    """One running task per case, each on its own GPU, all of one tenant."""
    lab = TenantFactory(name="vision-lab")
    small = make_gpus(NodeFactory(name="small"), count=4, memory_mb=24576)
    big = make_gpus(NodeFactory(name="big"), count=2, memory_mb=81920)
    by_card = {24576: iter(small), 81920: iter(big)}
    rows = []
    for exclusive, memory_mb, card_mb in CASES:
        task = TaskFactory(tenant=lab, state="running")
        gpu = next(by_card[card_mb])
        rows.append(AllocationFactory(task=task, gpu=gpu, memory_mb=memory_mb, exclusive=exclusive))
    return lab, rows


def test_the_orm_expression_and_the_raw_sql_agree_with_the_core(held):
    _, rows = held
    expected = {
        a.pk: card_share(
            exclusive=a.exclusive, memory_mb=a.memory_mb, card_memory_mb=a.gpu.memory_mb
        )
        for a in rows
    }
    orm = dict(Allocation.objects.annotate(share=CardShare()).values_list("pk", "share"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT a.id, {allocation_share_sql('a', 'g')} FROM scheduling_allocation a "  # noqa: S608
            "JOIN scheduling_gpu g ON g.id = a.gpu_id"
        )
        raw = dict(cursor.fetchall())
    assert orm == pytest.approx(expected)
    assert raw == pytest.approx(expected)
    assert sorted(expected.values()) == pytest.approx(
        sorted([1.0, 1.0, 8192 / 24576, 1.0, 30000 / 81920, 1 / 81920])
    )


def test_quota_use_fair_share_and_the_policy_books_count_the_same_gpus(held):
    lab, rows = held
    books = Books(gpu_memory={a.gpu_id: a.gpu.memory_mb for a in rows}, gpu_pool={})
    for a in rows:
        books.charge(lab.name, "batch", ((a.gpu_id, a.memory_mb),), a.exclusive)
    policy_gpus = books.tenant[lab.name].gpus
    assert usage.quota_in_use(tenant=lab)["gpus"] == pytest.approx(policy_gpus, abs=1e-3)
    # Held for ever, decayed use tends to what is held: after 30 half-lives, it is that.
    Allocation.objects.update(started_at=timezone.now() - timedelta(hours=30))
    recent = snapshot.recent_gpus(timezone.now(), 3600, tenant_id=lab.pk)
    assert recent == {lab.pk: pytest.approx(policy_gpus, rel=1e-6)}
    hours = sum(d["gpu_hours"] for d in usage.usage_per_day(tenant=lab, days=3))
    assert hours == pytest.approx(policy_gpus * 30, rel=1e-3)
