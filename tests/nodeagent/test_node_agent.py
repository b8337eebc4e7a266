"""The node agent: registration, heartbeats, noticing change, the command, and the real loop."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from nodeagent.agent import AgentError, NodeAgent, resolve_node_name
from nodeagent.inventory import SimulatedBackend
from scheduling import services
from scheduling.config import EstateConfig, SimulatedGpus, parse_config
from scheduling.models import GPU, GpuState, Node, NodeState
from telemetry.models import GpuSample

NODE = "workstation-1"
SIMULATE = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 4}
YAML = f"""\
heartbeat:
  interval: {{interval}}
  offline_after: 30s
pools:
  - name: training
    description: Where the big runs go.
nodes:
  - name: {NODE}
    pool: training
    simulate: {{{{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: 4}}}}
"""


def estate(*node_names: str) -> EstateConfig:
    nodes = [{"name": name, "simulate": SIMULATE} for name in node_names or (NODE,)]
    return parse_config({"nodes": nodes}, "test.yaml")


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend(NODE, SimulatedGpus.model_validate(SIMULATE))


@pytest.fixture
def agent(backend) -> NodeAgent:
    return NodeAgent(config=estate(), node_name=NODE, backend=backend)


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "scheduler.yaml"
    path.write_text(YAML.format(interval="5s"))
    return path


def last_seen() -> dict[str, object]:
    return dict(GPU.objects.values_list("uuid", "last_seen_at"))


# --- One step at a time ------------------------------------------------------------------------


def test_register_records_the_node_and_its_gpus(db, agent):
    gpus = agent.register()

    node = Node.objects.get(name=NODE)
    assert (node.backend, node.state, node.pool.name) == (
        "simulated",
        NodeState.AVAILABLE,
        "default",
    )
    assert sorted(node.gpus.values_list("uuid", flat=True)) == sorted(g.uuid for g in gpus)
    assert len(gpus) == 4


def test_the_first_tick_registers(db, agent):
    agent.tick()
    assert Node.objects.get(name=NODE).gpus.count() == 4


def test_a_tick_with_nothing_changed_only_heartbeats(db, agent):
    agent.register()
    long_ago = timezone.now() - timedelta(minutes=1)
    Node.objects.filter(name=NODE).update(last_heartbeat=long_ago)
    seen = last_seen()

    agent.tick()

    assert Node.objects.get(name=NODE).last_heartbeat > long_ago
    assert last_seen() == seen


def test_a_tick_registers_again_when_a_gpu_vanishes_and_returns(db, agent, backend):
    agent.register()
    backend.hidden.add(2)

    agent.tick()

    gone = GPU.objects.get(node__name=NODE, index=2)
    assert (gone.state, gone.state_reason) == (GpuState.OFFLINE, services.VANISHED)

    backend.hidden.clear()
    agent.tick()

    assert GPU.objects.get(pk=gone.pk).state == GpuState.AVAILABLE


def test_a_tick_registers_again_when_the_node_row_is_gone(db, agent):
    agent.register()
    Node.objects.filter(name=NODE).delete()

    agent.tick()

    assert Node.objects.get(name=NODE).gpus.count() == 4


def test_a_tick_brings_a_node_marked_silent_back(db, agent):
    agent.register()
    Node.objects.filter(name=NODE).update(last_heartbeat=timezone.now() - timedelta(hours=1))
    services.nodes_mark_silent(offline_after=timedelta(seconds=30))

    agent.tick()

    assert Node.objects.get(name=NODE).state == NodeState.AVAILABLE
    assert set(GPU.objects.values_list("state", flat=True)) == {GpuState.AVAILABLE}


# --- Which node am I ---------------------------------------------------------------------------


def test_it_speaks_for_the_node_it_is_told(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "elsewhere")
    assert resolve_node_name(estate("gpu-a", "gpu-b"), "gpu-b") == "gpu-b"


def test_it_speaks_for_the_only_configured_node(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "elsewhere")
    assert resolve_node_name(estate("gpu-a"), None) == "gpu-a"


def test_it_speaks_for_this_host_when_it_is_configured(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "GPU-B.lab.example.org")
    assert resolve_node_name(estate("gpu-a", "gpu-b"), None) == "gpu-b"


def test_it_names_the_configured_nodes_when_this_host_is_not_one(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "laptop.example.org")
    with pytest.raises(AgentError, match=r"laptop.*\(gpu-a, gpu-b\).*--node"):
        resolve_node_name(estate("gpu-a", "gpu-b"), None)


# --- The command -------------------------------------------------------------------------------


def run_once(config_file: Path) -> str:
    out = io.StringIO()
    call_command(
        "node_agent",
        "--once",
        "--backend",
        "simulated",
        "--config",
        str(config_file),
        "--node",
        NODE,
        stdout=out,
    )
    return out.getvalue()


def test_the_command_registers_once_and_prints_the_gpus(db, config_file):
    output = run_once(config_file)

    assert f"node {NODE}: registered 4 GPU(s) via simulated" in output
    for gpu in GPU.objects.all():
        assert f"gpu{gpu.index} {gpu.uuid} NVIDIA GeForce RTX 4090 24576 MiB" in output
    node = Node.objects.get(name=NODE)
    assert (node.pool.name, node.pool.description) == ("training", "Where the big runs go.")


def test_running_the_command_twice_keeps_four_gpus(db, config_file):
    run_once(config_file)
    run_once(config_file)
    assert GPU.objects.count() == 4
    assert Node.objects.count() == 1


def test_a_bad_configuration_stops_the_command_naming_the_file_and_key(db, tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text(f"nodes:\n  - name: {NODE}\n    simulate: {{model: X, memory: 1Gi, count: 0}}\n")

    with pytest.raises(CommandError) as raised:
        run_once(bad)

    assert f"{bad}: nodes[0].simulate.count: must be at least 1" in str(raised.value)
    assert not Node.objects.exists()


# --- Where the control plane reaches it ---------------------------------------------------------


def test_it_records_where_it_serves_its_logs_and_registering_once_keeps_it(db, agent, config_file):
    server = agent._peer()
    try:
        assert agent.advertise_address == server.address
        assert server.address.startswith("127.0.0.1:")
        agent.register()
        assert Node.objects.get(name=NODE).advertise_address == server.address
        run_once(config_file)  # an agent that serves nothing says nothing of where
        assert Node.objects.get(name=NODE).advertise_address == server.address
    finally:
        server.stop()


def test_an_agent_that_cannot_listen_where_told_refuses_to_run(db, agent, settings):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings.NODE_ADVERTISE_ADDRESS = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(AgentError, match="NODE_ADVERTISE_ADDRESS: cannot serve logs on"):
            agent._peer()


def test_a_bad_advertised_address_stops_the_command_naming_it(db, config_file, settings):
    settings.NODE_ADVERTISE_ADDRESS = "http://gpu-b/"
    with pytest.raises(CommandError, match="NODE_ADVERTISE_ADDRESS: 'http://gpu-b/'"):
        run_once(config_file)


# --- The real loop -----------------------------------------------------------------------------


def url_of_the_test_database() -> str:
    db = connection.settings_dict
    user = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    host = db["HOST"] or db.get("OPTIONS", {}).get("host") or "127.0.0.1"
    if host.startswith("/"):  # a Unix socket's directory: the embedded PostgreSQL
        port = f"&port={db['PORT']}" if db["PORT"] else ""
        return f"postgres://{user}@/{db['NAME']}?host={host}{port}"
    return f"postgres://{user}@{host}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_agent_heartbeats_until_sigterm_then_exits_cleanly(tmp_path):
    config_file = tmp_path / "scheduler.yaml"
    config_file.write_text(YAML.format(interval="1s"))
    env = {
        **os.environ,
        "DATABASE_URL": url_of_the_test_database(),
        "GPUPLATFORM_TESTING": "1",
        "GPUPLATFORM_CONFIG": str(config_file),
    }
    command = [sys.executable, "manage.py", "node_agent", "--backend", "simulated", "--no-launcher"]
    command += ["--config", str(config_file), "--node", NODE]
    agent = subprocess.Popen(
        command,
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        heartbeats = []
        deadline = time.monotonic() + 20
        while len(heartbeats) < 3 and time.monotonic() < deadline and agent.poll() is None:
            beat = Node.objects.filter(name=NODE).values_list("last_heartbeat", flat=True).first()
            if beat is not None and (not heartbeats or beat > heartbeats[-1]):
                heartbeats.append(beat)
            time.sleep(0.1)
        assert agent.poll() is None, agent.communicate()[0]
        assert len(heartbeats) == 3, f"heartbeats seen: {heartbeats}"
        assert GPU.objects.filter(node__name=NODE, state=GpuState.AVAILABLE).count() == 4
        # Its sampler thread writes every GPU each second, beside the heartbeat.
        samples = GpuSample.objects.filter(gpu__node__name=NODE)
        while samples.count() < 8 and time.monotonic() < deadline + 10:
            time.sleep(0.1)
        assert samples.values("gpu").distinct().count() == 4
        assert not samples.filter(simulated=False).exists()

        agent.send_signal(signal.SIGTERM)
        output, _ = agent.communicate(timeout=10)
        assert agent.returncode == 0, output
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_the_agent_warns_when_postgresql_accepts_fewer_connections_than_the_estate_may_hold(
    db, agent, caplog
):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int"
            " - current_setting('superuser_reserved_connections')::int"
        )
        (allows,) = cursor.fetchone()
    agent.tick()  # the first: registers, and checks
    assert agent.check_connections() is None  # one node fits any server that runs the tests
    # As many nodes again as the server's connections: each holds more than one.
    pool = Node.objects.get(name=NODE).pool
    Node.objects.bulk_create(Node(name=f"other-{i}", pool=pool) for i in range(allows))
    with caplog.at_level("WARNING", logger="nodeagent.agent"):
        problem = agent.check_connections()
    assert problem is not None
    assert f"PostgreSQL accepts {allows} connections" in problem
    assert f"and {allows + 1} node(s) with the web processes" in problem
    assert "raise max_connections" in caplog.text


def test_the_connection_cap_follows_the_processes_settings():
    from gpuplatform.connections import budget, shortfall

    def cap(nodes: int, pool: int = 8, workers: int = 2):
        return budget(web_workers=2, db_pool_size=pool, q_workers=workers, nodes=nodes)

    assert shortfall(cap(13), 97) is None  # 2 x (8 + 5) + 4 + 5 x 13 = 95
    assert "may hold 100 (web 26, scheduler 4, nodes 70" in shortfall(cap(14), 97)
    # One scheduler worker and smaller web pools fit fourteen: 2 x (4 + 5) + 3 + 5 x 14 = 91.
    assert shortfall(cap(14, pool=4, workers=1), 97) is None
