"""Reads of the GPU estate and tasks. Task reads take the tenant as a required keyword argument:
another tenant's task is simply not there (404), whoever calls."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from django.db.models import Count, Prefetch, QuerySet
from django.shortcuts import get_object_or_404

from scheduling.models import GPU, Allocation, Node, Pool, Task, TaskAttempt, TaskEvent
from tenants.models import Tenant

# At most this many of a tenant's queue names are compared with a new one.
QUEUES_COMPARED = 1000


def task_list(*, tenant: Tenant) -> QuerySet[Task]:
    return Task.objects.filter(tenant=tenant)


def task_get(*, tenant: Tenant, pk: int) -> Task:
    """The tenant's task, or 404."""
    return get_object_or_404(task_list(tenant=tenant), pk=pk)


def task_detail(*, tenant: Tenant, pk: int) -> Task:
    """The tenant's task with what its detail shows (node, pool, GPUs, attempts, dependencies)
    in a fixed number of queries, or 404."""
    allocations = Allocation.objects.select_related("gpu")
    attempts = Prefetch(
        "attempts", queryset=TaskAttempt.objects.select_related("node").order_by("number")
    )
    tasks = (
        task_list(tenant=tenant)
        .select_related("node", "owner", "pool")
        .prefetch_related(Prefetch("allocations", queryset=allocations), attempts, "depends_on")
    )
    return get_object_or_404(tasks, pk=pk)


def task_events(*, tenant: Tenant, pk: int) -> QuerySet[TaskEvent]:
    """The state changes of the tenant's task, oldest first; 404 for someone else's task."""
    task = task_get(tenant=tenant, pk=pk)
    return task.events.select_related("actor").order_by("at", "id")


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
