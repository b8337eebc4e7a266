"""Prometheus exposition: GPU gauges under dcgm-exporter's names and labels (so Grafana's
DCGM dashboards work unchanged) plus ``tenant`` and ``task``, and the platform's own metrics.

Everything is read from PostgreSQL at scrape time by one Collector, so any web process answers
with the same numbers and nothing depends on which process did the work. The exception is
``gpuplatform_api_requests_total``, counted in the web process that served each request.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.db.models import Count, F
from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from scheduling.models import Allocation, SchedulerState, Task, TaskAttempt
from telemetry.models import GpuSample, XidRecord

# A GPU whose newest sample is older than this is not exported: its agent stopped sampling.
FRESH = timedelta(seconds=60)
DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "tenant", "task", "simulated"]
# (dcgm-exporter name, help, column, scale)
GPU_GAUGES = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_gpu", 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "util_memory", 1),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used_mb", 1),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c", 1),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", "power_limit_w", 1),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", "fan_pct", 1),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Volatile single-bit ECC errors.", "ecc_corrected", 1),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Volatile double-bit ECC errors.", "ecc_uncorrected", 1),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Throttle reasons bit mask.", "throttle_reasons", 1),
)
WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
LAUNCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)

API_REQUESTS = Counter(
    "gpuplatform_api_requests",
    "API requests served by this web process.",
    ["method", "status"],
    registry=None,
)

_LATEST_SQL = f"""
SELECT DISTINCT ON (s.gpu_id) s.gpu_id, g.index, g.uuid, g.model, n.name, t.name, s.task_id,
       s.simulated, s.util_gpu, s.util_memory, s.memory_used_mb, s.memory_total_mb,
       s.temperature_c, s.power_w, s.power_limit_w, s.sm_clock_mhz, s.fan_pct,
       s.ecc_corrected, s.ecc_uncorrected, s.throttle_reasons
FROM {GpuSample._meta.db_table} s
JOIN scheduling_gpu g ON g.id = s.gpu_id
JOIN scheduling_node n ON n.id = g.node_id
LEFT JOIN tenants_tenant t ON t.id = s.tenant_id
WHERE s.at >= %s AND NOT s.lost
ORDER BY s.gpu_id, s.at DESC
"""  # noqa: S608 - table names from our own models
_COLUMNS = (
    "gpu_id index uuid model node tenant task_id simulated util_gpu util_memory memory_used_mb "
    "memory_total_mb temperature_c power_w power_limit_w sm_clock_mhz fan_pct ecc_corrected "
    "ecc_uncorrected throttle_reasons"
).split()


class PlatformCollector(Collector):
    def collect(self):
        yield from self._gpus()
        yield from self._tasks()
        yield from self._scheduler()

    def _gpus(self):
        with connection.cursor() as cursor:
            cursor.execute(_LATEST_SQL, [timezone.now() - FRESH])
            rows = [dict(zip(_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
        families = {
            name: GaugeMetricFamily(name, help_text, labels=DCGM_LABELS)
            for name, help_text, _, _ in GPU_GAUGES
        }
        free = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=DCGM_LABELS
        )
        xids = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            labels=DCGM_LABELS,
        )
        last_xid = dict(
            XidRecord.objects.order_by("gpu_id", "-at")
            .distinct("gpu_id")
            .values_list("gpu_id", "xid")
        )
        for row in rows:
            labels = [
                str(row["index"]),
                row["uuid"],
                f"nvidia{row['index']}",
                row["model"],
                row["node"],
                row["tenant"] or "",
                str(row["task_id"] or ""),
                "true" if row["simulated"] else "false",
            ]
            for name, _, column, scale in GPU_GAUGES:
                if row[column] is not None:
                    families[name].add_metric(labels, row[column] * scale)
            if row["memory_total_mb"] is not None and row["memory_used_mb"] is not None:
                free.add_metric(labels, row["memory_total_mb"] - row["memory_used_mb"])
            xids.add_metric(labels, last_xid.get(row["gpu_id"], 0))
        yield from families.values()
        yield free
        yield xids

    def _tasks(self):
        by_state = GaugeMetricFamily(
            "gpuplatform_tasks", "Tasks by state and tenant.", labels=["state", "tenant"]
        )
        for row in Task.objects.values("state", tenant_name=F("tenant__name")).annotate(
            n=Count("pk")
        ):
            by_state.add_metric([row["state"], row["tenant_name"]], row["n"])
        yield by_state
        yield _histogram(
            "gpuplatform_queue_wait_seconds",
            "From submission to the start of a task's latest attempt.",
            Task._meta.db_table,
            "EXTRACT(EPOCH FROM started_at - submitted_at)",
            "started_at IS NOT NULL",
            WAIT_BUCKETS,
        )
        yield _histogram(
            "gpuplatform_launch_latency_seconds",
            "From an attempt's creation (placement) to its process running.",
            TaskAttempt._meta.db_table,
            "EXTRACT(EPOCH FROM started_at - created_at)",
            "started_at IS NOT NULL",
            LAUNCH_BUCKETS,
        )
        placements = CounterMetricFamily(
            "gpuplatform_placements", "GPU allocations made by the scheduler."
        )
        placements.add_metric([], Allocation.objects.count())
        yield placements

    def _scheduler(self):
        state = SchedulerState.objects.filter(pk=1).first()
        passes = CounterMetricFamily("gpuplatform_scheduler_passes", "Scheduling passes run.")
        passes.add_metric([], state.passes if state else 0)
        yield passes
        duration = GaugeMetricFamily(
            "gpuplatform_scheduler_last_pass_seconds", "Duration of the latest scheduling pass."
        )
        if state is not None and state.last_pass_ms is not None:
            duration.add_metric([], state.last_pass_ms / 1000)
        yield duration
        waiting = GaugeMetricFamily(
            "gpuplatform_scheduler_waiting_tasks", "Tasks left waiting by the latest pass."
        )
        waiting.add_metric([], state.last_waiting if state else 0)
        yield waiting


def _histogram(name, help_text, table, expr, where, buckets) -> HistogramMetricFamily:
    # One pass over the rows: a FILTER per bucket, plus the count and the sum.
    counts = ", ".join(f"count(*) FILTER (WHERE {expr} <= {b})" for b in buckets)
    sql = f"SELECT {counts}, count(*), coalesce(sum({expr}), 0) FROM {table} WHERE {where}"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql)
        *cumulative, total, total_sum = cursor.fetchone()
    family = HistogramMetricFamily(name, help_text)
    family.add_metric(
        [],
        [(str(float(b)), c) for b, c in zip(buckets, cumulative, strict=True)] + [("+Inf", total)],
        float(total_sum),
    )
    return family


def registry() -> CollectorRegistry:
    """A registry per scrape: the collector reads the database; the request counter is this
    process's own."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(PlatformCollector())
    reg.register(_RequestCounter())
    return reg


class _RequestCounter(Collector):
    def collect(self):
        return API_REQUESTS.collect()
