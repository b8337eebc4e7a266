"""A partition never runs a task twice: the node's lease (``heartbeat.fence_after``), measured
as a partition test would, with real node agents, supervisors and tasks.

Node a reaches PostgreSQL through a TCP proxy that the test cuts for longer than
``heartbeat.lost_after``; node b reaches it directly. The scheduler (this process) requeues the
task of the silent node onto b; the link comes back. Each attempt appends a timestamp to a file
of its own every 0.1 s: at no moment may two of them tick.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.db import connection
from django_q.tasks import async_task

from gpuplatform.dburl import current_database_url, database_host
from scheduling import controls, scheduler
from scheduling import tasks as backstops
from scheduling.models import Node, Task, TaskAttempt, TaskEvent
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.factories import TenantFactory
from tests.live import PYTHON, ROOT, process_env
from tests.nodeagent.launcher.conftest import state_of, stop_supervisors, wait_for
from tests.tcpproxy import TcpProxy

pytestmark = pytest.mark.slow

FENCE_AFTER_S = 3
LOST_AFTER_S = 11  # > fence_after + TASK_STOP_GRACE (2 s, the launcher fixture's) + 5 s
CONFIG = f"""
heartbeat: {{interval: 1s, offline_after: 3s, fence_after: {FENCE_AFTER_S}s,
            lost_after: {LOST_AFTER_S}s}}
nodes:
  - name: node-a
    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: 1}}
  - name: node-b
    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: 1}}
"""
TICK = "while :; do date +%s.%N >> ticks-$GPUPLATFORM_ATTEMPT; sleep 0.1; done"


class Agent:
    """A node agent process (with its launcher cluster) in its own process group."""

    def __init__(self, config: Path, name: str, log: Path, **environ: str) -> None:
        self.config, self.name, self.log, self.environ = config, name, log, environ
        self.proc: subprocess.Popen | None = None

    def start(self) -> Agent:
        with open(self.log, "ab") as sink:
            self.proc = subprocess.Popen(
                [PYTHON, "manage.py", "node_agent", "--backend", "simulated", "--config",
                 str(self.config), "--node", self.name],
                cwd=ROOT,
                env=process_env(**self.environ),
                start_new_session=True,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(lambda: Node.objects.filter(name=self.name, gpus__isnull=False).exists())
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def estate(launcher, monkeypatch, settings, tmp_path):
    """Launches go through each node's own cluster, as in production; the configuration is
    the one above, for the agents and for this process (the scheduler)."""
    if database_host(connection.settings_dict).startswith("/"):
        pytest.skip("the test database is on a Unix socket: no TCP link to cut")
    monkeypatch.setattr(controls, "async_task", functools.partial(async_task, sync=False))
    monkeypatch.setenv("Q_SYNC", "0")
    # Outside pytest's directories, which other pytest runs on this machine may close to other
    # users (a tenant's task must reach its work directory) while this long test runs.
    tasks_root = Path(tempfile.mkdtemp(prefix="gpup-partition-"))
    tasks_root.chmod(0o711)
    monkeypatch.setenv("GPUPLATFORM_TASKS_ROOT", str(tasks_root))
    settings.TASKS_ROOT = tasks_root
    config = tmp_path / "estate.yaml"
    config.write_text(CONFIG)
    monkeypatch.setenv("GPUPLATFORM_CONFIG", str(config))
    settings.GPUPLATFORM_CONFIG = str(config)
    db = connection.settings_dict
    proxy = TcpProxy((database_host(db), int(db["PORT"])))
    agents: list[Agent] = []
    yield config, proxy, agents, tasks_root
    proxy.reconnect()
    for agent in agents:
        agent.stop()
        print(f"--- {agent.log.name}:\n{agent.log.read_text(errors='replace')[-6000:]}")
    proxy.close()
    stop_supervisors()  # their tasks write under tasks_root
    shutil.rmtree(tasks_root, ignore_errors=True)
    for event in TaskEvent.objects.order_by("id"):
        print(f"task {event.task_id} #{event.attempt}: {event.to_state}: {event.reason}")
    for log in (tmp_path / "logs").rglob("supervisor-*.log"):
        print(f"--- {log}:\n{log.read_text(errors='replace')[-3000:]}")


def ticks(root: Path) -> list[list[float]]:
    """Each attempt's timestamps, the attempts in the order they started."""
    found = [
        [float(line) for line in path.read_text().split()]
        for path in root.rglob("ticks-*")
        if path.stat().st_size
    ]
    return sorted(found, key=lambda stamps: stamps[0])


def test_a_partitioned_node_stops_its_task_before_it_is_requeued(estate, tmp_path):
    config, proxy, agents, root = estate
    url = current_database_url().replace(
        f"@{database_host(connection.settings_dict)}:{connection.settings_dict['PORT']}/",
        f"@127.0.0.1:{proxy.port}/",
    )
    assert str(proxy.port) in url
    agents.append(Agent(config, "node-a", tmp_path / "node-a.log", DATABASE_URL=url).start())
    lab = TenantFactory(name="vision-lab")
    task = task_submit(tenant=lab, spec=TaskSpec(name="ticker", command=TICK))
    scheduler.schedule_pass()
    wait_for(state_of(task, "running"), timeout=30)
    wait_for(lambda: len(ticks(root)) == 1 and len(ticks(root)[0]) > 5, timeout=30)
    agents.append(Agent(config, "node-b", tmp_path / "node-b.log").start())

    proxy.disconnect()
    cut_at = time.time()
    # The scheduler's backstop, run often: node a is marked silent, its task lost and requeued
    # onto node b once a has been silent for lost_after.
    deadline = time.monotonic() + LOST_AFTER_S + 40
    while not (len(ticks(root)) == 2 and len(ticks(root)[1]) > 20):
        assert time.monotonic() < deadline, "the task was not requeued onto node b"
        backstops.mark_silent_nodes()
        scheduler.schedule_pass()
        time.sleep(0.5)
    task.refresh_from_db()
    assert task.attempt == 2
    assert TaskAttempt.objects.get(task=task, number=2).node.name == "node-b"

    proxy.reconnect()
    back_at = time.time()
    # Attempt 1 stopped (at the latest when its supervisor hears it was requeued).
    wait_for(lambda: ticks(root)[0][-1] < time.time() - 2, timeout=30, every=0.5)
    one, two = ticks(root)
    assert one[-1] < two[0], (
        f"two copies ran at once: attempt 1 ticked until {one[-1]:.2f}, attempt 2 from "
        f"{two[0]:.2f} (link cut at {cut_at:.2f}, back at {back_at:.2f})"
    )
    assert one[-1] < cut_at + LOST_AFTER_S
    print(f"link cut -> attempt 1's last tick {one[-1] - cut_at:.2f} s, attempt 2's first tick "
          f"{two[0] - cut_at:.2f} s")  # fmt: skip
    first = TaskAttempt.objects.get(task=task, number=1)

    def reported():
        """attempt 1's supervisor to report why it stopped"""
        first.refresh_from_db()
        return first.end_reason

    wait_for(reported, timeout=60)
    time.sleep(2)  # a copy revived by the link's return would tick meanwhile
    assert ticks(root)[0] == one
    assert ticks(root)[1][-1] > back_at + 1  # attempt 2 goes on
    assert first.outcome == "lost"
    assert first.end_reason["code"] == "node_fenced"
    assert first.end_reason["params"]["node"] == "node-a"
    assert first.end_reason["params"]["seconds"] >= FENCE_AFTER_S
    task.refresh_from_db()
    assert (task.state, task.attempt) == ("running", 2)
    assert "node node-a: no heartbeat written for" in (tmp_path / "node-a.log").read_text()
    assert not Task.objects.exclude(pk=task.pk).exists()
