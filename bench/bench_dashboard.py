"""The live dashboard's first render: 256 GPUs and 10,000 pending tasks, under 300 ms server time.

In-process figures: Django's test client asks for /dashboard/ as a logged-in operator, so each
time is the server's whole work for the page (middleware, the reads, the template), without a
network or a browser, with the garbage collector set as a web process sets it
(``bench.common.as_a_web_process``: with the interpreter's defaults a full collection lands in
some renders). The estate: 32 nodes of 8 GPUs, a latest sample for each GPU, 200 running tasks
holding GPUs, 10,000 pending tasks with their positions and reasons, 20 open alerts. The query
count is compared with a one-node, one-task estate: it must not grow with the estate.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bench.common import as_a_web_process, clear_tasks, median, percentile, table, target
from monitoring.models import Alert
from nodeagent.inventory import simulated_uuid
from scheduling.models import GPU, Allocation, Node, Pool, Task
from telemetry.models import GpuSample
from tenants.models import Tenant

NEEDS_DATABASE = True

NODES = 32
GPUS_PER_NODE = 8
PENDING = 10_000
RUNNING = 200
ALERTS = 20
RENDERS = 30
TARGET_MS = 300


def build(nodes: int, pending: int, running: int) -> None:
    rng = random.Random(12)
    pool, _ = Pool.objects.get_or_create(name="default")
    made = Node.objects.bulk_create(
        Node(name=f"dash-{i:02d}", pool=pool, backend="simulated", last_heartbeat=timezone.now())
        for i in range(nodes)
    )
    gpus = GPU.objects.bulk_create(
        GPU(node=node, index=i, uuid=simulated_uuid(node.name, i), model="NVIDIA H100 80GB HBM3",
            gpu_type="h100-80g", memory_mb=81559)
        for node in made
        for i in range(GPUS_PER_NODE)
    )  # fmt: skip
    tenants = [Tenant.objects.create(name=f"lab-{i}") for i in range(8)]
    tasks = Task.objects.bulk_create(
        Task(tenant=rng.choice(tenants), name=f"train-{i}", command="python train.py",
             state="running", node=gpus[i % len(gpus)].node, started_at=timezone.now())
        for i in range(running)
    )  # fmt: skip
    Allocation.objects.bulk_create(
        Allocation(task=task, attempt=1, gpu=gpus[i % len(gpus)], memory_mb=81559)
        for i, task in enumerate(tasks)
    )
    Task.objects.bulk_create(
        Task(tenant=rng.choice(tenants), name=f"queued-{i}", command="python train.py",
             task_class=rng.choice(("batch", "online")), priority=rng.choice((10, 50, 90)),
             reason=f"position {i + 1}: waiting for 1 free GPU", wait={"position": i + 1})
        for i in range(pending)
    )  # fmt: skip
    now = timezone.now()
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpu, at=now - timedelta(seconds=1), util_gpu=rng.randint(0, 100),
                  memory_used_mb=rng.randint(0, 81559), memory_total_mb=81559,
                  temperature_c=rng.randint(30, 85), power_w=rng.uniform(60, 700))
        for gpu in gpus
    )  # fmt: skip
    Alert.objects.bulk_create(
        Alert(kind="gpu_memory_overuse", severity="warning", message=f"overuse {i}", gpu=gpu,
              node_id=gpu.node_id)
        for i, gpu in enumerate(gpus[:ALERTS])
    )  # fmt: skip


def clear() -> None:
    clear_tasks(
        GpuSample._meta.db_table,
        Alert._meta.db_table,
        GPU._meta.db_table,
        Node._meta.db_table,
        Tenant._meta.db_table,
    )


def render(client: Client) -> tuple[float, int, int]:
    with CaptureQueriesContext(connection) as queries:
        began = time.perf_counter()
        response = client.get("/dashboard/")
        elapsed = time.perf_counter() - began
    assert response.status_code == 200, response.status_code
    return elapsed, len(queries), len(response.content)


def main() -> dict:
    operator, _ = User.objects.get_or_create(username="bench-operator", is_staff=True)
    client = Client()
    client.force_login(operator)
    clear()
    build(nodes=1, pending=1, running=1)
    _, small_queries, _ = render(client)
    clear()
    began = time.perf_counter()
    build(nodes=NODES, pending=PENDING, running=RUNNING)
    print(f"estate built in {time.perf_counter() - began:.1f} s: {NODES * GPUS_PER_NODE} GPUs, "
          f"{PENDING:,} pending, {RUNNING} running")  # fmt: skip
    times, queries, size = [], 0, 0
    with as_a_web_process():
        render(client)  # warm: templates compiled, connections open
        for _ in range(RENDERS):
            elapsed, queries, size = render(client)
            times.append(elapsed)
    clear()
    p50, p99 = median(times) * 1000, percentile(times, 99) * 1000
    print(table(
        ["page", "renders", "p50 ms", "p99 ms", "max ms", "queries", "queries (1 GPU)", "HTML KB"],
        [["/dashboard/", RENDERS, f"{p50:.1f}", f"{p99:.1f}", f"{max(times) * 1000:.1f}",
          queries, small_queries, f"{size / 1024:.0f}"]],
    ))  # fmt: skip
    estate = f"{NODES * GPUS_PER_NODE} GPUs, {PENDING:,} pending"
    judged = target(f"dashboard first render, server time p99 ({estate})", f"{p99:.1f} ms",
                    f"< {TARGET_MS} ms", p99 < TARGET_MS)  # fmt: skip
    print(f"target: first render under {TARGET_MS} ms server time (p99): {judged}")
    judged = target(f"dashboard queries ({estate})", f"{queries} (1 GPU, 1 task: {small_queries})",
                    "the same as for 1 GPU and 1 task", queries == small_queries)  # fmt: skip
    print(f"target: query count constant in GPUs and tasks: {judged}")
    return {
        "gpus": NODES * GPUS_PER_NODE,
        "pending": PENDING,
        "p50_ms": round(p50, 1),
        "p99_ms": round(p99, 1),
        "queries": queries,
        "queries_small_estate": small_queries,
        "html_bytes": size,
    }
