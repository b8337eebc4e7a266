"""Free capacity during one scheduling pass, and where a task fits (best fit, one node)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.policy.model import GpuView, PendingView, Placement


@dataclass(slots=True)
class GpuState:
    """A GPU's capacity, mutated as the pass places tasks on it."""

    id: int
    node: str
    pool: str
    gpu_type: str
    memory_mb: int
    free_mb: int
    holders: int
    exclusive: bool
    foreign_mb: int

    @property
    def idle(self) -> bool:
        return self.holders == 0 and self.foreign_mb == 0 and not self.exclusive


class Capacity:
    """Schedulable GPUs grouped by node, with best-fit search.

    Placement never splits a task across nodes. Exclusive tasks take whole idle GPUs on the
    node with the fewest idle GPUs that still fits (keeping big holes for big tasks); shared
    tasks take the GPUs with the least free memory that still fits (keeping whole GPUs idle).
    """

    def __init__(self, gpus: Iterable[GpuView]) -> None:
        self.gpus: dict[int, GpuState] = {}
        self.nodes: dict[str, list[GpuState]] = {}
        for view in gpus:
            if not view.schedulable:
                continue
            state = GpuState(
                id=view.id,
                node=view.node,
                pool=view.pool,
                gpu_type=view.gpu_type,
                memory_mb=view.memory_mb,
                free_mb=view.free_mb,
                holders=view.holders,
                exclusive=view.exclusive,
                foreign_mb=view.foreign_mb,
            )
            self.gpus[view.id] = state
            self.nodes.setdefault(view.node, []).append(state)
        for members in self.nodes.values():
            members.sort(key=lambda g: g.id)
        # (node, pool, GPU type) asked for -> the matching GPUs per node: the constraints do not
        # change within a pass, only the GPUs' free capacity does (the lists hold the same
        # GpuState objects). A pass asks for the same few constraints thousands of times.
        self._matching: dict[tuple[str, str, str], list[tuple[str, list[GpuState]]]] = {}

    def candidates(self, task: PendingView) -> Iterable[tuple[str, list[GpuState]]]:
        """Per node, the GPUs that match the task's type, pool and node constraints."""
        key = (task.node, task.pool, task.gpu_type)
        found = self._matching.get(key)
        if found is None:
            found = self._matching[key] = list(self.matching(task))
        return found

    def matching(self, task: PendingView) -> Iterable[tuple[str, list[GpuState]]]:
        """What ``candidates`` answers, gathered from every node's GPUs."""
        for node, members in self.nodes.items():
            if task.node and node != task.node:
                continue
            matching = [
                g
                for g in members
                if (not task.pool or g.pool == task.pool)
                and (not task.gpu_type or g.gpu_type == task.gpu_type)
            ]
            if matching:
                yield node, matching

    def find(self, task: PendingView, held: frozenset[int] = frozenset()) -> Placement | None:
        """Where the task fits now, or None, on GPUs not in ``held`` (held for another task).
        Elastic tasks get as many GPUs as fit."""
        if task.gpus_max == 0:  # CPU-only: any node that matches its constraints
            node = next((n for n, _ in self.candidates(task)), None)
            return None if node is None else Placement(task.id, node, (), exclusive=False)
        best: tuple[tuple, str, list[GpuState]] | None = None
        for node, matching in self.candidates(task):
            usable = [g for g in matching if g.id not in held] if held else matching
            if task.exclusive:
                # GpuState.idle, spelled out: called for every GPU of every search.
                fits = [
                    g for g in usable if not (g.holders or g.foreign_mb or g.exclusive)
                ]  # fmt: skip
                if len(fits) < task.gpus_min:
                    continue
                take = min(len(fits), task.gpus_max)
                # More GPUs for elastic tasks first, then the tightest node.
                rank = (-take, len(fits), node)
                chosen = fits[:take]
            else:
                need = task.gpu_memory_mb or 0
                fits = sorted((g for g in usable if g.free_mb >= need and not g.exclusive),
                              key=lambda g: (g.free_mb, g.id))  # fmt: skip
                if len(fits) < task.gpus_min:
                    continue
                take = min(len(fits), task.gpus_max)
                chosen = fits[:take]
                # Tightest memory fit first; among equals, the node with the fewest idle GPUs,
                # so shared work piles up where whole GPUs are already scarce.
                idle = sum(1 for g in usable if g.idle)
                rank = (-take, sum(g.free_mb - need for g in chosen), idle, node)
            if best is None or rank < best[0]:
                best = (rank, node, chosen)
        if best is None:
            return None
        _, node, chosen = best
        if task.exclusive:
            gpus = tuple((g.id, g.memory_mb) for g in chosen)
        else:
            gpus = tuple((g.id, task.gpu_memory_mb or 0) for g in chosen)
        return Placement(task_id=task.id, node=node, gpus=gpus, exclusive=task.exclusive)

    def take(self, placement: Placement) -> None:
        for gpu_id, memory_mb in placement.gpus:
            gpu = self.gpus[gpu_id]
            gpu.holders += 1
            if placement.exclusive:
                gpu.exclusive = True
                gpu.free_mb = 0
            else:
                gpu.free_mb -= memory_mb

    def largest_fit(self, task: PendingView) -> int:
        """How many GPUs of the kind the task asks for are free on its best node right now."""
        best = 0
        for _, matching in self.candidates(task):
            if task.exclusive:
                count = sum(1 for g in matching if g.idle)
            else:
                need = task.gpu_memory_mb or 0
                count = sum(1 for g in matching if g.free_mb >= need and not g.exclusive)
            best = max(best, count)
        return best
