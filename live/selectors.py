"""Reads for the live plane: the groups a socket joins, what a reconnecting page missed, and the
dashboard's first render (a fixed number of queries whatever the size of the estate)."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime

from django.db.models import Count, IntegerField, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from live import events, history
from monitoring.models import Alert
from scheduling import estate
from scheduling.models import GPU, Allocation, Node, SchedulerState, Task
from scheduling.snapshot import recent_gpus
from scheduling.states import HOLDS_GPUS, TaskState
from tenants.access import Caller
from tenants.models import Quota, Tenant

# A reconnecting page catches up at most this far back; older gaps are reloaded with the page.
CATCH_UP_MAX_S = 3600
# Tasks (changed since) in one catch-up at most; beyond, the page is told to reload.
CATCH_UP_TASKS = 1000
# Rows of the queue and of the running list on the first render.
QUEUE_ROWS = 50
RUNNING_ROWS = 100
ALERT_ROWS = 50


def groups_for(caller: Caller) -> list[str]:
    """The groups a socket joins: the operators' for an operator, else its tenants' (every
    tenant of a session's user; a token's own); none for someone who may follow nothing."""
    if caller.operator:
        return [events.OPS]
    return [events.tenant_group(pk) for pk in sorted(caller.tenant_ids)]


def catch_up(*, caller: Caller, since: float) -> dict:
    """What changed since ``since`` (epoch seconds) that the caller may see (as its groups,
    ``groups_for``): the current state of tasks changed since, GPUs, nodes and alerts
    (operators), and the samples kept since."""
    now = time.time()
    too_old = since < now - CATCH_UP_MAX_S  # what changed before the window is not in it
    since = min(max(since, now - CATCH_UP_MAX_S), now)
    moment = datetime.fromtimestamp(since, UTC)
    tasks = Task.objects.filter(updated_at__gt=moment)
    if not caller.operator:
        tasks = tasks.filter(tenant_id__in=caller.tenant_ids)
    changed = list(tasks.order_by("updated_at")[: CATCH_UP_TASKS + 1])
    answer: dict = {
        "since": since,
        "server_time": now,
        "reload": too_old or len(changed) > CATCH_UP_TASKS,
        "events": [events.task_event(task) for task in changed[:CATCH_UP_TASKS]],
    }
    if caller.operator:
        answer["events"] += [events.gpu_event(gpu) for gpu in GPU.objects.all()]
        answer["events"] += [events.node_event(node) for node in Node.objects.all()]
        alerts = Alert.objects.filter(Q(resolved_at__isnull=True) | Q(resolved_at__gt=moment))
        answer["events"] += [events.alert_event(alert) for alert in alerts[:ALERT_ROWS]]
        gpu_ids = None
    else:
        gpu_ids = set(
            Allocation.objects.filter(
                released_at__isnull=True, task__tenant_id__in=caller.tenant_ids
            ).values_list("gpu_id", flat=True)
        )
    answer["samples"] = history.samples_since(since=since, gpu_ids=gpu_ids)
    return answer


# --- The dashboard -----------------------------------------------------------------------------


def dashboard() -> dict:
    """Everything the dashboard's first render shows, in a fixed number of queries."""
    now = timezone.now()
    nodes = list(Node.objects.select_related("pool").order_by("name"))
    gpus = list(GPU.objects.order_by("node__name", "index"))
    holders: dict[int, list[dict]] = defaultdict(list)
    task_gpus: dict[int, list[GPU]] = defaultdict(list)
    by_id = {gpu.pk: gpu for gpu in gpus}
    for row in Allocation.objects.filter(released_at__isnull=True).values(
        "gpu_id", "task_id", "task__name", "task__tenant__name"
    ):
        holders[row["gpu_id"]].append(row)
        task_gpus[row["task_id"]].append(by_id[row["gpu_id"]])
    latest = history.latest_samples()
    per_node: dict[int, list[dict]] = defaultdict(list)
    for gpu in gpus:
        per_node[gpu.node_id].append(
            {"gpu": gpu, "holders": holders.get(gpu.pk, []), "sample": latest.get(gpu.pk)}
        )
    pending = Task.objects.filter(state=TaskState.PENDING)
    queue_by_tenant = list(
        pending.values("tenant__name", "task_class")
        .annotate(count=Count("id"))
        .order_by("tenant__name", "task_class")
    )
    # Not the spec, environment or command: a task's can be large and the page shows none.
    heavy = ("spec", "env", "command")
    queue_head = list(
        pending.select_related("tenant")
        .defer(*heavy)
        .annotate(position=Cast(KT("wait__position"), IntegerField()))
        .order_by("position", "-priority", "id")[:QUEUE_ROWS]
    )
    running = list(
        Task.objects.filter(state__in=HOLDS_GPUS)
        .select_related("tenant", "node")
        .defer(*heavy)
        .order_by("started_at", "id")[:RUNNING_ROWS]
    )
    for task in running:
        task.gpu_list = task_gpus.get(task.pk, [])
        began = task.started_at or task.scheduled_at
        task.runtime_s = (now - began).total_seconds() if began else None
    alerts = list(
        Alert.objects.filter(resolved_at__isnull=True).select_related("gpu__node", "node", "task")[
            :ALERT_ROWS
        ]
    )
    scheduler = SchedulerState.objects.filter(pk=1).first()
    return {
        "now": now,
        "nodes": [{"node": node, "gpus": per_node.get(node.pk, [])} for node in nodes],
        "gpu_count": len(gpus),
        "queue_by_tenant": queue_by_tenant,
        "pending_total": sum(row["count"] for row in queue_by_tenant),
        "queue_head": queue_head,
        "running": running,
        "alerts": alerts,
        "scheduler": scheduler,
        "fair_share": fair_share(now),
    }


def fair_share(now: datetime) -> list[dict]:
    """Every active tenant's decayed recent GPU use against its weight, heaviest first."""
    half_life = estate.config().scheduling.fair_share_half_life_s
    recent = recent_gpus(now, half_life)
    weights = dict(
        Quota.objects.filter(pool__isnull=True).values_list("tenant_id", "fair_share_weight")
    )
    rows = [
        {
            "tenant": name,
            "recent_gpus": round(recent.get(pk, 0.0), 2),
            "weight": weights.get(pk, 1.0),
            "standing": round(recent.get(pk, 0.0) / (weights.get(pk, 1.0) or 1.0), 2),
        }
        for pk, name in Tenant.objects.filter(is_active=True).values_list("pk", "name")
    ]
    return sorted(rows, key=lambda row: (-row["standing"], row["tenant"]))
