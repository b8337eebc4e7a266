"""Each tenant's decayed GPU use, kept as running counters instead of rescanned every pass.

A tenant's use is the integral of the share of a card each of its allocations held, weighted by
2^(-age/half-life) and scaled so that a tenant holding n GPUs for ever tends to n (Slurm's
multifactor priority decays usage the same way). Finished allocations only ever decay, all by
the same factor, so their sum is one number per tenant and node: ``TenantUsage.closed``, as of
``as_of``, which reads add up per tenant. A trigger (migrations 0010, 0019, 0031) adds an
allocation's contribution when the transaction that releases it commits, so no release is ever
missed or counted twice, whatever path released it; a row per node, not per tenant, so that
node agents committing ends of one tenant's tasks do not queue behind each other's row lock. Running
allocations are bounded by the number of GPUs and are summed on each read. A pass costs the
same after a million finished allocations as after ten.

The half-life the counters are kept for lives in ``SchedulerState.fair_share_half_life_s``;
when the configuration changes it, the next pass rebuilds the counters once from the history
(``usage_by_scan`` is also the reference the tests compare the counters with).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import connection

from gpuplatform.db import Query, fetch_together
from scheduling.models import SchedulerState
from scheduling.shares import allocation_share_sql

# 2^-60 is 1e-18: a contribution that old is nothing, and PostgreSQL raises on float underflow.
MAX_HALF_LIVES = 60

# The share of a card an allocation holds (the trigger in migration 0010 computes the same;
# tests/scheduling/test_fairshare.py compares the two).
SHARE_SQL = allocation_share_sql("a", "g")

_OPEN = f"""
    SELECT t.tenant_id,
           SUM({SHARE_SQL} * (1 - POWER(2.0::float8,
               -LEAST(GREATEST(EXTRACT(EPOCH FROM (%(now)s - a.started_at))::float8, 0) / %(h)s,
                      {MAX_HALF_LIVES}))))
      FROM scheduling_allocation a
      JOIN scheduling_task t ON t.id = a.task_id
      JOIN scheduling_gpu g ON g.id = a.gpu_id
     WHERE a.released_at IS NULL
     GROUP BY t.tenant_id
"""  # noqa: S608 - built from constants; values are bound parameters

_CLOSED = f"""
    SELECT tenant_id,
           closed * POWER(2.0::float8,
               -LEAST(GREATEST(EXTRACT(EPOCH FROM (%(now)s - as_of))::float8, 0) / %(h)s,
                      {MAX_HALF_LIVES}))
      FROM scheduling_tenantusage
"""  # noqa: S608 - built from constants; values are bound parameters

_SCAN = f"""
    SELECT t.tenant_id,
           SUM({SHARE_SQL}
               * (POWER(2.0::float8, -LEAST(GREATEST(EXTRACT(EPOCH FROM
                      (%(now)s - COALESCE(a.released_at, %(now)s)))::float8, 0) / %(h)s,
                      {MAX_HALF_LIVES}))
                  - POWER(2.0::float8, -LEAST(GREATEST(EXTRACT(EPOCH FROM
                      (%(now)s - a.started_at))::float8, 0) / %(h)s, {MAX_HALF_LIVES}))))
      FROM scheduling_allocation a
      JOIN scheduling_task t ON t.id = a.task_id
      JOIN scheduling_gpu g ON g.id = a.gpu_id
     WHERE a.released_at IS NULL
        OR a.released_at > %(now)s - %(h)s * %(window)s * INTERVAL '1 second'
     GROUP BY t.tenant_id
"""  # noqa: S608 - built from constants; values are bound parameters

_REBUILD = f"""
    INSERT INTO scheduling_tenantusage (tenant_id, shard, closed, as_of)
    SELECT t.tenant_id, COALESCE(g.node_id, 0),
           SUM({SHARE_SQL}
               * (POWER(2.0::float8, -LEAST(GREATEST(EXTRACT(EPOCH FROM
                      (%(now)s - a.released_at))::float8, 0) / %(h)s, {MAX_HALF_LIVES}))
                  - POWER(2.0::float8, -LEAST(GREATEST(EXTRACT(EPOCH FROM
                      (%(now)s - a.started_at))::float8, 0) / %(h)s, {MAX_HALF_LIVES})))),
           %(now)s
      FROM scheduling_allocation a
      JOIN scheduling_task t ON t.id = a.task_id
      JOIN scheduling_gpu g ON g.id = a.gpu_id
     WHERE a.released_at > %(now)s - %(h)s * %(window)s * INTERVAL '1 second'
     GROUP BY t.tenant_id, COALESCE(g.node_id, 0)
"""  # noqa: S608 - built from constants; values are bound parameters


# The half-life the counters are kept for (None in a new database, before the first pass).
_KEPT_FOR = "SELECT fair_share_half_life_s FROM scheduling_schedulerstate WHERE id = 1"


def usage_queries(now: datetime, half_life_s: float) -> tuple[Query, Query, Query]:
    """What ``usage`` reads, for a caller that sends it with reads of its own
    (``fetch_together``): the half-life the counters are kept for, the counters, the running
    allocations. ``usage_from`` makes the figures of their rows."""
    params = {"now": now, "h": float(half_life_s)}
    return Query(_KEPT_FOR), Query(_CLOSED, params), Query(_OPEN, params)


def usage_from(rows: Sequence[list[tuple]], now: datetime, half_life_s: float) -> dict[int, float]:
    """``usage`` from the rows of ``usage_queries``; the full scan while the counters are kept
    for another half-life (until the next pass rebuilds them)."""
    if not counters_kept(rows, half_life_s):
        return usage_by_scan(now, half_life_s)
    _, closed, running = rows
    found: dict[int, float] = {}
    for tenant_id, value in (*closed, *running):
        found[tenant_id] = found.get(tenant_id, 0.0) + float(value or 0.0)
    return found


def counters_kept(rows: Sequence[list[tuple]], half_life_s: float) -> bool:
    """Whether the rows of ``usage_queries`` say the counters are kept for ``half_life_s``."""
    return rows[0] == [(float(half_life_s),)]


def usage(now: datetime, half_life_s: float) -> dict[int, float]:
    """Each tenant's decayed use in GPUs: counters plus running allocations, in one round trip.
    Falls back to the full scan while the counters are kept for another half-life."""
    return usage_from(fetch_together(*usage_queries(now, half_life_s)), now, half_life_s)


def usage_by_scan(now: datetime, half_life_s: float) -> dict[int, float]:
    """The same figure from the whole history: the reference, and the fallback."""
    with connection.cursor() as cursor:
        cursor.execute(_SCAN, {"now": now, "h": float(half_life_s), "window": MAX_HALF_LIVES})
        return {tenant_id: float(value or 0.0) for tenant_id, value in cursor.fetchall()}


def keep_counters_for(now: datetime, half_life_s: float) -> bool:
    """In a pass (under its lock): make sure the counters are kept for this half-life,
    rebuilding them from the history if not. True when it rebuilt them."""
    state, _ = SchedulerState.objects.get_or_create(pk=1)
    if state.fair_share_half_life_s == float(half_life_s):
        return False
    # The row lock waits for releases in flight (their trigger holds a KEY SHARE lock on it)
    # and holds new ones back until the rebuilt counters and the new half-life commit together.
    SchedulerState.objects.select_for_update().get(pk=1)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM scheduling_tenantusage")
        cursor.execute(_REBUILD, {"now": now, "h": float(half_life_s), "window": MAX_HALF_LIVES})
    SchedulerState.objects.filter(pk=1).update(fair_share_half_life_s=float(half_life_s))
    return True
