"""Registering nodes and their GPUs, heartbeats, and nodes that fall silent."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from nodeagent.inventory import GpuInfo, SimulatedBackend
from scheduling import services, tasks
from scheduling.config import SimulatedGpus
from scheduling.models import GPU, GpuState, Node, NodeState, Pool

pytestmark = pytest.mark.django_db

NODE = "workstation-1"
SPEC = SimulatedGpus.model_validate(
    {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 4}
)


def discovered(*, hidden: tuple[int, ...] = ()) -> list[GpuInfo]:
    return SimulatedBackend(NODE, SPEC, hidden=hidden).discover()


def register(gpus: list[GpuInfo] | None = None, *, pool_name: str = "default") -> Node:
    return services.node_register(
        name=NODE,
        pool_name=pool_name,
        hostname="ws1",
        backend="simulated",
        gpus=discovered() if gpus is None else gpus,
    )


def gpu_at(index: int) -> GPU:
    return GPU.objects.exclude(state=GpuState.OFFLINE).get(node__name=NODE, index=index)


def states() -> dict[int, tuple[str, str]]:
    """{index: (state, reason)} of the node's GPUs that still hold an index."""
    return {
        gpu.index: (gpu.state, gpu.state_reason)
        for gpu in GPU.objects.filter(node__name=NODE).exclude(state=GpuState.OFFLINE)
    }


def silence(node: Node, seconds: int) -> None:
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat=timezone.now() - timedelta(seconds=seconds)
    )


# --- Registration ------------------------------------------------------------------------------


def test_it_registers_a_node_and_its_gpus():
    node = register()

    assert node.name == NODE
    assert (node.hostname, node.backend, node.state) == ("ws1", "simulated", NodeState.AVAILABLE)
    assert node.last_heartbeat is not None
    gpus = list(node.gpus.order_by("index"))
    assert [gpu.index for gpu in gpus] == [0, 1, 2, 3]
    assert [gpu.uuid for gpu in gpus] == [info.uuid for info in discovered()]
    assert {gpu.state for gpu in gpus} == {GpuState.AVAILABLE}
    assert {(gpu.gpu_type, gpu.memory_mb) for gpu in gpus} == {("rtx4090-24g", 24576)}


def test_registering_again_changes_nothing():
    register()
    before = {gpu.uuid: (gpu.pk, gpu.first_seen_at) for gpu in GPU.objects.all()}

    register()

    assert Node.objects.count() == 1
    assert GPU.objects.count() == 4
    after = {gpu.uuid: (gpu.pk, gpu.first_seen_at) for gpu in GPU.objects.all()}
    assert after == before


def test_a_gpu_missing_from_discovery_goes_offline_and_comes_back():
    register()
    vanished = gpu_at(2)

    register(discovered(hidden=(2,)))

    vanished.refresh_from_db()
    assert (vanished.state, vanished.state_reason) == (GpuState.OFFLINE, services.VANISHED)
    assert set(states()) == {0, 1, 3}

    register()

    vanished.refresh_from_db()
    assert (vanished.state, vanished.state_reason) == (GpuState.AVAILABLE, "")
    assert GPU.objects.count() == 4


def test_a_gpu_an_operator_drained_stays_drained_after_registration():
    register()
    services.gpus_drain(gpus=[gpu_at(1)])
    reason = gpu_at(1).state_reason

    register()

    assert states()[1] == (GpuState.DRAINING, reason)
    assert reason.startswith("drained")


def test_a_failed_gpu_stays_failed_after_registration():
    register()
    GPU.objects.filter(pk=gpu_at(0).pk).update(state=GpuState.FAILED, state_reason="Xid 79")

    register()

    assert states()[0] == (GpuState.FAILED, "Xid 79")


def test_two_gpus_that_swap_indices_register_without_error():
    register()
    services.gpus_drain(gpus=[gpu_at(0)])
    first, second, *rest = discovered()

    register([replace(first, index=1), replace(second, index=0), *rest])

    assert gpu_at(0).uuid == second.uuid
    assert gpu_at(1).uuid == first.uuid
    # The drained GPU keeps its state through the move.
    assert gpu_at(1).state == GpuState.DRAINING
    assert gpu_at(0).state == GpuState.AVAILABLE
    assert GPU.objects.count() == 4


def test_a_new_gpu_takes_the_index_of_a_vanished_one():
    register()
    old = gpu_at(3)
    replacement = replace(discovered()[3], uuid="GPU-replacement-card")

    register([*discovered(hidden=(3,)), replacement])

    old.refresh_from_db()
    assert (old.state, old.state_reason, old.index) == (GpuState.OFFLINE, services.VANISHED, 3)
    assert gpu_at(3).uuid == "GPU-replacement-card"
    assert gpu_at(3).state == GpuState.AVAILABLE
    assert GPU.objects.count() == 5


def test_it_creates_the_pool_it_is_told_to_join():
    node = register(pool_name="training")

    assert node.pool.name == "training"
    assert Pool.objects.filter(name="training").exists()

    moved = register(pool_name="inference")
    assert moved.pool.name == "inference"
    assert Node.objects.get(name=NODE).pool.name == "inference"


# --- Silent nodes and heartbeats --------------------------------------------------------------


def test_a_node_goes_offline_only_after_offline_after_without_heartbeat():
    node = register()
    silence(node, 25)

    assert services.nodes_mark_silent(offline_after=timedelta(seconds=30)) == []
    assert Node.objects.get(pk=node.pk).state == NodeState.AVAILABLE

    silence(node, 35)

    assert services.nodes_mark_silent(offline_after=timedelta(seconds=30)) == [NODE]
    node.refresh_from_db()
    assert (node.state, node.state_reason) == (NodeState.OFFLINE, services.NODE_SILENT)
    assert {(g.state, g.state_reason) for g in node.gpus.all()} == {
        (GpuState.OFFLINE, services.NODE_SILENT)
    }
    # Already offline: not marked again.
    assert services.nodes_mark_silent(offline_after=timedelta(seconds=30)) == []


def test_a_silent_node_leaves_drained_and_failed_gpus_as_the_operator_left_them():
    node = register()
    services.gpus_drain(gpus=[gpu_at(1)])
    drained_reason = gpu_at(1).state_reason
    GPU.objects.filter(pk=gpu_at(2).pk).update(state=GpuState.FAILED, state_reason="Xid 79")
    silence(node, 60)

    services.nodes_mark_silent(offline_after=timedelta(seconds=30))

    by_index = {g.index: (g.state, g.state_reason) for g in node.gpus.all()}
    assert by_index == {
        0: (GpuState.OFFLINE, services.NODE_SILENT),
        1: (GpuState.DRAINING, drained_reason),
        2: (GpuState.FAILED, "Xid 79"),
        3: (GpuState.OFFLINE, services.NODE_SILENT),
    }

    assert services.node_heartbeat(name=NODE)

    by_index = {g.index: (g.state, g.state_reason) for g in node.gpus.all()}
    assert by_index == {
        0: (GpuState.AVAILABLE, ""),
        1: (GpuState.DRAINING, drained_reason),
        2: (GpuState.FAILED, "Xid 79"),
        3: (GpuState.AVAILABLE, ""),
    }


def test_a_heartbeat_brings_a_silent_node_and_its_gpus_back():
    node = register()
    silence(node, 60)
    services.nodes_mark_silent(offline_after=timedelta(seconds=30))
    silent_since = Node.objects.get(pk=node.pk).last_heartbeat

    assert services.node_heartbeat(name=NODE) is True

    node.refresh_from_db()
    assert (node.state, node.state_reason) == (NodeState.AVAILABLE, "")
    assert node.last_heartbeat > silent_since
    assert {(g.state, g.state_reason) for g in node.gpus.all()} == {(GpuState.AVAILABLE, "")}


def test_registering_brings_a_silent_node_back_too():
    node = register()
    silence(node, 60)
    services.nodes_mark_silent(offline_after=timedelta(seconds=30))

    register()

    node.refresh_from_db()
    assert (node.state, node.state_reason) == (NodeState.AVAILABLE, "")
    assert {g.state for g in node.gpus.all()} == {GpuState.AVAILABLE}


def test_a_heartbeat_leaves_a_node_an_operator_drained_alone():
    node = register()
    services.nodes_drain(nodes=[node])

    assert services.node_heartbeat(name=NODE)

    assert Node.objects.get(pk=node.pk).state == NodeState.DRAINING


def test_a_heartbeat_from_an_unknown_node_says_so():
    assert services.node_heartbeat(name="nobody") is False
    assert not Node.objects.exists()


def test_the_backstop_task_uses_the_configured_offline_after(settings, tmp_path):
    config = tmp_path / "estate.yaml"
    config.write_text(
        "heartbeat: {interval: 1m, offline_after: 10m, fence_after: 2m, lost_after: 3m}\n"
        "nodes:\n  - name: workstation-1\n"
    )
    settings.GPUPLATFORM_CONFIG = config
    node = register()

    # Silent for 5 minutes: long past the default 30 s, but within the configured 10 minutes.
    silence(node, 5 * 60)
    assert tasks.mark_silent_nodes()["silent_nodes"] == []
    assert Node.objects.get(pk=node.pk).state == NodeState.AVAILABLE

    silence(node, 11 * 60)
    assert tasks.mark_silent_nodes()["silent_nodes"] == [NODE]
    assert Node.objects.get(pk=node.pk).state == NodeState.OFFLINE


@pytest.mark.parametrize("comeback", ["heartbeat", "register"])
def test_a_drained_node_that_falls_silent_is_still_drained_when_it_returns(comeback):
    node = register()
    services.nodes_drain(nodes=[node])
    silence(node, 60)
    services.nodes_mark_silent(offline_after=timedelta(seconds=30))
    assert Node.objects.get(pk=node.pk).state == NodeState.OFFLINE

    if comeback == "heartbeat":
        services.node_heartbeat(name=NODE)
    else:
        register()

    node.refresh_from_db()
    assert node.state == NodeState.DRAINING
    assert node.resume_state == ""


@pytest.mark.parametrize("state", [GpuState.DRAINING, GpuState.FAILED])
def test_a_drained_or_failed_gpu_that_vanishes_keeps_its_state_when_it_returns(state):
    register()
    GPU.objects.filter(node__name=NODE, index=2).update(state=state, state_reason="operator")

    register(discovered(hidden=(2,)))
    vanished = GPU.objects.get(node__name=NODE, index=2)
    assert (vanished.state, vanished.state_reason) == (GpuState.OFFLINE, services.VANISHED)

    register()
    assert gpu_at(2).state == state
