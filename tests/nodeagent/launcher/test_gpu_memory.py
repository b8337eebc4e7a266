"""The node agent watches GPU memory: foreign use is never offered, overuse is flagged or
stopped. GPUs are simulated; the task is a real process found through its supervisor."""

from __future__ import annotations

import pytest

from monitoring.models import Alert
from nodeagent.agent import NodeAgent
from nodeagent.inventory import SimulatedBackend
from scheduling import scheduler
from scheduling.agentapi.messages import GpuProcess
from scheduling.config import SimulatedGpus, parse_config
from scheduling.models import GPU, Task, TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.nodeagent.launcher.conftest import state_of, wait_for

SPEC = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 4}


@pytest.fixture
def agent_for(tmp_path, settings):
    def make(policy: str = "alert", processes: list | None = None) -> NodeAgent:
        config_file = tmp_path / "estate.yaml"
        config_file.write_text(
            f"scheduling: {{gpu_memory_overuse: {policy}}}\n"
            "nodes:\n  - name: workstation-1\n    simulate: {model: NVIDIA GeForce RTX 4090, "
            "memory: 24Gi, count: 4}\n"
        )
        settings.GPUPLATFORM_CONFIG = config_file
        config = parse_config({"nodes": [{"name": "workstation-1", "simulate": SPEC}]}, "t")
        backend = SimulatedBackend(
            "workstation-1", SimulatedGpus.model_validate(SPEC), fake_processes=processes
        )
        return NodeAgent(config=config, node_name="workstation-1", backend=backend)

    return make


def test_memory_of_processes_the_platform_did_not_start_is_not_offered(
    launcher, node, lab, agent_for
):
    gpu = node.gpus.get(index=0)
    stray = [GpuProcess(gpu_uuid=gpu.uuid, pid=999_999, used_mb=20_000)]
    agent = agent_for(processes=stray)
    agent.tick()
    gpu.refresh_from_db()
    assert gpu.foreign_memory_mb == 20_000
    # A task wanting 8 GiB on each of 4 GPUs no longer fits: GPU 0 has only 4 GiB to give.
    task = task_submit(tenant=lab, spec=TaskSpec(name="t", command="true", gpus_min=4,
                                                 gpus_max=4, gpu_memory_mb=8192))  # fmt: skip
    scheduler.schedule_pass()
    task.refresh_from_db()
    assert task.state == "pending"
    stray.clear()  # the stray notebook exits
    agent.tick()
    gpu.refresh_from_db()
    assert gpu.foreign_memory_mb == 0
    scheduler.schedule_pass()
    wait_for(state_of(task, "scheduled", "running", "succeeded"))


@pytest.mark.parametrize("policy", ["alert", "kill"])
def test_a_task_using_more_than_it_reserved_is_flagged_or_stopped(
    launcher, node, lab, agent_for, policy
):
    task = task_submit(tenant=lab, spec=TaskSpec(name="t", command="sleep 300",
                                                 gpu_memory_mb=4096))  # fmt: skip
    scheduler.schedule_pass()
    wait_for(state_of(task, "running"))
    attempt = TaskAttempt.objects.get(task=task)
    gpu = GPU.objects.get(uuid=attempt.gpu_uuids[0])
    agent = agent_for(policy, [GpuProcess(gpu_uuid=gpu.uuid, pid=attempt.pid, used_mb=6000)])
    agent.tick()
    alert = Alert.objects.get(task=task, resolved_at__isnull=True)
    assert "uses 6000 MiB of GPU memory" in alert.message
    assert "reserved 4096 MiB" in alert.message
    gpu.refresh_from_db()
    assert gpu.foreign_memory_mb == 0  # the task's own use is not foreign
    if policy == "alert":
        assert Task.objects.get(pk=task.pk).state == "running"
        agent.backend.fake_processes.clear()
        agent.tick()
        alert.refresh_from_db()
        assert alert.resolved_at is not None
    else:
        wait_for(state_of(task, "failed"))
        assert "uses 6000 MiB of GPU memory" in task.reason
        assert TaskAttempt.objects.get(task=task).outcome == "failed"


def test_an_idle_heartbeat_reads_nothing_about_gpu_memory_until_its_backstop(
    node, agent_for, django_assert_num_queries
):
    stray = [GpuProcess(gpu_uuid=node.gpus.get(index=0).uuid, pid=999_999, used_mb=2_000)]
    watch = agent_for(processes=stray).memory
    watch.check(again=False)  # a process: checked in full
    stray.clear()
    watch.check(again=False)  # it left: its foreign memory is taken back
    assert GPU.objects.get(pk=node.gpus.get(index=0).pk).foreign_memory_mb == 0
    with django_assert_num_queries(0):
        watch.check(again=False)  # no process then, none now: nothing can have changed
    watch.check(again=True)  # the backstop, with each reconciliation, reads all the same
    stray.append(GpuProcess(gpu_uuid=node.gpus.get(index=1).uuid, pid=999_999, used_mb=1_000))
    watch.check(again=False)
    assert GPU.objects.get(pk=node.gpus.get(index=1).pk).foreign_memory_mb == 1_000
