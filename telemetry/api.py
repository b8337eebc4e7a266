"""Metrics API under /api/v1/: a task's GPU history for its tenant; any GPU's, node's or
task's for operators; the newest sample of every GPU (``gpuctl top``); usage from samples."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform import query
from gpuplatform.api import IsOperator, IsTenantMember, request_tenant
from gpuplatform.query import INT_MAX, WholeNumber
from gpuplatform.units import parse_duration_s
from scheduling import selectors as scheduling_selectors
from scheduling.models import GPU, Node, Task
from telemetry import selectors


class Duration(serializers.CharField):
    """A length of time as ``gpuplatform.units`` reads it (90, 30s, 15m, 6h, 1h30m, 30d), in
    seconds, at most an integer's worth (68 years)."""

    def to_internal_value(self, data) -> int:
        try:
            seconds = parse_duration_s(super().to_internal_value(data), field="")
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        if seconds > INT_MAX:
            raise serializers.ValidationError(f"must be at most {INT_MAX} seconds, got {data!r}")
        return seconds


class Moment(serializers.DateTimeField):
    """An ISO 8601 date and time after the Unix epoch (the series count time from it)."""

    def to_internal_value(self, value) -> datetime:
        moment = super().to_internal_value(value)
        if moment < EPOCH:
            raise serializers.ValidationError(f"must be after {EPOCH.isoformat()}, got {value!r}")
        return moment


class RangeQuery(serializers.Serializer):
    """A metrics range: ``start`` to ``end`` read at ``step``; the defaults depend on what is
    asked about (a task's whole run, else the last hour), so they are applied by ``_range``."""

    start = Moment(required=False, help_text="ISO 8601; default: end minus since")
    end = Moment(required=False, help_text="ISO 8601; default: now")
    since = Duration(
        required=False,
        help_text="range length when start is omitted (15m, 6h, 30d); default 1h, or the "
        "task's whole run",
    )
    step = Duration(
        required=False,
        help_text="bucket width (1s, 1m, 1h); default: about 300 points. Under a minute reads "
        "raw samples, under an hour the 1-minute rollups, else the 1-hour rollups",
    )


MAX_USAGE_DAYS = 366
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

SeriesOut = inline_serializer(
    "MetricSeries",
    {
        "source": serializers.ChoiceField(choices=["raw", "1m", "1h"]),
        "step": serializers.IntegerField(help_text="seconds"),
        "start": serializers.DateTimeField(),
        "end": serializers.DateTimeField(),
        "columns": serializers.ListField(child=serializers.CharField()),
        "series": inline_serializer(
            "GpuSeries",
            {
                "gpu": serializers.CharField(help_text="UUID"),
                "index": serializers.IntegerField(),
                "node": serializers.CharField(),
                "values": serializers.ListField(
                    child=serializers.ListField(),
                    help_text="one list per entry of columns, aligned: the i-th point is "
                    "each list's i-th value",
                ),
            },
            many=True,
        ),
    },
)


def _range(request: Request, *, default_start: datetime | None = None,
           default_end: datetime | None = None) -> tuple[datetime, datetime, int]:  # fmt: skip
    asked = query.parse(RangeQuery, request.query_params)
    end = asked.get("end") or default_end or timezone.now()
    start = asked.get("start")
    if start is None:
        if "since" in asked or default_start is None:
            start = max(end - timedelta(seconds=asked.get("since", 3600)), EPOCH)
        else:
            start = default_start
    if start >= end:
        raise serializers.ValidationError({"start": ["must be before end"]})
    span = (end - start).total_seconds()
    step = asked["step"] if "step" in asked else max(1, math.ceil(span / 300))
    if span / step > selectors.MAX_POINTS:
        raise serializers.ValidationError({"step": [
            f"gives {math.ceil(span / step)} points per GPU; at most "
            f"{selectors.MAX_POINTS}: use a larger step or a shorter range"
        ]})  # fmt: skip
    return start, end, step


def _answer(request: Request, windows_for, **defaults) -> Response:
    start, end, step = _range(request, **defaults)
    data = selectors.series(windows=windows_for(start, end), start=start, end=end, step_s=step)
    return Response({**data, "start": start.isoformat(), "end": end.isoformat()})


def _task_answer(request: Request, task: Task) -> Response:
    windows = selectors.task_windows(task=task)
    return _answer(
        request,
        lambda start, end: windows,
        default_start=min((w.start for w in windows), default=None),
        default_end=(task.finished_at + timedelta(seconds=1)) if task.finished_at else None,
    )


class TaskMetrics(APIView):
    """Your task's GPUs while it held them: utilisation, memory, temperature, power."""

    permission_classes = [IsTenantMember]

    def tenant_object(self) -> Task:
        """The caller's task, or 404 whatever the method (gpuplatform.api.IsTenantMember)."""
        return selectors.task_metrics_get(
            tenant=request_tenant(self.request).tenant, pk=self.kwargs["pk"]
        )

    @extend_schema(parameters=[RangeQuery], responses=SeriesOut)
    def get(self, request: Request, pk: int) -> Response:
        return _task_answer(request, self.tenant_object())


class OperatorTaskMetrics(APIView):
    """Any tenant's task's GPU metrics (operators)."""

    permission_classes = [IsOperator]

    @extend_schema(parameters=[RangeQuery], responses=SeriesOut)
    def get(self, request: Request, pk: int) -> Response:
        return _task_answer(request, scheduling_selectors.task_get_any(pk=pk))


class GpuMetrics(APIView):
    """One GPU's metrics, whoever held it (operators)."""

    permission_classes = [IsOperator]

    @extend_schema(parameters=[RangeQuery], responses=SeriesOut)
    def get(self, request: Request, pk: int) -> Response:
        gpu = get_object_or_404(GPU, pk=pk)
        return _answer(
            request, lambda start, end: selectors.gpu_windows(gpus=[gpu], start=start, end=end)
        )


class NodeMetrics(APIView):
    """Every GPU of one node (operators)."""

    permission_classes = [IsOperator]

    @extend_schema(parameters=[RangeQuery], responses=SeriesOut)
    def get(self, request: Request, name: str) -> Response:
        node = get_object_or_404(Node, name=name)
        gpus = selectors.node_gpus(node=node)
        return _answer(
            request, lambda start, end: selectors.gpu_windows(gpus=gpus, start=start, end=end)
        )


LiveOut = inline_serializer(
    "GpuLive",
    {
        "node": serializers.CharField(),
        "index": serializers.IntegerField(),
        "uuid": serializers.CharField(),
        "model": serializers.CharField(),
        "state": serializers.CharField(),
        "sampled_at": serializers.DateTimeField(allow_null=True),
        "util_gpu": serializers.IntegerField(required=False, allow_null=True),
        "memory_used_mb": serializers.IntegerField(required=False, allow_null=True),
        "memory_total_mb": serializers.IntegerField(required=False, allow_null=True),
        "temperature_c": serializers.IntegerField(required=False, allow_null=True),
        "power_w": serializers.FloatField(required=False, allow_null=True),
        "simulated": serializers.BooleanField(required=False),
        "tenant": serializers.CharField(required=False, allow_null=True),
        "task": serializers.IntegerField(required=False, allow_null=True),
    },
    many=True,
)


class GpuLive(APIView):
    """Every GPU's newest sample (at most a minute old), with the task and tenant holding it
    where that is your tenant (other tenants' work shows as "another tenant")."""

    permission_classes = [IsTenantMember]

    @extend_schema(responses=LiveOut)
    def get(self, request: Request) -> Response:
        tenant = request_tenant(request).tenant
        return Response(selectors.latest_samples(tenant=tenant))


class OperatorGpuLive(APIView):
    """Every GPU's newest sample with every holder's task and tenant (operators)."""

    permission_classes = [IsOperator]

    @extend_schema(responses=LiveOut)
    def get(self, request: Request) -> Response:
        return Response(selectors.latest_samples(tenant=None))


UsageOut = inline_serializer(
    "SampledUsage",
    {
        "days": serializers.IntegerField(),
        "rows": inline_serializer(
            "SampledUsageRow",
            {
                "day": serializers.DateField(),
                "tenant": serializers.CharField(),
                "member": serializers.CharField(),
                "allocated_gpu_hours": serializers.FloatField(),
                "used_gpu_hours": serializers.FloatField(),
                "idle_gpu_hours": serializers.FloatField(),
            },
            many=True,
        ),
    },
)


class DaysQuery(serializers.Serializer):
    days = WholeNumber(minimum=1, maximum=MAX_USAGE_DAYS, default=30)


def _days(request: Request) -> int:
    return query.parse(DaysQuery, request.query_params)["days"]


class SampledUsage(APIView):
    """Your tenant's GPU-hours per day and member: held, actually used (weighted by
    utilisation) and idle while held, measured from the samples."""

    permission_classes = [IsTenantMember]

    @extend_schema(parameters=[DaysQuery], responses=UsageOut)
    def get(self, request: Request) -> Response:
        days = _days(request)
        tenant = request_tenant(request).tenant
        return Response(
            {"days": days, "rows": selectors.usage_from_samples(tenant=tenant, days=days)}
        )


class OperatorSampledUsage(APIView):
    """Every tenant's sampled GPU-hours per day and member (operators)."""

    permission_classes = [IsOperator]

    @extend_schema(parameters=[DaysQuery], responses=UsageOut)
    def get(self, request: Request) -> Response:
        days = _days(request)
        return Response(
            {"days": days, "rows": selectors.usage_from_samples(tenant=None, days=days)}
        )
