"""The harness itself: four hosts, each reaching PostgreSQL on the bridge with a password, and
a cut link that really cuts."""

import json
import subprocess
import sys
import urllib.request

from tests.hosts.harness import GPU_HOSTS, GPUS_PER_HOST, wait_until


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
