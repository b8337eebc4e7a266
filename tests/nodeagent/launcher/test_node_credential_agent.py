"""A node agent that connects with its node's own credential (``manage.py node_credential``)
runs a task end to end: what the row-level security lets its role do is all it needs."""

from __future__ import annotations

import functools
import io
import os
import signal
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django_q.tasks import async_task

from scheduling import controls, scheduler
from scheduling.models import Node, NodeCredential, TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from telemetry.models import GpuSample
from tests.live import PYTHON, ROOT, manage, process_env
from tests.nodeagent.launcher.conftest import state_of, wait_for

pytestmark = pytest.mark.slow

NODE = f"confined-{os.getpid()}"  # roles are the server's: a name of this run's own
CONFIG = f"""
heartbeat: {{interval: 1s, offline_after: 30s}}
nodes:
  - name: {NODE}
    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: 2}}
"""


@pytest.fixture
def node_url(transactional_db, tmp_path):
    path = tmp_path / "node.url"
    call_command("node_credential", "create", NODE, "--output", str(path), stderr=io.StringIO())
    yield path
    call_command("node_credential", "revoke", NODE, stdout=io.StringIO())


class ConfinedAgent:
    """The node agent (and its cluster) on the node's own credential, in a session of its own;
    its log (with its cluster's) goes to ``log``."""

    def __init__(self, config: Path, url_file: Path, log: Path) -> None:
        self.config, self.url_file, self.log, self.proc = config, url_file, log, None

    def start(self) -> ConfinedAgent:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [PYTHON, "manage.py", "node_agent", "--backend", "simulated", "--config",
                 str(self.config), "--node", NODE],
                cwd=ROOT, env=process_env(DATABASE_URL="", DATABASE_URL_FILE=str(self.url_file)),
                start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def kill(self) -> None:
        """SIGKILL the agent and its cluster, not the supervisors (sessions of their own)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def confined_agent(launcher, node_url, tmp_path, monkeypatch):
    # Launches go through the broker to the node's own cluster, as in production.
    monkeypatch.setattr(controls, "async_task", functools.partial(async_task, sync=False))
    monkeypatch.setenv("Q_SYNC", "0")
    config = tmp_path / "estate.yaml"
    config.write_text(CONFIG)
    agent = ConfinedAgent(config, node_url, tmp_path / "agent.log").start()
    try:
        wait_for(lambda: Node.objects.filter(name=NODE, gpus__isnull=False).exists())
        yield agent, agent.log
    finally:
        agent.stop()


def wait_showing(log: Path, predicate, timeout: float = 60, **kwargs):
    """``wait_for``, failing with the agent's log (what its role was refused shows there)."""
    try:
        return wait_for(predicate, timeout=timeout, **kwargs)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n--- agent log ---\n{log.read_text()[-4000:]}")


def denied(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "permission denied" in line
            or "row-level security" in line]  # fmt: skip


def test_a_task_succeeds_on_an_agent_with_its_nodes_own_credential(confined_agent, lab):
    agent, log = confined_agent
    tasks = [
        task_submit(tenant=lab, spec=TaskSpec(name=f"t{i}", command="echo hello", node=NODE))
        for i in range(3)
    ]
    scheduler.schedule_pass()
    for task in tasks:
        wait_showing(log, state_of(task, "succeeded", "failed", "lost"))
        scheduler.schedule_pass()  # what a confined agent does not hand on, a pass places
    for task in tasks:
        task.refresh_from_db()
        attempt = TaskAttempt.objects.get(task=task)
        assert (task.state, attempt.launched_by) == ("succeeded", NODE), task.reason
        assert Path(attempt.log_path).read_text() == "hello\n"
    wait_for(lambda: GpuSample.objects.filter(gpu__node__name=NODE).exists())
    assert agent.proc.poll() is None, log.read_text()[-3000:]
    assert not denied(log), "\n".join(denied(log))


def test_its_failures_retries_and_cancels_go_through_too(confined_agent, lab):
    agent, log = confined_agent
    failing = task_submit(
        tenant=lab, spec=TaskSpec(name="f", command="exit 3", node=NODE, retries=1)
    )
    sleeper = task_submit(tenant=lab, spec=TaskSpec(name="s", command="sleep 60", node=NODE))
    scheduler.schedule_pass()
    wait_showing(log, state_of(sleeper, "running"))
    # The agent (its job thread too) and the task's supervisor all log in as the node's role.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT application_name, usename FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = ANY(%s)",
            [["gpuplatform node_agent", "gpuplatform supervisor"]],
        )
        sessions = cursor.fetchall()
    role = NodeCredential.objects.get(node_name=NODE).role
    assert "gpuplatform node_agent" in {a for a, _ in sessions}
    assert {user for _, user in sessions} == {role}, sessions
    controls.task_cancel(task=sleeper)  # a stop job on the node's own queue
    wait_showing(log, state_of(sleeper, "cancelled"))

    def failed_twice():
        scheduler.schedule_pass()  # the retry, once its backoff is over
        failing.refresh_from_db()
        return failing.state == "failed"

    wait_showing(log, failed_twice, every=0.5)
    assert TaskAttempt.objects.filter(task=failing).count() == 2
    assert failing.exit_code == 3
    assert agent.proc.poll() is None, log.read_text()[-3000:]
    assert not denied(log), "\n".join(denied(log))


def test_a_process_knows_whether_its_role_is_confined_to_a_node(node_url):
    """A confined agent hands no GPUs on (``handoff.plain_ends``): the successors and their
    tenants' quotas are the control plane's, which its role may not read."""
    ask = "from scheduling.nodecredentials import node_scope; print(node_scope())"
    confined = manage("shell", "-c", ask, DATABASE_URL=node_url.read_text().strip())
    assert confined.stdout.strip().splitlines()[-1] == NODE, confined.stderr
    platform = manage("shell", "-c", ask)
    assert platform.stdout.strip().splitlines()[-1] == "None", platform.stderr


def test_a_gpu_fault_on_its_node_is_handled_by_its_role(confined_agent, lab):
    """XID 79 under a running task: the agent's sampler records it, fails the GPU, opens an
    alert and requeues the task elsewhere, all as the node's role."""
    from monitoring.models import Alert
    from scheduling.models import GPU
    from telemetry.models import XidRecord

    agent, log = confined_agent
    task = task_submit(tenant=lab, spec=TaskSpec(name="x", command="sleep 60", node=NODE))
    scheduler.schedule_pass()
    wait_showing(log, state_of(task, "running"))
    gpu = GPU.objects.get(uuid=TaskAttempt.objects.get(task=task).gpu_uuids[0])
    call_command("gpu_fault", NODE, str(gpu.index), "xid", "79", stdout=io.StringIO())
    wait_showing(log, lambda: XidRecord.objects.filter(gpu=gpu, xid=79).exists(), timeout=30)
    wait_showing(log, lambda: GPU.objects.get(pk=gpu.pk).state == "failed", timeout=30)
    wait_showing(log, lambda: Alert.objects.filter(gpu=gpu).exists(), timeout=30)
    wait_showing(log, state_of(task, "pending", "scheduled", "running"), timeout=30)
    wait_showing(log, lambda: TaskAttempt.objects.get(task=task, number=1).outcome)
    assert agent.proc.poll() is None, log.read_text()[-3000:]
    assert not denied(log), "\n".join(denied(log))


def test_a_restarted_agent_reconciles_its_tasks_on_its_role(confined_agent, lab):
    """Killed while its task runs, the agent starts again and re-adopts it; the task ends as
    it would have."""
    agent, log = confined_agent
    task = task_submit(tenant=lab, spec=TaskSpec(name="r", command="sleep 4", node=NODE))
    scheduler.schedule_pass()
    wait_showing(log, state_of(task, "running"))
    agent.kill()
    agent.start()
    wait_showing(log, state_of(task, "succeeded", "failed", "lost", "pending"))
    assert task.state == "succeeded", task.reason
    assert TaskAttempt.objects.filter(task=task).count() == 1
    assert agent.proc.poll() is None, log.read_text()[-3000:]
    assert not denied(log), "\n".join(denied(log))
