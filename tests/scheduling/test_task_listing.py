"""selectors.TaskListing (the task list's SQL) reads exactly the rows selectors.task_list (the
ORM's) reads for the same tenant and filters: the tenant is scoped the same way in both."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling import selectors
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def tasks(owner, outsider):
    now = timezone.now()
    for i in range(12):
        for actor in (owner, outsider):
            TaskFactory(
                tenant=actor.tenant,
                name=f"{'train' if i % 2 else 'eval'}-{i}%_",
                queue="sft" if i % 3 == 0 else "",
                state=["pending", "running", "succeeded"][i % 3],
                submitted_at=now - timedelta(hours=i),
            )
    return now


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"states": ["pending", "running"]},
        {"queue": "sft"},
        {"name_contains": "train"},
        {"name_contains": "%_"},  # LIKE's own characters, matched as text
        {"submitted_after": -5, "submitted_before": -1},
    ],
)
def test_the_sql_listing_reads_what_the_orm_reads(owner, tasks, filters):
    filters = {
        key: tasks + timedelta(hours=value) if key.startswith("submitted") else value
        for key, value in filters.items()
    }
    listing = selectors.TaskListing(tenant=owner.tenant, **filters)
    orm = selectors.task_list(tenant=owner.tenant)
    lookups = {
        "states": "state__in", "queue": "queue", "name_contains": "name__icontains",
        "submitted_after": "submitted_at__gte", "submitted_before": "submitted_at__lt",
    }  # fmt: skip
    orm = orm.filter(**{lookups[key]: value for key, value in filters.items()}).order_by("-id")
    expected = list(orm.values_list("id", flat=True))
    assert expected, filters
    assert [row[0] for row in listing[0:100]] == expected
    assert listing.count() == len(expected)


def test_the_listing_needs_its_tenant_by_name():
    with pytest.raises(TypeError):
        selectors.TaskListing(None)  # keyword only: a tenant is never passed by accident
