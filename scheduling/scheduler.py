"""The scheduling service: snapshot from PostgreSQL, the pure policy, decisions applied.

One pass runs in one transaction under a cluster-wide advisory lock, so passes from any number
of processes take turns and each sees the previous one's allocations. Placements are written
in bulk (one UPDATE, one INSERT of allocations, one of events), and PostgreSQL's allocation
trigger refuses an over-allocation even if this code had a bug.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from gpuplatform.db import server_bound_cursor
from live import events as live
from scheduling import estate, fairshare, passes, services, states
from scheduling.launcher import lifecycle
from scheduling.models import (
    GPU,
    Allocation,
    GpuState,
    Node,
    NodeState,
    Pool,
    Task,
    TaskEvent,
)
from scheduling.policy import (
    WAIT_DEPENDENCIES,
    WAIT_HELD,
    Decision,
    GpuView,
    Limits,
    PendingView,
    RunningView,
    Snapshot,
    TenantView,
    Wait,
    schedule,
)
from scheduling.states import TaskState
from tenants.models import Quota, Tenant

logger = logging.getLogger(__name__)

PASS_LOCK = zlib.crc32(b"gpuplatform.scheduling.pass")
FAILED_DEPENDENCY = (TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMED_OUT)
WAKE_MIN_GAP_S = 1.0  # a time-based pass is booked at least this long after the one booking it


@dataclass
class PassResult:
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    waiting: int = 0
    ms: float = 0.0
    wake_at: datetime | None = None  # the next pass booked for a time-based wait


def schedule_pass() -> PassResult:
    """Run one pass now (waiting for any pass already running elsewhere to finish)."""
    # A pass builds tens of thousands of short-lived objects (one view per waiting task, their
    # reasons) that hold no reference cycles: left on, the cycle collector ran full collections
    # in the middle of one pass in four, adding about 70 ms each (10,000 waiting tasks). It is
    # off for the pass, and back on (if it was) as soon as the pass ends.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _schedule_pass()
    finally:
        if collecting:
            gc.enable()


def _schedule_pass() -> PassResult:
    began = time.perf_counter()
    result = PassResult()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [PASS_LOCK])
        kept_for = passes.mark_started()
        now = timezone.now()
        half_life = estate.config().scheduling.fair_share_half_life_s
        fairshare.keep_counters_for(now, half_life, kept_for)
        result.failed = fail_broken_dependencies()
        digests: dict[int, int] = {}
        snapshot = build_snapshot(now, digests, counters_kept_for=half_life)
        decision = schedule(snapshot, estate.config().scheduling.policy_settings())
        # Stamped after the snapshot: an allocation released while it was taken must not
        # appear to overlap the one that replaces it.
        result.placed = apply_placements(decision, timezone.now())
        result.preempted = apply_preemptions(decision)
        result.waiting = update_reasons(decision, digests)
        # The policy says when a wait ends by time alone (backoff, starvation, reclaim); at
        # most one such pass a second, so tasks crossing starvation_after one after another
        # (a backlog submitted over hours) do not keep the scheduler busy with a pass each.
        if decision.wake_at is not None:
            wake_at = max(decision.wake_at, now.timestamp() + WAKE_MIN_GAP_S)
            result.wake_at = datetime.fromtimestamp(wake_at, UTC)
            passes.book_wake_up(result.wake_at)
        result.ms = (time.perf_counter() - began) * 1000
        record_pass(result, now, decision.line)
        live.publish_scheduler(
            {
                "last_pass_at": now.timestamp(),
                "last_pass_ms": round(result.ms, 1),
                "placed": len(result.placed),
                "preempted": len(result.preempted),
                "waiting": result.waiting,
            }
        )
    if result.placed or result.preempted or result.failed:
        logger.info(
            "pass: %d placed, %d preempted, %d failed (dependencies), %d waiting, %.1f ms",
            len(result.placed),
            len(result.preempted),
            len(result.failed),
            result.waiting,
            result.ms,
        )
    return result


# --- Dependencies ------------------------------------------------------------------------------


def fail_broken_dependencies() -> list[int]:
    """Pending tasks one of whose dependencies ended without success fail now, with the reason."""
    links = (
        Task.depends_on.through.objects.filter(
            from_task__state=TaskState.PENDING, to_task__state__in=FAILED_DEPENDENCY
        )
        .values_list("from_task_id", "to_task_id", "to_task__name", "to_task__state")
        .order_by("from_task_id")
    )
    first_cause: dict[int, str] = {}
    for task_id, dep_id, dep_name, dep_state in links:
        first_cause.setdefault(task_id, f"dependency {dep_name} (#{dep_id}) {dep_state}")
    failed = []
    for task in Task.objects.filter(pk__in=first_cause, state=TaskState.PENDING):
        try:
            services.task_transition(task=task, to_state=TaskState.FAILED,
                                     reason=first_cause[task.pk])  # fmt: skip
        except services.StaleTask:
            continue
        failed.append(task.pk)
    return failed


def _dependency_blocks() -> dict[int, str]:
    """Pending task id -> why its dependencies hold it back (absent: nothing holds it)."""
    waiting: dict[int, list[str]] = defaultdict(list)
    links = Task.depends_on.through.objects.filter(from_task__state=TaskState.PENDING).exclude(
        to_task__state=TaskState.SUCCEEDED
    )
    for task_id, dep_id, dep_name, dep_state in links.values_list(
        "from_task_id", "to_task_id", "to_task__name", "to_task__state"
    ):
        waiting[task_id].append(f"{dep_name} (#{dep_id}, {dep_state})")
    return {task_id: "waiting for " + ", ".join(deps) for task_id, deps in waiting.items()}


# --- Snapshot ------------------------------------------------------------------------------------


def _ts(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def build_snapshot(
    now: datetime,
    digests: dict[int, int] | None = None,
    *,
    counters_kept_for: float | None = None,
) -> Snapshot:
    """Everything the policy needs, in a handful of queries whatever the cluster's size.

    ``digests``, when given, receives each pending task's ``wait_digest`` (update_reasons);
    ``counters_kept_for``: the half-life the fair-share counters are known to be kept for (a
    pass made sure of it), so they are not asked."""
    active = Allocation.objects.filter(released_at__isnull=True)
    held = {
        row["gpu_id"]: row
        for row in active.values("gpu_id").annotate(
            mb=Sum("memory_mb"), n=Count("id"), exclusive=Count("id", filter=Q(exclusive=True))
        )
    }
    gpu_views = []
    # Values, not model instances: 256 GPUs with their node and pool cost several ms as objects.
    gpus = GPU.objects.exclude(state=GpuState.OFFLINE).values_list(
        "id", "node__name", "node__pool__name", "gpu_type", "memory_mb", "foreign_memory_mb",
        "state", "node__state",
    )  # fmt: skip
    for gpu_id, node, pool, gpu_type, memory_mb, foreign_mb, state, node_state in gpus:
        row = held.get(gpu_id, {})
        gpu_views.append(
            GpuView(
                id=gpu_id,
                node=node,
                pool=pool,
                gpu_type=gpu_type,
                memory_mb=memory_mb,
                reserved_mb=row.get("mb", 0),
                foreign_mb=foreign_mb,
                holders=row.get("n", 0),
                exclusive=bool(row.get("exclusive")),
                schedulable=state == GpuState.AVAILABLE and node_state == NodeState.AVAILABLE,
            )
        )

    tenants = dict(Tenant.objects.values_list("pk", "name"))
    node_names = dict(Node.objects.values_list("pk", "name"))
    pool_names = dict(Pool.objects.values_list("pk", "name"))
    by_task: dict[int, list[tuple[int, int, bool]]] = defaultdict(list)
    for task_id, gpu_id, mb, exclusive in active.values_list(
        "task_id", "gpu_id", "memory_mb", "exclusive"
    ):
        by_task[task_id].append((gpu_id, mb, exclusive))

    running = []
    for row in Task.objects.filter(state__in=states.HOLDS_GPUS).values(
        "id", "tenant_id", "priority", "task_class", "preemptible", "node_id", "queue",
        "timeout_s", "state", "started_at", "scheduled_at", "submitted_at",
    ):  # fmt: skip
        allocations = by_task.get(row["id"], [])
        started = row["started_at"] or row["scheduled_at"] or now
        running.append(
            RunningView(
                id=row["id"],
                tenant=tenants[row["tenant_id"]],
                priority=row["priority"],
                task_class=row["task_class"],
                preemptible=row["preemptible"],
                node=node_names.get(row["node_id"], ""),
                gpus=tuple((gpu_id, mb) for gpu_id, mb, _ in allocations),
                exclusive=any(exclusive for *_, exclusive in allocations) or not allocations,
                started_at=started.timestamp(),
                timeout_s=row["timeout_s"],
                queue=row["queue"],
                stopping=row["state"] == TaskState.PREEMPTED,
                submitted_at=row["submitted_at"].timestamp(),
            )
        )

    blocks = _dependency_blocks()
    rows = _pending_rows()
    if digests is not None:
        digests.update((row[0], row[-1]) for row in rows)
    pending = [
        PendingView(
            id=task_id,
            tenant=tenants[tenant_id],
            priority=priority,
            task_class=task_class,
            submitted_at=submitted_at,
            gpus_min=gpus_min,
            gpus_max=gpus_max,
            gpu_memory_mb=gpu_memory_mb,
            gpu_type=gpu_type,
            pool=pool_names.get(pool_id, ""),
            node=required_node,
            queue=queue,
            timeout_s=timeout_s,
            not_before=not_before,
            blocked=hold_reason or blocks.get(task_id, ""),
            blocked_code=WAIT_HELD if hold_reason else WAIT_DEPENDENCIES,
        )
        for (task_id, tenant_id, priority, task_class, submitted_at, gpus_min, gpus_max,
             gpu_memory_mb, gpu_type, pool_id, required_node, queue, timeout_s, not_before,
             hold_reason, _) in rows
    ]  # fmt: skip

    return Snapshot(
        now=now.timestamp(),
        gpus=tuple(gpu_views),
        running=tuple(running),
        pending=tuple(pending),
        tenants=_tenant_views(tenants, pool_names, now, counters_kept_for=counters_kept_for),
    )


def _pending_rows() -> list[tuple]:
    """Every pending task's fields, times as epoch seconds: with 10,000 pending tasks, reading
    them through the ORM (model rows, datetime objects) cost more than the policy itself."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT id, tenant_id, priority, task_class,
                   EXTRACT(EPOCH FROM submitted_at)::float8, gpus_min, gpus_max, gpu_memory_mb,
                   gpu_type, pool_id, required_node, queue, timeout_s,
                   EXTRACT(EPOCH FROM not_before)::float8, hold_reason, wait_digest
              FROM scheduling_task
             WHERE state = %s
            """,
            [TaskState.PENDING],
        )
        return cursor.fetchall()


def _tenant_views(
    tenants: dict[int, str],
    pool_names: dict[int, str],
    now: datetime,
    *,
    counters_kept_for: float | None,
) -> dict[str, TenantView]:
    half_life = estate.config().scheduling.fair_share_half_life_s
    # The configuration may have changed since the pass made sure of the counters: then ask.
    recent = fairshare.usage(now, half_life, kept=counters_kept_for == float(half_life))
    limits: dict[int, Limits] = {}
    pool_limits: dict[int, dict[str, Limits]] = defaultdict(dict)
    weights: dict[int, float] = {}
    for quota in Quota.objects.all():
        value = Limits(
            gpus=quota.max_gpus,
            gpu_memory_mb=quota.max_gpu_memory_mb,
            running_tasks=quota.max_running_tasks,
        )
        if quota.pool_id is None:
            limits[quota.tenant_id] = value
            weights[quota.tenant_id] = quota.fair_share_weight
        else:
            pool_limits[quota.tenant_id][pool_names[quota.pool_id]] = value
    return {
        name: TenantView(
            name=name,
            weight=weights.get(pk, 1.0),
            recent_gpus=recent.get(pk, 0.0),
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


# --- Applying decisions --------------------------------------------------------------------------


def apply_placements(decision: Decision, now: datetime) -> list[int]:
    """Pending -> scheduled for every placement, with its allocations and events, in bulk.

    The UPDATE only touches tasks still pending, so a task cancelled since the snapshot is
    simply skipped (the snapshot was taken under the pass lock, but cancels do not take it).
    The launches are queued for the nodes once the pass commits, from what it wrote.
    """
    if not decision.placements:
        return []
    states.check(TaskState.PENDING, TaskState.SCHEDULED)  # the bulk path of task_transition
    node_ids = dict(Node.objects.values_list("name", "pk"))
    values = [(p.task_id, node_ids[p.node]) for p in decision.placements]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE scheduling_task AS t
               SET state = %s, node_id = v.node_id, attempt = t.attempt + 1,
                   scheduled_at = %s, updated_at = %s, reason = '', wait = '{}',
                   wait_digest = 0
              FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::bigint[]) AS node_id) AS v
             WHERE t.id = v.id AND t.state = %s
         RETURNING t.id, t.attempt, t.tenant_id
            """,
            [
                TaskState.SCHEDULED,
                now,
                now,
                [task_id for task_id, _ in values],
                [node_id for _, node_id in values],
                TaskState.PENDING,
            ],
        )
        returned = cursor.fetchall()
    attempts = {task_id: attempt for task_id, attempt, _ in returned}
    tenants = {task_id: tenant_id for task_id, _, tenant_id in returned}
    allocations = []
    placed = []
    events = []
    for placement in decision.placements:
        attempt = attempts.get(placement.task_id)
        if attempt is None:
            continue
        for gpu_id, memory_mb in placement.gpus:
            allocations.append(
                Allocation(
                    task_id=placement.task_id,
                    attempt=attempt,
                    gpu_id=gpu_id,
                    memory_mb=memory_mb,
                    exclusive=placement.exclusive,
                    started_at=now,
                )
            )
        gpus = ", ".join(str(gpu_id) for gpu_id, _ in placement.gpus) or "none"
        gpu_ids = [gpu_id for gpu_id, _ in placement.gpus]
        placed.append(
            (placement.task_id, tenants[placement.task_id], node_ids[placement.node], gpu_ids)
        )
        events.append(
            TaskEvent(
                task_id=placement.task_id,
                at=now,
                from_state=TaskState.PENDING,
                to_state=TaskState.SCHEDULED,
                reason=f"placed on {placement.node} (GPU ids {gpus})",
                attempt=attempt,
            )
        )
    Allocation.objects.bulk_create(allocations)
    TaskEvent.objects.bulk_create(events)
    # Registered before the live events, so the launches are queued first after the commit.
    launches = [(p.task_id, attempts[p.task_id], p.node) for p in decision.placements
                if p.task_id in attempts]  # fmt: skip
    transaction.on_commit(lambda: lifecycle.dispatch_launches(launches))
    live.publish_placements(placed)
    return list(attempts)


def apply_preemptions(decision: Decision) -> list[int]:
    done = []
    victims = Task.objects.in_bulk([p.task_id for p in decision.preemptions])
    for preemption in decision.preemptions:
        task = victims.get(preemption.task_id)
        if task is None:
            continue
        try:
            lifecycle.task_preempt(task=task, reason=preemption.reason)
        except (services.StaleTask, states.IllegalTransition):
            continue
        done.append(task.pk)
    return done


def update_reasons(decision: Decision, digests: dict[int, int]) -> int:
    """Store why each task waits, as text and as data (``Task.wait``), without its place in
    line (``record_pass``): both stay the same from pass to pass until something about the
    task's wait changes, and only the tasks whose wait changed are written, in one statement.

    ``digests`` holds what each task's row says now (its ``wait_digest``). A pass gives one
    Wait object to all the tasks of a shape it blocked, so the text, the JSON and the digest are
    made once per distinct wait, not once per task."""
    if decision.waits:
        waits = decision.waits.items()
    else:  # a policy that gives text only (a baseline, a test's)
        texts = decision.waiting
        by_text = {text: Wait("other", text) for text in set(texts.values())}
        waits = ((task_id, by_text[text]) for task_id, text in texts.items())
    index: dict[int, int] = {}  # id(Wait) -> its place in the arrays below
    reasons: list[str] = []
    records: list[str] = []
    digest_of: list[int] = []
    ids: list[int] = []
    which: list[int] = []
    count = 0
    for task_id, why in waits:
        count += 1
        n = index.get(id(why))
        if n is None:
            n = index[id(why)] = len(reasons)
            record = json.dumps({"code": why.code, "details": why.details}, sort_keys=True)
            reasons.append(why.text)
            records.append(record)
            digest_of.append(_digest(why.text, record))
        if digests.get(task_id) != digest_of[n]:
            ids.append(task_id)
            which.append(n + 1)  # SQL arrays count from 1
    if ids:
        with server_bound_cursor() as cursor:
            cursor.execute(
                """
                UPDATE scheduling_task AS t
                   SET reason = (%s::text[])[v.n], wait = (%s::jsonb[])[v.n],
                       wait_digest = (%s::bigint[])[v.n]
                  FROM unnest(%s::bigint[], %s::int[]) AS v(id, n)
                 WHERE t.id = v.id AND t.state = %s
             RETURNING t.id, t.tenant_id, t.reason
                """,
                [reasons, records, digest_of, ids, which, TaskState.PENDING.value],
            )
            # Only the reasons that changed: an unchanged queue costs the pages nothing.
            live.publish_reasons(cursor.fetchall())
    return count


def record_pass(result: PassResult, now: datetime, line: list[int]) -> None:
    """The pass's figures, and the tasks waiting for GPUs or quota in the order they would
    start (``line``), in one statement on the scheduler's row (which ``keep_counters_for`` made
    sure exists). The line is one array, so a placement ahead of 10,000 waiting tasks moves
    their places without rewriting them, and it is not written again while it stays the same."""
    digest = hash(tuple(line))
    # As the array's text: psycopg dumps a Python list element by element in Python (about
    # 15 ms for 10,000 ids); joining the digits is a fraction of that.
    text = "{" + ",".join(map(str, line)) + "}"
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE scheduling_schedulerstate
               SET passes = passes + 1, last_pass_at = %s, last_pass_ms = %s,
                   last_placed = %s, last_preempted = %s, last_waiting = %s,
                   line = CASE WHEN line_digest <> %s THEN %s::bigint[] ELSE line END,
                   line_digest = %s
             WHERE id = 1
            """,
            [
                now,
                round(result.ms, 1),
                len(result.placed),
                len(result.preempted),
                result.waiting,
                digest,
                text,
                digest,
            ],
        )


def _digest(reason: str, record: str) -> int:
    """A signed 64-bit digest of a stored (reason, wait): what bigint holds."""
    raw = hashlib.blake2b(f"{reason}\0{record}".encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big", signed=True) or 1  # 0 means "not written by a pass"
