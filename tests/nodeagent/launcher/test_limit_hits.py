"""Limits are named: a task that hit its process or CPU limit says so in its reason and its
events, as one killed for memory does. Real tasks in real cgroups: root only."""

from __future__ import annotations

import os

import pytest

from nodeagent.launcher import cgroups
from scheduling.models import TaskEvent
from tests.nodeagent.launcher.conftest import state_of, wait_for
from tests.nodeagent.launcher.test_launch import start

needs_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or cgroups.detect() is None, reason="limits need root and cgroups"
)

FORK_LOOP = "i=0; while [ $i -lt 200 ]; do sleep 5 & i=$((i+1)); done; wait"


def last_event_reason(task) -> str:
    return TaskEvent.objects.filter(task=task).latest("at", "pk").reason


@needs_cgroups
def test_a_task_that_failed_at_its_process_limit_says_so(launcher, node, lab):
    task = start(lab, FORK_LOOP, pids=50)
    wait_for(state_of(task, "succeeded", "failed"), timeout=60)
    assert task.state == "failed", task.reason
    assert task.reason.startswith(f"exited with {task.exit_code} after it hit the process limit")
    assert "(resources.pids: 50; " in task.reason and " forks refused)" in task.reason
    assert last_event_reason(task) == task.reason


@needs_cgroups
def test_a_task_that_survived_its_process_limit_succeeds_with_it_noted(launcher, node, lab):
    task = start(lab, f"({FORK_LOOP}) 2>/dev/null; exit 0", pids=50)
    wait_for(state_of(task, "succeeded", "failed"), timeout=60)
    assert task.state == "succeeded", task.reason
    assert task.reason.startswith("exited with 0; hit the process limit (resources.pids: 50; ")
    assert last_event_reason(task) == task.reason


@needs_cgroups
def test_a_task_held_back_by_its_cpu_limit_says_so(launcher, node, lab):
    busy = "timeout 2 sh -c 'while :; do :; done'; exit 0"
    task = start(lab, busy, cpus=0.05)
    wait_for(state_of(task, "succeeded", "failed"), timeout=60)
    assert task.state == "succeeded", task.reason
    assert task.reason.startswith(
        "exited with 0; held back by the CPU limit (resources.cpus: 0.05;"
    )
    assert last_event_reason(task) == task.reason


@needs_cgroups
def test_a_task_within_its_limits_says_nothing_of_them(launcher, node, lab):
    task = start(lab, "echo ok", pids=50, cpus=1)
    wait_for(state_of(task, "succeeded", "failed"), timeout=60)
    assert task.reason == "exited with 0"
