"""The harness itself: four hosts, each reaching PostgreSQL on the bridge with a password and
seeing only its own directory, a cut link that really cuts, and nothing left behind."""

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.hosts import netns
from tests.hosts.harness import GPU_HOSTS, GPUS_PER_HOST, OWNER, remove_abandoned_runs, wait_until


def test_four_hosts_reach_the_database_over_the_bridge_and_gpu_hosts_register(estate):
    control = estate.hosts["control"]
    control.start("web")
    for name in GPU_HOSTS:
        estate.hosts[name].start("agent")
    estate.wait_for_web()

    def registered():
        return estate.sql(
            "SELECT n.name, count(g.id) FROM scheduling_node n JOIN scheduling_gpu g"
            " ON g.node_id = n.id GROUP BY n.name ORDER BY n.name"
        ) == [(name, GPUS_PER_HOST) for name in GPU_HOSTS]

    wait_until(registered, 60, "both GPU hosts registering their GPUs")
    # Each agent connected from its own host's address, with the password.
    clients = {row[0] for row in estate.sql(
        "SELECT host(client_addr) FROM pg_stat_activity WHERE datname = 'gpuplatform'"
    )}  # fmt: skip
    assert {estate.hosts[name].address for name in GPU_HOSTS} <= clients
    request = urllib.request.Request(
        f"{estate.web}/api/v1/me/", headers={"Authorization": f"Bearer {estate.token}"}
    )
    assert json.loads(urllib.request.urlopen(request, timeout=10).read())["tenant"] == "demo"


def test_each_host_sees_its_own_directory_and_no_other_hosts(estate):
    hosts_dir = estate.root / "hosts"
    for name, host in estate.hosts.items():
        on_host = [*estate.exec_prefix(name), "sh", "-c", 'ls "$1"; echo x > "$2"/written',
                   "sh", str(hosts_dir), str(host.var_dir)]  # fmt: skip
        listing = subprocess.run(on_host, capture_output=True, text=True, check=True).stdout
        assert listing.split() == [name]
        assert (host.var_dir / "written").read_text() == "x\n"  # the test process sees it


def test_a_cut_link_stops_a_hosts_traffic_and_mending_it_restores_it(estate):
    gpu = estate.hosts["gpu-1"]
    probe = [*estate.network.exec_prefix("gpu-1"), sys.executable, "-c",
             "import socket, sys; socket.create_connection((sys.argv[1], 5432), 1)",
             estate.network.gateway]  # fmt: skip

    def connects() -> bool:
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0  # noqa: S603

    wait_until(connects, 10, "gpu-1 reaching the database's address")
    gpu.cut()
    assert not connects()
    gpu.mend()
    # The neighbour entry the cut left failed is retried within moments.
    wait_until(connects, 10, "gpu-1 reaching the database's address again")


def test_it_says_why_it_is_skipped_when_not_root(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert "needs root" in netns.unavailable()


def test_what_a_killed_run_left_behind_is_removed_by_the_next(tmp_path):
    if netns.unavailable():
        pytest.skip(netns.unavailable())
    root = Path(tempfile.mkdtemp(prefix="gpup-hosts-"))
    network = netns.Network()
    network.create()
    network.add_host("lost")
    dead = subprocess.Popen(["true"])  # noqa: S607 - a pid that no longer runs
    dead.wait()
    (root / OWNER).write_text(f"{network.run} {dead.pid}\n")
    sleeper = subprocess.Popen([*network.exec_prefix("lost"), "sleep", "300"])
    try:
        wait_until(lambda: sleeper.pid in network.pids("lost"), 10, "the sleeper in its host")
        assert network.run in remove_abandoned_runs()
        assert sleeper.wait(timeout=10) == -9
        assert network.namespaces["lost"] not in netns.ip("netns", "list").stdout
        assert netns.ip("link", "show", network.bridge, check=False).returncode != 0
        assert not root.exists()
    finally:
        network.remove()
        shutil.rmtree(root, ignore_errors=True)
