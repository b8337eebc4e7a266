"""GPU samples from the past, read from telemetry's tables: what a reconnecting page fills its
gap with, the time-range picker's series, the tiles' first values.

Resolution follows the span asked for, so that a chart gets a few hundred to a couple of
thousand points whatever the range: raw samples up to RAW_SPAN_S, minute rollups up to
MINUTE_SPAN_S, hour rollups beyond (each also lives only as long as telemetry keeps it).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Collection
from datetime import UTC, datetime

from django.db import connection

from scheduling.models import GPU, Node

RAW_SPAN_S = 30 * 60
MINUTE_SPAN_S = 48 * 3600
# A catch-up sends raw samples for at most this much of the gap, minute means for the rest.
CATCH_UP_RAW_S = 5 * 60
# A tile's newest sample counts only if it is this recent (older: the tile shows nothing).
LATEST_WITHIN_S = 120


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def samples_since(*, since: float, gpu_ids: Collection[int] | None) -> list[list]:
    """Rows in live.events.SAMPLE_FIELDS order taken after ``since`` (``gpu_ids`` None: every
    GPU): raw samples for the last CATCH_UP_RAW_S, minute means before that."""
    if gpu_ids is not None and not gpu_ids:
        return []
    raw_from = max(since, time.time() - CATCH_UP_RAW_S)
    only = "" if gpu_ids is None else "AND gpu_id = ANY(%(gpus)s)"
    params = {"since": _dt(since), "raw_from": _dt(raw_from), "gpus": list(gpu_ids or [])}
    sql = f"""
        SELECT gpu_id, extract(epoch FROM start), util_gpu_mean, memory_used_mb_mean, NULL,
               temperature_c_mean, power_w_mean
          FROM (SELECT gpu_id, start,
                       sum(util_gpu_mean * samples) / nullif(sum(samples), 0) AS util_gpu_mean,
                       sum(memory_used_mb_mean * samples) / nullif(sum(samples), 0)
                           AS memory_used_mb_mean,
                       sum(temperature_c_mean * samples) / nullif(sum(samples), 0)
                           AS temperature_c_mean,
                       sum(power_w_mean * samples) / nullif(sum(samples), 0) AS power_w_mean
                  FROM telemetry_gpurollupminute
                 WHERE start > %(since)s AND start < %(raw_from)s {only}
                 GROUP BY gpu_id, start) AS minute
        UNION ALL
        SELECT gpu_id, extract(epoch FROM at), util_gpu, memory_used_mb, memory_total_mb,
               temperature_c, power_w
          FROM telemetry_gpusample
         WHERE at >= %(raw_from)s AND at > %(since)s {only}
         ORDER BY 2
    """  # noqa: S608 - constant SQL of ours; values are parameters
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [_row(row) for row in cursor.fetchall()]


def _row(row: tuple) -> list:
    gpu_id, at, util, mem, total, temp, power = row
    return [
        gpu_id,
        float(at),
        _round(util),
        _round(mem),
        total,
        _round(temp),
        None if power is None else round(float(power), 1),
    ]


def _round(value) -> int | None:
    return None if value is None else round(float(value))


def latest_samples() -> dict[int, dict]:
    """Each GPU's newest sample of the last LATEST_WITHIN_S, by GPU id, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT DISTINCT ON (gpu_id) gpu_id, util_gpu, memory_used_mb, temperature_c, power_w
              FROM telemetry_gpusample
             WHERE at > %s
             ORDER BY gpu_id, at DESC
            """,
            [_dt(time.time() - LATEST_WITHIN_S)],
        )
        return {
            gpu_id: {
                "util": util,
                "mem_used_mb": mem,
                "temp_c": temp,
                "power_w": power,
                # The tile's heatmap hue, as the page's script computes it for live samples.
                "heat": None if util is None else round(210 - 2.1 * min(util, 100)),
            }
            for gpu_id, util, mem, temp, power in cursor.fetchall()
        }


def series(*, node: Node, start: float, end: float) -> dict:
    """The node's GPUs over [start, end]: ``gpus`` (ids), ``t`` (epoch seconds), and per GPU
    ``util`` and ``mem`` (percent of its memory) aligned with ``t``, the node's ``power`` total
    (W) and the ``resolution`` read (raw, minute or hour)."""
    gpus = dict(GPU.objects.filter(node=node).values_list("pk", "memory_mb"))
    span = end - start
    if span <= RAW_SPAN_S:
        resolution = "raw"
        # Whole seconds: one tick's GPUs line up even if their reads straddle a millisecond.
        sql = """
            SELECT gpu_id, floor(extract(epoch FROM at)) AS second, avg(util_gpu),
                   avg(memory_used_mb), avg(power_w)
              FROM telemetry_gpusample
             WHERE gpu_id = ANY(%s) AND at >= %s AND at <= %s
             GROUP BY gpu_id, second
        """
    else:
        resolution = "minute" if span <= MINUTE_SPAN_S else "hour"
        table = f"telemetry_gpurollup{resolution}"
        sql = f"""
            SELECT gpu_id, extract(epoch FROM start),
                   sum(util_gpu_mean * samples) / nullif(sum(samples), 0),
                   sum(memory_used_mb_mean * samples) / nullif(sum(samples), 0),
                   sum(power_w_mean * samples) / nullif(sum(samples), 0)
              FROM {table}
             WHERE gpu_id = ANY(%s) AND start >= %s AND start <= %s
             GROUP BY gpu_id, start
        """  # noqa: S608 - the table is one of two constants; values are parameters
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(gpus), _dt(start), _dt(end)])
        rows = cursor.fetchall()
    by_time: dict[float, dict[int, tuple]] = defaultdict(dict)
    for gpu_id, at, util, mem, power in rows:
        by_time[float(at)][gpu_id] = (util, mem, power)
    times = sorted(by_time)
    util: dict[int, list] = {gpu_id: [] for gpu_id in gpus}
    memory: dict[int, list] = {gpu_id: [] for gpu_id in gpus}
    power_total: list = []
    for moment in times:
        values = by_time[moment]
        watts = [v[2] for v in values.values() if v[2] is not None]
        power_total.append(round(sum(watts), 1) if watts else None)
        for gpu_id, total_mb in gpus.items():
            u, m, _ = values.get(gpu_id, (None, None, None))
            util[gpu_id].append(_round(u))
            memory[gpu_id].append(None if m is None else round(100 * float(m) / total_mb, 1))
    return {
        "gpus": list(gpus),
        "resolution": resolution,
        "t": times,
        "util": util,
        "mem": memory,
        "power": power_total,
    }
