"""What a tenant holds and has used: its GPUs now, its fair share, its GPU-hours.

Every read takes the tenant as a required keyword argument. The tenants' API, the portal and
the admin read through these; the quota limits themselves are ``tenants.selectors``.
"""

from __future__ import annotations

from datetime import UTC, timedelta

from django.db import connection
from django.db.models import Count, Q, Sum
from django.utils import timezone

from scheduling import estate
from scheduling.models import Allocation, Task
from scheduling.shares import CardShare, allocation_share_sql
from scheduling.snapshot import recent_gpus
from scheduling.states import HOLDS_GPUS, TaskState
from tenants.models import Quota, Tenant
from tenants.selectors import quota_limits


def quota_in_use(*, tenant: Tenant) -> dict[str, float | int]:
    """What the tenant holds now, in the units quotas count (a shared GPU counts its share)."""
    held = Allocation.objects.filter(released_at__isnull=True, task__tenant=tenant).aggregate(
        gpus=Sum(CardShare()), memory=Sum("memory_mb")
    )
    # Only the states counted: with the (tenant, state) index this reads the tenant's live
    # tasks, not its whole history.
    live = [*HOLDS_GPUS, TaskState.PENDING]
    counts = Task.objects.filter(tenant=tenant, state__in=live).aggregate(
        running=Count("id", filter=Q(state__in=HOLDS_GPUS)),
        queued=Count("id", filter=Q(state=TaskState.PENDING)),
    )
    return {
        "gpus": round(held["gpus"] or 0.0, 3),
        "gpu_memory_mb": held["memory"] or 0,
        "running_tasks": counts["running"],
        "queued_tasks": counts["queued"],
    }


def fair_share(*, tenant: Tenant, quotas: list[Quota] | None = None) -> dict[str, float | int]:
    """The tenant's standing as the scheduler weighs it: decayed recent use and its weight."""
    half_life = estate.config().scheduling.fair_share_half_life_s
    quotas = quota_limits(tenant=tenant) if quotas is None else quotas
    cluster_wide = next((q for q in quotas if q.pool_id is None), None)
    recent = recent_gpus(timezone.now(), half_life, tenant_id=tenant.pk).get(tenant.pk, 0.0)
    return {
        "recent_gpus": round(recent, 3),
        "weight": cluster_wide.fair_share_weight if cluster_wide else 1.0,
        "half_life_s": half_life,
    }


def quota_summary(*, tenant: Tenant) -> dict:
    """Limits, use now and fair share together: what ``/api/v1/quota/`` answers."""
    quotas = quota_limits(tenant=tenant)
    return {
        "tenant": tenant.name,
        "limits": [
            {
                "pool": q.pool.name if q.pool else None,
                "max_gpus": q.max_gpus,
                "max_gpu_memory_mb": q.max_gpu_memory_mb,
                "max_running_tasks": q.max_running_tasks,
                "max_queued_tasks": q.max_queued_tasks,
                "max_priority": q.max_priority,
                "fair_share_weight": q.fair_share_weight,
            }
            for q in quotas
        ],
        "in_use": quota_in_use(tenant=tenant),
        "fair_share": fair_share(tenant=tenant, quotas=quotas),
    }


def gpus_quota_left(*, tenant: Tenant) -> tuple[float | None, dict[str, float | None]]:
    """How many more GPUs the tenant's quotas let it hold now: cluster-wide, and in each pool
    that has a quota of its own (the smaller of the two there). ``None``: no limit. Use is
    counted as the scheduler counts it: a shared GPU by its share, in the pool of its node."""
    quotas = quota_limits(tenant=tenant)
    if not any(q.max_gpus is not None for q in quotas):
        return None, {}
    held = (
        Allocation.objects.filter(released_at__isnull=True, task__tenant=tenant)
        .values("gpu__node__pool__name")
        .annotate(gpus=Sum(CardShare()))
        .order_by()
    )
    in_pool = {row["gpu__node__pool__name"]: row["gpus"] or 0.0 for row in held}

    def left(limit: int | None, used: float) -> float | None:
        return None if limit is None else max(0.0, round(limit - used, 3))

    cluster = next((q for q in quotas if q.pool_id is None), None)
    cluster_left = left(cluster.max_gpus if cluster else None, sum(in_pool.values()))
    pools: dict[str, float | None] = {}
    for quota in quotas:
        if quota.pool_id is None:
            continue
        here = left(quota.max_gpus, in_pool.get(quota.pool.name, 0.0))
        pools[quota.pool.name] = min(
            (x for x in (here, cluster_left) if x is not None), default=None
        )
    return cluster_left, pools


def usage_per_day(*, tenant: Tenant, days: int) -> list[dict]:
    """Each UTC day's GPU-hours: every allocation's overlap with the day, times its share."""
    sql = f"""
        WITH day AS (
            SELECT generate_series(date_trunc('day', now() AT TIME ZONE 'UTC') - (%(days)s - 1)
                                   * interval '1 day', date_trunc('day', now() AT TIME ZONE 'UTC'),
                                   interval '1 day') AS start
        )
        SELECT day.start::date,
               COALESCE(SUM(
                   {allocation_share_sql("a", "g")}
                   * GREATEST(0, EXTRACT(EPOCH FROM
                       LEAST(COALESCE(a.released_at, now()) AT TIME ZONE 'UTC',
                             day.start + interval '1 day')
                       - GREATEST(a.started_at AT TIME ZONE 'UTC', day.start))) / 3600.0
               ), 0)
          FROM day
          LEFT JOIN scheduling_allocation a
                 ON a.started_at AT TIME ZONE 'UTC' < day.start + interval '1 day'
                AND COALESCE(a.released_at, now()) AT TIME ZONE 'UTC' > day.start
                AND a.task_id IN (SELECT id FROM scheduling_task WHERE tenant_id = %(tenant)s)
          LEFT JOIN scheduling_gpu g ON g.id = a.gpu_id
         GROUP BY day.start
         ORDER BY day.start
    """  # noqa: S608 - the formula is a constant of ours; values are parameters
    with connection.cursor() as cursor:
        cursor.execute(sql, {"days": days, "tenant": tenant.pk})
        return [
            {"day": day, "gpu_hours": round(float(hours), 4)} for day, hours in cursor.fetchall()
        ]


def usage_per_member(*, tenant: Tenant, days: int) -> list[dict]:
    """GPU-hours allocated to each member's tasks over the last ``days`` UTC days (today
    included), most first; tasks whose owner is gone count as ``None``."""
    sql = f"""
        SELECT u.username,
               COALESCE(SUM(
                   {allocation_share_sql("a", "g")}
                   * GREATEST(0, EXTRACT(EPOCH FROM
                       COALESCE(a.released_at, now())
                       - GREATEST(a.started_at, %(since)s))) / 3600.0
               ), 0) AS hours
          FROM scheduling_allocation a
          JOIN scheduling_task t ON t.id = a.task_id
          JOIN scheduling_gpu g ON g.id = a.gpu_id
          LEFT JOIN auth_user u ON u.id = t.owner_id
         WHERE t.tenant_id = %(tenant)s
           AND COALESCE(a.released_at, now()) > %(since)s
         GROUP BY u.username
         ORDER BY hours DESC, u.username
    """  # noqa: S608 - the formula is a constant of ours; values are parameters
    today = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    since = today - timedelta(days=days - 1)
    with connection.cursor() as cursor:
        cursor.execute(sql, {"since": since, "tenant": tenant.pk})
        return [
            {"member": name, "gpu_hours": round(float(hours), 4)}
            for name, hours in cursor.fetchall()
        ]
