"""Reading GPU history back: a GPU's, a node's or a task's metrics over a time range at a step,
from the raw samples or a rollup, whichever serves the range and step.

Tenant-facing reads take ``tenant=``: a task's metrics are those of its own GPUs during its own
allocations, and another tenant's task is not found (404).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from gpuplatform.db import server_bound_cursor
from scheduling import estate
from scheduling import selectors as scheduling_selectors
from scheduling.models import GPU, Allocation, Node, Task
from telemetry.models import GpuRollupHour, GpuRollupMinute, GpuSample
from tenants.models import Tenant

# The metrics a series carries, in this order after the time.
SERIES_METRICS = ("util_gpu", "util_memory", "memory_used_mb", "temperature_c", "power_w")
# time: the bucket's start in Unix seconds (what chart libraries take).
COLUMNS = ("time", *SERIES_METRICS, "util_gpu_max", "samples")
MAX_POINTS = 5000  # per GPU; more is a mistake (a month at 1 s), answered with a 400


@dataclass(frozen=True)
class Window:
    """One GPU over [start, end); for a task, only rollup rows attributed to it."""

    gpu_id: int
    start: datetime
    end: datetime
    task_id: int | None = None


def choose_source(*, start: datetime, step_s: int, now: datetime | None = None) -> str:
    """The coarsest table whose buckets fit the step and that still holds ``start``: raw for
    steps under a minute (if the range is within raw retention), minutes under an hour, else
    hours."""
    now = now or timezone.now()
    config = estate.config().telemetry
    age = now - start
    if step_s < 60 and age <= timedelta(seconds=config.raw_retention_s):
        return "raw"
    if step_s < 3600 and age <= timedelta(seconds=config.minute_retention_s):
        return "1m"
    return "1h"


def series(*, windows: Iterable[Window], start: datetime, end: datetime, step_s: int) -> dict:
    """Per GPU, ``values``: one list per entry of ``COLUMNS``, aligned, in time order: each
    step's mean of each metric (and max of utilisation, and the samples counted), in one query.

    Rollups are averaged weighted by their sample counts, so a step over rollups equals a step
    over the raw samples they summarise."""
    windows = [w for w in windows if w.start < end and w.end > start]
    source = choose_source(start=start, step_s=step_s)
    if not windows:
        return {"source": source, "step": step_s, "columns": COLUMNS, "series": []}
    if source == "raw":
        table, time_col = GpuSample._meta.db_table, "at"
        # float8 on the server: psycopg turns numeric into Decimal, far slower to build.
        means = [f"avg({m})::float8" for m in SERIES_METRICS]
        peak, weight = "max(util_gpu)::float8", "count(*)"
        extra = " AND NOT lost"
        reach = 0
    else:
        model = GpuRollupMinute if source == "1m" else GpuRollupHour
        table, time_col = model._meta.db_table, "start"
        means = [
            f"sum({m}_mean * samples) / nullif(sum(samples) filter (where {m}_mean is not null), 0)"
            for m in SERIES_METRICS
        ]
        peak, weight = "max(util_gpu_max)", "sum(samples)"
        # A task's rows only: a bucket it shared with another task is split between them.
        extra = " AND (w.task_id IS NULL OR s.task_id = w.task_id)"
        # A bucket that began before the window still overlaps it.
        reach = 60 if source == "1m" else 3600
    # One (gpu, start, end, task) row per window, each read by its own range scan of the
    # (gpu, time) index: LATERAL with OFFSET 0 (or an aggregate), which keeps PostgreSQL from
    # flattening the subquery into a hash join over a sequential scan of every sample.
    values = ", ".join(
        ["(%s::bigint, %s::timestamptz, %s::timestamptz, %s::bigint)"] * len(windows)
    )
    params: list = []
    for w in windows:
        w_start = max(w.start, start) - timedelta(seconds=reach)
        params += [w.gpu_id, w_start, min(w.end, end), w.task_id]
    # Each GPU comes back as one row of arrays, a column each, and is handed on as columns (what
    # chart libraries take): tens of thousands of rows, or of Python lists built from them, cost
    # more than the scan that finds them.
    if source == "raw" and step_s == 1:
        # One sample a second at most: every sample is its own point, no grouping to do. Each
        # window's samples are aggregated where they are read (a sort of a few hundred rows,
        # no regrouping); the peak is the sample itself and the count 1, added below, not sent.
        # date_part, not extract: extract's numeric is several times slower per row. Values in
        # their stored types (whole numbers stay integers): no cast per value, fewer bytes.
        arrays = ", ".join(f"array_agg({m})" for m in SERIES_METRICS)
        sql = f"""
            SELECT w.gpu_id, p.*
              FROM (VALUES {values}) AS w(gpu_id, w_start, w_end, task_id)
              CROSS JOIN LATERAL (
                    SELECT array_agg(date_part('epoch', s.at)::bigint), {arrays}
                      FROM (SELECT * FROM {table} s
                             WHERE s.gpu_id = w.gpu_id AND s.at >= w.w_start
                               AND s.at < w.w_end{extra}
                             ORDER BY s.at) s
                    HAVING count(*) > 0
              ) p
        """  # noqa: S608 - table and column names are ours; values are parameters
        head: list = []
    else:
        names = [f"m{i}" for i in range(len(SERIES_METRICS) + 2)]
        picked = zip([*means, peak, weight], names, strict=True)
        selected = ", ".join(f"{expression} AS {name}" for expression, name in picked)
        arrays = ", ".join(f"array_agg({n}::float8 ORDER BY t)" for n in names[:-1])
        sql = f"""
            SELECT gpu_id, array_agg(t ORDER BY t), {arrays},
                   array_agg({names[-1]}::bigint ORDER BY t)
              FROM (
                SELECT w.gpu_id,
                       extract(epoch FROM date_bin(make_interval(secs => %s), s.{time_col},
                                                   %s::timestamptz))::bigint AS t,
                       {selected}
                  FROM (VALUES {values}) AS w(gpu_id, w_start, w_end, task_id)
                  CROSS JOIN LATERAL (
                        SELECT * FROM {table} s
                         WHERE s.gpu_id = w.gpu_id AND s.{time_col} >= w.w_start
                           AND s.{time_col} < w.w_end{extra}
                        OFFSET 0
                  ) s
                 GROUP BY w.gpu_id, t
              ) points
             GROUP BY gpu_id
        """  # noqa: S608 - table and column names are ours; values are parameters
        head = [step_s, start]
    # The GPUs' names in the same round trip.
    sql = f"""
        SELECT g.uuid, g.index, n.name, q.*
          FROM ({sql}) q
          JOIN {GPU._meta.db_table} g ON g.id = q.gpu_id
          JOIN {Node._meta.db_table} n ON n.id = g.node_id
    """  # noqa: S608 - table names are ours
    with server_bound_cursor(binary_results=True) as cursor:
        cursor.execute(sql, [*head, *params])
        rows = cursor.fetchall()
    gpus: dict[int, tuple] = {}
    by_gpu: dict[int, list[list]] = {}
    merged: set[int] = set()
    for uuid, index, node, gpu_id, *columns in rows:
        gpus[gpu_id] = (uuid, index, node)
        if source == "raw" and step_s == 1:
            columns += [list(columns[1]), [1] * len(columns[0])]
        if gpu_id in by_gpu:  # a GPU in several windows (a task's attempts)
            for into, more in zip(by_gpu[gpu_id], columns, strict=True):
                into.extend(more)
            merged.add(gpu_id)
        else:
            by_gpu[gpu_id] = columns
    series_out = []
    for gpu_id in sorted(by_gpu):
        values = by_gpu[gpu_id]
        if gpu_id in merged:  # each window is in time order, the windows maybe not
            order = sorted(range(len(values[0])), key=values[0].__getitem__)
            values = [[column[i] for i in order] for column in values]
        uuid, index, node = gpus[gpu_id]
        series_out.append({"gpu": uuid, "index": index, "node": node, "values": values})
    return {"source": source, "step": step_s, "columns": COLUMNS, "series": series_out}


def gpu_windows(*, gpus: Iterable[GPU], start: datetime, end: datetime) -> list[Window]:
    return [Window(gpu.pk, start, end) for gpu in gpus]


def task_windows(*, task: Task) -> list[Window]:
    """The task's GPUs while it held them (every attempt)."""
    now = timezone.now()
    return [
        Window(a.gpu_id, a.started_at, a.released_at or now, task.pk)
        for a in Allocation.objects.filter(task=task).only("gpu_id", "started_at", "released_at")
    ]


def task_metrics_get(*, tenant: Tenant, pk: int) -> Task:
    """The tenant's task whose metrics are asked for, or 404."""
    return scheduling_selectors.task_get(tenant=tenant, pk=pk)


def node_gpus(*, node: Node) -> list[GPU]:
    return list(GPU.objects.filter(node=node).order_by("index"))


def latest_samples(*, tenant: Tenant | None, max_age_s: int = 60) -> list[dict]:
    """Every GPU's newest sample (``gpuctl top``). ``tenant``: holders other than that tenant
    are shown as "another tenant" with no task; None (operators) shows everyone."""
    since = timezone.now() - timedelta(seconds=max_age_s)
    sql = f"""
        SELECT DISTINCT ON (s.gpu_id) s.gpu_id, s.at, s.util_gpu, s.util_memory,
               s.memory_used_mb, s.memory_total_mb, s.temperature_c, s.power_w, s.power_limit_w,
               s.sm_clock_mhz, s.fan_pct, s.simulated, s.lost, s.task_id, s.tenant_id,
               t.name, task.name
          FROM {GpuSample._meta.db_table} s
          LEFT JOIN tenants_tenant t ON t.id = s.tenant_id
          LEFT JOIN scheduling_task task ON task.id = s.task_id
         WHERE s.at >= %s
         ORDER BY s.gpu_id, s.at DESC
    """  # noqa: S608 - table names are ours
    with connection.cursor() as cursor:
        cursor.execute(sql, [since])
        rows = {row[0]: row for row in cursor.fetchall()}
    out = []
    for gpu in GPU.objects.select_related("node").order_by("node__name", "index"):
        row = rows.get(gpu.pk)
        item = {
            "node": gpu.node.name,
            "index": gpu.index,
            "uuid": gpu.uuid,
            "model": gpu.model,
            "state": gpu.state,
            "sampled_at": None,
            "tenant": None,
            "task": None,
        }
        if row is not None:
            (_, at, util, mutil, used, total, temp, power, limit, clock, fan, simulated, lost,
             task_id, tenant_id, tenant_name, task_name) = row  # fmt: skip
            visible = tenant is None or tenant_id == tenant.pk
            item.update(
                sampled_at=at.isoformat(),
                util_gpu=util,
                util_memory=mutil,
                memory_used_mb=used,
                memory_total_mb=total,
                temperature_c=temp,
                power_w=power,
                power_limit_w=limit,
                sm_clock_mhz=clock,
                fan_pct=fan,
                simulated=simulated,
                lost=lost,
                tenant=(tenant_name if visible else "another tenant") if tenant_id else None,
                task=task_id if visible else None,
                task_name=task_name if visible else None,
            )
        out.append(item)
    return out


def usage_from_samples(
    *, tenant: Tenant | None, days: int, now: datetime | None = None
) -> list[dict]:
    """Per day, tenant and member: GPU-hours held (as sampled), used (utilisation-weighted)
    and idle (in minutes whose utilisation never rose above the idle threshold), from the
    minute rollups. ``tenant`` None: every tenant (operators)."""
    now = now or timezone.now()
    config = estate.config().telemetry
    since = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    # Each minute bucket covers samples x interval seconds of holding, at most the minute.
    held = f"least(60.0, r.samples * {float(config.sample_interval_s)}) / 3600.0"
    sql = f"""
        SELECT (r.start AT TIME ZONE 'UTC')::date AS day, t.name, coalesce(u.username, ''),
               sum({held}),
               sum({held} * coalesce(r.util_gpu_mean, 0) / 100.0),
               sum({held}) FILTER (WHERE r.util_gpu_max <= %s)
          FROM {GpuRollupMinute._meta.db_table} r
          JOIN scheduling_task task ON task.id = r.task_id
          JOIN tenants_tenant t ON t.id = task.tenant_id
          LEFT JOIN auth_user u ON u.id = task.owner_id
         WHERE r.start >= %s AND r.task_id IS NOT NULL {"AND task.tenant_id = %s" if tenant else ""}
         GROUP BY day, t.name, u.username
         ORDER BY day, t.name, u.username
    """  # noqa: S608 - table names and the formula are ours; values are parameters
    params: list = [config.idle.threshold, since]
    if tenant is not None:
        params.append(tenant.pk)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [
            {
                "day": day.isoformat(),
                "tenant": tenant_name,
                "member": member,
                "allocated_gpu_hours": round(float(held_h or 0), 4),
                "used_gpu_hours": round(float(used_h or 0), 4),
                "idle_gpu_hours": round(float(idle_h or 0), 4),
            }
            for day, tenant_name, member, held_h, used_h, idle_h in cursor.fetchall()
        ]
