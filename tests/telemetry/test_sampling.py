"""Sampling: the simulated backend follows the work placed on it, the sampler stores one batch
per tick tied to the task and tenant holding each GPU, and injected faults reach the samples."""

from __future__ import annotations

import time

from nodeagent.inventory import simulated_uuid
from nodeagent.sampler import Sampler
from scheduling.states import TaskState
from telemetry import services
from telemetry.models import GpuSample
from tests.factories import AllocationFactory, NodeFactory, TaskFactory, TenantFactory


def test_a_simulated_gpu_reads_busy_only_while_memory_is_reserved_on_it(backend):
    busy = simulated_uuid("workstation-1", 1)
    samples = {s.gpu_uuid: s for s in backend.sample(reserved_mb={busy: 8192})}

    assert len(samples) == 4
    assert all(s.simulated for s in samples.values())
    assert samples[busy].util_gpu >= 85
    assert samples[busy].memory_used_mb == 8192
    idle = samples[simulated_uuid("workstation-1", 0)]
    assert (idle.util_gpu, idle.memory_used_mb) == (0, 0)
    assert idle.temperature_c < samples[busy].temperature_c
    assert len({s.at for s in samples.values()}) == 1  # one batch, one time


def test_a_tick_stores_every_gpu_tied_to_its_task_and_tenant(backend, running, lab):
    stored = Sampler(node_name="workstation-1", backend=backend).tick()

    assert stored == 4
    rows = {row.gpu.index: row for row in GpuSample.objects.select_related("gpu")}
    assert (rows[0].task_id, rows[0].tenant_id) == (running.pk, lab.pk)
    assert rows[0].memory_used_mb == 20480 and rows[0].util_gpu >= 85
    assert all(rows[i].task_id is None and rows[i].util_gpu == 0 for i in (1, 2, 3))
    assert all(row.simulated for row in rows.values())


def test_a_shared_gpu_is_held_by_its_largest_reservation_and_heard_by_every_tenant(
    workstation, lab
):
    other = TenantFactory(name="nlp-lab")
    gpu = workstation.gpus.get(index=1)
    small = TaskFactory(tenant=lab, state=TaskState.RUNNING, node=workstation, attempt=1)
    large = TaskFactory(tenant=other, state=TaskState.RUNNING, node=workstation, attempt=1)
    ended = TaskFactory(tenant=lab, state=TaskState.SUCCEEDED, node=workstation, attempt=1)
    AllocationFactory(task=small, gpu=gpu, memory_mb=4096)
    AllocationFactory(task=large, gpu=gpu, memory_mb=8192)
    AllocationFactory(task=ended, gpu=gpu, memory_mb=2048)  # its task ended: not a holder

    state = services.node_state(node_name="workstation-1")

    held = state.holders[gpu.uuid]
    assert (held.gpu_id, held.task_id, held.tenant_id) == (gpu.pk, large.pk, other.pk)
    assert held.reserved_mb == 4096 + 8192 and held.tenant_ids == {lab.pk, other.pk}
    idle = state.holders[workstation.gpus.get(index=0).uuid]
    assert (idle.task_id, idle.reserved_mb, idle.tenant_ids) == (None, 0, frozenset())
    assert len(state.holders) == 4 and not state.faults_pending and not state.alerts_open
    assert services.node_state(node_name="no-such-node") is None


def test_one_insert_per_tick(backend, workstation, django_assert_max_num_queries):
    sampler = Sampler(node_name="workstation-1", backend=backend)
    # With all well: one read (node, GPUs, holders, and whether a fault or an alert is pending)
    # and the INSERT.
    with django_assert_max_num_queries(2) as queries:
        sampler.tick()
    inserts = [q for q in queries.captured_queries if q["sql"].lstrip().startswith("INSERT")]
    assert len(inserts) == 1


def test_an_injected_temperature_shows_in_the_next_sample_and_clears(backend, workstation):
    gpu = workstation.gpus.get(index=2)
    sampler = Sampler(node_name="workstation-1", backend=backend)
    services.fault_inject(gpu=gpu, kind="temperature", value=97)
    sampler.tick()
    assert GpuSample.objects.get(gpu=gpu).temperature_c == 97

    services.fault_inject(gpu=gpu, kind="clear")
    sampler.tick()
    assert GpuSample.objects.filter(gpu=gpu).order_by("-at")[0].temperature_c < 97


def test_a_sample_of_a_gpu_unknown_to_the_database_is_dropped(backend, db):
    NodeFactory(name="workstation-1")  # registered, its GPUs not yet
    assert Sampler(node_name="workstation-1", backend=backend).tick() == 0
    assert not GpuSample.objects.exists()


def test_a_failing_read_is_logged_and_sampling_goes_on(
    transactional_db, backend, workstation, monkeypatch
):
    # transactional: the sampler thread reads with its own connection.
    import threading

    calls = []
    enough = threading.Event()

    def broken(**kwargs):
        calls.append(1)
        if len(calls) >= 3:
            enough.set()
        raise RuntimeError("NVML: GPU is lost")

    monkeypatch.setattr(backend, "sample", broken)
    sampler = Sampler(node_name="workstation-1", backend=backend, interval_s=0.01)
    sampler.start()
    try:
        assert enough.wait(10), "the sampler stopped after a failed read"
    finally:
        sampler.stop()
    assert sampler.errors >= 3 and not sampler._thread.is_alive()


def test_a_tick_says_whether_the_node_is_unheld(backend, workstation, lab):
    sampler = Sampler(node_name="workstation-1", backend=backend)
    sampler.tick()
    assert sampler.unheld

    gpu = workstation.gpus.get(index=2)
    services.fault_inject(gpu=gpu, kind="temperature", value=97)
    sampler.tick()  # the fault was pending when it read the node
    assert not sampler.unheld

    services.fault_inject(gpu=gpu, kind="clear")
    task = TaskFactory(tenant=lab, state=TaskState.RUNNING, node=workstation, attempt=1)
    AllocationFactory(task=task, gpu=gpu, memory_mb=1024)
    sampler.tick()
    assert not sampler.unheld


def wait_until(predicate, bound_s: float = 20.0) -> None:
    deadline = time.monotonic() + bound_s
    while not predicate():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.01)


def test_an_unheld_node_is_sampled_at_its_own_pace_until_woken(
    transactional_db, backend, workstation
):
    # transactional: the sampler thread reads with its own connection.
    sampler = Sampler(
        node_name="workstation-1", backend=backend, interval_s=0.05, unheld_interval_s=60
    )
    sampler.start()
    try:
        wait_until(lambda: sampler.ticks == 1)
        time.sleep(0.5)  # ten ticks at sample_interval
        assert sampler.ticks == 1 and GpuSample.objects.count() == 4
        sampler.wake()  # what the agent does after a launch
        wait_until(lambda: sampler.ticks == 2)
    finally:
        sampler.stop()
    assert not sampler._thread.is_alive()


def test_a_node_with_a_held_gpu_is_sampled_at_sample_interval(transactional_db, backend, running):
    sampler = Sampler(
        node_name="workstation-1", backend=backend, interval_s=0.05, unheld_interval_s=60
    )
    sampler.start()
    try:
        wait_until(lambda: sampler.ticks >= 5)
    finally:
        sampler.stop()
    assert not sampler.unheld


def test_a_database_outage_is_logged_once_by_the_sampler_and_its_end_too(caplog):
    """It samples every second (5 s while idle): through an outage, an error each time."""
    import logging

    from django.db import OperationalError

    sampler = Sampler(node_name="workstation-1", backend=None, interval_s=0.001)
    outcomes = iter(["down", "down", "down", "ok", "ok", "down", "stop"])

    def tick() -> int:
        outcome = next(outcomes)
        if outcome == "stop":
            sampler.stopping.set()
        if outcome in ("down", "stop"):
            raise OperationalError("connection refused")
        return 1

    sampler.tick = tick
    with caplog.at_level(logging.DEBUG, logger="nodeagent.sampler"):
        sampler.run()
    said = [(r.levelname, r.getMessage().split(":")[1].strip()) for r in caplog.records]
    assert said == [
        ("ERROR", "GPU sample failed, will retry"),
        ("DEBUG", "GPU sample failed, will retry"),
        ("DEBUG", "GPU sample failed, will retry"),
        ("INFO", "sampling again after 0 s"),
        ("ERROR", "GPU sample failed, will retry"),  # the next outage is said again
        ("DEBUG", "GPU sample failed, will retry"),
    ]
    assert sampler.errors == 5
