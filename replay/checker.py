"""Checks each decision of a policy against the placement rules, so a replay doubles as a
checker for the pure policy core."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from replay.common import PolicyViolation
from scheduling.policy.model import (
    ONLINE,
    Decision,
    GpuView,
    PendingView,
    RunningView,
    Snapshot,
)

# --- the decision checker -------------------------------------------------------------------


@dataclass(slots=True)
class SimGpu:
    reserved_mb: int = 0
    holders: int = 0
    exclusive: bool = False


def check_decision(
    snapshot: Snapshot, decision: Decision, class_shares: dict[str, float] | None = None
) -> None:
    """Raise PolicyViolation if applying ``decision`` to ``snapshot`` would break a rule.

    Preemptions are applied first (a victim's GPUs are free for placements in the same
    decision), then placements one by one, each against what the ones before it took.

    With ``class_shares`` (the policy's class guarantees), a task that is not preemptible may
    still be preempted by a task of another class, to give back what its own class borrowed:
    its class keeps more than its guarantee less one GPU (``_check_guarantees``); without
    them, never.
    """
    gpus = {gpu.id: gpu for gpu in snapshot.gpus}
    state = {gpu.id: SimGpu(gpu.reserved_mb, gpu.holders, gpu.exclusive) for gpu in snapshot.gpus}
    running = {task.id: task for task in snapshot.running}
    pending = {task.id: task for task in snapshot.pending}

    def fail(problem: str) -> NoReturn:
        raise PolicyViolation(f"t={snapshot.now:g}: {problem}")

    victims: set[int] = set()
    for preemption in decision.preemptions:
        victim = running.get(preemption.task_id)
        if victim is None:
            fail(f"preempts task {preemption.task_id}, which is not running")
        if preemption.task_id in victims:
            fail(f"preempts task {victim.id} twice")
        if victim.stopping:
            fail(f"preempts task {victim.id}, which is already stopping")
        if preemption.for_task_id not in pending:
            fail(f"preempts task {victim.id} for task {preemption.for_task_id}, not pending")
        reclaim = (
            class_shares is not None
            and pending[preemption.for_task_id].task_class != victim.task_class
        )
        if not victim.preemptible and not reclaim:
            fail(f"preempts task {victim.id} ({victim.task_class}), which is not preemptible")
        victims.add(victim.id)
        for gpu_id, mb in victim.gpus:
            gpu_state = state[gpu_id]
            gpu_state.holders -= 1
            gpu_state.reserved_mb -= mb
            if victim.exclusive:
                gpu_state.exclusive = False

    if class_shares is not None:
        _check_guarantees(snapshot, decision, class_shares, fail)

    placed: set[int] = set()
    for placement in decision.placements:
        task = pending.get(placement.task_id)
        where = f"placement of task {placement.task_id} on {placement.node} {placement.gpus}"
        if task is None:
            fail(f"{where}: the task is not pending")
        if task.id in placed:
            fail(f"{where}: the task is placed twice")
        placed.add(task.id)
        if task.blocked:
            fail(f"{where}: the task is blocked ({task.blocked})")
        if task.not_before is not None and task.not_before > snapshot.now:
            fail(f"{where}: the task may not start before {task.not_before:g}")
        if not task.gpus_min <= len(placement.gpus) <= task.gpus_max:
            fail(
                f"{where}: {len(placement.gpus)} GPU(s), task asks {task.gpus_min}..{task.gpus_max}"
            )
        if placement.exclusive != task.exclusive:
            fail(f"{where}: exclusive={placement.exclusive}, task asks exclusive={task.exclusive}")
        ids = [gpu_id for gpu_id, _ in placement.gpus]
        if len(set(ids)) != len(ids):
            fail(f"{where}: the same GPU twice")
        if task.node and placement.node != task.node:
            fail(f"{where}: the task asks for node {task.node}")
        for gpu_id, mb in placement.gpus:
            gpu = gpus.get(gpu_id)
            if gpu is None:
                fail(f"{where}: no GPU {gpu_id}")
            _check_gpu(fail, where, task, gpu, state[gpu_id], placement.node, mb)
            gpu_state = state[gpu_id]
            gpu_state.holders += 1
            gpu_state.reserved_mb += mb
            gpu_state.exclusive = placement.exclusive


def _check_guarantees(
    snapshot: Snapshot,
    decision: Decision,
    class_shares: dict[str, float],
    fail: Callable[[str], NoReturn],
) -> None:
    """Tasks that are not preemptible (online ones included) are preempted only as capacity
    their class borrowed: their class keeps more than its guaranteed share less one GPU (a
    task cannot be evicted by halves; counted over schedulable GPUs, stopping tasks not
    counted)."""
    from scheduling.policy.core import _guarantees

    schedulable = sum(1 for gpu in snapshot.gpus if gpu.schedulable)
    guarantee = _guarantees(schedulable, class_shares)
    memory = {gpu.id: gpu.memory_mb for gpu in snapshot.gpus}

    def share(task: RunningView) -> float:
        if task.exclusive:
            return float(len(task.gpus))
        return sum(mb / (memory.get(gpu_id) or 1) for gpu_id, mb in task.gpus)

    held: dict[str, float] = {}
    for task in snapshot.running:
        if not task.stopping:
            held[task.task_class] = held.get(task.task_class, 0.0) + share(task)
    running = {task.id: task for task in snapshot.running}
    for preemption in decision.preemptions:
        victim = running[preemption.task_id]
        held[victim.task_class] -= share(victim)
    for preemption in decision.preemptions:
        victim = running[preemption.task_id]
        if victim.preemptible and victim.task_class != ONLINE:
            continue  # the usual rules, checked by the caller
        kept = held[victim.task_class]
        if kept <= guarantee.get(victim.task_class, 0) - 1 + 1e-9:
            fail(
                f"preempts task {victim.id} ({victim.task_class}), which is not preemptible, "
                f"for task {preemption.for_task_id}, leaving {victim.task_class} {kept:g} GPUs, "
                f"a whole GPU below its guaranteed {guarantee.get(victim.task_class, 0)}"
            )


def _check_gpu(
    fail: Callable[[str], NoReturn],
    where: str,
    task: PendingView,
    gpu: GpuView,
    now: SimGpu,
    node: str,
    mb: int,
) -> None:
    if gpu.node != node:
        fail(f"{where}: GPU {gpu.id} is on {gpu.node}; all GPUs of a task must be on one node")
    if not gpu.schedulable:
        fail(f"{where}: GPU {gpu.id} is not schedulable")
    if task.pool and gpu.pool != task.pool:
        fail(f"{where}: GPU {gpu.id} is in pool {gpu.pool}, task asks {task.pool}")
    if task.gpu_type and gpu.gpu_type != task.gpu_type:
        fail(f"{where}: GPU {gpu.id} is {gpu.gpu_type}, task asks {task.gpu_type}")
    if mb < 0:
        fail(f"{where}: negative reservation on GPU {gpu.id}")
    if now.exclusive:
        fail(f"{where}: GPU {gpu.id} is held exclusively by another task")
    if task.exclusive:
        if now.holders or gpu.foreign_mb:
            fail(
                f"{where}: exclusive task on GPU {gpu.id}, which is shared "
                f"({now.holders} holder(s), {now.reserved_mb} MiB reserved, "
                f"{gpu.foreign_mb} MiB foreign)"
            )
        return
    asked = task.gpu_memory_mb or 0  # not exclusive, so set
    if mb < asked:
        fail(f"{where}: reserves {mb} MiB on GPU {gpu.id}, task asks {asked} MiB")
    free = gpu.memory_mb - now.reserved_mb - gpu.foreign_mb
    if mb > free:
        fail(
            f"{where}: no room on GPU {gpu.id}: {mb} MiB asked, {free} MiB free "
            f"of {gpu.memory_mb} MiB ({now.reserved_mb} reserved, {gpu.foreign_mb} foreign)"
        )
