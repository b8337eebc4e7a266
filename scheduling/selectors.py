"""Reads of the GPU estate and tasks."""

from __future__ import annotations

from django.db.models import Count, QuerySet

from scheduling.models import GPU, Node, Pool


def node_list() -> QuerySet[Node]:
    return Node.objects.select_related("pool").annotate(gpu_count=Count("gpus"))


def gpu_list() -> QuerySet[GPU]:
    return GPU.objects.select_related("node")


def pool_list() -> QuerySet[Pool]:
    return Pool.objects.annotate(
        node_count=Count("nodes", distinct=True), gpu_count=Count("nodes__gpus", distinct=True)
    )
