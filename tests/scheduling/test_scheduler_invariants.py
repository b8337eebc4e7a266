"""The scheduler's invariants, held by a hypothesis state machine against the real database.

Each example builds a small estate (two nodes, three tenants with quotas), then submits, places,
starts, finishes, cancels, preempts, loses and recovers in random order. After every step the
database is checked against DESIGN.md's invariants:

1. A GPU's reserved memory never exceeds its capacity; an exclusive allocation never shares.
2. A pass never raises a tenant above its quota.
3. Every task is in exactly one known state, holds GPUs exactly while its state says so, from
   one attempt only, and no task is ever lost.
4. A serial queue runs one task at a time, in submission order.

Passes run explicitly: the ``on_commit`` wake-ups that services register never fire inside the
test's transaction.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import pytest
from django.db.models import Count, Q, Sum
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from scheduling import scheduler, services, states, transitions
from scheduling.models import (
    GPU,
    Allocation,
    GpuState,
    Node,
    NodeState,
    Pool,
    Task,
    TaskAttempt,
    TaskEvent,
)
from scheduling.spec import parse_spec
from scheduling.states import TaskState
from scheduling.submission import SubmitError, tasks_submit
from tenants.models import Quota, Tenant
from tests.factories import NodeFactory, PoolFactory, QuotaFactory, TenantFactory, make_gpus

GIB = 1024
GPU_MB = 24 * GIB
EPSILON = 1e-9
TENANTS = ("alpha", "beta", "gamma")
NODES = ("big", "small")  # 4 and 2 GPUs
HOLDS = {s.value for s in states.HOLDS_GPUS}
KNOWN_STATES = {s.value for s in TaskState}
CANCELLABLE = [TaskState.PENDING, TaskState.SCHEDULED, TaskState.RUNNING, TaskState.PREEMPTED]

SETTINGS = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def wipe() -> None:
    """Every example starts from an empty estate (all examples share one test transaction)."""
    Allocation.objects.all().delete()
    TaskEvent.objects.all().delete()
    Task.objects.all().delete()
    Quota.objects.all().delete()
    GPU.objects.all().delete()
    Node.objects.all().delete()
    Pool.objects.all().delete()
    Tenant.objects.all().delete()


@st.composite
def task_documents(draw, priorities=("low", "normal", "high")) -> tuple[dict, int | None]:
    """A task spec as a user writes it (name and ``after`` filled in by the rule), and which
    earlier task it should wait for, if any."""
    gpus = draw(
        st.one_of(
            st.sampled_from([0, 1, 1, 1, 2, 2, 3, 4]),
            st.tuples(st.integers(1, 2), st.integers(1, 2)).map(lambda r: f"{r[0]}-{r[0] + r[1]}"),
        )
    )
    resources: dict = {"gpus": gpus}
    if gpus != 0 and draw(st.booleans()):
        resources["gpu_memory"] = f"{draw(st.integers(4, 20))}Gi"
    if draw(st.integers(0, 5)) == 0:
        resources["pool"] = "training"
    document: dict = {
        "kind": "task",
        "command": "true",
        "priority": draw(st.sampled_from(priorities)),
        "class": draw(st.sampled_from(["batch", "batch", "online"])),
        "resources": resources,
        "policy": {},
    }
    queue = draw(st.sampled_from(["", "sft", "sft", "eval"]))
    if queue:
        document["queue"] = queue
    timeout = draw(st.sampled_from([None, None, "10m", "3h"]))
    if timeout:
        document["policy"]["timeout"] = timeout
    after = draw(st.none() | st.none() | st.integers(0, 1000))
    return document, after


# --- What the invariants measure -----------------------------------------------------------------


def tenant_usage() -> dict[int, tuple[float, int, int]]:
    """Tenant id -> (GPUs, GPU memory MiB, tasks holding GPUs), counted as quotas count them:
    an exclusive allocation is one GPU, a shared one its fraction of the card."""
    gpus: dict[int, float] = defaultdict(float)
    memory: dict[int, int] = defaultdict(int)
    for tenant_id, mb, exclusive, capacity in Allocation.objects.filter(
        released_at__isnull=True
    ).values_list("task__tenant_id", "memory_mb", "exclusive", "gpu__memory_mb"):
        gpus[tenant_id] += 1.0 if exclusive else mb / capacity
        memory[tenant_id] += mb
    tasks = dict(
        Task.objects.filter(state__in=HOLDS)
        .values("tenant_id")
        .annotate(n=Count("id"))
        .values_list("tenant_id", "n")
    )
    return {
        pk: (gpus.get(pk, 0.0), memory.get(pk, 0), tasks.get(pk, 0))
        for pk in Tenant.objects.values_list("pk", flat=True)
    }


def settle(task: Task, outcome: str) -> None:
    """What the supervisor records as an attempt ends (the launcher is not running here)."""
    TaskAttempt.objects.filter(task=task, number=task.attempt, outcome="").update(
        outcome=outcome, ended_at=timezone.now()
    )


def order_key(task: Task) -> tuple:
    return (task.submitted_at, task.pk)


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        wipe()
        self.task_ids: set[int] = set()
        self.names: dict[str, list[str]] = {name: [] for name in TENANTS}
        self.serial = 0

    # -- setup --

    @initialize(
        small_in_training=st.booleans(),
        beta_memory_gib=st.sampled_from([None, 48, 64]),
        gamma_running=st.sampled_from([None, 2, 3]),
        backlog=st.lists(
            # Mostly modest work first, so that later important work has something to preempt.
            st.tuples(st.sampled_from(TENANTS), task_documents(("low", "low", "normal"))),
            min_size=2,
            max_size=10,
        ),
    )
    def build_estate(self, small_in_training, beta_memory_gib, gamma_running, backlog=()):
        now = timezone.now()
        default = PoolFactory(name="default")
        training = PoolFactory(name="training")
        big = NodeFactory(name="big", pool=default, last_heartbeat=now)
        make_gpus(big, count=4, memory_mb=GPU_MB)
        small = NodeFactory(
            name="small", pool=training if small_in_training else default, last_heartbeat=now
        )
        make_gpus(small, count=2, memory_mb=GPU_MB)
        QuotaFactory(tenant=TenantFactory(name="alpha"), max_gpus=2)
        QuotaFactory(
            tenant=TenantFactory(name="beta"),
            max_gpus=4,
            max_gpu_memory_mb=None if beta_memory_gib is None else beta_memory_gib * GIB,
        )
        QuotaFactory(tenant=TenantFactory(name="gamma"), max_gpus=None,
                     max_running_tasks=gamma_running)  # fmt: skip
        # Work waiting before the first step, so that every example has something to place.
        for tenant, document in backlog:
            self.submit(tenant, [document])

    # -- rules --
    # ``then_pass``: the services these rules call ask for a pass on commit; in production one
    # runs soon after, sometimes not before the next event.

    @rule(
        tenant=st.sampled_from(TENANTS),
        documents=st.lists(task_documents(), min_size=1, max_size=3),
        then_pass=st.booleans(),
    )
    def submit(self, tenant, documents, then_pass=False):
        specs = []
        names = list(self.names[tenant])
        for document, after in documents:
            self.serial += 1
            name = f"job-{self.serial}"
            document = {**document, "name": name, "policy": dict(document.get("policy", {}))}
            if after is not None and names:
                document["policy"]["after"] = [names[after % len(names)]]
            specs.append(parse_spec(document))
            names.append(name)
        before = Task.objects.count()
        try:
            created = tasks_submit(tenant=Tenant.objects.get(name=tenant), specs=specs)
        except SubmitError:
            assert Task.objects.count() == before, "a refused batch left tasks behind"
            return
        assert [t.state for t in created] == [TaskState.PENDING] * len(specs)
        self.task_ids.update(t.pk for t in created)
        self.names[tenant] = names
        self.maybe_pass(then_pass)

    @rule(passes=st.integers(1, 2))
    def run_passes(self, passes):
        for _ in range(passes):
            self.run_one_pass()

    def maybe_pass(self, then_pass: bool) -> None:
        if then_pass:
            self.run_one_pass()

    def run_one_pass(self) -> None:
        before = tenant_usage()
        pending_before = set(
            Task.objects.filter(state=TaskState.PENDING).values_list("pk", flat=True)
        )
        allocations_before = set(Allocation.objects.values_list("pk", flat=True))
        result = scheduler.schedule_pass()
        after = tenant_usage()

        # Invariant 2: a pass may leave a tenant over a quota lowered meanwhile, never raise it.
        for quota in Quota.objects.filter(pool__isnull=True).select_related("tenant"):
            (gpus_before, mb_before, tasks_before) = before[quota.tenant_id]
            (gpus_after, mb_after, tasks_after) = after[quota.tenant_id]
            name = quota.tenant.name
            if quota.max_gpus is not None and gpus_after > gpus_before + EPSILON:
                assert gpus_after <= quota.max_gpus + EPSILON, (
                    f"pass raised {name} from {gpus_before} to {gpus_after} GPUs, "
                    f"quota {quota.max_gpus}"
                )
            if quota.max_gpu_memory_mb is not None and mb_after > mb_before:
                assert mb_after <= quota.max_gpu_memory_mb, (
                    f"pass raised {name} from {mb_before} to {mb_after} MiB, "
                    f"quota {quota.max_gpu_memory_mb}"
                )
            if quota.max_running_tasks is not None and tasks_after > tasks_before:
                assert tasks_after <= quota.max_running_tasks, (
                    f"pass raised {name} from {tasks_before} to {tasks_after} running tasks, "
                    f"quota {quota.max_running_tasks}"
                )

        # What the pass says it did is what the database holds.
        assert set(result.placed) <= pending_before
        assert set(result.failed) <= pending_before
        assert not set(result.placed) & set(result.failed)
        placed_states = set(
            Task.objects.filter(pk__in=result.placed).values_list("state", flat=True)
        )
        assert placed_states <= {TaskState.SCHEDULED}
        # A victim that runs stays preempted (holding its GPUs) until its launcher stops it;
        # one that never started goes straight back to the queue.
        for task in Task.objects.filter(pk__in=result.preempted):
            launched = TaskAttempt.objects.filter(task=task, number=task.attempt).exists()
            assert task.state == (TaskState.PREEMPTED if launched else TaskState.PENDING), task
        # New work only lands on GPUs that are in service, on nodes that are.
        fresh = Allocation.objects.exclude(pk__in=allocations_before).select_related("gpu__node")
        for allocation in fresh:
            assert allocation.task_id in result.placed
            assert allocation.gpu.state == GpuState.AVAILABLE, f"placed on {allocation.gpu}"
            assert allocation.gpu.node.state == NodeState.AVAILABLE, f"placed on {allocation.gpu}"

    @precondition(lambda self: Task.objects.filter(state=TaskState.SCHEDULED).exists())
    @rule(pick=st.integers(0, 1000))
    def start(self, pick):
        """The node's launcher starts a placed task: an attempt row, then running."""
        task = self.pick(TaskState.SCHEDULED, pick)
        TaskAttempt.objects.create(task=task, number=task.attempt, node_id=task.node_id)
        transitions.task_transition(task=task, to_state=TaskState.RUNNING, reason="launched")

    @precondition(lambda self: Task.objects.filter(state=TaskState.RUNNING).exists())
    @rule(
        pick=st.integers(0, 1000),
        outcome=st.sampled_from([TaskState.SUCCEEDED, TaskState.FAILED]),
        then_pass=st.booleans(),
    )
    def finish(self, pick, outcome, then_pass):
        task = self.pick(TaskState.RUNNING, pick)
        settle(task, outcome)
        transitions.task_transition(task=task, to_state=outcome, reason="exited")
        self.maybe_pass(then_pass)

    @precondition(lambda self: Task.objects.filter(state__in=CANCELLABLE).exists())
    @rule(pick=st.integers(0, 1000), then_pass=st.booleans())
    def cancel(self, pick, then_pass):
        task = self.pick(CANCELLABLE, pick)
        settle(task, "cancelled")
        transitions.task_transition(task=task, to_state=TaskState.CANCELLED, reason="cancelled")
        self.maybe_pass(then_pass)

    @precondition(lambda self: Task.objects.filter(state=TaskState.PREEMPTED).exists())
    @rule(pick=st.integers(0, 1000), then_pass=st.booleans())
    def complete_preemption(self, pick, then_pass):
        """The launcher stopped a preempted task's processes: it goes back to the queue."""
        task = self.pick(TaskState.PREEMPTED, pick)
        settle(task, "preempted")
        transitions.task_transition(
            task=task, to_state=TaskState.PENDING, reason="preempted; requeued"
        )
        self.maybe_pass(then_pass)

    @precondition(lambda self: Node.objects.exclude(state=NodeState.OFFLINE).exists())
    @rule(pick=st.integers(0, 1), then_pass=st.booleans())
    def lose_node(self, pick, then_pass):
        """Its agent goes silent: offline, and what ran there is lost and requeued."""
        nodes = list(Node.objects.exclude(state=NodeState.OFFLINE).order_by("name"))
        node = nodes[pick % len(nodes)]
        Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(hours=1))
        assert services.nodes_mark_silent(offline_after=timedelta(minutes=5)) == [node.name]
        assert not GPU.objects.filter(node=node, state=GpuState.AVAILABLE).exists()
        for task in Task.objects.filter(
            node=node, state__in=[TaskState.SCHEDULED, TaskState.RUNNING]
        ).order_by("pk"):
            settle(task, "lost")
            task = transitions.task_transition(
                task=task, to_state=TaskState.LOST, reason="node lost"
            )
            transitions.task_transition(task=task, to_state=TaskState.PENDING, reason="requeued")
        self.maybe_pass(then_pass)

    @precondition(lambda self: Node.objects.filter(state=NodeState.OFFLINE).exists())
    @rule(pick=st.integers(0, 1), then_pass=st.booleans())
    def node_comes_back(self, pick, then_pass):
        nodes = list(Node.objects.filter(state=NodeState.OFFLINE).order_by("name"))
        node = nodes[pick % len(nodes)]
        assert services.node_heartbeat(name=node.name)
        assert Node.objects.get(pk=node.pk).state == NodeState.AVAILABLE
        assert not GPU.objects.filter(node=node).exclude(state=GpuState.AVAILABLE).exists()
        self.maybe_pass(then_pass)

    @rule(
        tenant=st.sampled_from(TENANTS),
        max_gpus=st.sampled_from([0, 1, 2, 3, 4, 6, None]),
        then_pass=st.booleans(),
    )
    def change_quota(self, tenant, max_gpus, then_pass):
        Quota.objects.filter(tenant__name=tenant, pool__isnull=True).update(max_gpus=max_gpus)
        self.maybe_pass(then_pass)

    def pick(self, wanted, pick: int) -> Task:
        wanted = [wanted] if isinstance(wanted, str) else wanted
        candidates = list(Task.objects.filter(state__in=wanted).order_by("pk"))
        return candidates[pick % len(candidates)]

    # -- invariants --

    @invariant()
    def no_gpu_is_over_allocated_and_exclusive_use_never_shares(self):
        active = Q(allocations__released_at__isnull=True)
        for gpu in GPU.objects.annotate(
            reserved=Sum("allocations__memory_mb", filter=active),
            holders=Count("allocations", filter=active),
            exclusive_holders=Count("allocations", filter=active & Q(allocations__exclusive=True)),
        ):
            assert (gpu.reserved or 0) <= gpu.memory_mb, (
                f"{gpu}: {gpu.reserved} MiB reserved of {gpu.memory_mb}"
            )
            if gpu.exclusive_holders:
                assert gpu.holders == 1, f"{gpu}: exclusive allocation shared by {gpu.holders}"

    @invariant()
    def every_task_is_in_one_state_and_holds_gpus_exactly_while_it_says_so(self):
        tasks = {task.pk: task for task in Task.objects.all()}
        assert set(tasks) == self.task_ids, "tasks appeared or vanished"
        active: dict[int, list[Allocation]] = defaultdict(list)
        for allocation in Allocation.objects.filter(released_at__isnull=True).select_related("gpu"):
            active[allocation.task_id].append(allocation)
        last_event = {}
        for task_id, to_state in TaskEvent.objects.order_by("task_id", "at", "id").values_list(
            "task_id", "to_state"
        ):
            last_event[task_id] = to_state
        for task in tasks.values():
            assert task.state in KNOWN_STATES
            assert last_event.get(task.pk) == task.state, (
                f"{task} is {task.state} but its last event says {last_event.get(task.pk)}"
            )
            held = active.pop(task.pk, [])
            if task.state not in HOLDS:
                assert not held, f"{task} is {task.state} but holds {held}"
                if task.state == TaskState.PENDING:
                    assert task.reason, f"{task} waits without a reason"
                continue
            assert task.node_id is not None, f"{task} is {task.state} on no node"
            if task.gpus_max == 0:
                assert not held, f"CPU-only {task} holds {held}"
                continue
            assert task.gpus_min <= len(held) <= task.gpus_max, (
                f"{task} asks for {task.gpus_min}-{task.gpus_max} GPUs but holds {len(held)}"
            )
            assert {a.attempt for a in held} == {task.attempt}, (
                f"{task} (attempt {task.attempt}) holds GPUs of attempts "
                f"{sorted({a.attempt for a in held})}"
            )
            assert len({a.gpu_id for a in held}) == len(held)
            assert {a.gpu.node_id for a in held} == {task.node_id}
            for allocation in held:
                assert allocation.exclusive == (task.gpu_memory_mb is None)
                expected_mb = task.gpu_memory_mb or allocation.gpu.memory_mb
                assert allocation.memory_mb == expected_mb
        assert not active, f"allocations of unknown tasks: {active}"

        twice = (
            TaskEvent.objects.filter(from_state=TaskState.PENDING, to_state=TaskState.SCHEDULED)
            .values("task_id", "attempt")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
        )
        assert not twice.exists(), f"scheduled twice in one attempt: {list(twice)}"

    @invariant()
    def serial_queues_run_one_task_at_a_time_in_submission_order(self):
        queues: dict[tuple[int, str], list[Task]] = defaultdict(list)
        queue_of: dict[int, tuple[int, str]] = {}
        for task in Task.objects.exclude(queue="").order_by("submitted_at", "pk"):
            queues[(task.tenant_id, task.queue)].append(task)
            queue_of[task.pk] = (task.tenant_id, task.queue)
        placed: dict[tuple[int, str], list[Task]] = defaultdict(list)
        tasks = {t.pk: t for members in queues.values() for t in members}
        for task_id in (
            TaskEvent.objects.filter(
                task__queue__gt="", from_state=TaskState.PENDING, to_state=TaskState.SCHEDULED
            )
            .order_by("at", "id")
            .values_list("task_id", flat=True)
        ):
            placed[queue_of[task_id]].append(tasks[task_id])
        for key, members in queues.items():
            queue = key[1]
            holding = [t for t in members if t.state in HOLDS]
            assert len(holding) <= 1, f"queue {queue}: {holding} hold GPUs at once"
            for head in holding:
                earlier = [
                    t
                    for t in members
                    if t.state == TaskState.PENDING and order_key(t) < order_key(head)
                ]
                assert not earlier, f"queue {queue}: {head} overtook pending {earlier}"
            order = [order_key(t) for t in placed[key]]
            assert order == sorted(order), f"queue {queue} placed out of order: {placed[key]}"


def test_the_scheduler_holds_its_invariants_whatever_happens(db):
    run_state_machine_as_test(SchedulerMachine, settings=SETTINGS)


def test_a_lowered_quota_stops_new_placements_but_keeps_running_work(db):
    """A hand-written case of invariant 2, so it does not rest on hypothesis finding it."""
    machine = SchedulerMachine()
    machine.build_estate(small_in_training=False, beta_memory_gib=None, gamma_running=None)
    document = {"kind": "task", "command": "true", "resources": {"gpus": 2}}
    machine.submit("beta", [(document, None), (document, None)])
    machine.run_passes(1)
    assert Task.objects.filter(state=TaskState.SCHEDULED).count() == 2
    machine.change_quota("beta", 1, then_pass=False)
    machine.submit("beta", [(document | {"resources": {"gpus": 1}}, None)])
    machine.run_passes(2)
    assert Task.objects.filter(state=TaskState.SCHEDULED).count() == 2
    assert "its quota of 1 GPUs" in Task.objects.get(state=TaskState.PENDING).reason
    machine.no_gpu_is_over_allocated_and_exclusive_use_never_shares()
    machine.every_task_is_in_one_state_and_holds_gpus_exactly_while_it_says_so()
    machine.serial_queues_run_one_task_at_a_time_in_submission_order()


def test_a_cpu_only_task_for_a_pool_without_nodes_is_refused_at_submission(db):
    machine = SchedulerMachine()
    machine.build_estate(small_in_training=False, beta_memory_gib=None, gamma_running=None)
    assert not Node.objects.filter(pool__name="training").exists()
    spec = parse_spec(
        {
            "kind": "task",
            "name": "etl",
            "command": "true",
            "resources": {"gpus": 0, "pool": "training"},
        }  # fmt: skip
    )
    with pytest.raises(SubmitError, match="training"):
        tasks_submit(tenant=Tenant.objects.get(name="beta"), specs=[spec])
