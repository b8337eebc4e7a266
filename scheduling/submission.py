"""Submitting tasks: the one path the API, the CLI and the portal all take.

A spec that passed ``scheduling.spec`` is checked against the tenant (active, quotas) and
against the cluster: a request that no GPU could ever satisfy is refused now, with the reason,
instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import functools
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models.base import ModelState
from django.utils import timezone
from django.utils.translation import gettext as _

from gpuplatform.db import server_bound_cursor
from gpuplatform.units import format_memory_mb
from scheduling import passes, paths, reasons
from scheduling.models import GpuState, Task, TaskEvent
from scheduling.spec import MAX_SWEEP_TASKS, SpecError, TaskSpec
from scheduling.states import TaskState
from tenants.models import Quota, Tenant

QUEUED_STATES = (TaskState.PENDING,)


class SubmitError(SpecError):
    """Same shape as SpecError: {field path: [reasons]}, so callers handle both alike."""


@dataclass(frozen=True)
class _Shape:
    """What the cluster could ever offer, per (pool, node, GPU type)."""

    pool: str
    node: str
    gpu_type: str
    count: int
    memory_mb: int


@dataclass(frozen=True)
class _Estate:
    """Pools, nodes and GPU shapes, and the tenant's cluster-wide quota: read once per
    submission however many tasks it holds."""

    pools: dict[str, int]  # name: id
    nodes: set[str]
    nodes_by_pool: set[str]  # pools that have at least one node
    shapes: list[_Shape]
    quota: Quota | None


# One round trip for everything a submission checks against: for queries this small, Django's
# compiler and PostgreSQL's parser cost more than the execution, so four ORM queries became one.
# Read fresh every time rather than cached: a cached pool could have been deleted since, and
# the task's INSERT would then fail on its foreign key. Prepared (server_bound_cursor), as are
# the INSERT, the token's read and the rate step: PostgreSQL plans each once per connection.
ESTATE_SQL = """
SELECT
  (SELECT coalesce(json_agg(json_build_array(p.name, p.id)), '[]') FROM scheduling_pool p),
  (SELECT coalesce(json_agg(json_build_array(n.name, p.name)), '[]')
     FROM scheduling_node n JOIN scheduling_pool p ON p.id = n.pool_id),
  (SELECT coalesce(json_agg(json_build_array(s.pool, s.node, s.gpu_type, s.count, s.memory)),
                   '[]')
     FROM (SELECT p.name AS pool, n.name AS node, g.gpu_type, count(*) AS count,
                  max(g.memory_mb) AS memory
             FROM scheduling_gpu g
             JOIN scheduling_node n ON n.id = g.node_id
             JOIN scheduling_pool p ON p.id = n.pool_id
            WHERE g.state <> %(failed)s
            GROUP BY p.name, n.name, g.gpu_type) s),
  (SELECT json_build_array(q.max_priority, q.max_gpus, q.max_queued_tasks)
     FROM tenants_quota q WHERE q.tenant_id = %(tenant)s AND q.pool_id IS NULL)
"""


def _estate(tenant: Tenant) -> _Estate:
    with server_bound_cursor() as cursor:
        cursor.execute(ESTATE_SQL, {"failed": GpuState.FAILED.value, "tenant": tenant.pk})
        pools, nodes, shapes, quota = cursor.fetchone()
    return _Estate(
        pools=dict(pools),
        nodes={name for name, _ in nodes},
        nodes_by_pool={pool for _node, pool in nodes},
        shapes=[_Shape(*row) for row in shapes],
        quota=(
            None
            if quota is None
            else Quota(
                tenant=tenant,
                max_priority=quota[0],
                max_gpus=quota[1],
                max_queued_tasks=quota[2],
            )
        ),
    )


def _feasibility(spec: TaskSpec, estate: _Estate, prefix: str) -> dict[str, list[str]]:
    """Could any node of the cluster ever run this task? Field -> reasons if not."""
    errors: dict[str, list[str]] = {}

    def add(field: str, reason: str) -> None:
        errors.setdefault(f"{prefix}{field}", []).append(reason)

    if spec.pool and spec.pool not in estate.pools:
        known = ", ".join(sorted(estate.pools)) or _("none")
        add(
            "resources.pool",
            _("unknown pool %(pool)r (pools: %(known)s)") % {"pool": spec.pool, "known": known},
        )
        return errors
    if spec.node and spec.node not in estate.nodes:
        add("resources.node", _("unknown node %(node)r") % {"node": spec.node})
        return errors
    if spec.gpus_max == 0:
        if spec.pool and spec.pool not in estate.nodes_by_pool:
            add(
                "resources.pool",
                _("pool %(pool)r has no nodes to run the task on") % {"pool": spec.pool},
            )
        elif not estate.nodes:
            add("resources.gpus", _("the cluster has no nodes to run the task on"))
        return errors
    candidates = [
        s
        for s in estate.shapes
        if (not spec.pool or s.pool == spec.pool) and (not spec.node or s.node == spec.node)
    ]
    if spec.gpu_type:
        typed = [s for s in candidates if s.gpu_type == spec.gpu_type]
        if not typed:
            types = ", ".join(sorted({s.gpu_type for s in candidates})) or _("none")
            add("resources.gpu_type", _("no GPU of type %(type)r here (types: %(types)s)")
                % {"type": spec.gpu_type, "types": types})  # fmt: skip
            return errors
        candidates = typed
    per_node: dict[str, int] = {}
    for shape in candidates:
        per_node[shape.node] = per_node.get(shape.node, 0) + shape.count
    most = max(per_node.values(), default=0)
    if spec.gpus_min > most:
        add("resources.gpus", _("asks for %(n)s GPUs on one node, but the largest matching "
            "node has %(most)s") % {"n": spec.gpus_min, "most": most})  # fmt: skip
    if spec.gpu_memory_mb is not None:
        biggest = max((s.memory_mb for s in candidates), default=0)
        if spec.gpu_memory_mb > biggest:
            add("resources.gpu_memory", _("asks for %(asked)s per GPU, but the largest matching "
                "GPU has %(biggest)s") % {"asked": format_memory_mb(spec.gpu_memory_mb),
                                          "biggest": format_memory_mb(biggest)})  # fmt: skip
    return errors


def priority_problem(priority: int, quota: Quota | None) -> str:
    """Why the tenant's quota refuses this priority, or "" (submission and later changes)."""
    if quota is not None and priority > quota.max_priority:
        return _("priority %(priority)s is above this tenant's highest allowed, %(max)s") % {
            "priority": priority,
            "max": quota.max_priority,
        }
    return ""


def _quota_errors(spec: TaskSpec, quota: Quota | None, prefix: str) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if quota is None:
        return errors
    if problem := priority_problem(spec.priority, quota):
        errors[f"{prefix}priority"] = [problem]
    if quota.max_gpus is not None and spec.gpus_min > quota.max_gpus:
        errors[f"{prefix}resources.gpus"] = [
            _("asks for %(n)s GPUs but the tenant may use at most %(max)s")
            % {"n": spec.gpus_min, "max": quota.max_gpus}
        ]
    return errors


# pg_advisory_xact_lock(namespace, tenant id): the two-int4 form, a key space apart from the
# scheduler's one-bigint PASS_LOCK. A tenant id past 2^31 shares its key with another tenant's,
# which only makes their submissions wait for each other.
QUEUE_LOCK_NAMESPACE = zlib.crc32(b"gpuplatform.submission.queue") - 2**31


def _queue_capped(quota: Quota | None) -> bool:
    return quota is not None and quota.max_queued_tasks is not None


def _queue_errors(tenant: Tenant, quota: Quota | None, adding: int) -> dict[str, list[str]]:
    """The max_queued_tasks check, made safe against concurrent submissions of the tenant.

    A per-tenant advisory lock taken here, after everything else was checked, and held until
    the transaction commits, covers only this count and the INSERT that follows. Under READ
    COMMITTED the count is a new statement, so its snapshot is taken after the lock was granted
    and includes every task committed by whoever held the lock before: each submitter counts
    all the queued tasks of earlier ones, and two batches can never both pass the cap. Tenants
    without the cap take no lock at all, and no submission locks a row that anything else
    (the scheduler, the tenant's other requests) waits on.
    """
    if not _queue_capped(quota):
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)", [QUEUE_LOCK_NAMESPACE, tenant.pk % 2**31]
        )
        cursor.execute(
            "SELECT count(*) FROM scheduling_task WHERE tenant_id = %s AND state = ANY(%s)",
            [tenant.pk, [state.value for state in QUEUED_STATES]],
        )
        (queued,) = cursor.fetchone()
    if queued + adding <= quota.max_queued_tasks:
        return {}
    return {
        "quota": [
            _("the tenant may have at most %(max)s tasks queued; this would make %(n)s")
            % {"max": quota.max_queued_tasks, "n": queued + adding}
        ]
    }


def _known_tasks(specs: list[TaskSpec], tenant: Tenant) -> tuple[set[int], dict[str, int]]:
    """The tenant's tasks that any ``after`` of the batch names: the ids that exist, and each
    name's latest task. Two queries for the batch (a sweep repeats its template's ``after`` in
    every task: once per task, that was a query per task and reference)."""
    ids = {ref for spec in specs for ref in spec.after if isinstance(ref, int)}
    names = {ref for spec in specs for ref in spec.after if isinstance(ref, str)}
    if not ids and not names:
        return set(), {}  # most submissions: not even a queryset to build
    mine = Task.objects.filter(tenant=tenant)
    by_id = set(mine.filter(pk__in=ids).values_list("pk", flat=True)) if ids else set()
    by_name = (
        dict(
            mine.filter(name__in=names)
            .order_by("name", "-id")
            .distinct("name")
            .values_list("name", "pk")
        )
        if names
        else {}
    )
    return by_id, by_name


def _resolve_after(
    spec: TaskSpec, batch: set[str], known: tuple[set[int], dict[str, int]]
) -> tuple[list[int | str], list[str]]:
    """Tasks named in ``after``: by id, by the name of a task earlier in this batch (kept as
    the name: it exists once the batch is created), or by the tenant's latest task of that
    name (``known``: ``_known_tasks``)."""
    by_id, by_name = known
    found: list[int | str] = []
    problems: list[str] = []
    for ref in spec.after:
        if isinstance(ref, str) and ref in batch:
            found.append(ref)
            continue
        pk = (ref if ref in by_id else None) if isinstance(ref, int) else by_name.get(ref)
        if pk is None:
            # Same words whether the task does not exist or belongs to someone else.
            text = f"#{ref}" if isinstance(ref, int) else ref
            problems.append(_("no task %(ref)s in this tenant") % {"ref": text})
        else:
            found.append(pk)
    return found, problems


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()  # to the microsecond, as the model holds it
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _own_columns(specs: Sequence[TaskSpec], pools: dict[str, int]) -> list[dict[str, object]]:
    """Each task's columns (``_spec_columns``). When every spec is the first one under
    another name (copies, as spec.parse._task_like makes for a list of alike tasks), they share one
    stored spec object: the batch then sends it once, and the INSERT writes each task's own
    name into it (``_insert_sql``'s ``renamed``), instead of a copy per task for PostgreSQL to
    parse. All or none: a shared spec bears the first task's name, which only the INSERT's
    renaming corrects."""
    first = specs[0]
    others = {key: value for key, value in first.__dict__.items() if key != "name"}
    if len(specs) > 1 and all(_renamed_copy(spec, others) for spec in specs[1:]):
        stored = [first.as_dict()] * len(specs)
    else:
        stored = [spec.as_dict() for spec in specs]
    return [_spec_columns(spec, pools, own) for spec, own in zip(specs, stored, strict=True)]


def _renamed_copy(spec: TaskSpec, others: dict[str, object]) -> bool:
    """Whether every field of ``spec`` but its name is the very object in ``others``: then
    its stored spec is theirs with its own name (the same objects write the same JSON, where
    equal ones may not: 1 == 1.0 == True)."""
    return all(value is others[key] for key, value in spec.__dict__.items() if key != "name")


def _spec_columns(spec: TaskSpec, pools: dict[str, int], stored: dict) -> dict[str, object]:
    """The columns (by attname) a task takes from its own spec, ``stored`` its stored form
    (``spec.as_dict()``, or a copy's under another name); the rest are the batch's."""
    return {
        "name": spec.name,
        "queue": spec.queue,
        "priority": spec.priority,
        "task_class": spec.task_class,
        "preemptible": spec.preemptible,
        "command": spec.command,
        "workdir": spec.workdir,
        "env": spec.env,
        "spec": stored,
        "gpus_min": spec.gpus_min,
        "gpus_max": spec.gpus_max,
        "gpu_memory_mb": spec.gpu_memory_mb,
        "gpu_type": spec.gpu_type,
        "pool_id": pools.get(spec.pool),
        "required_node": spec.node,
        "timeout_s": spec.timeout_s,
        "retries": spec.retries,
    }


def _same(values: list[object]) -> bool:
    """One value for every task? ``==`` alone holds 1 == True == 1.0 inside JSON, which it
    would then write as one of them: JSON values must also write alike."""
    first = values[0]
    if all(value is first for value in values):
        return True  # one object (_own_columns' shared spec): written alike, without writing it
    if any(value != first for value in values):
        return False
    if not isinstance(first, dict | list) or not first:
        return True  # a scalar, or empty (equal to an empty container, so empty alike)
    return len({json.dumps(value, sort_keys=True) for value in values}) == 1


@functools.lru_cache(maxsize=64)
def _insert_sql(varying: tuple[str, ...], claim: bool, renamed: bool = False) -> str:
    """Tasks and their "submitted" events in one statement: the columns in ``varying`` from one
    JSON object per task, the rest from one object for the whole batch.

    PostgreSQL builds the rows itself with ``jsonb_populate_recordset`` over the task table's own
    row type, so the columns and their types come from the table, and the task columns from the
    model (any field it gains is written too). From ``jsonb`` rather than ``json``: each task's
    spec then goes into its jsonb column as it is, where from ``json`` its text was parsed a
    second time. Django's bulk_create spent most of a large batch's request preparing each
    value of each row in Python. Sending the columns a batch's tasks share once rather than per
    task leaves only each task's spec and name to send and parse.
    Ids are taken in the array's order (ORDER BY ordinality), so sorted they match the tasks.
    With ``claim``, the statement also claims the pass flag (``passes.claim_cte``) and each row
    says what the claim found (``passes.CLAIMED``). With ``renamed``, the tasks share one spec
    but for its name (``_own_columns``), sent once: each task's is that one with its own name."""
    fields = [f for f in Task._meta.concrete_fields if not f.primary_key]
    table, events = Task._meta.db_table, TaskEvent._meta.db_table
    columns = ", ".join(f'"{f.column}"' for f in fields)
    picked = ", ".join(
        """jsonb_set(c."spec", '{name}', to_jsonb(r."name"))"""
        if renamed and f.name == "spec"
        else f'{"r" if f.column in varying else "c"}."{f.column}"'
        for f in fields
    )
    return (
        f'WITH t AS (INSERT INTO "{table}" ({columns}) '  # noqa: S608 - names from the model
        f'SELECT {picked} FROM jsonb_populate_recordset(NULL::"{table}", %(rows)s::jsonb) '
        f'WITH ORDINALITY AS r, jsonb_populate_record(NULL::"{table}", %(common)s::jsonb) AS c '
        "ORDER BY r.ordinality RETURNING id), "
        f'e AS (INSERT INTO "{events}" (task_id, at, from_state, to_state, reason, reason_code, '
        "reason_params, attempt, actor_id) SELECT id, %(at)s, '', %(state)s, %(reason)s, "
        "%(code)s, %(params)s::jsonb, 0, %(actor)s FROM t)"
        f"{f', {passes.claim_cte()} SELECT id, {passes.CLAIMED}' if claim else ' SELECT id'} FROM t"
    )


def _insert(
    template: Task, own: list[dict[str, object]], *, reason: reasons.Reason, actor, claim: bool
) -> tuple[list[Task], tuple[int, bool] | None]:
    """INSERT a task per ``own`` (its columns from its spec; the others ``template``'s), each
    with a "submitted" event; the tasks as loaded from the database, and with ``claim`` what
    the pass flag's claim in the same statement found (for ``passes.request_pass``).

    The tasks are built as ``_loaded`` builds them, cheaper than ``Model.from_db`` (itself
    cheaper than keyword arguments) for a batch of a thousand."""
    concrete = Task._meta.concrete_fields
    batch = {f.attname: getattr(template, f.attname) for f in concrete}
    varying = tuple(name for name in own[0] if not _same([row[name] for row in own]))
    batch.update((name, value) for name, value in own[0].items() if name not in varying)
    # One spec object for tasks that differ by name (_own_columns): the INSERT names each.
    renamed = "spec" not in varying and "name" in varying
    column = {f.attname: f.column for f in concrete}
    common = {column[name]: value for name, value in batch.items() if name != "id"}
    rows = [{column[name]: row[name] for name in varying} for row in own]
    with server_bound_cursor() as cursor:
        cursor.execute(
            _insert_sql(tuple(column[name] for name in varying), claim, renamed),
            {"rows": json.dumps(rows, default=_json_default),
             "common": json.dumps(common, default=_json_default),
             "at": template.submitted_at, "state": TaskState.PENDING.value,
             "reason": reason.text, "code": reason.code, "params": json.dumps(reason.params),
             "actor": actor.pk if actor is not None else None},
        )  # fmt: skip
        returned = cursor.fetchall()
    ids = sorted(row[0] for row in returned)
    tasks = [_loaded(batch | row | {"id": pk}, template) for pk, row in zip(ids, own, strict=True)]
    if renamed:
        for task in tasks:
            task.spec = {**task.spec, "name": task.name}
    return tasks, (returned[0][1], returned[0][2]) if claim else None


_TENANT, _OWNER = Task._meta.get_field("tenant"), Task._meta.get_field("owner")


def _loaded(values: dict[str, object], template: Task) -> Task:
    """The task whose columns (by attname) are ``values``, as a query would have loaded it,
    with ``template``'s tenant and owner cached as they were given. Its attributes are set
    directly, as unpickling sets them: ``Model.__init__`` runs each field's descriptor and the
    pre_init and post_init signals (nothing here listens to them for a task; a test compares
    what this builds with the row read back)."""
    task = Task.__new__(Task)
    task._state = ModelState()
    task._state.adding, task._state.db = False, connection.alias
    task.__dict__.update(values)
    _TENANT.set_cached_value(task, template.tenant)
    _OWNER.set_cached_value(task, template.owner)
    return task


def tasks_submit(
    *,
    tenant: Tenant,
    specs: Sequence[TaskSpec],
    owner: AbstractBaseUser | None = None,
    by: AbstractBaseUser | None = None,
) -> list[Task]:
    """Create all the tasks or none: the first problem anywhere refuses the whole batch.

    ``by`` is who submits when it is not the owner (an operator submitting for a tenant in the
    admin): the audit trail names both. A constant number of statements whatever the batch's
    size. The reads that check the batch run before any transaction; the writes are one
    statement, which needs no transaction of its own (BEGIN and COMMIT were two of a plain
    submission's seven round trips), unless a queue cap's lock or dependency links make them
    several.
    """
    if not tenant.is_active:
        raise SubmitError({"tenant": [_("tenant %(name)s is inactive") % {"name": tenant.name}]})
    if not specs:
        raise SubmitError({"tasks": [_("nothing to submit")]})
    if len(specs) > MAX_SWEEP_TASKS:
        problem = _("at most %(max)s tasks at once, got %(n)s") % {
            "max": MAX_SWEEP_TASKS,
            "n": len(specs),
        }
        raise SubmitError({"tasks": [problem]})
    estate = _estate(tenant)
    errors: dict[str, list[str]] = {}
    many = len(specs) > 1
    resolved: list[list[int | str]] = []
    batch: set[str] = set()
    known = _known_tasks(specs, tenant)
    # Resolving a workdir walks the file system (symlinks); a sweep's tasks mostly share one.
    workdirs: dict[str, str] = {}
    for i, spec in enumerate(specs):
        prefix = f"[{i}]." if many else ""
        errors.update(_feasibility(spec, estate, prefix))
        errors.update(_quota_errors(spec, estate.quota, prefix))
        if spec.workdir not in workdirs:
            try:
                paths.workdir(tenant.name, spec.workdir)
                workdirs[spec.workdir] = ""
            except paths.PathLoop:
                workdirs[spec.workdir] = _("%(workdir)r is a loop of symbolic links") % {
                    "workdir": spec.workdir
                }
            except paths.PathEscape:
                workdirs[spec.workdir] = _("%(workdir)r leads outside the tenant's directory") % {
                    "workdir": spec.workdir
                }
        if workdirs[spec.workdir]:
            errors[f"{prefix}workdir"] = [workdirs[spec.workdir]]
        deps, problems = _resolve_after(spec, batch, known) if spec.after else ([], [])
        if problems:
            errors[f"{prefix}policy.after"] = problems
        resolved.append(deps)
        batch.add(spec.name)
    if errors:
        raise SubmitError(errors)
    specs, replica_of, origin = _with_replicas(specs)
    if replica_of:
        resolved = [resolved[index] for index in origin]
        if len(specs) > MAX_SWEEP_TASKS:
            problem = _("at most %(max)s tasks at once, got %(n)s (replicas included)") % {
                "max": MAX_SWEEP_TASKS,
                "n": len(specs),
            }
            raise SubmitError({"tasks": [problem]})

    now = timezone.now()
    template = Task(
        tenant=tenant,
        owner=owner,
        reason=reasons.Reason("waiting_for_scheduler").text,
        reason_code="waiting_for_scheduler",
        submitted_at=now,
        updated_at=now,
    )
    own = _own_columns(specs, estate.pools)
    reason = reasons.Reason("submitted")
    if by is not None and by != owner:
        whose = owner.get_username() if owner is not None else "nobody"
        reason = reasons.Reason("submitted_for", {"by": by.get_username(), "owner": whose})
    # A lock, dependency links, or replicas linked to their service.
    several = _queue_capped(estate.quota) or any(resolved) or bool(replica_of)
    # A statement that commits by itself also claims the pass flag in that commit: one round
    # trip fewer than request_pass's after it (a plain POST's five were: token, rate limit,
    # estate, INSERT, pass request).
    alone = not several and not connection.in_atomic_block
    with transaction.atomic() if several else contextlib.nullcontext():
        # Last, so the lock it may take is held only for the count, the INSERTs and the commit.
        if errors := _queue_errors(tenant, estate.quota, len(specs)):
            raise SubmitError(errors)
        created, claimed = _insert(template, own, reason=reason, actor=by or owner, claim=alone)
        for first, indexes in replica_of.items():
            service = created[first]
            Task.objects.filter(pk__in=[created[i].pk for i in indexes]).update(
                replica_of=service.pk
            )
            for i in indexes:
                created[i].replica_of_id = service.pk
        # A name in ``after`` means the latest task of that name earlier in the batch (a
        # service, not one of its other replicas, which bear its name).
        earlier: dict[str, Task] = {}
        links: set[tuple[int, int]] = set()
        for task, deps in zip(created, resolved, strict=True):
            links.update((task.pk, earlier[d].pk if isinstance(d, str) else d) for d in deps)
            if task.replica_of_id is None:
                earlier[task.name] = task
        if links:
            through = Task.depends_on.through
            through.objects.bulk_create(
                through(from_task_id=source, to_task_id=target) for source, target in sorted(links)
            )
    # After the commit (or in a caller's transaction, once it commits), or at once when the
    # INSERT claimed the flag in its own commit.
    passes.request_pass(claimed)
    return created


def _with_replicas(
    specs: Sequence[TaskSpec],
) -> tuple[Sequence[TaskSpec], dict[int, list[int]], list[int]]:
    """``specs`` with each service of N replicas written N times (one task each, under the same
    name); for each service's index the indexes of its other replicas; and each task's index
    in ``specs``."""
    if not any(spec.service and spec.service["replicas"] > 1 for spec in specs):
        return specs, {}, []
    expanded: list[TaskSpec] = []
    replica_of: dict[int, list[int]] = {}
    origin: list[int] = []
    for index, spec in enumerate(specs):
        first = len(expanded)
        copies = spec.service["replicas"] - 1 if spec.service else 0
        expanded.extend([spec] * (1 + copies))
        origin.extend([index] * (1 + copies))
        if copies:
            replica_of[first] = list(range(first + 1, first + 1 + copies))
    return expanded, replica_of, origin


def task_submit(*, tenant: Tenant, spec: TaskSpec, owner: AbstractBaseUser | None = None) -> Task:
    return tasks_submit(tenant=tenant, specs=[spec], owner=owner)[0]
