"""Reads of the GPU estate and tasks. Task reads take the tenant as a required keyword argument:
another tenant's task is simply not there (404), whoever calls. The views, serializers and
consumers read tasks, attempts and allocations only through here (tests/test_tenancy_choke_point
checks it); operators' reads of every tenant's tasks are the ``*_all``/``*_any`` ones."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Exists, OuterRef, Prefetch, Q, QuerySet
from django.shortcuts import get_object_or_404

from gpuplatform.db import server_bound_cursor
from scheduling.models import GPU, Allocation, Health, Node, Pool, Task, TaskAttempt, TaskEvent
from scheduling.states import TaskState
from tenants.models import Tenant

# At most this many of a tenant's queue names are compared with a new one.
QUEUES_COMPARED = 1000


def task_list(*, tenant: Tenant) -> QuerySet[Task]:
    """The tenant's tasks, as a queryset (TaskListing reads the same rows, as SQL)."""
    return Task.objects.filter(tenant=tenant)


def task_list_all(*, tenant_name: str = "", states: list[str] | None = None) -> QuerySet[Task]:
    """Every tenant's tasks, newest first (operators), or one tenant's by its name."""
    tasks = Task.objects.select_related("node", "owner", "tenant")
    if tenant_name:
        tasks = tasks.filter(tenant__name=tenant_name)
    if states:
        tasks = tasks.filter(state__in=states)
    return tasks.order_by("-id")


def task_get_any(*, pk: int) -> Task:
    """Any tenant's task (operators), or 404."""
    return get_object_or_404(Task.objects.select_related("tenant"), pk=pk)


# What a task list's row holds, in this order (scheduling.api_rows._row reads it): Task columns,
# then "wait_code" (None until a pass assessed the task, else the code of why it waits, "" if
# none), "node" (its node's name) and "owner" (its owner's username).
TASK_ROW = (
    "id", "name", "state", "reason", "reason_code", "reason_params", "wait_code", "queue",
    "priority", "task_class", "gpus_min", "gpus_max", "gpu_memory_mb", "node", "owner", "attempt",
    "exit_code", "submitted_at", "started_at", "finished_at",
)  # fmt: skip


@functools.cache
def _task_row_sql() -> tuple[str, str]:
    """The select list and FROM clause of TASK_ROW, from the models' own names."""
    task, node = Task._meta.db_table, Node._meta.db_table
    user_model = get_user_model()
    user, username = (
        user_model._meta.db_table,
        user_model._meta.get_field(user_model.USERNAME_FIELD).column,
    )

    def column(name: str) -> str:
        return f'"{task}"."{Task._meta.get_field(name).column}"'

    wait = column("wait")
    special = {
        "wait_code": f"CASE WHEN {wait} = '{{}}'::jsonb THEN NULL "
        f"ELSE coalesce({wait} ->> 'code', '') END",
        "node": f'"{node}"."name"',
        "owner": f'"{user}"."{username}"',
    }
    select = ", ".join(special.get(name) or column(name) for name in TASK_ROW)
    source = (
        f'"{task}" LEFT OUTER JOIN "{node}" ON ({column("node")} = "{node}"."id") '
        f'LEFT OUTER JOIN "{user}" ON ({column("owner")} = "{user}"."id")'
    )
    return select, source


@dataclass(frozen=True, kw_only=True)
class TaskListing:
    """A tenant's tasks, newest first, with the task list's filters, as DRF's pagination reads
    a queryset: ``count()``, and a slice as rows of TASK_ROW. The rows ``task_list`` answers
    for the same tenant (tests/api checks the two agree), written as SQL, not as an ORM query:
    building and compiling the queryset, its count and the values' converters were a large
    share of a page's CPU in the web process. Both statements are prepared
    (server_bound_cursor), and only the columns the list shows are read."""

    tenant: Tenant
    states: list[str] | None = None
    queue: str | None = None
    name_contains: str | None = None
    submitted_after: datetime | None = None  # inclusive
    submitted_before: datetime | None = None

    def _where(self) -> tuple[str, dict[str, object]]:
        task = Task._meta.db_table
        tests, args = [f'"{task}"."tenant_id" = %(tenant)s'], {"tenant": self.tenant.pk}
        if self.states:
            tests.append(f'"{task}"."state" = ANY(%(states)s)')
            args["states"] = list(self.states)
        if self.queue:
            tests.append(f'"{task}"."queue" = %(queue)s')
            args["queue"] = self.queue
        if self.name_contains:
            # As the ORM's name__icontains: LIKE with the text's own % _ \ escaped.
            tests.append(f'UPPER("{task}"."name"::text) LIKE UPPER(%(name)s)')
            args["name"] = f"%{connection.ops.prep_for_like_query(self.name_contains)}%"
        if self.submitted_after is not None:
            tests.append(f'"{task}"."submitted_at" >= %(after)s')
            args["after"] = self.submitted_after
        if self.submitted_before is not None:
            tests.append(f'"{task}"."submitted_at" < %(before)s')
            args["before"] = self.submitted_before
        return " AND ".join(tests), args

    def count(self, at_most: int | None = None) -> int:
        """How many tasks match, or ``at_most`` when at least that many do: a tenant's history
        can hold millions of tasks, and counting them all for every page grows with the
        history, where counting up to ``at_most`` costs what reading that many entries of an
        index does."""
        where, args = self._where()
        matching = f'FROM "{Task._meta.db_table}" WHERE {where}'
        if at_most is not None:
            matching = f"FROM (SELECT 1 {matching} LIMIT %(at_most)s) AS matching"
            args["at_most"] = at_most
        with server_bound_cursor() as cursor:
            cursor.execute(f"SELECT count(*) {matching}", args)  # noqa: S608 - our SQL
            return cursor.fetchone()[0]

    def __getitem__(self, window: slice) -> list[tuple]:
        if window.step is not None or window.start is None or window.stop is None:
            raise TypeError("a task listing is read in windows [start:stop]")
        where, args = self._where()
        select, source = _task_row_sql()
        with server_bound_cursor() as cursor:
            cursor.execute(
                f"SELECT {select} FROM {source} WHERE {where} "  # noqa: S608 - our SQL
                f'ORDER BY "{Task._meta.db_table}"."id" DESC LIMIT %(limit)s OFFSET %(offset)s',
                {**args, "limit": window.stop - window.start, "offset": window.start},
            )
            return cursor.fetchall()


def task_get(*, tenant: Tenant, pk: int) -> Task:
    """The tenant's task, or 404."""
    return get_object_or_404(task_list(tenant=tenant), pk=pk)


def task_attempt(*, tenant: Tenant, task_id: int, number: int) -> TaskAttempt | None:
    """Attempt ``number`` of the tenant's task (its log file, the node holding it, and its
    outcome), or None."""
    attempts = TaskAttempt.objects.filter(task__tenant=tenant, task_id=task_id, number=number)
    fields = ("task_id", "number", "log_path", "outcome", "node__name", "node__advertise_address")
    return attempts.select_related("node").only(*fields).first()


def task_detail(*, tenant: Tenant, pk: int) -> Task:
    """The tenant's task with what its detail shows (node, pool, GPUs, attempts, dependencies)
    in a fixed number of queries, or 404."""
    allocations = Allocation.objects.select_related("gpu")
    attempts = Prefetch(
        "attempts", queryset=TaskAttempt.objects.select_related("node").order_by("number")
    )
    tasks = (
        task_list(tenant=tenant)
        .select_related("node", "owner", "pool")
        .prefetch_related(Prefetch("allocations", queryset=allocations), attempts, "depends_on")
    )
    task = get_object_or_404(tasks, pk=pk)
    if (task.spec or {}).get("service") is not None:
        task.service_group = service_group(tenant=tenant, task=task)
    return task


@dataclass(frozen=True)
class Replica:
    """One replica of a service as its detail shows it: the task and its current attempt."""

    task: Task
    attempt: TaskAttempt | None


def service_group(*, tenant: Tenant, task: Task) -> list[Replica]:
    """Every replica of ``task``'s service (the service first), each with its current attempt
    (its port and health), in two queries."""
    first = task.replica_of_id or task.pk
    members = list(
        task_list(tenant=tenant)
        .filter(Q(pk=first) | Q(replica_of=first))
        .select_related("node")
        .only("pk", "name", "state", "attempt", "replica_of", "node__name")
        .order_by("id")
    )
    current = {
        (a.task_id, a.number): a
        for a in TaskAttempt.objects.filter(
            task__in=[m.pk for m in members], number__gte=1, outcome=""
        ).only(
            "task_id", "number", "service_port", "health", "health_detail", "health_checked_at"
        )  # fmt: skip
    }
    return [Replica(m, current.get((m.pk, m.attempt))) for m in members]


def task_events(*, tenant: Tenant, pk: int) -> QuerySet[TaskEvent]:
    """The state changes of the tenant's task, oldest first; 404 for someone else's task."""
    task = task_get(tenant=tenant, pk=pk)
    return task.events.select_related("actor").order_by("at", "id")


def node_list() -> QuerySet[Node]:
    return Node.objects.select_related("pool").annotate(gpu_count=Count("gpus"))


def gpu_list(*, tenant: Tenant) -> QuerySet[GPU]:
    """Every GPU, with ``active_allocations`` (every tenant's, for what they reserve) and
    ``tenant_allocations`` (the tenant's own, with their tasks)."""
    active = Allocation.objects.filter(released_at__isnull=True)
    return GPU.objects.select_related("node").prefetch_related(
        Prefetch("allocations", queryset=active, to_attr="active_allocations"),
        Prefetch(
            "allocations",
            queryset=active.filter(task__tenant=tenant).select_related("task"),
            to_attr="tenant_allocations",
        ),
    )


def pool_list() -> QuerySet[Pool]:
    return Pool.objects.annotate(
        node_count=Count("nodes", distinct=True), gpu_count=Count("nodes__gpus", distinct=True)
    )


def queues_new_for_tenant(*, tenant: Tenant, names: Iterable[str]) -> dict[str, list[str]]:
    """Which of ``names`` no task of ``tenant`` has used yet, each with the tenant's queues it
    most resembles (what a misspelt ``queue:`` probably meant), closest first."""
    wanted = {name for name in names if name}
    if not wanted:
        return {}
    used = set(Task.objects.filter(tenant=tenant, queue__in=wanted).values_list("queue", flat=True))
    new = sorted(wanted - used)
    if not new:
        return {}
    known = list(
        Task.objects.filter(tenant=tenant)
        .exclude(queue="")
        .order_by("queue")
        .values_list("queue", flat=True)
        .distinct()[:QUEUES_COMPARED]
    )
    return {name: difflib.get_close_matches(name, known, n=3, cutoff=0.6) for name in new}


# --- The portal's task list ---------------------------------------------------------------------

# Orders the portal's task list offers, each ending in the primary key so that a page's last row
# is a unique cursor (keyset pagination: the 1,000th page costs what the first does).
TASK_SORTS = {
    "newest": ("-id",),
    "oldest": ("id",),
    "priority": ("-priority", "-id"),
}
ACTIVE_STATES = ("pending", "scheduled", "running", "paused", "preempted")


def task_page(
    *,
    tenant: Tenant,
    states: Iterable[str] = (),
    queue: str = "",
    owner_id: int | None = None,
    name: str = "",
    sort: str = "newest",
    after: tuple[int, ...] | None = None,
    limit: int = 50,
) -> tuple[list[Task], tuple[int, ...] | None]:
    """One page of the tenant's tasks, filtered and sorted, starting after the cursor ``after``
    (the sort key of the previous page's last row). Returns the rows and the next cursor (None
    on the last page). One query, whatever the page."""
    tasks = task_list(tenant=tenant).select_related("owner", "node")
    states = list(states)
    if states:
        tasks = tasks.filter(state__in=states)
    if queue:
        tasks = tasks.filter(queue=queue)
    if owner_id is not None:
        tasks = tasks.filter(owner_id=owner_id)
    if name:
        tasks = tasks.filter(name__icontains=name)
    order = TASK_SORTS[sort]
    if after is not None:
        tasks = tasks.filter(_after(order, after))
    rows = list(tasks.order_by(*order)[: limit + 1])
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    last = rows[-1]
    return rows, tuple(getattr(last, field.lstrip("-")) for field in order)


def _after(order: tuple[str, ...], cursor: tuple[int, ...]) -> Q:
    """Rows after ``cursor`` in ``order``: (a, b) > (x, y) spelt out per direction."""
    condition = Q()
    for i, field in enumerate(order):
        name = field.lstrip("-")
        lookup = "lt" if field.startswith("-") else "gt"
        step = Q(**{f"{name}__{lookup}": cursor[i]})
        for earlier, value in zip(order[:i], cursor[:i], strict=False):
            step &= Q(**{earlier.lstrip("-"): value})
        condition |= step
    return condition


def tasks_active(*, tenant: Tenant, owner_id: int, limit: int = 20) -> list[Task]:
    """The owner's tasks that have not ended, newest first (the portal's overview), with the
    pending ones' places in line (``Task.reason_text``)."""
    tasks = list(
        task_list(tenant=tenant)
        .filter(owner_id=owner_id, state__in=ACTIVE_STATES)
        .select_related("node")
        .order_by("-id")[:limit]
    )
    Task.attach_places(tasks)
    return tasks


def gpus_free_by_type() -> list[dict]:
    """Whole GPUs nothing holds now, per type, on nodes that take new work: what a new task
    could start on at once. Also how many are simulated (said so wherever they are shown).

    "Holds" is what the API's ``in_use`` says (:func:`gpu_list`'s active allocations): a GPU
    that never held an allocation is free, one shared by memory is not free whole."""
    held = Allocation.objects.filter(gpu=OuterRef("pk"), released_at__isnull=True)
    free = (
        GPU.objects.filter(state="available", node__state="available")
        .exclude(Exists(held))
        .values("gpu_type", "memory_mb")
        .annotate(
            free=Count("id"),
            simulated=Count("id", filter=Q(node__backend="simulated")),
        )
        .order_by("gpu_type")
    )
    return list(free)


@dataclass(frozen=True)
class Offer:
    """One GPU type or pool a task may ask for, as the submit form lists it: ``free`` whole
    GPUs a new task could start on at once (what :func:`gpus_free_by_type` counts), of
    ``total`` GPUs the platform knows of it in any state."""

    name: str
    free: int
    total: int


def gpu_offers() -> tuple[list[Offer], list[Offer]]:
    """Every GPU type and every pool that has nodes (one of CPU-only nodes too: a task of
    ``gpus: 0`` may ask for it), each with its free and total GPUs: the choices a task's
    ``gpu_type`` and ``pool`` have now."""
    held = Allocation.objects.filter(gpu=OuterRef("pk"), released_at__isnull=True)
    rows = (
        GPU.objects.values("gpu_type", "node__pool__name")
        .annotate(
            total=Count("id"),
            free=Count("id", filter=Q(~Exists(held), state="available", node__state="available")),
        )
        .order_by()
    )
    types: dict[str, list[int]] = {}
    pools: dict[str, list[int]] = {
        name: [0, 0]
        for name in Pool.objects.filter(nodes__isnull=False).values_list("name", flat=True)
    }
    for row in rows:
        for key, into in ((row["gpu_type"], types), (row["node__pool__name"], pools)):
            counts = into.setdefault(key, [0, 0])
            counts[0] += row["free"]
            counts[1] += row["total"]
    return (
        [Offer(name, free, total) for name, (free, total) in sorted(types.items())],
        [Offer(name, free, total) for name, (free, total) in sorted(pools.items())],
    )


@dataclass(frozen=True)
class Upstream:
    """One running copy of a service: its task, the node it runs on (where to reach it) and
    the port its attempt listens on there."""

    task_id: int
    node_name: str
    advertise_address: str
    port: int
    health: str


def service_replicas(*, tenant_ids: Iterable[int], pk: int) -> tuple[Task, list[Upstream]] | None:
    """The service ``pk`` of one of ``tenant_ids`` (a replica's id stands for its service) and
    its replicas that may take requests: running, with a port, and healthy when the service has
    a health check (running is enough without one). None when no such task is the caller's:
    someone else's service is simply not there."""
    tenant_ids = list(tenant_ids)
    task = (
        Task.objects.filter(tenant_id__in=tenant_ids, pk=pk)
        .only("id", "tenant_id", "replica_of_id", "state", "name")
        .first()
    )
    if task is None:
        return None
    if task.replica_of_id is not None:
        task = Task.objects.filter(tenant_id__in=tenant_ids, pk=task.replica_of_id).first()
        if task is None:
            return None
    attempts = (
        TaskAttempt.objects.filter(
            Q(task_id=task.pk) | Q(task__replica_of_id=task.pk),
            task__tenant_id=task.tenant_id,
            task__state=TaskState.RUNNING,
            ended_at__isnull=True,
            service_port__isnull=False,
        )
        .exclude(health__in=[Health.STARTING, Health.UNHEALTHY])
        .select_related("node")
        .order_by("task_id", "-number")
    )
    replicas, seen = [], set()
    for attempt in attempts:
        if attempt.task_id in seen:  # only a task's newest unfinished attempt
            continue
        seen.add(attempt.task_id)
        replicas.append(
            Upstream(
                task_id=attempt.task_id,
                node_name=attempt.node.name,
                advertise_address=attempt.node.advertise_address,
                port=attempt.service_port,
                health=attempt.health,
            )
        )
    return task, replicas
