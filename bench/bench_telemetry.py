"""GPU telemetry: sampling cost in the node agent, sample writes for a 32 x 8 estate, reads.

Figures, never assertions (targets from issue 11):
- sampling 8 simulated GPUs at 1 Hz: the node agent's CPU per tick (the backend's read alone,
  and the whole tick: read, attribution, the one INSERT, the alert checks), as a share of one
  core; the NVML read per tick where a driver answers;
- writing: 32 nodes x 8 GPUs at 1 Hz (32 INSERTs of 8 rows per second of estate time), the
  PostgreSQL backend's own CPU (read from /proc through psutil, so only when the server runs
  on this machine) per second of estate time;
- reading: 30 days of one GPU at a 1 h step, and the last 15 minutes of 32 GPUs at 1 s, each
  through the same selector the API uses, in a database holding 2 h of raw samples for all
  256 GPUs, a day of minute rollups and 30 days of hour rollups;
- history size per GPU per day, from the tables' measured size per row.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import psutil
from django.db import connection
from django.utils import timezone

from bench.common import clear_tasks, median, ms, table, target
from nodeagent.inventory import BackendUnavailable, NvmlBackend, SimulatedBackend, simulated_uuid
from nodeagent.sampler import Sampler
from scheduling.config import SimulatedGpus
from scheduling.models import GPU, Node, Pool
from telemetry import selectors, services
from telemetry.models import GpuRollupHour, GpuRollupMinute, GpuSample

NEEDS_DATABASE = True

NODES, GPUS_PER_NODE = 32, 8
TICKS = 120
WRITE_SECONDS = 60
RAW_HOURS = 2
READ_ROUNDS = 15
SPEC = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": GPUS_PER_NODE}


def build_estate() -> list[Node]:
    pool, _ = Pool.objects.get_or_create(name="default")
    nodes = Node.objects.bulk_create(
        Node(name=f"tel-{i:02d}", pool=pool, backend="simulated") for i in range(NODES)
    )
    GPU.objects.bulk_create(
        GPU(node=node, index=i, uuid=simulated_uuid(node.name, i),
            model="NVIDIA GeForce RTX 4090", gpu_type="rtx4090-24g", memory_mb=24576)
        for node in nodes
        for i in range(GPUS_PER_NODE)
    )  # fmt: skip
    return nodes


def remove_estate(nodes: list[Node]) -> None:
    """Leave the shared benchmark database as it was found. Its samples and rollups (about 1.8
    million rows) are truncated: deleted through the GPUs' cascade by the next benchmark, they
    took seconds and wrote enough WAL to start checkpoints inside the throughput benchmark."""
    clear_tasks(*(model._meta.db_table for model in (GpuSample, GpuRollupMinute, GpuRollupHour)))
    GPU.objects.filter(node__in=nodes).delete()
    Node.objects.filter(pk__in=[node.pk for node in nodes]).delete()


def sampling_cost(node: Node) -> dict:
    backend = SimulatedBackend(node.name, SimulatedGpus.model_validate(SPEC))
    sampler = Sampler(node_name=node.name, backend=backend)
    sampler.tick()  # warm: imports, first queries
    cpu = time.process_time()
    for _ in range(TICKS):
        backend.sample()
    read_s = (time.process_time() - cpu) / TICKS
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(TICKS):
        sampler.tick()
    tick_cpu = (time.process_time() - cpu) / TICKS
    tick_wall = (time.perf_counter() - wall) / TICKS
    return {"read_cpu_s": read_s, "tick_cpu_s": tick_cpu, "tick_wall_s": tick_wall}


def nvml_cost() -> dict | None:
    try:
        backend = NvmlBackend()
    except BackendUnavailable as exc:
        return {"unavailable": str(exc)}
    with backend:
        gpus = backend.discover()
        backend.sample()
        began, cpu = time.perf_counter(), time.process_time()
        for _ in range(TICKS):
            backend.sample()
            backend.xid_events()
        return {
            "gpus": len(gpus),
            "tick_wall_s": (time.perf_counter() - began) / TICKS,
            "tick_cpu_s": (time.process_time() - cpu) / TICKS,
        }


def _backend_process() -> psutil.Process | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        process = psutil.Process(pid)
        process.cpu_times()
    except psutil.Error:
        return None
    return process


def write_cost(nodes: list[Node]) -> dict:
    """WRITE_SECONDS of estate time: each second, every node's 8 samples in one INSERT."""
    backends = [SimulatedBackend(n.name, SimulatedGpus.model_validate(SPEC)) for n in nodes]
    holders = {n.pk: services.gpu_holders(node=n) for n in nodes}
    base = time.time() - 3 * 3600
    server = _backend_process()
    before = sum(server.cpu_times()[:2]) if server else None
    began = time.perf_counter()
    for second in range(WRITE_SECONDS):
        for node, backend in zip(nodes, backends, strict=True):
            samples = [type(s)(**{**s.__dict__, "at": base + second}) for s in backend.sample()]
            services.record_samples(node=node, samples=samples, holders=holders[node.pk])
    wall = time.perf_counter() - began
    db_cpu = (sum(server.cpu_times()[:2]) - before) if server else None
    return {
        "rows": WRITE_SECONDS * NODES * GPUS_PER_NODE,
        "wall_s": wall,
        "db_cpu_per_estate_second": None if db_cpu is None else db_cpu / WRITE_SECONDS,
    }


def fill_history(now) -> None:
    """2 h of raw samples for every GPU, a day of minute and 30 days of hour rollups."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {GpuSample._meta.db_table}
                   (gpu_id, at, simulated, lost, util_gpu, util_memory, memory_used_mb,
                    memory_total_mb, temperature_c, power_w, power_limit_w, sm_clock_mhz,
                    fan_pct, ecc_corrected, ecc_uncorrected, throttle_reasons)
            SELECT g.id, t, true, false, (random() * 100)::int, (random() * 60)::int,
                   (random() * 24576)::int, 24576, 40 + (random() * 40)::int,
                   25 + random() * 400, 450, 2520, 50, 0, 0, 0
              FROM scheduling_gpu g,
                   generate_series(%s::timestamptz, %s::timestamptz, interval '1 second') t
             ON CONFLICT DO NOTHING
            """,  # noqa: S608
            [now - timedelta(hours=RAW_HOURS), now - timedelta(seconds=WRITE_SECONDS + 5)],
        )
        metrics = ", ".join(
            f"{m}_min, {m}_mean, {m}_max" for m in ("util_gpu", "temperature_c", "power_w")
        )
        for model, span, step in (
            (GpuRollupMinute, timedelta(days=1), "1 minute"),
            (GpuRollupHour, timedelta(days=30), "1 hour"),
        ):
            cursor.execute(
                f"""
                INSERT INTO {model._meta.db_table}
                       (gpu_id, start, samples, simulated, {metrics})
                SELECT g.id, t, 60, true, 0, 50 + random() * 10, 100, 40, 60, 80, 25, 300, 450
                  FROM scheduling_gpu g,
                       generate_series(%s::timestamptz, %s::timestamptz, interval '{step}') t
                """,  # noqa: S608
                [now - span, now],
            )
        cursor.execute("ANALYZE")


def read_cost(now) -> dict:
    one = GPU.objects.order_by("pk").first()
    many = list(GPU.objects.order_by("pk")[:32])
    month = [selectors.Window(one.pk, now - timedelta(days=30), now)]
    quarter = [selectors.Window(g.pk, now - timedelta(minutes=15), now) for g in many]
    timings = {}
    for name, windows, start, step in (
        ("30 days of 1 GPU at 1 h", month, now - timedelta(days=30), 3600),
        ("15 min of 32 GPUs at 1 s", quarter, now - timedelta(minutes=15), 1),
    ):
        runs, points = [], 0
        for _ in range(READ_ROUNDS):
            began = time.perf_counter()
            data = selectors.series(windows=windows, start=start, end=now, step_s=step)
            runs.append(time.perf_counter() - began)
            points = sum(len(s["values"][0]) for s in data["series"])
        timings[name] = {"median_s": median(runs), "points": points, "source": data["source"]}
    return timings


def sizes() -> dict:
    out = {}
    with connection.cursor() as cursor:
        for label, model, per_day in (
            ("raw samples (1 Hz)", GpuSample, 86400),
            ("1-minute rollups", GpuRollupMinute, 1440),
            ("1-hour rollups", GpuRollupHour, 24),
        ):
            table_name = model._meta.db_table
            cursor.execute(
                f"SELECT pg_total_relation_size(%s), (SELECT count(*) FROM {table_name})",  # noqa: S608
                [table_name],
            )
            size, rows = cursor.fetchone()
            per_row = size / rows if rows else 0
            out[label] = {"bytes_per_row": per_row, "bytes_per_gpu_day": per_row * per_day}
    return out


def main() -> dict:
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.1f} on {os.cpu_count()} CPUs (timings below grow "
          "with it: the machine may be shared)")  # fmt: skip
    nodes = build_estate()
    sampling = sampling_cost(nodes[0])
    nvml = nvml_cost()
    now = timezone.now()
    writes = write_cost(nodes)
    fill_history(now)
    reads = read_cost(now)
    size = sizes()
    remove_estate(nodes)

    share = sampling["tick_cpu_s"] / 1.0
    tick = f"sampling tick, {GPUS_PER_NODE} simulated GPUs, share of a core at 1 Hz"
    tick_judged = target(tick, f"{share * 100:.2f} %", "< 1 %", share < 0.01)
    print(table(
        ["sampling, 8 simulated GPUs", "CPU per tick", "share of a core at 1 Hz", "target"],
        [
            ["backend read only", ms(sampling["read_cpu_s"]),
             f"{sampling['read_cpu_s'] * 100:.3f} %", ""],
            ["whole tick (read, attribution, INSERT, alerts)", ms(sampling["tick_cpu_s"]),
             f"{share * 100:.2f} %", f"< 1 %: {tick_judged}"],
        ],
    ))  # fmt: skip
    print(f"whole tick wall time (database round trips included): {ms(sampling['tick_wall_s'])}")
    if nvml and "unavailable" not in nvml:
        print(f"NVML read of {nvml['gpus']} GPU(s) per tick: {ms(nvml['tick_wall_s'])} wall, "
              f"{ms(nvml['tick_cpu_s'])} CPU")  # fmt: skip
    else:
        print(f"NVML per-tick cost: not measured here ({nvml['unavailable']})")
    db = writes["db_cpu_per_estate_second"]
    print()
    print(f"writes: {writes['rows']:,} samples ({NODES} nodes x {GPUS_PER_NODE} GPUs x "
          f"{WRITE_SECONDS} s) in {writes['wall_s']:.2f} s wall "
          f"({writes['rows'] / writes['wall_s']:,.0f} samples/s possible)")  # fmt: skip
    writing = f"PostgreSQL CPU for sample inserts, {NODES} x {GPUS_PER_NODE} GPUs at 1 Hz"
    if db is None:
        target(writing, "not measured (the server is not a local process)", "< 10 % of a core",
               None)  # fmt: skip
        print("database CPU: not measured (the PostgreSQL server is not a local process)")
    else:
        judged = target(writing, f"{db * 100:.2f} %", "< 10 % of a core", db < 0.10)
        print(f"database CPU for inserts: {db * 100:.2f} % of one core at 256 samples/s "
              f"(target < 10 %: {judged})")  # fmt: skip
    read_judged = {
        name: target(f"read: {name} (median)", ms(r["median_s"]), "< 50 ms", r["median_s"] < 0.05)
        for name, r in reads.items()
    }
    print()
    print(table(
        ["read (telemetry.selectors.series)", "source", "points", "median", "target"],
        [[name, r["source"], r["points"], ms(r["median_s"]),
          f"< 50 ms: {read_judged[name]}"] for name, r in reads.items()],
    ))  # fmt: skip
    print()
    print(table(
        ["history per GPU per day", "bytes/row", "per GPU-day"],
        [[k, f"{v['bytes_per_row']:.0f}", f"{v['bytes_per_gpu_day'] / 1024**2:.2f} MiB"]
         for k, v in size.items()],
    ))  # fmt: skip
    total = sum(v["bytes_per_gpu_day"] for v in size.values())
    steady = (
        size["raw samples (1 Hz)"]["bytes_per_gpu_day"] * 2
        + size["1-minute rollups"]["bytes_per_gpu_day"] * 30
        + size["1-hour rollups"]["bytes_per_gpu_day"] * 365
    )
    print(f"(raw kept 48 h, minutes 30 d, hours 1 y: about {steady / 1024**2:.0f} MiB per GPU "
          "at steady state)")  # fmt: skip
    return {"sampling": sampling, "nvml": nvml, "writes": writes, "reads": reads, "sizes": size,
            "total_bytes_per_gpu_day": total, "load_average": load[0]}  # fmt: skip
