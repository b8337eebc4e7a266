"""Reads of the GPU estate and tasks."""

from __future__ import annotations

from django.db.models import Count, QuerySet

from scheduling.models import GPU, Node


def node_list() -> QuerySet[Node]:
    return Node.objects.select_related("pool").annotate(gpu_count=Count("gpus"))


def gpu_list() -> QuerySet[GPU]:
    return GPU.objects.select_related("node")
