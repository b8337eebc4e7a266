"""Reads of the GPU estate and tasks."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from django.db.models import Count, QuerySet

from scheduling.models import GPU, Node, Pool, Task
from tenants.models import Tenant

# At most this many of a tenant's queue names are compared with a new one.
QUEUES_COMPARED = 1000


def node_list() -> QuerySet[Node]:
    return Node.objects.select_related("pool").annotate(gpu_count=Count("gpus"))


def gpu_list() -> QuerySet[GPU]:
    return GPU.objects.select_related("node")


def pool_list() -> QuerySet[Pool]:
    return Pool.objects.annotate(
        node_count=Count("nodes", distinct=True), gpu_count=Count("nodes__gpus", distinct=True)
    )


def queues_new_for_tenant(*, tenant: Tenant, names: Iterable[str]) -> dict[str, list[str]]:
    """Which of ``names`` no task of ``tenant`` has used yet, each with the tenant's queues it
    most resembles (what a misspelt ``queue:`` probably meant), closest first."""
    wanted = {name for name in names if name}
    if not wanted:
        return {}
    used = set(Task.objects.filter(tenant=tenant, queue__in=wanted).values_list("queue", flat=True))
    new = sorted(wanted - used)
    if not new:
        return {}
    known = list(
        Task.objects.filter(tenant=tenant)
        .exclude(queue="")
        .order_by("queue")
        .values_list("queue", flat=True)
        .distinct()[:QUEUES_COMPARED]
    )
    return {name: difflib.get_close_matches(name, known, n=3, cutoff=0.6) for name in new}
