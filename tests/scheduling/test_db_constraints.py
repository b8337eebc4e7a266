"""The invariants PostgreSQL itself holds for the GPU estate, tasks and allocations.

Every write here skips model validation (``save()``, ``objects.create()``, ``update()``), so a
refusal can only come from the database: a constraint or the capacity trigger of migration 0003.
Each refusal is paired with the nearest write that must still be accepted.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from scheduling.models import GPU, Allocation, GpuState, Node, Task
from tests.factories import AllocationFactory, NodeFactory, TaskFactory, make_gpus

pytestmark = pytest.mark.django_db

CAPACITY = 24576


@contextmanager
def refused(match: str):
    """Expect PostgreSQL to refuse the write; the savepoint keeps the test transaction usable."""
    with pytest.raises(IntegrityError, match=match), transaction.atomic():
        yield


@pytest.fixture
def gpu(workstation) -> GPU:
    return workstation.gpus.get(index=0)


def new_gpu(node: Node, index: int, **fields) -> GPU:
    values = {
        "uuid": f"GPU-test-{node.name}-{index}-{fields.get('state', 'available')}",
        "model": "NVIDIA GeForce RTX 4090",
        "gpu_type": "rtx4090-24g",
        "memory_mb": CAPACITY,
    }
    return GPU.objects.create(node=node, index=index, **{**values, **fields})


# --- GPUs and nodes ----------------------------------------------------------------------------


def test_it_refuses_a_second_gpu_with_the_same_uuid(gpu):
    other_node = NodeFactory()
    with refused("uuid"):
        new_gpu(other_node, 0, uuid=gpu.uuid)
    assert GPU.objects.filter(uuid=gpu.uuid).count() == 1


@pytest.mark.parametrize("state", [GpuState.AVAILABLE, GpuState.DRAINING, GpuState.FAILED])
def test_it_refuses_two_gpus_in_service_at_one_index_of_a_node(gpu, state):
    with refused("gpu_unique_index_per_node"):
        new_gpu(gpu.node, gpu.index, state=state)


def test_it_lets_an_offline_gpu_keep_the_index_a_new_one_took(gpu):
    new_gpu(gpu.node, gpu.index, state=GpuState.OFFLINE)
    GPU.objects.filter(pk=gpu.pk).update(state=GpuState.OFFLINE)
    new_gpu(gpu.node, gpu.index, uuid="GPU-replacement")

    assert gpu.node.gpus.filter(index=gpu.index).count() == 3


def test_it_allows_the_same_index_on_two_nodes(gpu):
    new_gpu(NodeFactory(), gpu.index)


def test_it_refuses_a_gpu_without_memory(workstation):
    with refused("gpu_memory_positive"):
        new_gpu(workstation, 9, memory_mb=0)


def test_it_refuses_more_foreign_memory_than_the_gpu_has(gpu):
    GPU.objects.filter(pk=gpu.pk).update(foreign_memory_mb=CAPACITY)
    with refused("gpu_foreign_le_memory"):
        GPU.objects.filter(pk=gpu.pk).update(foreign_memory_mb=CAPACITY + 1)
    gpu.refresh_from_db()
    assert gpu.foreign_memory_mb == CAPACITY


def test_it_refuses_an_unknown_gpu_state(gpu):
    with refused("gpu_state_valid"):
        GPU.objects.filter(pk=gpu.pk).update(state="melted")


def test_it_refuses_an_unknown_node_state(db):
    with refused("node_state_valid"):
        NodeFactory(state="sleeping")
    node = NodeFactory()
    with refused("node_state_valid"):
        Node.objects.filter(pk=node.pk).update(state="sleeping")


# --- Tasks -------------------------------------------------------------------------------------


def test_it_refuses_an_unknown_task_state(db):
    task = TaskFactory()
    with refused("task_state_valid"):
        Task.objects.filter(pk=task.pk).update(state="exploded")


def test_it_refuses_an_unknown_task_class(db):
    with refused("task_class_valid"):
        TaskFactory(task_class="urgent")


def test_it_refuses_a_priority_above_100(db):
    TaskFactory(priority=100)
    with refused("task_priority_range"):
        TaskFactory(priority=101)


def test_it_refuses_fewer_gpus_at_most_than_at_least(db):
    TaskFactory(gpus_min=2, gpus_max=2)
    with refused("task_gpus_range"):
        TaskFactory(gpus_min=2, gpus_max=1)


def test_it_refuses_a_task_asking_for_no_gpu_memory(db):
    TaskFactory(gpu_memory_mb=None)
    with refused("task_gpu_memory_positive"):
        TaskFactory(gpu_memory_mb=0)


def test_it_refuses_a_zero_timeout(db):
    TaskFactory(timeout_s=None)
    with refused("task_timeout_positive"):
        TaskFactory(timeout_s=0)


# --- Allocations -------------------------------------------------------------------------------


def test_it_refuses_a_second_active_allocation_of_a_task_on_one_gpu(gpu):
    first = AllocationFactory(gpu=gpu)
    with refused("alloc_one_active_per_task_gpu"):
        AllocationFactory(task=first.task, gpu=gpu)

    Allocation.objects.filter(pk=first.pk).update(released_at=timezone.now())
    AllocationFactory(task=first.task, gpu=gpu, attempt=2)

    assert Allocation.objects.filter(task=first.task, gpu=gpu).count() == 2


def test_it_refuses_an_allocation_released_before_it_started(gpu):
    now = timezone.now()
    with refused("alloc_released_after_start"):
        AllocationFactory(gpu=gpu, started_at=now, released_at=now - timedelta(seconds=1))
    AllocationFactory(gpu=gpu, started_at=now, released_at=now)


def test_it_refuses_an_allocation_of_no_memory(gpu):
    with refused("alloc_memory_positive"):
        AllocationFactory(gpu=gpu, memory_mb=0)


# --- The capacity trigger ----------------------------------------------------------------------


def test_it_refuses_shares_that_add_up_to_more_than_the_gpu(gpu):
    AllocationFactory(gpu=gpu, memory_mb=16384)
    with refused(f"would have 26624 MiB reserved, more than its {CAPACITY} MiB"):
        AllocationFactory(gpu=gpu, memory_mb=10240)
    assert gpu.allocations.count() == 1


def test_it_refuses_one_allocation_bigger_than_the_gpu(gpu):
    with refused("more than its"):
        AllocationFactory(gpu=gpu, memory_mb=CAPACITY + 1, exclusive=True)


def test_it_accepts_shares_that_fit_exactly(gpu):
    for _ in range(3):
        AllocationFactory(gpu=gpu, memory_mb=CAPACITY // 3)
    assert gpu.allocations.filter(released_at__isnull=True).count() == 3


def test_it_refuses_an_exclusive_allocation_on_a_shared_gpu(gpu):
    AllocationFactory(gpu=gpu, memory_mb=4096)
    with refused("exclusive use cannot share it"):
        AllocationFactory(gpu=gpu, memory_mb=4096, exclusive=True)


def test_it_refuses_a_share_of_a_gpu_held_exclusively(gpu):
    # Less than the whole card, so only exclusivity (not capacity) can refuse the share.
    AllocationFactory(gpu=gpu, memory_mb=4096, exclusive=True)
    with refused("exclusive use cannot share it"):
        AllocationFactory(gpu=gpu, memory_mb=4096)


def test_it_refuses_a_second_exclusive_allocation(gpu):
    AllocationFactory(gpu=gpu, memory_mb=CAPACITY, exclusive=True)
    with refused("exclusive use cannot share it"):
        AllocationFactory(gpu=gpu, memory_mb=CAPACITY, exclusive=True)


def test_a_released_allocation_frees_its_memory_and_its_exclusivity(gpu):
    held = AllocationFactory(gpu=gpu, memory_mb=CAPACITY, exclusive=True)
    Allocation.objects.filter(pk=held.pk).update(released_at=timezone.now())

    AllocationFactory(gpu=gpu, memory_mb=16384)
    AllocationFactory(gpu=gpu, memory_mb=8192)

    assert gpu.allocations.filter(released_at__isnull=True).count() == 2


def test_other_gpus_do_not_count_against_this_one(workstation):
    gpu0, gpu1 = workstation.gpus.order_by("index")[:2]
    AllocationFactory(gpu=gpu0, memory_mb=CAPACITY, exclusive=True)
    AllocationFactory(gpu=gpu1, memory_mb=CAPACITY, exclusive=True)


def test_it_checks_updates_as_well_as_inserts(gpu):
    share = AllocationFactory(gpu=gpu, memory_mb=16384)
    other = AllocationFactory(gpu=gpu, memory_mb=8192)
    with refused("more than its"):
        Allocation.objects.filter(pk=other.pk).update(memory_mb=8193)
    with refused("exclusive use cannot share it"):
        Allocation.objects.filter(pk=other.pk).update(exclusive=True)

    # Bringing a released allocation back is an allocation too.
    Allocation.objects.filter(pk=share.pk).update(released_at=timezone.now())
    AllocationFactory(gpu=gpu, memory_mb=16384)
    with refused("more than its"):
        Allocation.objects.filter(pk=share.pk).update(released_at=None)


def test_it_checks_a_move_to_another_gpu(workstation):
    gpu0, gpu1 = workstation.gpus.order_by("index")[:2]
    AllocationFactory(gpu=gpu0, memory_mb=CAPACITY, exclusive=True)
    moving = AllocationFactory(gpu=gpu1, memory_mb=1024)
    with refused("exclusive use cannot share it"):
        Allocation.objects.filter(pk=moving.pk).update(gpu=gpu0)


@pytest.mark.django_db(transaction=True)
def test_two_writers_at_once_cannot_both_take_a_gpu_exclusively():
    """The trigger locks the GPU row, so the second writer waits for the first and sees its row.

    Without that lock both transactions would check an empty GPU and both commit.
    """
    node = NodeFactory()
    (gpu,) = make_gpus(node, count=1)
    tasks = [TaskFactory(), TaskFactory()]
    barrier = threading.Barrier(len(tasks), timeout=10)
    outcomes: list[str] = []

    def allocate(task: Task) -> None:
        try:
            with transaction.atomic():
                barrier.wait()
                Allocation.objects.create(
                    task=task, attempt=1, gpu=gpu, memory_mb=gpu.memory_mb, exclusive=True
                )
                # Hold the transaction open so the other writer's insert overlaps it.
                time.sleep(0.3)
            outcomes.append("allocated")
        except IntegrityError as exc:
            outcomes.append(f"refused: {exc}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=allocate, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(o.split(":")[0] for o in outcomes) == ["allocated", "refused"], outcomes
    assert "exclusive use cannot share it" in next(o for o in outcomes if o.startswith("refused"))
    assert Allocation.objects.filter(gpu=gpu, released_at__isnull=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_allocation_being_made_does_not_hold_up_a_sample_of_its_gpu():
    """A pass holds the trigger's lock on each GPU it places on until it commits; storing a
    sample checks its foreign key to the GPU (KEY SHARE) and must not wait for the pass:
    the trigger locks FOR NO KEY UPDATE (migration 0015), which KEY SHARE does not conflict
    with, where FOR UPDATE made every sampling tick of the node wait."""
    from telemetry.models import GpuSample

    node = NodeFactory()
    (gpu,) = make_gpus(node, count=1)
    task = TaskFactory()
    allocated, release = threading.Event(), threading.Event()

    def allocate_and_hold() -> None:
        try:
            with transaction.atomic():
                Allocation.objects.create(task=task, attempt=1, gpu=gpu, memory_mb=1024)
                allocated.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=allocate_and_hold)
    holder.start()
    try:
        assert allocated.wait(10)
        with transaction.atomic(), connections["default"].cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")  # waiting would fail the commit
            GpuSample.objects.create(gpu=gpu, at=timezone.now())
    finally:
        release.set()
        holder.join(timeout=10)
    assert GpuSample.objects.filter(gpu=gpu).count() == 1
    assert Allocation.objects.filter(gpu=gpu, released_at__isnull=True).count() == 1
