"""Supervisors are forked by the node's spawner, a small process that never loads Django's
models; they outlive it, and it forks nothing for a request it cannot vouch for."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from nodeagent.launcher import lifecycle, procs, spawner, wire
from scheduling import controls, scheduler
from scheduling.agentapi.messages import Assignment
from scheduling.models import Task, TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.live import PYTHON, ROOT, process_env
from tests.nodeagent.launcher.conftest import state_of, wait_for


def listens(node_name: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(wire.address(node_name, "spawner"))
        except OSError:
            return False
    return True


@contextmanager
def running_spawner(node, **environ: str) -> Iterator[subprocess.Popen]:
    """The node's spawner, as the agent starts it (``environ``: settings of its own)."""
    proc = subprocess.Popen(  # noqa: S603 - fixed argv
        [PYTHON, "-m", "nodeagent.launcher.spawner", node.name],
        cwd=ROOT,
        env=process_env(**environ),
    )
    wait_for(lambda: listens(node.name))
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture
def spawning(launcher, node):
    with running_spawner(node) as proc:
        yield proc


def submit(lab, command: str) -> Task:
    task = task_submit(tenant=lab, spec=TaskSpec(name="t", command=command))
    scheduler.schedule_pass()
    return task


def supervisor_of(task: Task) -> psutil.Process:
    pid = wait_for(
        lambda: TaskAttempt.objects.filter(task=task).values_list("supervisor_pid", flat=True)[0]
    )
    return psutil.Process(pid)


def test_supervisors_are_forked_by_the_spawner_out_of_its_tree_and_outlive_it(
    spawning, listening, lab
):
    task = submit(lab, "sleep 2; echo done")
    wait_for(state_of(task, "running"))
    supervisor = supervisor_of(task)
    # Not under the spawner, nor under this process that started it (as `make run` does): a
    # process manager killing its whole tree leaves the supervisor be.
    assert supervisor.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    assert supervisor.pid == os.getsid(supervisor.pid)  # a session of its own
    # Nothing of the agent's output: that pipe's reader would never see its end.
    assert {os.readlink(f"/proc/{supervisor.pid}/fd/{fd}") for fd in (0, 1, 2)} == {"/dev/null"}
    spawning.send_signal(signal.SIGKILL)
    spawning.wait()
    wait_for(state_of(task, "succeeded"))
    attempt = TaskAttempt.objects.get(task=task)
    with open(attempt.log_path) as log:
        assert log.read() == "done\n"
    wait_for(lambda: listening.reports == 2, timeout=5)  # start and end, through the agent


def test_a_supervisor_of_the_spawner_logs_to_its_own_file(spawning, listening, lab):
    """INFO and up, to a file of its own beside the attempt's log, made by its first line."""
    task = submit(lab, "exit 3")
    wait_for(state_of(task, "failed"))
    sink = Path(TaskAttempt.objects.get(task=task).log_path).with_name("supervisor-1.log")
    ended = re.compile(
        rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}} INFO task {task.pk} attempt 1 "
        r"ended: failed \(exit 3\)$",
        re.MULTILINE,
    )
    wait_for(lambda: sink.exists() and ended.search(sink.read_text()), timeout=5)
    assert sink.stat().st_mode & 0o777 == 0o640


def test_a_supervisor_with_nothing_to_say_makes_no_file(spawning, listening, lab, node):
    """A success is the task's record: its supervisor writes no line, so makes no file."""
    task = submit(lab, "true")
    wait_for(state_of(task, "succeeded"))
    log = Path(TaskAttempt.objects.get(task=task).log_path)
    supervisor = supervisor_of(task)
    title = f"gpup-supervisor idle node={node.name}"
    wait_for(lambda: supervisor.cmdline()[0] == title)  # its end is all behind it
    assert sorted(path.name for path in log.parent.iterdir()) == [
        "attempt-1.exit.json",
        "attempt-1.log",
    ]


def test_a_supervisor_of_the_spawner_writes_to_the_database_when_no_agent_answers(spawning, lab):
    """The one path on which it loads Django's apps: nobody else can record its exit."""
    task = submit(lab, "sleep 3; exit 3")  # running long enough to be seen, Django cold
    wait_for(state_of(task, "running"))
    assert supervisor_of(task).cmdline()[0].startswith(procs.SUPERVISOR_NAME)
    wait_for(state_of(task, "failed"))
    assert (task.exit_code, task.reason) == (3, "exited with 3")


def raw_request(node_name: str, message: dict) -> bytes:
    """Send ``message`` as the launch worker would, and what came back (b"": nothing)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(wire.address(node_name, "spawner"))
        data = json.dumps(message).encode()
        sock.sendall(len(data).to_bytes(4, "big") + data)
        return sock.recv(65536)


def assignment(lab, node) -> Assignment:
    return Assignment(
        attempt_id=1, task_id=1, attempt_no=1, node=node.name, tenant=lab.name,
        unix_user=lab.unix_user, task_name="t", command="touch /tmp/owned", workdir="",
        log_path="/dev/null",
    )  # fmt: skip


@pytest.fixture
def forks_seen(spawning):
    """This process made a child subreaper while the test runs: what the spawner forks (its
    supervisors leave its tree at once, see ``Spawner.fork``) is re-parented here instead of to
    init, and stays one of our descendants, alive or a zombie. Returns a function that lists
    them."""
    procs.become_subreaper()

    def descendants() -> set[int]:
        return {p.pid for p in psutil.Process().children(recursive=True)} - {spawning.pid}

    try:
        yield descendants
    finally:
        procs.prctl(procs.PR_SET_CHILD_SUBREAPER, 0)
        for pid in descendants():  # zombies re-parented here; not the spawner (Popen's)
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def test_a_request_without_the_platforms_signature_forks_nothing(spawning, lab, node, forks_seen):
    message = {"assignment": assignment(lab, node).as_dict(), "sink": "/dev/null"}
    before = forks_seen()
    assert raw_request(node.name, {**message, "sig": "0" * 64}) == b""
    assert raw_request(node.name, message) == b""
    assert forks_seen() == before
    assert spawning.poll() is None  # and it goes on serving


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_a_request_from_another_user_forks_nothing(spawning, lab, node, forks_seen):
    before = forks_seen()
    message = {"assignment": assignment(lab, node).as_dict(), "sink": "/dev/null"}
    message["sig"] = wire.signature(message)  # even signed: a task never has the key
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        answer = b"?"
        try:
            os.setgid(65534)
            os.setuid(65534)
            answer = raw_request(node.name, message) or b"-"
        except (ConnectionResetError, BrokenPipeError):
            answer = b"-"  # dropped unread (closed before or while the request was sent)
        except OSError as exc:
            answer = f"? {exc!r}".encode()  # what went wrong, for the assertion below
        finally:
            os.write(write, answer)
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    assert os.read(read, 65536) == b"-"
    assert forks_seen() == before


def test_without_a_spawner_a_request_is_not_sent(launcher, lab, node):
    with pytest.raises(wire.NotSent):
        wire.request(assignment(lab, node), "/dev/null")


def test_the_spawner_drops_the_secrets_names_once_it_has_read_the_settings(monkeypatch):
    for name in ("DATABASE_URL", "DATABASE_URL_FILE", "SECRET_KEY", "SECRET_KEY_FILE"):
        monkeypatch.setenv(name, "not for supervisors")
    spawner.warm()
    assert not {"DATABASE_URL", "DATABASE_URL_FILE", "SECRET_KEY", "SECRET_KEY_FILE"} & set(
        os.environ
    )


# --- Supervisors reused for the next attempt --------------------------------------------------


def test_a_supervisor_whose_attempt_ended_plainly_supervises_the_next(spawning, listening, lab,
                                                                       node):  # fmt: skip
    first = submit(lab, "echo one")
    wait_for(state_of(first, "succeeded"))
    supervisor = supervisor_of(first)
    title = f"gpup-supervisor idle node={node.name}"
    wait_for(lambda: supervisor.cmdline()[0] == title)  # waiting at the spawner
    second = submit(lab, "echo two; exit 4")
    wait_for(state_of(second, "failed"))
    assert supervisor_of(second).pid == supervisor.pid  # not forked: handed over
    logs = [Path(TaskAttempt.objects.get(task=task).log_path) for task in (first, second)]
    assert [log.read_text() for log in logs] == ["one\n", "two\n"]
    ended = f"INFO task {second.pk} attempt 1 ended: failed (exit 4)"
    sinks = [log.with_name("supervisor-1.log") for log in logs]
    wait_for(lambda: sinks[1].exists() and ended in sinks[1].read_text(), timeout=5)
    assert not sinks[0].exists()  # each its own file: the first had nothing to say


def test_a_signal_for_an_attempt_that_ended_never_reaches_the_next(spawning, listening, lab):
    # Back at the spawner before the next launch, or the next gets a new one: a task's end is
    # recorded before its supervisor has said it is idle (a slow machine saw the two race).
    first, supervisor = idle_supervisor(lab)
    second = submit(lab, "sleep 2; echo still here")
    wait_for(state_of(second, "running"))
    assert supervisor_of(second).pid == supervisor.pid
    assert lifecycle.control(first.pk, 1, "stop") == "nothing to do"
    wait_for(state_of(second, "succeeded"))


def test_a_stopped_attempts_supervisor_exits_and_the_next_is_forked(spawning, listening, lab):
    first = submit(lab, "sleep 300")
    wait_for(state_of(first, "running"))
    supervisor = supervisor_of(first)
    controls.task_cancel(task=first)
    wait_for(state_of(first, "cancelled"))
    wait_for(lambda: not procs.running(supervisor))
    second = submit(lab, "true")
    wait_for(state_of(second, "succeeded"))
    assert supervisor_of(second).pid != supervisor.pid


def idle_supervisor(lab) -> tuple[Task, psutil.Process]:
    """A task that ran and ended, and its supervisor once it waits at the spawner."""
    task = submit(lab, "true")
    wait_for(state_of(task, "succeeded"))
    idle = supervisor_of(task)
    wait_for(lambda: "idle" in idle.cmdline()[0])
    return task, idle


def test_when_the_idle_supervisor_is_gone_the_spawner_forks_one(spawning, listening, lab):
    _, idle = idle_supervisor(lab)
    idle.kill()
    second = submit(lab, "true")
    wait_for(state_of(second, "succeeded"))
    assert supervisor_of(second).pid != idle.pid


def test_idle_supervisors_leave_with_the_spawner(spawning, listening, lab):
    _, idle = idle_supervisor(lab)
    spawning.terminate()
    spawning.wait(timeout=10)
    wait_for(lambda: not procs.running(idle), timeout=5)


def test_a_start_up_sweep_leaves_a_reused_supervisor_alone(spawning, listening, lab, node):
    _, idle = idle_supervisor(lab)  # a task's end is recorded before its supervisor is idle
    second = submit(lab, "sleep 2")
    wait_for(state_of(second, "running"))
    assert supervisor_of(second).pid == idle.pid
    assert lifecycle._stop_stale_supervisors(node.name) == 0  # first's ended: not stale here
    wait_for(state_of(second, "succeeded"))


def test_an_idle_offer_needs_the_signature_and_to_come_from_its_sender(spawning, lab, node):
    unsigned = {"idle": os.getpid()}
    assert raw_request(node.name, unsigned) == b""  # closed at once: nothing kept
    claimed = {"idle": os.getpid() + 1}  # signed, but not the sender's own pid
    claimed["sig"] = wire.signature(claimed)
    assert raw_request(node.name, claimed) == b""
    assert spawning.poll() is None


@pytest.fixture
def spawning_without_reuse(launcher, node):
    with running_spawner(node, SUPERVISOR_REUSE="1") as proc:
        yield proc


def test_with_reuse_off_every_attempt_gets_its_own_supervisor(spawning_without_reuse, listening,
                                                              lab):  # fmt: skip
    first = submit(lab, "true")
    wait_for(state_of(first, "succeeded"))
    second = submit(lab, "true")
    wait_for(state_of(second, "succeeded"))
    assert supervisor_pid(second) != supervisor_pid(first)


def supervisor_pid(task: Task) -> int:
    return TaskAttempt.objects.get(task=task).supervisor_pid
