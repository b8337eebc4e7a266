"""Submitting tasks: the one path the API, the CLI and the portal all take.

A spec that passed ``scheduling.spec`` is checked against the tenant (active, quotas) and
against the cluster: a request that no GPU could ever satisfy is refused now, with the reason,
instead of waiting forever.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, Max

from gpuplatform.units import format_memory_mb
from scheduling import passes
from scheduling.launcher import paths
from scheduling.models import GPU, GpuState, Node, Pool, Task, TaskEvent
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


def _cluster_shapes() -> list[_Shape]:
    rows = (
        GPU.objects.exclude(state=GpuState.FAILED)
        .values("node__pool__name", "node__name", "gpu_type")
        .annotate(count=Count("id"), memory=Max("memory_mb"))
    )
    return [
        _Shape(r["node__pool__name"], r["node__name"], r["gpu_type"], r["count"], r["memory"])
        for r in rows
    ]


@dataclass(frozen=True)
class _Estate:
    """Pools and nodes, read once per submission however many tasks it holds."""

    pools: dict[str, Pool]
    nodes: set[str]
    nodes_by_pool: set[str]  # pools that have at least one node


def _feasibility(
    spec: TaskSpec, shapes: list[_Shape], estate: _Estate, prefix: str
) -> dict[str, list[str]]:
    """Could any node of the cluster ever run this task? Field -> reasons if not."""
    errors: dict[str, list[str]] = {}

    def add(field: str, reason: str) -> None:
        errors.setdefault(f"{prefix}{field}", []).append(reason)

    if spec.pool and spec.pool not in estate.pools:
        known = ", ".join(sorted(estate.pools)) or "none"
        add("resources.pool", f"unknown pool {spec.pool!r} (pools: {known})")
        return errors
    if spec.node and spec.node not in estate.nodes:
        add("resources.node", f"unknown node {spec.node!r}")
        return errors
    if spec.gpus_max == 0:
        if spec.pool and spec.pool not in estate.nodes_by_pool:
            add("resources.pool", f"pool {spec.pool!r} has no nodes to run the task on")
        elif not estate.nodes:
            add("resources.gpus", "the cluster has no nodes to run the task on")
        return errors
    candidates = [
        s
        for s in shapes
        if (not spec.pool or s.pool == spec.pool) and (not spec.node or s.node == spec.node)
    ]
    if spec.gpu_type:
        typed = [s for s in candidates if s.gpu_type == spec.gpu_type]
        if not typed:
            types = sorted({s.gpu_type for s in candidates}) or ["none"]
            add("resources.gpu_type", f"no GPU of type {spec.gpu_type!r} here (types: "
                f"{', '.join(types)})")  # fmt: skip
            return errors
        candidates = typed
    per_node: dict[str, int] = {}
    for shape in candidates:
        per_node[shape.node] = per_node.get(shape.node, 0) + shape.count
    most = max(per_node.values(), default=0)
    if spec.gpus_min > most:
        add("resources.gpus", f"asks for {spec.gpus_min} GPUs on one node, but the largest "
            f"matching node has {most}")  # fmt: skip
    if spec.gpu_memory_mb is not None:
        biggest = max((s.memory_mb for s in candidates), default=0)
        if spec.gpu_memory_mb > biggest:
            add("resources.gpu_memory", f"asks for {format_memory_mb(spec.gpu_memory_mb)} per "
                f"GPU, but the largest matching GPU has {format_memory_mb(biggest)}")  # fmt: skip
    return errors


def priority_problem(priority: int, quota: Quota | None) -> str:
    """Why the tenant's quota refuses this priority, or "" (submission and later changes)."""
    if quota is not None and priority > quota.max_priority:
        return f"priority {priority} is above this tenant's highest allowed, {quota.max_priority}"
    return ""


def _quota_errors(
    spec: TaskSpec, quota: Quota | None, prefix: str, queued: int
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if quota is None:
        return errors
    if problem := priority_problem(spec.priority, quota):
        errors[f"{prefix}priority"] = [problem]
    if quota.max_gpus is not None and spec.gpus_min > quota.max_gpus:
        errors[f"{prefix}resources.gpus"] = [
            f"asks for {spec.gpus_min} GPUs but the tenant may use at most {quota.max_gpus}"
        ]
    if quota.max_queued_tasks is not None and queued > quota.max_queued_tasks:
        errors["quota"] = [
            f"the tenant may have at most {quota.max_queued_tasks} tasks queued; this would "
            f"make {queued}"
        ]
    return errors


def _resolve_after(
    spec: TaskSpec, tenant: Tenant, batch: set[str]
) -> tuple[list[Task | str], list[str]]:
    """Tasks named in ``after``: by id, by the name of a task earlier in this batch (kept as
    the name: it exists once the batch is created), or by the tenant's latest task of that
    name."""
    found: list[Task | str] = []
    problems: list[str] = []
    for ref in spec.after:
        if isinstance(ref, str) and ref in batch:
            found.append(ref)
            continue
        if isinstance(ref, int):
            task = Task.objects.filter(tenant=tenant, pk=ref).first()
        else:
            task = Task.objects.filter(tenant=tenant, name=ref).order_by("-id").first()
        if task is None:
            # Same words whether the task does not exist or belongs to someone else.
            problems.append(f"no task {'#' if isinstance(ref, int) else ''}{ref} in this tenant")
        else:
            found.append(task)
    return found, problems


@transaction.atomic
def tasks_submit(
    *,
    tenant: Tenant,
    specs: Sequence[TaskSpec],
    owner: AbstractBaseUser | None = None,
    by: AbstractBaseUser | None = None,
) -> list[Task]:
    """Create all the tasks or none: the first problem anywhere refuses the whole batch.

    ``by`` is who submits when it is not the owner (an operator submitting for a tenant in the
    admin): the audit trail names both.
    """
    if not tenant.is_active:
        raise SubmitError({"tenant": [f"tenant {tenant.name} is inactive"]})
    if not specs:
        raise SubmitError({"tasks": ["nothing to submit"]})
    if len(specs) > MAX_SWEEP_TASKS:
        raise SubmitError({"tasks": [f"at most {MAX_SWEEP_TASKS} tasks at once, got {len(specs)}"]})
    # Serialise submissions of one tenant so two batches cannot both pass max_queued_tasks.
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
    quota = Quota.objects.filter(tenant=tenant, pool__isnull=True).first()
    queued = Task.objects.filter(tenant=tenant, state__in=QUEUED_STATES).count() + len(specs)
    shapes = _cluster_shapes()
    estate = _Estate(
        pools={pool.name: pool for pool in Pool.objects.all()},
        nodes=set(Node.objects.values_list("name", flat=True)),
        nodes_by_pool=set(Node.objects.values_list("pool__name", flat=True)),
    )
    errors: dict[str, list[str]] = {}
    many = len(specs) > 1
    resolved: list[list[Task | str]] = []
    batch: set[str] = set()
    for i, spec in enumerate(specs):
        prefix = f"[{i}]." if many else ""
        errors.update(_feasibility(spec, shapes, estate, prefix))
        errors.update(_quota_errors(spec, quota, prefix, queued))
        try:
            paths.workdir(tenant.name, spec.workdir)
        except paths.PathEscape as exc:
            errors[f"{prefix}workdir"] = [str(exc).removeprefix("workdir: ")]
        deps, problems = _resolve_after(spec, tenant, batch)
        if problems:
            errors[f"{prefix}policy.after"] = problems
        resolved.append(deps)
        batch.add(spec.name)
    if errors:
        raise SubmitError(errors)

    created: list[Task] = []
    earlier: dict[str, Task] = {}
    for spec, deps in zip(specs, resolved, strict=True):
        task = Task.objects.create(
            tenant=tenant,
            owner=owner,
            name=spec.name,
            queue=spec.queue,
            priority=spec.priority,
            task_class=spec.task_class,
            preemptible=spec.preemptible,
            command=spec.command,
            workdir=spec.workdir,
            env=spec.env,
            spec=spec.as_dict(),
            gpus_min=spec.gpus_min,
            gpus_max=spec.gpus_max,
            gpu_memory_mb=spec.gpu_memory_mb,
            gpu_type=spec.gpu_type,
            pool=estate.pools.get(spec.pool),
            required_node=spec.node,
            timeout_s=spec.timeout_s,
            retries=spec.retries,
            reason="submitted; waiting for the scheduler",
        )
        if deps:
            task.depends_on.set([earlier[d] if isinstance(d, str) else d for d in deps])
        earlier[spec.name] = task
        created.append(task)
    reason = "submitted"
    if by is not None and by != owner:
        whose = owner.get_username() if owner is not None else "nobody"
        reason = f"submitted by {by.get_username()} for {whose}"
    TaskEvent.objects.bulk_create(
        TaskEvent(task=t, at=t.submitted_at, to_state=TaskState.PENDING, reason=reason,
                  actor=by or owner)
        for t in created
    )  # fmt: skip
    passes.request_pass()
    return created


def task_submit(*, tenant: Tenant, spec: TaskSpec, owner: AbstractBaseUser | None = None) -> Task:
    return tasks_submit(tenant=tenant, specs=[spec], owner=owner)[0]
