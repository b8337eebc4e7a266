"""Tasks survive the platform: real node agents with their own django-q2 clusters, killed
with SIGKILL and restarted while tasks run."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.db import connection
from django_q.tasks import async_task

from gpuplatform import connections
from scheduling import controls, scheduler
from scheduling.models import Node, Task, TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.live import PYTHON, ROOT, process_env
from tests.nodeagent.launcher.conftest import state_of, wait_for

pytestmark = pytest.mark.slow

CONFIG = """
heartbeat: {{interval: 1s, offline_after: 30s}}
nodes:
{nodes}
"""
NODE = """  - name: {name}
    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: {count}}}
"""

COUNT_TO_100K = (
    'python3 -c "import time\n'
    "for i in range(100000):\n"
    "    print(i, flush=True)\n"
    '    if i % 2000 == 0: time.sleep(0.1)"'
)


@pytest.fixture
def via_clusters(monkeypatch):
    """Launches go through the django-q2 broker to each node's own cluster, as in production
    (the test settings would otherwise run them inline, in whichever process asked)."""
    monkeypatch.setattr(controls, "async_task", functools.partial(async_task, sync=False))
    monkeypatch.setenv("Q_SYNC", "0")  # for the agents, their clusters and the supervisors


class Agent:
    """A node agent process (with its launcher cluster) in its own process group."""

    def __init__(self, config: Path, name: str) -> None:
        self.config, self.name, self.proc = config, name, None

    def start(self) -> Agent:
        self.proc = subprocess.Popen(
            [PYTHON, "manage.py", "node_agent", "--backend", "simulated", "--config",
             str(self.config), "--node", self.name],
            cwd=ROOT,
            env=process_env(),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: Node.objects.filter(name=self.name, gpus__isnull=False).exists())
        return self

    def kill(self) -> None:
        """SIGKILL the agent, its cluster and the cluster's workers: not the supervisors, which
        run in sessions of their own."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def agents(launcher, via_clusters, tmp_path):
    started: list[Agent] = []

    def start(nodes: dict[str, int]) -> list[Agent]:
        config = tmp_path / "estate.yaml"
        body = "".join(NODE.format(name=n, count=c) for n, c in nodes.items())
        config.write_text(CONFIG.format(nodes=body))
        for name in nodes:
            started.append(Agent(config, name).start())
        return started

    yield start
    for agent in started:
        agent.stop()


def submit(lab, command: str, **fields) -> Task:
    task = task_submit(tenant=lab, spec=TaskSpec(name="t", command=command, **fields))
    scheduler.schedule_pass()
    return task


def test_a_log_keeps_all_100000_lines_while_the_agent_and_its_cluster_are_killed(agents, lab):
    from tenants.models import Tenant

    (agent,) = agents({"workstation-1": 4})
    lab = Tenant.objects.get(pk=lab.pk)
    task = submit(lab, COUNT_TO_100K)
    wait_for(state_of(task, "running"))
    log = Path(TaskAttempt.objects.get(task=task).log_path)
    wait_for(lambda: log.exists() and log.stat().st_size > 1000)
    agent.kill()
    agent.start()
    agent.kill()
    agent.start()
    wait_for(state_of(task, "succeeded"), timeout=60)
    lines = log.read_text().splitlines()
    assert lines == [str(i) for i in range(100000)]
    assert TaskAttempt.objects.get(task=task).launched_by == "workstation-1"


def test_exit_codes_are_recorded_while_every_platform_process_is_down(agents, lab):
    (agent,) = agents({"workstation-1": 4})
    commands = {
        "zero": "sleep 2; exit 0",
        "three": "sleep 2; exit 3",
        "killed": "sleep 2; kill -9 $$",
    }
    tasks = {name: submit(lab, cmd) for name, cmd in commands.items()}
    for task in tasks.values():
        wait_for(state_of(task, "running"))
    agent.kill()  # nothing of the platform runs now but the detached supervisors
    expected = {"zero": ("succeeded", 0), "three": ("failed", 3), "killed": ("failed", 137)}
    for name, task in tasks.items():
        wait_for(state_of(task, "succeeded", "failed"))
        assert (task.state, task.exit_code) == expected[name]
    agent.start()  # reconciliation finds nothing to fix
    for name, task in tasks.items():
        task.refresh_from_db()
        assert (task.state, task.exit_code) == expected[name]


def test_two_agents_on_one_machine_behave_as_two_hosts(agents, lab):
    agents({"node-a": 2, "node-b": 2})
    tasks = [submit(lab, "sleep 1", node=node) for node in ("node-a", "node-b", "node-b")]
    for task in tasks:
        wait_for(state_of(task, "succeeded"))
    for task in tasks:
        attempt = TaskAttempt.objects.get(task=task)
        assert attempt.node.name == task.required_node
        assert attempt.launched_by == task.required_node  # launched by that node's agent


def test_a_node_holds_no_more_database_connections_than_documented(agents, lab):
    agents({"node-c": 2})
    tasks = [submit(lab, "sleep 0.5") for _ in range(4)]  # two at a time, reports relayed
    ours = connection.cursor().connection.info.backend_pid
    peak: Counter[str] = Counter()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
        t.state == "succeeded" for t in Task.objects.filter(pk__in=[t.pk for t in tasks])
    ):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> %s GROUP BY 1",
                [ours],
            )
            for name, count in cursor.fetchall():
                peak[name] = max(peak[name], count)
        scheduler.schedule_pass()  # the next two, once the first two have ended
        time.sleep(0.05)
    for task in tasks:
        wait_for(state_of(task, "succeeded"))
    node = {"gpuplatform node_agent", "gpuplatform supervisor"}
    assert set(peak) <= node, peak  # every session of the node's processes says whose it is
    assert "gpuplatform node_agent" in peak
    cap = connections.budget(web_workers=0, db_pool_size=0, nodes=1,
                             q_workers=settings.Q_CLUSTER["workers"])  # fmt: skip
    assert 0 < peak["gpuplatform node_agent"] <= cap.nodes, peak
    # A supervisor writes its own report only when the agent did not answer in time (a busy
    # machine): one connection each, for the two that run at once at most.
    assert peak["gpuplatform supervisor"] <= 2, peak


COUNT_TO_80 = (
    'python3 -c "import time\nfor i in range(80):\n    print(i, flush=True)\n    time.sleep(0.1)"'
)


def kill_root_tree(leader: subprocess.Popen) -> list[int]:
    """SIGKILL ``leader`` and every process of root's under it at once, as a fault injector
    does to what `make run` starts: everything the platform runs, but tasks (their tenants'
    users). Returns the pids killed."""
    try:
        tree = [psutil.Process(leader.pid), *psutil.Process(leader.pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    killed = []
    for proc in tree:
        try:
            if proc.uids().real == 0:
                proc.kill()
                killed.append(proc.pid)
        except psutil.Error:
            pass
    leader.wait()
    return killed


@pytest.mark.skipif(os.geteuid() != 0, reason="tasks run as their tenant's user only as root")
def test_running_tasks_are_adopted_after_every_root_process_under_the_agent_is_killed(agents, lab):
    (agent,) = agents({"workstation-1": 4})
    running = [submit(lab, COUNT_TO_80) for _ in range(4)]
    pending = [submit(lab, "echo later") for _ in range(3)]
    for task in running:
        wait_for(state_of(task, "running"), timeout=60)
    for task in pending:
        assert state_of(task, "pending")()
    assert kill_root_tree(agent.proc)  # the agent, its spawner, its cluster and its workers
    agent.start()
    for task in running:  # adopted: run once, from start to end, every line in its log
        wait_for(state_of(task, "succeeded", "failed", "pending"), timeout=90)  # pending: requeued
        attempts = list(TaskAttempt.objects.filter(task=task).values_list("number", "outcome"))
        assert (task.state, attempts) == ("succeeded", [(1, "succeeded")]), task.reason
        lines = Path(TaskAttempt.objects.get(task=task).log_path).read_text().splitlines()
        assert lines == [str(i) for i in range(80)]
    for task in pending:
        wait_for(state_of(task, "succeeded"), timeout=60)
