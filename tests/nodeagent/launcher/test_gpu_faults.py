"""GPU faults reported by the node agent's sampler, acting on real task processes: a broken
GPU's XID drains it and requeues its task as the infrastructure's failure, an application XID
fails only the task, and a GPU that falls off the bus is handled while its task still hangs."""

from __future__ import annotations

import pytest

from monitoring.models import Alert
from nodeagent.inventory import SimulatedBackend
from nodeagent.sampler import Sampler
from scheduling.config import SimulatedGpus
from scheduling.models import GPU
from telemetry import services
from telemetry.models import XidRecord
from tests.nodeagent.launcher.conftest import wait_for
from tests.nodeagent.launcher.test_launch import attempt_of, gone, running, start

SPEC = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 4}


@pytest.fixture
def sampler(node):
    backend = SimulatedBackend(node.name, SimulatedGpus.model_validate(SPEC))
    return Sampler(node_name=node.name, backend=backend)


def gpu_of(task) -> GPU:
    return GPU.objects.get(uuid=attempt_of(task).gpu_uuids[0])


def requeued(task):
    def check():
        attempt = attempt_of(task)
        task.refresh_from_db()
        return attempt.outcome == "lost" and task.infra_requeues == 1

    check.__doc__ = f"task {task.pk}'s first attempt to be lost and the task requeued"
    return check


def test_xid_79_drains_the_gpu_and_requeues_its_task_within_10_s(launcher, node, lab, sampler):
    task = start(lab, "sleep 300")
    attempt = running(task)
    gpu = gpu_of(task)

    services.fault_inject(gpu=gpu, kind="xid", value=79)
    sampler.tick()

    wait_for(requeued(task), timeout=10)
    gpu.refresh_from_db()
    assert gpu.state == "failed" and "XID 79 (GPU has fallen off the bus)" in gpu.state_reason
    assert task.retries == 0 and task.state in ("pending", "scheduled", "running")
    assert "became failed during the attempt" in task.events.get(from_state="lost").reason
    assert XidRecord.objects.get(gpu=gpu).action == "drain"
    assert Alert.objects.get(kind="gpu_xid", gpu=gpu, resolved_at=None).severity == "critical"
    wait_for(lambda: gone(attempt.pid))


def test_xid_13_fails_only_the_task_and_keeps_the_gpu(launcher, node, lab, sampler):
    task = start(lab, "sleep 300", retries=2)
    attempt = running(task)
    gpu = gpu_of(task)

    services.fault_inject(gpu=gpu, kind="xid", value=13)
    sampler.tick()

    wait_for(lambda: attempt_of(task).outcome, timeout=10)
    task.refresh_from_db()
    gpu.refresh_from_db()
    assert task.state == "failed"  # not retried: it would fault again
    assert "XID 13 (graphics engine exception)" in task.reason
    assert task.infra_requeues == 0
    assert gpu.state == "available"
    assert XidRecord.objects.get(gpu=gpu).action == "fail_task"
    wait_for(lambda: gone(attempt.pid))


def test_a_gpu_lost_under_a_hanging_task_is_handled_at_the_next_sample(
    launcher, node, lab, sampler
):
    task = start(lab, "sleep 300")
    running(task)
    gpu = gpu_of(task)

    services.fault_inject(gpu=gpu, kind="lost")
    sampler.tick()

    wait_for(requeued(task), timeout=10)
    gpu.refresh_from_db()
    assert gpu.state == "failed" and "lost" in gpu.state_reason
    assert Alert.objects.filter(kind="gpu_failed", gpu=gpu, resolved_at=None).exists()
    sampler.tick()  # still lost: nothing is done twice
    task.refresh_from_db()
    assert task.infra_requeues == 1
