"""Whose memory is on each GPU: the platform's tasks, or someone else.

Pure (no Django) so that the node agent, the simulator and the tests call it alike. The node
agent lists the GPU processes (``GpuBackend.processes()``), maps pids to tasks with
``owners_from_tree()`` from each running attempt's supervisor, and gets back:

- per GPU, the memory held by processes no task owns (``GPU.foreign_memory_mb``: never offered
  to tasks, so a stray notebook cannot make the scheduler overcommit a card);
- per (task, GPU), the memory the task's processes hold, and the tasks holding more than they
  reserved (the ``gpu_memory_overuse`` alerts).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import psutil

from gpuplatform.procid import ProcessId
from scheduling.agentapi.messages import GpuProcess

# Slack before a task counts as overusing: the CUDA context alone costs a few hundred MiB that a
# user's estimate rarely includes, and allocators round up.
DEFAULT_TOLERANCE_MB = 256


class Overuse(NamedTuple):
    task_id: int
    gpu_uuid: str
    used_mb: int
    reserved_mb: int


@dataclass(frozen=True)
class GpuMemoryReport:
    # MiB held by processes no task owns, per GPU uuid. Every GPU passed as ``gpus`` (and every
    # GPU a process was seen on) has an entry, 0 when nothing foreign runs there.
    foreign_mb: dict[str, int] = field(default_factory=dict)
    # The foreign processes themselves per GPU uuid, including those of unknown usage.
    foreign_processes: dict[str, list[GpuProcess]] = field(default_factory=dict)
    # MiB held by each task's processes, per (task id, GPU uuid) where any was seen.
    task_used_mb: dict[tuple[int, str], int] = field(default_factory=dict)
    # Processes (owned or not) whose usage the driver could not tell: counted as 0 above.
    unknown_usage: list[GpuProcess] = field(default_factory=list)
    # Tasks holding more than they reserved plus the tolerance, sorted by (task id, GPU uuid).
    overuses: list[Overuse] = field(default_factory=list)


def gpu_memory_report(
    processes: Iterable[GpuProcess],
    owners: Mapping[int, int],
    reserved: Mapping[tuple[int, str], int],
    *,
    gpus: Iterable[str] = (),
    tolerance_mb: int = DEFAULT_TOLERANCE_MB,
) -> GpuMemoryReport:
    """Split the memory on each GPU between the tasks (``owners``: pid -> task id) and the rest.

    ``reserved`` maps (task id, GPU uuid) to the MiB the task reserved there; a task using a GPU
    it reserved nothing on counts as reserving 0. ``gpus`` are the uuids whose processes were
    listed: each gets a ``foreign_mb`` entry even when nothing runs there, so the caller can
    clear a GPU's foreign memory. Leave out the GPUs the backend could not list
    (``backend.unlisted_gpus``): an unknown GPU is not an empty one.
    """
    if tolerance_mb < 0:
        raise ValueError(f"tolerance_mb must be >= 0, got {tolerance_mb}")
    foreign_mb: dict[str, int] = dict.fromkeys(gpus, 0)
    foreign_processes: dict[str, list[GpuProcess]] = defaultdict(list)
    task_used_mb: dict[tuple[int, str], int] = defaultdict(int)
    unknown_usage: list[GpuProcess] = []

    for process in processes:
        used = process.used_mb or 0
        if process.used_mb is None:
            unknown_usage.append(process)
        task_id = owners.get(process.pid)
        if task_id is None:
            foreign_mb[process.gpu_uuid] = foreign_mb.get(process.gpu_uuid, 0) + used
            foreign_processes[process.gpu_uuid].append(process)
        else:
            task_used_mb[(task_id, process.gpu_uuid)] += used

    overuses = sorted(
        Overuse(task_id, gpu_uuid, used, reserved.get((task_id, gpu_uuid), 0))
        for (task_id, gpu_uuid), used in task_used_mb.items()
        if used > reserved.get((task_id, gpu_uuid), 0) + tolerance_mb
    )
    return GpuMemoryReport(
        foreign_mb=foreign_mb,
        foreign_processes=dict(foreign_processes),
        task_used_mb=dict(task_used_mb),
        unknown_usage=unknown_usage,
        overuses=overuses,
    )


def owners_from_tree(attempts: Iterable[tuple[int, ProcessId | None]]) -> dict[int, int]:
    """Map every pid in each live supervisor's tree (the supervisor included) to its task id.

    ``attempts`` pairs a task id with its running attempt's supervisor
    (``ProcessId(attempt.supervisor_pid, attempt.supervisor_started)``); None, a dead
    supervisor, or a pid reused by another process contribute nothing. The supervisor is a
    subreaper, so a task's processes that ``setsid`` or double-fork away still count as its own.
    Pids are this machine's: the node agent must share the task processes' pid namespace.
    """
    owners: dict[int, int] = {}
    for task_id, supervisor in attempts:
        if supervisor is None:
            continue
        try:
            root = psutil.Process(supervisor.pid)
            # The same check as ProcessId.alive(), on the process we then walk.
            if abs(root.create_time() - supervisor.started) >= 0.01:
                continue
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in tree:
            owners[proc.pid] = task_id
    return owners
