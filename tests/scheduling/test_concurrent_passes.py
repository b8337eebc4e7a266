"""Scheduling passes from several processes at once: the advisory lock makes them take turns.

Four real processes run passes against one 8-GPU node and a backlog of ~200 tasks while they
also start and finish tasks (outside the lock, as launchers do), so capacity churns under the
passes. Afterwards the allocation history must show that no GPU was ever over-allocated and
no attempt of a task was placed twice.
"""

from __future__ import annotations

import json
import random
import subprocess
import textwrap
import time
from collections import defaultdict
from datetime import datetime

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from scheduling import passes, scheduler, states, transitions
from scheduling.models import GPU, Allocation, Task, TaskEvent
from scheduling.spec import parse_spec
from scheduling.states import TaskState
from scheduling.submission import tasks_submit
from tests.factories import NodeFactory, QuotaFactory, TenantFactory, make_gpus
from tests.live import PYTHON, ROOT, process_env

PROCESSES = 4
PASSES_EACH = 20
GPU_MB = 24 * 1024

# One scheduler process: wait for the start signal, then pass, start one task, finish one.
WORKER = textwrap.dedent(
    """
    import json, os, random, sys, time
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    django.setup()
    from scheduling import passes, scheduler, transitions
    from scheduling.models import Task
    from scheduling.states import TaskState
    from django.utils import timezone

    # Only the passes this loop runs: no extra pass on each commit (tests run django-q2 sync).
    passes.request_pass = lambda claimed=None: None
    seed, count, ready, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rng = random.Random(seed)
    open(ready, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("no start signal")
        time.sleep(0.005)
    steps = ((TaskState.SCHEDULED, TaskState.RUNNING), (TaskState.RUNNING, TaskState.SUCCEEDED))
    for _ in range(count):
        result = scheduler.schedule_pass()
        # When the pass had committed: by then its allocations exist, and every release it
        # relied on had happened.
        print(json.dumps({"placed": result.placed, "ended": timezone.now().isoformat()}))
        for state, to_state in steps:
            ids = list(Task.objects.filter(state=state).values_list("pk", flat=True))
            if not ids:
                continue
            task = Task.objects.get(pk=rng.choice(ids))
            if task.state != state:
                continue  # moved on since we looked
            try:
                transitions.task_transition(task=task, to_state=to_state, reason="churn")
            except transitions.StaleTask:
                pass  # another process got there first
    """
)


def backlog(rng: random.Random, tenant: str, count: int) -> list:
    documents = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.45:
            resources: dict = {"gpus": 1}
        elif roll < 0.6:
            resources = {"gpus": 2}
        elif roll < 0.7:
            resources = {"gpus": "1-3"}
        else:
            resources = {"gpus": rng.choice([1, 1, 2]), "gpu_memory": f"{rng.randint(4, 12)}Gi"}
        documents.append(
            {
                "kind": "task",
                "name": f"{tenant}-{i}",
                "command": "true",
                "priority": rng.choice(["low", "normal", "normal", "high"]),
                "resources": resources,
            }
        )
    return [parse_spec(document) for document in documents]


LIVE_SQL = """
    SELECT a.gpu_id, SUM(a.memory_mb), COUNT(*), COUNT(*) FILTER (WHERE a.exclusive),
           MIN(g.memory_mb)
      FROM scheduling_allocation a JOIN scheduling_gpu g ON g.id = a.gpu_id
     WHERE a.released_at IS NULL
     GROUP BY a.gpu_id
"""


def check_live_state() -> None:
    """Invariant 1 on what is reserved right now, read in one statement (one snapshot)."""
    with connection.cursor() as cursor:
        cursor.execute(LIVE_SQL)
        rows = cursor.fetchall()
    for gpu_id, reserved, holders, exclusive, capacity in rows:
        assert reserved <= capacity, f"GPU {gpu_id}: {reserved} of {capacity} MiB reserved"
        assert not exclusive or holders == 1, f"GPU {gpu_id}: exclusive use shared by {holders}"


def run_workers(tmp_path) -> tuple[list[subprocess.CompletedProcess], int]:
    """Run the workers together; check the live state over and over while they run.

    Returns their results and how many times the live state was checked.
    """
    go = tmp_path / "go"
    procs = []
    for n in range(PROCESSES):
        ready = tmp_path / f"ready-{n}"
        argv = [PYTHON, "-c", WORKER, str(n), str(PASSES_EACH), str(ready), str(go)]
        procs.append(
            subprocess.Popen(
                argv,
                cwd=ROOT,
                env=process_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        # Start them together, once every one has loaded Django, so that the passes overlap.
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready-{n}").exists() for n in range(PROCESSES)):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.02)
        go.touch()
        checks = 0
        deadline = time.monotonic() + 120
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            check_live_state()
            checks += 1
            time.sleep(0.005)
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=10)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return results, checks
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_four_processes_running_passes_never_over_allocate_a_gpu(monkeypatch, tmp_path):
    # Submitting would run a pass right here on commit (django-q2 is synchronous in tests).
    monkeypatch.setattr(passes, "request_pass", lambda claimed=None: None)
    node = NodeFactory(name="box", last_heartbeat=timezone.now())
    make_gpus(node, count=8, memory_mb=GPU_MB)
    rng = random.Random(20261122)
    for name, max_gpus in (("vision", 3), ("nlp", 5), ("speech", None)):
        tenant = TenantFactory(name=name)
        QuotaFactory(tenant=tenant, max_gpus=max_gpus)
        tasks_submit(tenant=tenant, specs=backlog(rng, name, 67))
    assert Task.objects.filter(state=TaskState.PENDING).count() == 201

    results, live_checks = run_workers(tmp_path)

    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    assert live_checks > 10
    placements = TaskEvent.objects.filter(
        from_state=TaskState.PENDING, to_state=TaskState.SCHEDULED
    )
    assert placements.count() > 40, "too little happened to prove anything"
    assert Task.objects.filter(state=TaskState.SUCCEEDED).exists()

    # Now: every GPU within its memory, exclusive allocations alone on theirs.
    check_live_state()

    # At every moment: the reservations live when each allocation began fit their GPU.
    committed = pass_commit_times(results)
    gpus = {gpu.pk: gpu for gpu in GPU.objects.all()}
    spans = []
    for allocation in Allocation.objects.all():
        began = committed_start(allocation, committed)
        spans.append((allocation, began))
    for moment in sorted({began for _, began in spans}):
        assert_within_capacity(gpus, spans, moment)

    # No attempt of a task was placed twice, and its allocations are that placement's.
    twice = placements.values("task_id", "attempt").annotate(n=Count("id")).filter(n__gt=1)
    assert not twice.exists(), list(twice)
    placed = set(placements.values_list("task_id", "attempt"))
    assert {(a.task_id, a.attempt) for a in Allocation.objects.all()} <= placed
    # Only tasks that hold GPUs have live allocations, all from their current attempt.
    holding = dict(Task.objects.filter(state__in=states.HOLDS_GPUS).values_list("pk", "attempt"))
    for task_id, attempt in Allocation.objects.filter(released_at__isnull=True).values_list(
        "task_id", "attempt"
    ):
        assert holding.get(task_id) == attempt, f"task {task_id} holds GPUs of attempt {attempt}"


def pass_commit_times(results) -> dict[int, list[datetime]]:
    """Task id -> when each pass that placed it had committed, from the workers' output."""
    committed: dict[int, list[datetime]] = defaultdict(list)
    for result in results:
        for line in result.stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                for task_id in record["placed"]:
                    committed[task_id].append(datetime.fromisoformat(record["ended"]))
    return committed


def committed_start(allocation: Allocation, committed: dict[int, list[datetime]]) -> datetime:
    """When the allocation certainly existed: the end of the pass that made it.

    Allocation.started_at is read after the pass's snapshot, but a clock reading is not a
    commit order; the end of the pass is certainly after both.
    """
    ends = [end for end in committed[allocation.task_id] if end >= allocation.started_at]
    assert ends, f"no worker reported placing {allocation}"
    began = min(ends)
    if allocation.released_at is not None:
        began = min(began, allocation.released_at)
    return began


def assert_within_capacity(gpus, spans, moment: datetime) -> None:
    """At ``moment``, no GPU holds more than its memory, nor shares exclusive use."""
    live = defaultdict(list)
    for allocation, began in spans:
        if began <= moment and (allocation.released_at is None or allocation.released_at > moment):
            live[allocation.gpu_id].append(allocation)
    for gpu_id, held in live.items():
        gpu = gpus[gpu_id]
        reserved = sum(a.memory_mb for a in held)
        who = [(a.task_id, a.attempt, a.started_at, a.released_at) for a in held]
        assert reserved <= gpu.memory_mb, (
            f"{gpu} at {moment}: {reserved} of {gpu.memory_mb} MiB, held by {who}"
        )
        if any(a.exclusive for a in held):
            assert len(held) == 1, f"{gpu} at {moment}: exclusive use shared by {who}"


@pytest.mark.django_db
def test_an_allocation_never_starts_before_the_one_it_replaced_was_released(monkeypatch):
    node = NodeFactory(name="box", last_heartbeat=timezone.now())
    make_gpus(node, count=1, memory_mb=GPU_MB)
    tenant = TenantFactory(name="vision")
    spec = {"kind": "task", "command": "true", "resources": {"gpus": 1}}
    first = tasks_submit(tenant=tenant, specs=[parse_spec({**spec, "name": "first"})])[0]
    scheduler.schedule_pass()
    first.refresh_from_db()
    assert first.state == TaskState.SCHEDULED
    second = tasks_submit(tenant=tenant, specs=[parse_spec({**spec, "name": "second"})])[0]

    read_for_pass = scheduler._read_for_pass

    def released_meanwhile(now, *args, **kwargs):
        # Another process finishes the first task after this pass began, before it read.
        transitions.task_transition(task=first, to_state=TaskState.CANCELLED, reason="cancelled")
        return read_for_pass(now, *args, **kwargs)

    monkeypatch.setattr(scheduler, "_read_for_pass", released_meanwhile)
    assert scheduler.schedule_pass().placed == [second.pk]

    old = Allocation.objects.get(task=first)
    new = Allocation.objects.get(task=second)
    assert new.started_at >= old.released_at, (
        f"GPU held twice from {new.started_at} to {old.released_at} in the records"
    )
