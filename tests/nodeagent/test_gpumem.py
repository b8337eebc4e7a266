"""Whose memory is on each GPU: the pure report, and pids mapped to tasks from real trees."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from gpuplatform.procid import ProcessId
from nodeagent.gpumem import (
    DEFAULT_TOLERANCE_MB,
    GpuMemoryReport,
    Overuse,
    gpu_memory_report,
    owners_from_tree,
)
from scheduling.agentapi.messages import GpuProcess

GPU0 = "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
GPU1 = "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"


def p(gpu: str, pid: int, used_mb: int | None) -> GpuProcess:
    return GpuProcess(gpu_uuid=gpu, pid=pid, used_mb=used_mb)


# --- The report -------------------------------------------------------------------------------


def test_it_counts_processes_no_task_owns_as_foreign() -> None:
    report = gpu_memory_report(
        [p(GPU0, 10, 4000), p(GPU0, 11, 1000), p(GPU0, 20, 6000)],
        owners={20: 7},
        reserved={(7, GPU0): 8000},
    )

    assert report.foreign_mb == {GPU0: 5000}
    assert [proc.pid for proc in report.foreign_processes[GPU0]] == [10, 11]
    assert report.task_used_mb == {(7, GPU0): 6000}
    assert report.overuses == []


def test_it_gives_every_listed_gpu_a_foreign_entry_even_when_idle() -> None:
    report = gpu_memory_report([p(GPU0, 20, 100)], owners={20: 7}, reserved={}, gpus=[GPU0, GPU1])

    # GPU1 runs nothing: 0, so the caller clears what it stored before.
    assert report.foreign_mb == {GPU0: 0, GPU1: 0}
    assert report.foreign_processes == {}


def test_it_adds_up_a_tasks_processes_on_one_gpu() -> None:
    report = gpu_memory_report(
        [p(GPU0, 20, 3000), p(GPU0, 21, 3000)], owners={20: 7, 21: 7}, reserved={(7, GPU0): 4000}
    )

    assert report.task_used_mb == {(7, GPU0): 6000}
    assert report.overuses == [Overuse(task_id=7, gpu_uuid=GPU0, used_mb=6000, reserved_mb=4000)]


def test_it_tolerates_a_little_more_than_reserved() -> None:
    def overuses(used: int, tolerance_mb: int = DEFAULT_TOLERANCE_MB) -> list[Overuse]:
        return gpu_memory_report(
            [p(GPU0, 20, used)],
            owners={20: 7},
            reserved={(7, GPU0): 4000},
            tolerance_mb=tolerance_mb,
        ).overuses

    assert DEFAULT_TOLERANCE_MB == 256
    assert overuses(4000 + 256) == []
    assert overuses(4000 + 257) == [(7, GPU0, 4257, 4000)]
    assert overuses(4001, tolerance_mb=0) == [(7, GPU0, 4001, 4000)]
    assert overuses(4000, tolerance_mb=0) == []
    assert overuses(5000, tolerance_mb=1000) == []


def test_it_rejects_a_negative_tolerance() -> None:
    with pytest.raises(ValueError, match="tolerance_mb"):
        gpu_memory_report([], owners={}, reserved={}, tolerance_mb=-1)


def test_it_counts_unknown_usage_as_zero_but_lists_it() -> None:
    stray = p(GPU0, 10, None)
    blind_task = p(GPU0, 20, None)

    report = gpu_memory_report(
        [stray, p(GPU0, 11, 500), blind_task], owners={20: 7}, reserved={(7, GPU0): 1}
    )

    assert report.foreign_mb == {GPU0: 500}
    assert report.foreign_processes[GPU0] == [stray, p(GPU0, 11, 500)]
    assert report.task_used_mb == {(7, GPU0): 0}
    assert report.unknown_usage == [stray, blind_task]
    # Nothing known to be over: an overuse is never guessed.
    assert report.overuses == []


def test_it_splits_a_process_on_two_gpus_by_gpu() -> None:
    report = gpu_memory_report(
        [p(GPU0, 20, 9000), p(GPU1, 20, 1000), p(GPU0, 10, 700), p(GPU1, 10, 300)],
        owners={20: 7},
        reserved={(7, GPU0): 4000, (7, GPU1): 4000},
    )

    assert report.foreign_mb == {GPU0: 700, GPU1: 300}
    assert report.task_used_mb == {(7, GPU0): 9000, (7, GPU1): 1000}
    assert report.overuses == [(7, GPU0, 9000, 4000)]


def test_it_counts_a_gpu_the_task_reserved_nothing_on_as_reserved_zero() -> None:
    # The task ignored CUDA_VISIBLE_DEVICES and opened a GPU it was not given.
    report = gpu_memory_report(
        [p(GPU0, 20, 1000), p(GPU1, 20, 1000)], owners={20: 7}, reserved={(7, GPU0): 4000}
    )

    assert report.overuses == [(7, GPU1, 1000, 0)]


def test_it_lists_every_overuse_sorted_by_task_and_gpu() -> None:
    report = gpu_memory_report(
        [p(GPU1, 30, 5000), p(GPU0, 20, 5000), p(GPU0, 30, 5000), p(GPU1, 20, 100)],
        owners={20: 7, 30: 3},
        reserved={(7, GPU0): 1000, (7, GPU1): 1000, (3, GPU0): 1000, (3, GPU1): 1000},
    )

    assert report.overuses == [
        Overuse(3, GPU0, 5000, 1000),
        Overuse(3, GPU1, 5000, 1000),
        Overuse(7, GPU0, 5000, 1000),
    ]
    task_id, gpu_uuid, used_mb, reserved_mb = report.overuses[0]  # plain tuples too
    assert (task_id, gpu_uuid, used_mb, reserved_mb) == (3, GPU0, 5000, 1000)


def test_it_reports_nothing_for_nothing() -> None:
    assert gpu_memory_report([], owners={}, reserved={(7, GPU0): 100}) == GpuMemoryReport()


# --- Owners from real process trees -----------------------------------------------------------

# A stand-in supervisor: starts two `sleep`s, one of them in its own session (as a task that
# setsid's away would), prints their pids and waits.
SUPERVISOR = """
import os, subprocess, sys
a = subprocess.Popen(["sleep", "60"])
b = subprocess.Popen(["sleep", "60"], start_new_session=True)
print(a.pid, b.pid, flush=True)
sys.stdin.read()
"""


Started = tuple[subprocess.Popen[str], list[int]]


@pytest.fixture
def supervisors() -> Iterator[Callable[[], Started]]:
    """Starts stand-in supervisors; kills them and their children after the test."""
    started: list[Started] = []

    def start() -> Started:
        sup = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert sup.stdout is not None
        children = [int(pid) for pid in sup.stdout.readline().split()]
        started.append((sup, children))
        return sup, children

    yield start

    for sup, children in started:
        for pid in children:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        sup.kill()
        sup.wait(timeout=10)
        for pid in children:
            try:
                psutil.Process(pid).wait(timeout=10)
            except psutil.Error:
                pass


def test_it_maps_each_supervisors_tree_to_its_task(supervisors) -> None:
    sup_a, children_a = supervisors()
    sup_b, children_b = supervisors()

    owners = owners_from_tree(
        [(7, ProcessId.of(sup_a.pid)), (8, ProcessId.of(sup_b.pid))],
    )

    assert owners == {
        sup_a.pid: 7,
        children_a[0]: 7,
        children_a[1]: 7,
        sup_b.pid: 8,
        children_b[0]: 8,
        children_b[1]: 8,
    }
    assert os.getpid() not in owners


def test_it_ignores_dead_missing_and_reused_supervisors(supervisors) -> None:
    sup, children = supervisors()
    live = ProcessId.of(sup.pid)
    assert live is not None
    # Same pid, another start time: the pid was reused by a process that is not the supervisor.
    reused = ProcessId(sup.pid, live.started - 100)
    gone = subprocess.Popen(["true"])
    gone.wait()

    owners = owners_from_tree(
        [(7, reused), (8, None), (9, ProcessId(gone.pid, time.time())), (10, live)]
    )

    assert owners == {sup.pid: 10, children[0]: 10, children[1]: 10}


def test_it_feeds_the_report(supervisors) -> None:
    sup, (child, _) = supervisors()
    owners = owners_from_tree([(7, ProcessId.of(sup.pid))])

    report = gpu_memory_report(
        [p(GPU0, child, 5000), p(GPU0, os.getpid(), 300)],
        owners=owners,
        reserved={(7, GPU0): 4000},
    )

    assert report.foreign_mb == {GPU0: 300}
    assert report.overuses == [(7, GPU0, 5000, 4000)]
