"""Launcher tests run real supervisors and real task processes against the test database.

Run as root (CI), tasks run as their tenant's own Unix user in their own cgroup, as in
production; the cgroups of this test run live under a name of their own.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import psutil
import pytest
from django.db import connection

from nodeagent.launcher import cgroups, gpufence, procs, relay
from scheduling.models import Task, TaskAttempt
from tests.factories import NodeFactory, TenantFactory, make_gpus


@pytest.fixture
def launcher(transactional_db, tmp_path, monkeypatch, settings):
    """Tasks really start: directories under tmp_path, a short stop grace, no retry backoff.

    Supervisors read their settings from the environment, so both are set.
    """
    # pytest keeps its temporary directories private; tenant users must pass through them.
    for directory in (tmp_path, *list(tmp_path.parents)[:2]):
        directory.chmod(0o711)
    values = {
        "CGROUP_NAME": TEST_CGROUP,
        "GPUPLATFORM_TASKS_ROOT": tmp_path / "tasks",
        "GPUPLATFORM_TASK_LOG_DIR": tmp_path / "logs",
        "TASK_STOP_GRACE": 2,
        "RETRY_BACKOFF": 0,
        # A pass run inside a supervisor (a finished task wakes the scheduler; in tests
        # django-q2 runs it right there) must launch what it places too.
        "LAUNCH_TASKS": 1,
    }
    for name, value in values.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("GPUPLATFORM_TESTING", "1")
    settings.CGROUP_NAME = TEST_CGROUP
    settings.TASKS_ROOT = values["GPUPLATFORM_TASKS_ROOT"]
    settings.TASK_LOG_DIR = values["GPUPLATFORM_TASK_LOG_DIR"]
    settings.TASK_STOP_GRACE = 2
    settings.RETRY_BACKOFF = 0
    settings.LAUNCH_TASKS = True
    yield tmp_path
    stop_supervisors()
    remove_test_cgroups()


TEST_CGROUP = f"gpuplatform-test-{os.getpid()}"


def remove_test_cgroups() -> None:
    found = cgroups.detect()
    group = found and cgroups.AttemptCgroup.find(found, TEST_CGROUP)
    if group is not None:
        assert group.remove(), "processes of a test's attempts survived it"


def stop_supervisors() -> None:
    """Kill every supervisor (and its task tree) a test left running, and every other session
    on the test database, before it is flushed: they hold locks the flush would wait on."""
    quiet = 0
    while quiet < 3:  # a supervisor may be starting another as we look
        quiet = 0 if _kill_supervisors() else quiet + 1
        time.sleep(0.05)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def _kill_supervisors() -> int:
    """Kill the supervisors of this test's attempts (recorded in its database), with their
    task trees. Supervisors of anything else on the machine are left alone."""
    found = 0
    for pid, started in TaskAttempt.objects.exclude(supervisor_pid=None).values_list(
        "supervisor_pid", "supervisor_started"
    ):
        if not procs.ProcessId(pid, started).alive():
            continue
        try:
            supervisor = psutil.Process(pid)
            tree = [supervisor, *supervisor.children(recursive=True)]
        except psutil.Error:
            continue
        found += 1
        for member in tree:
            try:
                member.kill()
            except psutil.Error:
                pass
        procs.wait_stopped(tree, timeout=5)
    return found


@pytest.fixture
def node(transactional_db):
    """A node with 4 GPUs whose device minors are published, as its agent does at start-up
    (without the map, supervisors fence the GPUs off and log it)."""
    node = NodeFactory(name="workstation-1")
    gpus = make_gpus(node, count=4)
    gpufence.publish(node.name, [SimpleNamespace(uuid=gpu.uuid, minor=gpu.index) for gpu in gpus])
    return node


@pytest.fixture
def listening(launcher, node):
    """The node agent's relay, on a thread of this process, as the agent runs it."""
    thread = relay.Relay(node.name)
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture
def lab(transactional_db):
    return TenantFactory(name="vision-lab")


def wait_for(predicate, timeout: float = 20.0, every: float = 0.05):
    """Poll until predicate() is truthy; return its value, or fail with what it last saw."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout} s waiting for {predicate.__doc__ or predicate}")
        time.sleep(every)


def state_of(task: Task, *states: str):
    """The task's state once it is one of ``states``."""

    def check():
        task.refresh_from_db()
        return task.state if task.state in states else None

    check.__doc__ = f"task {task.pk} to be one of {states}"
    return check


def rewind(task: Task, **fields) -> None:
    """Put a task back where a lost report would have left it (``fields``: its state and the
    rest). That is a move the state machine's trigger refuses to any process; the test makes it
    as a replica applies rows, with user triggers off for this one statement's session."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            Task.objects.filter(pk=task.pk).update(**fields)
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
