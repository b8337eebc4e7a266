"""Telemetry fixtures: the simulated backend of the workstation fixture's node, and a running
task holding one of its GPUs."""

from __future__ import annotations

import pytest

from nodeagent.inventory import SimulatedBackend
from scheduling.config import SimulatedGpus
from scheduling.states import TaskState
from tests.factories import AllocationFactory, TaskFactory

SPEC = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 4}


@pytest.fixture
def backend() -> SimulatedBackend:
    return SimulatedBackend("workstation-1", SimulatedGpus.model_validate(SPEC))


@pytest.fixture
def running(workstation, lab):
    """A task of the vision lab running on GPU 0 of the workstation, reserving 20 GiB."""
    task = TaskFactory(tenant=lab, state=TaskState.RUNNING, node=workstation, attempt=1)
    gpu = workstation.gpus.get(index=0)
    AllocationFactory(task=task, gpu=gpu, memory_mb=20480, exclusive=True)
    return task
