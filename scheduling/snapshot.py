"""What a scheduling pass reads: the snapshot of the estate, and the dependencies of the pending
tasks (those whose dependency ended without success fail before the policy runs).

Plain SQL in a fixed number of statements whatever the estate's size, read together
(``fetch_together``); the pure policy core gets the result as a ``policy.Snapshot``.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import NamedTuple

from gpuplatform.db import Query, fetch_together
from scheduling import estate, fairshare, states, transitions
from scheduling.models import (
    GpuState,
    NodeState,
    Task,
)
from scheduling.policy import (
    WAIT_DEPENDENCIES,
    WAIT_HELD,
    GpuView,
    Limits,
    PendingView,
    Promise,
    RunningView,
    Snapshot,
    TenantView,
)
from scheduling.states import TaskState

FAILED_DEPENDENCY = (TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMED_OUT)


# --- Dependencies ------------------------------------------------------------------------------


def fail_broken_dependencies(links: list[tuple[int, int, str, str]]) -> list[int]:
    """Pending tasks one of whose dependencies ended without success fail now, with the reason.
    ``links``: ``_dependency_links()`` as the pass read them."""
    first_cause: dict[int, str] = {}
    for task_id, dep_id, dep_name, dep_state in links:
        if dep_state in FAILED_DEPENDENCY:
            first_cause.setdefault(task_id, f"dependency {dep_name} (#{dep_id}) {dep_state}")
    failed: list[int] = []
    if not first_cause:
        return failed
    for task in Task.objects.filter(pk__in=first_cause, state=TaskState.PENDING):
        try:
            transitions.task_transition(task=task, to_state=TaskState.FAILED,
                                        reason=first_cause[task.pk])  # fmt: skip
        except transitions.StaleTask:
            continue
        failed.append(task.pk)
    return failed


def after_failing(
    links: list[tuple[int, int, str, str]], failed: list[int]
) -> list[tuple[int, int, str, str]]:
    """``links`` as ``_dependency_links()`` would read them once ``failed`` (pending tasks
    that ``fail_broken_dependencies`` failed) are: theirs gone, and they failed where they are
    a dependency. A pass reads the links once, not again after failing tasks."""
    if not failed:
        return links
    gone = set(failed)
    return [
        (task_id, dep_id, dep_name, TaskState.FAILED.value if dep_id in gone else dep_state)
        for task_id, dep_id, dep_name, dep_state in links
        if task_id not in gone
    ]


def _dependency_blocks(links: list[tuple[int, int, str, str]]) -> dict[int, str]:
    """Pending task id -> why its dependencies hold it back (absent: nothing holds it)."""
    waiting: dict[int, list[str]] = defaultdict(list)
    for task_id, dep_id, dep_name, dep_state in links:
        waiting[task_id].append(f"{dep_name} (#{dep_id}, {dep_state})")
    return {task_id: "waiting for " + ", ".join(deps) for task_id, deps in waiting.items()}


def _dependency_links() -> list[tuple[int, int, str, str]]:
    """(pending task, dependency, its name, its state) for each dependency not yet succeeded,
    in the order they were declared."""
    (links,) = fetch_together(Query(LINKS))
    return links


# Each dependency is looked up by its primary key (LATERAL ... LIMIT 1 keeps it a lookup):
# joined plainly, PostgreSQL hashed every task not succeeded, finished history included, even
# with no dependency at all (a cost growing with the task table). The states are in the SQL,
# as in _RUNNING.
LINKS = f"""
    SELECT d.from_task_id, d.to_task_id, t.name, t.state
      FROM scheduling_task_depends_on d
      JOIN scheduling_task f ON f.id = d.from_task_id
     CROSS JOIN LATERAL (SELECT name, state FROM scheduling_task
                          WHERE id = d.to_task_id LIMIT 1) t
     WHERE f.state = '{TaskState.PENDING.value}' AND t.state <> '{TaskState.SUCCEEDED.value}'
     ORDER BY d.from_task_id, d.id
"""  # noqa: S608 - the states are the code's constants


# --- Snapshot ------------------------------------------------------------------------------------


def _ts(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


class SnapshotRows(NamedTuple):
    """What ``snapshot_queries`` read, in their order."""

    promised: list[tuple]
    names: list[tuple]
    gpus: list[tuple]
    running: list[tuple]
    pending: list[tuple]
    quotas: list[tuple]
    usage: tuple[list[tuple], ...]  # fairshare.usage_queries'

    @classmethod
    def of(cls, read: list[list[tuple]]) -> SnapshotRows:
        promised, names, gpus, running, pending, quotas, *usage = read
        return cls(promised, names, gpus, running, pending, quotas, tuple(usage))


def snapshot_queries(now: datetime, half_life: float) -> list[Query]:
    """The reads a snapshot is built from (``SnapshotRows``), in a fixed number whatever the
    cluster's size. Plain SQL: through the ORM, compiling these queries was much of a small
    pass's CPU."""
    offline_after = estate.config().heartbeat.offline_after_s
    return [
        Query(_PROMISED),  # first: before the tasks (see _PROMISED)
        Query(_NAMES),
        Query(_GPUS, [now - timedelta(seconds=offline_after), NodeState.OFFLINE, GpuState.OFFLINE]),
        Query(_RUNNING, {"now": now}),
        # In binary: cheaper to read than as text.
        Query(_PENDING, binary=True),
        Query(_QUOTAS),
        *fairshare.usage_queries(now, half_life),
    ]


def build_snapshot(
    now: datetime,
    digests: dict[int, int] | None = None,
    *,
    dependency_links: list[tuple[int, int, str, str]] | None = None,
    rows: SnapshotRows | None = None,
) -> Snapshot:
    """Everything the policy needs, read in one round trip.

    ``digests``, when given, receives each pending task's ``wait_digest`` (update_reasons);
    ``dependency_links``: what ``_dependency_links()`` would read (a pass has them), so they
    are not read again; ``rows``: what ``snapshot_queries`` read (a pass reads them with its
    lock), so nothing is read."""
    half_life = estate.config().scheduling.fair_share_half_life_s
    if rows is None:
        queries = snapshot_queries(now, half_life)
        if dependency_links is None:
            queries.append(Query(LINKS))
        read = fetch_together(*queries)
        if dependency_links is None:
            dependency_links = read.pop()
        rows = SnapshotRows.of(read)
    names: dict[str, dict[int, str]] = {"tenant": {}, "node": {}, "pool": {}}
    for kind, pk, name in rows.names:
        names[kind][pk] = name
    tenants, node_names, pool_names = names["tenant"], names["node"], names["pool"]
    gpu_views = [
        GpuView(id=gpu_id, node=node, pool=pool or "", gpu_type=gpu_type,
                memory_mb=memory_mb, reserved_mb=reserved_mb, foreign_mb=foreign_mb,
                holders=holders, exclusive=exclusive > 0,
                schedulable=state == GpuState.AVAILABLE and node_state == NodeState.AVAILABLE)
        for (gpu_id, node, pool, gpu_type, memory_mb, foreign_mb, state, node_state,
             reserved_mb, holders, exclusive) in rows.gpus
    ]  # fmt: skip
    running = [
        RunningView(id=task_id, tenant=tenants[tenant_id], priority=priority,
                    task_class=task_class, preemptible=preemptible,
                    node=node_names.get(node_id, ""),
                    gpus=tuple((gpu_id, mb) for gpu_id, mb, _ in held or ()),
                    exclusive=not held or any(exclusive for *_, exclusive in held),
                    started_at=started_at, timeout_s=timeout_s, queue=queue,
                    stopping=state == TaskState.PREEMPTED, submitted_at=submitted_at)
        for (task_id, tenant_id, priority, task_class, preemptible, node_id, queue, timeout_s,
             state, started_at, submitted_at, held) in rows.running
    ]  # fmt: skip

    blocks = _dependency_blocks(
        _dependency_links() if dependency_links is None else dependency_links
    )
    if digests is not None:
        digests.update((row[0], row[-1]) for row in rows.pending)
    # Positional, in PendingView's field order (test_snapshot compares every field with a view
    # built by keywords): keywords made building them take longer.
    pending = [
        PendingView(
            task_id,
            tenants[tenant_id],
            priority,
            task_class,
            submitted_at,
            gpus_min,
            gpus_max,
            gpu_memory_mb,
            gpu_type,
            pool_names.get(pool_id, ""),
            required_node,
            queue,
            timeout_s,
            not_before,
            hold_reason or blocks.get(task_id, ""),
            WAIT_HELD if hold_reason else WAIT_DEPENDENCIES,
        )
        for (task_id, tenant_id, priority, task_class, submitted_at, gpus_min, gpus_max,
             gpu_memory_mb, gpu_type, pool_id, required_node, queue, timeout_s, not_before,
             hold_reason, _) in rows.pending
    ]  # fmt: skip

    return Snapshot(
        now=now.timestamp(),
        gpus=tuple(gpu_views),
        running=tuple(running),
        pending=tuple(pending),
        promised=tuple(Promise(task_id, tuple(gpu_ids)) for task_id, gpu_ids in rows.promised),
        tenants=_tenant_views(
            tenants, pool_names, rows.quotas, fairshare.usage_from(rows.usage, now, half_life)
        ),
    )


# Tenants, nodes and pools by name (tenants in name order: the order of the snapshot's tenants).
# The successors of the newest list that their tenants' quotas were charged for
# (``Successor.fenced``), each with the GPUs it would take first: a node agent may place any of
# them while the pass runs (``handoff``), so the pass counts each one it reads still pending as
# started (``policy.Promise``). Read before the tasks, each statement seeing what was committed
# when it began: a hand-off committed between the two reads is counted twice (it is listed,
# and runs), never not at all.
_PROMISED = """
    SELECT task_id, gpu_ids[1:gpus] FROM scheduling_successor
     WHERE fenced AND generation = (SELECT max(generation) FROM scheduling_successor)
"""

_NAMES = """
    SELECT 'tenant', id, name FROM tenants_tenant
    UNION ALL SELECT 'node', id, name FROM scheduling_node
    UNION ALL SELECT 'pool', id, name FROM scheduling_pool
    ORDER BY 1, 3
"""

# Every GPU but the offline ones, in node name and index order, with what its open
# allocations reserve on it.
# A node silent past heartbeat.offline_after is offline to the pass at once, whatever its row
# says until the every-minute schedule marks it (``tasks.mark_silent_nodes``): a dead node got
# tasks for up to a minute more, which then waited for lost_after to be requeued.
_GPUS = """
    SELECT g.id, n.name, p.name, g.gpu_type, g.memory_mb, g.foreign_memory_mb, g.state,
           CASE WHEN n.last_heartbeat < %s THEN %s ELSE n.state END,
           COALESCE(h.mb, 0), COALESCE(h.holders, 0), COALESCE(h.exclusive, 0)
      FROM scheduling_gpu g
      JOIN scheduling_node n ON n.id = g.node_id
      LEFT JOIN scheduling_pool p ON p.id = n.pool_id
      LEFT JOIN (SELECT gpu_id, SUM(memory_mb) AS mb, COUNT(*) AS holders,
                        COUNT(*) FILTER (WHERE exclusive) AS exclusive
                   FROM scheduling_allocation WHERE released_at IS NULL
                  GROUP BY gpu_id) h ON h.gpu_id = g.id
     WHERE g.state <> %s
     ORDER BY n.name, g.index
"""

# Tasks holding GPUs, newest first, each with its open allocations (gpu id, MiB, exclusive),
# latest first; times as epoch seconds, a task not yet started from when it was scheduled. The
# open allocations are aggregated once and joined: read per task in a subquery, PostgreSQL
# walked every open allocation for each running task through the per-GPU index wherever its
# statistics of the partial indexes were older than the running set, as they stay on a large
# allocation table.
#
# The states are written into this statement, _PENDING and LINKS, not passed: prepared
# (after its fifth run), a statement may switch to a generic plan, which cannot see which
# states it reads. For the running tasks that plan walked the task table in id order (for the
# ORDER BY), finished history and all, where the states in the SQL let it read only the
# running ones.
_HOLDING = ", ".join(f"'{state.value}'" for state in sorted(states.HOLDS_GPUS))

_RUNNING = f"""
    SELECT t.id, t.tenant_id, t.priority, t.task_class, t.preemptible, t.node_id, t.queue,
           t.timeout_s, t.state,
           EXTRACT(EPOCH FROM COALESCE(t.started_at, t.scheduled_at, %(now)s))::float8,
           EXTRACT(EPOCH FROM t.submitted_at)::float8, h.held
      FROM scheduling_task t
      LEFT JOIN (SELECT task_id, array_agg(ARRAY[gpu_id, memory_mb, exclusive::int]
                                           ORDER BY started_at DESC, id DESC) AS held
                   FROM scheduling_allocation WHERE released_at IS NULL
                  GROUP BY task_id) h ON h.task_id = t.id
     WHERE t.state IN ({_HOLDING})
     ORDER BY t.id DESC
"""  # noqa: S608 - the states are the code's constants


# Every pending task's fields, times as epoch seconds: with many pending tasks, reading them
# through the ORM (model rows, datetime objects) cost more than the policy itself.
_PENDING = f"""
    SELECT id, tenant_id, priority, task_class,
           EXTRACT(EPOCH FROM submitted_at)::float8, gpus_min, gpus_max, gpu_memory_mb,
           gpu_type, pool_id, required_node, queue, timeout_s,
           EXTRACT(EPOCH FROM not_before)::float8, hold_reason, wait_digest
      FROM scheduling_task
     WHERE state = '{TaskState.PENDING.value}'
"""  # noqa: S608 - the state is the code's constant

_QUOTAS = """
    SELECT tenant_id, pool_id, max_gpus, max_gpu_memory_mb, max_running_tasks, fair_share_weight
      FROM tenants_quota
"""


def _tenant_views(
    tenants: dict[int, str],
    pool_names: dict[int, str],
    quotas: list[tuple],
    usage: dict[int, float],
) -> dict[str, TenantView]:
    limits: dict[int, Limits] = {}
    pool_limits: dict[int, dict[str, Limits]] = defaultdict(dict)
    weights: dict[int, float] = {}
    for tenant_id, pool_id, gpus, gpu_memory_mb, running_tasks, weight in quotas:
        value = Limits(gpus=gpus, gpu_memory_mb=gpu_memory_mb, running_tasks=running_tasks)
        if pool_id is None:
            limits[tenant_id] = value
            weights[tenant_id] = weight
        else:
            pool_limits[tenant_id][pool_names[pool_id]] = value
    return {
        name: TenantView(
            name=name,
            weight=weights.get(pk, 1.0),
            recent_gpus=usage.get(pk, 0.0),
            limits=limits.get(pk, Limits()),
            pool_limits=pool_limits.get(pk, {}),
        )
        for pk, name in tenants.items()
    }


def recent_gpus(
    now: datetime, half_life_s: float, tenant_id: int | None = None
) -> dict[int, float]:
    """Each tenant's GPU use (or only ``tenant_id``'s), decayed with the half-life, in GPUs
    (see scheduling.fairshare: counters kept by a trigger plus the running allocations, never
    a scan of the history)."""
    usage = fairshare.usage(now, half_life_s)
    if tenant_id is None:
        return usage
    return {tenant_id: usage[tenant_id]} if tenant_id in usage else {}
