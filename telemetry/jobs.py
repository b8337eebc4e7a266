"""Rollups and retention, run by django-q2 schedules that the platform creates itself.

``telemetry-rollup`` (every minute): recomputes the minute buckets of the last few minutes
from the raw samples and the hour buckets of the last two hours from the minute buckets, then
checks for idle allocated GPUs. Recomputing (DELETE + INSERT ... SELECT in one transaction) is
idempotent: a late sample, a re-run or two schedulers at once (the advisory lock makes the
second one skip) all end with the same rows. The current, partial bucket is included and
completed by the next run, so charts over rollups reach the present.

``telemetry-retention`` (every 10 minutes): deletes what is past each table's window, in
batches so that one run never holds a long lock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone
from django_q.models import Schedule

from scheduling import estate, passes
from telemetry.models import METRICS, GpuRollupHour, GpuRollupMinute, GpuSample

MINUTE_LOOKBACK = timedelta(minutes=5)
HOUR_LOOKBACK = timedelta(hours=2)
DELETE_BATCH = 20_000
_LOCK_KEY = 0x7E1E_0001  # pg_advisory_xact_lock key: one rollup at a time

SCHEDULES = (
    ("telemetry-rollup", "telemetry.tasks.rollup", 1),
    ("telemetry-retention", "telemetry.tasks.retention", 10),
)


def _aggregates(source: str) -> tuple[str, str]:
    """(column list, SELECT expressions) summarising each metric from ``source``."""
    columns, exprs = [], []
    for metric in METRICS:
        columns += [f"{metric}_min", f"{metric}_mean", f"{metric}_max"]
        if source == "raw":
            exprs += [f"min({metric})", f"avg({metric})", f"max({metric})"]
        else:
            # The hour's mean weighs each minute by its sample count.
            exprs += [
                f"min({metric}_min)",
                f"sum({metric}_mean * samples) / nullif(sum(samples) "
                f"filter (where {metric}_mean is not null), 0)",
                f"max({metric}_max)",
            ]
    columns.append("ecc_uncorrected_max")
    exprs.append("max(ecc_uncorrected)" if source == "raw" else "max(ecc_uncorrected_max)")
    return ", ".join(columns), ", ".join(exprs)


def _rollup(table: str, source_sql: str, unit: str, start: datetime, end: datetime) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return 0  # another process is rolling up the same buckets right now
        cursor.execute(f"DELETE FROM {table} WHERE start >= %s AND start < %s", [start, end])  # noqa: S608
        cursor.execute(source_sql.format(table=table, unit=unit), [start, end])
        return cursor.rowcount


def rollup_minutes(*, start: datetime, end: datetime) -> int:
    """(Re)compute the minute buckets starting in [start, end) from the raw samples."""
    columns, exprs = _aggregates("raw")
    sql = (
        "INSERT INTO {table} (gpu_id, start, task_id, tenant_id, samples, simulated, "  # noqa: S608
        + columns
        + ") SELECT gpu_id, date_trunc('{unit}', at) AS bucket, task_id, tenant_id, count(*), "
        "bool_or(simulated), "
        + exprs
        + f" FROM {GpuSample._meta.db_table} WHERE at >= %s AND at < %s AND NOT lost "
        "GROUP BY gpu_id, bucket, task_id, tenant_id"
    )
    return _rollup(GpuRollupMinute._meta.db_table, sql, "minute", start, end)


def rollup_hours(*, start: datetime, end: datetime) -> int:
    """(Re)compute the hour buckets starting in [start, end) from the minute buckets."""
    columns, exprs = _aggregates("minutes")
    sql = (
        "INSERT INTO {table} (gpu_id, start, task_id, tenant_id, samples, simulated, "  # noqa: S608
        + columns
        + ") SELECT gpu_id, date_trunc('{unit}', start) AS bucket, task_id, tenant_id, "
        "sum(samples), bool_or(simulated), "
        + exprs
        + f" FROM {GpuRollupMinute._meta.db_table} WHERE start >= %s AND start < %s "
        "GROUP BY gpu_id, bucket, task_id, tenant_id"
    )
    return _rollup(GpuRollupHour._meta.db_table, sql, "hour", start, end)


def rollup(*, now: datetime | None = None) -> dict[str, int]:
    now = now or timezone.now()
    minute = now.replace(second=0, microsecond=0)
    hour = minute.replace(minute=0)
    end = now + timedelta(seconds=1)
    return {
        "minutes": rollup_minutes(start=minute - MINUTE_LOOKBACK, end=end),
        "hours": rollup_hours(start=hour - HOUR_LOOKBACK, end=end),
    }


def _delete_before(table: str, column: str, cutoff: datetime) -> int:
    deleted = 0
    while True:
        with connection.cursor() as cursor:
            # ctid batches: a plain DELETE of a day's backlog would hold its locks for minutes.
            cursor.execute(
                f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} "  # noqa: S608
                f"WHERE {column} < %s LIMIT {DELETE_BATCH}))",
                [cutoff],
            )
            deleted += cursor.rowcount
            if cursor.rowcount < DELETE_BATCH:
                return deleted


def retention(*, now: datetime | None = None) -> dict[str, int]:
    """Delete raw samples, minute and hour buckets past their windows (telemetry config)."""
    now = now or timezone.now()
    config = estate.config().telemetry
    return {
        "samples": _delete_before(
            GpuSample._meta.db_table, "at", now - timedelta(seconds=config.raw_retention_s)
        ),
        "minutes": _delete_before(
            GpuRollupMinute._meta.db_table,
            "start",
            now - timedelta(seconds=config.minute_retention_s),
        ),
        "hours": _delete_before(
            GpuRollupHour._meta.db_table, "start", now - timedelta(seconds=config.hour_retention_s)
        ),
    }


def schedules_ensure(*, schedule_model: type[Schedule] = Schedule, using: str = "default") -> int:
    """Create or repair the telemetry schedules, one row each (as the scheduling backstops)."""
    return passes.schedules_ensure(SCHEDULES, schedule_model=schedule_model, using=using)
