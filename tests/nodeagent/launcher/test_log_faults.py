"""A log disk that fails (full, read-only, removed) costs tasks their output, never a run: each
task runs on its first attempt, its reason says what was lost, and the node gets one alert.

The tasks run as on a node: forked by the node's spawner, reporting through the agent's relay,
a supervisor taking the next attempt once its own ended. Mounting a tmpfs needs root; the
supervisor's own pieces are checked without it.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from monitoring.models import Alert, AlertKind
from nodeagent.launcher import logrelay, supervisor
from scheduling import scheduler
from scheduling.models import Task, TaskAttempt, TaskEvent
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.nodeagent.launcher.conftest import state_of, wait_for
from tests.nodeagent.launcher.test_spawner import running_spawner

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

PRINTS_5MB = "python3 -c \"import sys; [print('x' * 99) for _ in range(50000)]\"; exit 0"


@pytest.fixture
def spawning(launcher, node):
    with running_spawner(node) as proc:
        yield proc


def log_disk(launcher, *options: str) -> Path:
    logs = launcher / "logs"
    logs.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(["size=1m", "mode=0700", *options]), "tmpfs",
         str(logs)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the logs: {mounted.stderr.strip()}")
    return logs


@pytest.fixture
def small_log_disk(launcher):
    logs = log_disk(launcher)
    yield logs
    subprocess.run(["umount", "-l", str(logs)], check=False)


@pytest.fixture
def read_only_log_disk(launcher):
    logs = log_disk(launcher, "ro")
    yield logs
    subprocess.run(["umount", "-l", str(logs)], check=False)


def run(lab, command: str, name: str = "t") -> Task:
    task = task_submit(tenant=lab, spec=TaskSpec(name=name, command=command))
    scheduler.schedule_pass()
    wait_for(state_of(task, "succeeded", "failed", "pending"), timeout=60)
    return task


def ran_once(task: Task) -> None:
    """Succeeded on its first attempt: no retry, no backoff, no attempt lost to the platform."""
    assert (task.state, task.attempt, task.not_before) == ("succeeded", 1, None), task.reason
    assert TaskAttempt.objects.filter(task=task).count() == 1
    assert not TaskEvent.objects.filter(task=task, to_state="pending").exclude(from_state="")


def one_alert_for(node) -> Alert:
    alerts = list(Alert.objects.filter(kind=AlertKind.TASK_LOG_IO))
    assert len(alerts) == 1, [a.message for a in alerts]
    assert (alerts[0].node_id, alerts[0].task_id, alerts[0].resolved_at) == (node.pk, None, None)
    return alerts[0]


@needs_root
def test_after_a_full_log_disk_the_next_tasks_start_on_their_first_attempt(
    small_log_disk, spawning, listening, node, lab
):
    first = run(lab, PRINTS_5MB, name="loud")
    ran_once(first)
    assert "output not kept: the log disk is full (" in first.reason
    assert "bytes dropped)" in first.reason
    assert first.reason in TaskEvent.objects.filter(task=first).values_list("reason", flat=True)

    # Handed to the supervisor that ran the first (its own file on the full disk) or forked.
    later = [run(lab, "echo after-ok", name=f"after-{i}") for i in range(3)]
    for task in later:
        ran_once(task)
        assert (
            task.reason == "exited with 0; output not kept: the log disk is full (9 bytes dropped)"
        )
    alert = one_alert_for(node)
    assert node.name in alert.message and str(small_log_disk) in alert.message
    assert "No space left on device" in alert.message


@needs_root
def test_on_a_read_only_log_disk_tasks_run_and_say_their_output_was_lost(
    read_only_log_disk, spawning, listening, node, lab
):
    tasks = [run(lab, "echo hello", name=f"t{i}") for i in range(2)]
    for task in tasks:
        ran_once(task)
        assert (
            task.reason
            == "exited with 0; output not kept: the log disk is read-only (6 bytes dropped)"
        )
    assert "Read-only file system" in one_alert_for(node).message


@needs_root
def test_a_log_directory_removed_while_its_task_runs_is_named_in_its_reason(
    launcher, spawning, listening, node, lab, settings
):
    go = Path(settings.TASKS_ROOT) / lab.name / "go"
    task = task_submit(
        tenant=lab,
        spec=TaskSpec(name="t", command="echo before; while [ ! -e go ]; do sleep 0.05; done"),
    )
    scheduler.schedule_pass()
    wait_for(state_of(task, "running"))
    log = Path(TaskAttempt.objects.get(task=task).log_path)
    wait_for(lambda: log.exists() and log.read_text() == "before\n")
    shutil.rmtree(log.parent.parent)  # the tenant's log directory, by an operator's clean-up
    go.touch()
    wait_for(state_of(task, "succeeded", "failed"), timeout=30)
    ran_once(task)
    assert task.reason == "exited with 0; output not kept: the log was removed while the task ran"
    one_alert_for(node)

    after = run(lab, "echo after-ok", name="after")
    ran_once(after)
    assert after.reason == "exited with 0"
    assert Path(TaskAttempt.objects.get(task=after).log_path).read_text() == "after-ok\n"


# --- The supervisor's pieces -------------------------------------------------------------------


def copy(relay: logrelay.LogRelay, data: bytes) -> None:
    os.write(relay.write_fd, data)
    os.close(relay.write_fd)
    while relay.pump(1):
        pass


def test_a_log_whose_directory_is_gone_drops_the_output_and_says_why(tmp_path):
    relay = logrelay.LogRelay(tmp_path / "gone" / "lab" / "7" / "attempt-1.log")
    copy(relay, b"hello")
    relay.close()
    assert relay.note() == "output not kept: the log directory is gone (5 bytes dropped)"
    assert relay.trouble == "No such file or directory"


def test_a_log_whose_directories_were_removed_since_the_launch_is_made_again(tmp_path):
    log = tmp_path / "lab" / "7" / "attempt-1.log"
    relay = logrelay.LogRelay(log)
    copy(relay, b"hello")
    relay.close()
    assert (relay.note(), log.read_bytes()) == ("", b"hello")
    assert oct(log.parent.parent.stat().st_mode & 0o777) == oct(0o700)


def test_a_log_that_cannot_be_closed_is_named_and_raises_nothing(tmp_path, monkeypatch):
    relay = logrelay.LogRelay(tmp_path / "attempt-1.log")
    copy(relay, b"hello")
    real_close, log_fd = os.close, relay.log_fd

    def close(fd: int) -> None:
        real_close(fd)
        if fd == log_fd:  # as NFS reports a write that failed after it was taken
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "close", close)
    relay.close()
    monkeypatch.undo()
    assert (
        relay.note() == "output may be incomplete: the log cannot be written (Input/output error)"
    )
    assert (tmp_path / "attempt-1.log").read_bytes() == b"hello"


def test_the_supervisors_own_file_on_a_failing_disk_never_ends_it(tmp_path):
    """Lines that cannot be written are dropped; moving to the next attempt's file still works
    (a failed flush at that move ended a supervisor, and its next attempt waited for
    reconciliation)."""
    handler = supervisor.SinkHandler("/dev/full")  # every write: No space left on device
    log = logging.getLogger("test-sink")
    log.propagate = False
    log.addHandler(handler)
    try:
        log.error("cannot write the log")
        handler.to(tmp_path / "gone" / "supervisor-2.log")  # a directory that is not there
        log.error("still cannot")
        handler.to(tmp_path / "supervisor-3.log")
        log.error("written")
        handler.close()
    finally:
        log.removeHandler(handler)
    assert (tmp_path / "supervisor-3.log").read_text().endswith("ERROR written\n")
