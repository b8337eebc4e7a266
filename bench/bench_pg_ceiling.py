"""How far one PostgreSQL goes: the database server's own CPU per unit of the platform's work.

Figures, never assertions (docs/scale.md turns them into ceilings). Two probes:

- in-process (``make bench``, the throwaway test database): one Django connection, its
  backend's CPU read from /proc through psutil (so only when the server runs on this machine,
  and only that backend: the WAL writer and the checkpointer are not counted), per heartbeat
  (``node_heartbeat``, 32 nodes in turn), per GPU sample (``record_samples``, one 8-row INSERT
  per node and second, as an agent writes), and per task submitted and placed (``tasks_submit``
  in batches of 100, then one ``schedule_pass``: bench_service's round);
- end to end (``python bench/bench_pg_ceiling.py --live``, run with the settings of a running
  installation whose PostgreSQL serves nothing else on this machine): the whole server's CPU
  (the postmaster, every backend, and the children it reaped) and its commits, while the
  installation idles, then while ``--tasks N`` one-GPU ``true`` tasks go through the API
  (``--url``, ``--token``) and end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import psutil

NEEDS_DATABASE = True

HEARTBEATS = 2_000
SAMPLE_SECONDS = 20  # of estate time: 32 nodes x 8 GPUs each second


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


class BackendClock:
    """CPU seconds of this process's own PostgreSQL backend (None: the server is elsewhere)."""

    def __init__(self) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        try:
            self.process: psutil.Process | None = psutil.Process(pid)
            _cpu(self.process)
        except psutil.Error:
            self.process = None

    def read(self) -> float | None:
        return None if self.process is None else _cpu(self.process)


def measure(label: str, count: int, work) -> dict:
    clock = BackendClock()
    before, began = clock.read(), time.perf_counter()
    work()
    wall, after = time.perf_counter() - began, clock.read()
    db_cpu = None if before is None else after - before
    return {
        "what": label,
        "count": count,
        "wall_s": wall,
        "db_cpu_s": db_cpu,
        "db_cpu_us_each": None if db_cpu is None else db_cpu / count * 1e6,
        "per_db_core_s": None if not db_cpu else count / db_cpu,
    }


def in_process() -> list[dict]:
    import random

    from bench import bench_service
    from nodeagent.inventory import SimulatedBackend
    from scheduling.config import SimulatedGpus
    from scheduling.models import Node
    from scheduling.services import node_heartbeat
    from telemetry import services as telemetry

    tenants = bench_service.build_estate()
    nodes = list(Node.objects.filter(name__startswith="bench-").order_by("name"))
    results = [
        measure("heartbeat (node_heartbeat)", HEARTBEATS,
                lambda: [node_heartbeat(name=nodes[i % len(nodes)].name)
                         for i in range(HEARTBEATS)]),
    ]  # fmt: skip

    spec = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 8}
    backends = [SimulatedBackend(n.name, SimulatedGpus.model_validate(spec)) for n in nodes]
    holders = {n.pk: telemetry.gpu_holders(node=n) for n in nodes}
    base = time.time() - 3600

    def write_samples() -> None:
        for second in range(SAMPLE_SECONDS):
            for node, backend in zip(nodes, backends, strict=True):
                samples = [type(s)(**{**s.__dict__, "at": base + second}) for s in backend.sample()]
                telemetry.record_samples(node=node, samples=samples, holders=holders[node.pk])

    results.append(measure("GPU sample (8-row INSERT per node)",
                           SAMPLE_SECONDS * len(nodes) * 8, write_samples))  # fmt: skip

    rounds: list[dict] = []
    rng = random.Random(bench_service.SEED)

    def submit_and_place() -> None:
        rounds.append(bench_service.one_round(tenants, rng))

    tasks = (bench_service.EXCLUSIVE_TASKS + bench_service.SMALL_SHARES
             + bench_service.LARGE_SHARES)  # fmt: skip
    results.append(measure("task submitted and placed (batches of 100, one pass)", tasks,
                           submit_and_place))  # fmt: skip
    return results


def print_results(results: list[dict], title: str) -> None:
    from bench.common import table

    rows = [
        (r["what"], f"{r['count']:,}", f"{r['wall_s']:.2f} s",
         "-" if r["db_cpu_s"] is None else f"{r['db_cpu_us_each']:.0f} us",
         "-" if not r["per_db_core_s"] else f"{r['per_db_core_s']:,.0f}/s")
        for r in results
    ]  # fmt: skip
    print(title)
    print(table(("operation", "count", "wall", "PostgreSQL CPU each", "per PostgreSQL core"),
                rows))  # fmt: skip


def main() -> dict:
    from bench import bench_service
    from bench.common import clear_estate
    from telemetry.models import GpuSample
    from tenants.models import Tenant

    try:
        results = in_process()
    finally:  # bench_service makes the same tenants: leave none behind for it
        clear_estate(GpuSample._meta.db_table)
        Tenant.objects.filter(name__in=bench_service.TENANTS).delete()
    print_results(results, "in-process, one backend's CPU:")
    return {"in_process": results}


# --- End to end, against a running installation -----------------------------------------------


class ServerClock:
    """CPU seconds of a whole local PostgreSQL server: its postmaster, the processes it runs
    now, and those it reaped (the postmaster's children's times), plus its commits."""

    def __init__(self, connection) -> None:
        self.connection = connection
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.postmaster = psutil.Process(cursor.fetchone()[0]).parent()

    def cpu(self) -> float:
        own = self.postmaster.cpu_times()
        total = own.user + own.system + own.children_user + own.children_system
        for child in self.postmaster.children():
            try:
                total += _cpu(child)
            except psutil.NoSuchProcess:
                pass  # gone between the listing and the read: counted once it is reaped
        return total

    def commits(self) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT sum(xact_commit) FROM pg_stat_database")
            return int(cursor.fetchone()[0])

    def window(self) -> tuple[float, int, float]:
        return self.cpu(), self.commits(), time.perf_counter()


def delta(start: tuple[float, int, float], end: tuple[float, int, float]) -> dict:
    cpu, commits, wall = (b - a for a, b in zip(start, end, strict=True))
    return {"wall_s": wall, "db_cpu_s": cpu, "commits": commits,
            "db_core_share": cpu / wall, "commits_per_s": commits / wall}  # fmt: skip


def api(url: str, token: str, method: str, path: str, body=None):
    request = urllib.request.Request(  # noqa: S310 - the operator's own URL
        url.rstrip("/") + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                 "Accept": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
        return json.loads(response.read() or b"null")


def live(args: argparse.Namespace) -> dict:
    import django

    django.setup()
    from django.db import connection

    from scheduling.models import Node, Task

    clock = ServerClock(connection)
    agents = Node.objects.exclude(state="offline").count()
    start = clock.window()
    time.sleep(args.seconds)
    idle = delta(start, clock.window())
    idle["agents"] = agents
    print(f"idle, {agents} node agent(s) (+ web, scheduler), {idle['wall_s']:.0f} s: "
          f"PostgreSQL {idle['db_core_share'] * 100:.2f} % of a core, "
          f"{idle['commits_per_s']:.1f} commits/s")  # fmt: skip
    result = {"idle": idle}
    if args.tasks:
        first = Task.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        start = clock.window()
        for offset in range(0, args.tasks, 100):
            size = min(100, args.tasks - offset)
            specs = [{"name": f"ceiling-{offset + i}", "command": "true",
                      "resources": {"gpus": 1}} for i in range(size)]  # fmt: skip
            api(args.url, args.token, "POST", "/api/v1/tasks/", specs)
        ended = {"succeeded", "failed", "cancelled"}
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            states = Task.objects.filter(pk__gt=first).values_list("state", flat=True)
            if len(states) >= args.tasks and all(state in ended for state in states):
                break
            time.sleep(0.2)
        busy = delta(start, clock.window())
        busy["tasks"] = Task.objects.filter(pk__gt=first, state__in=ended).count()
        busy["db_cpu_ms_per_task"] = busy["db_cpu_s"] / max(1, busy["tasks"]) * 1e3
        busy["commits_per_task"] = busy["commits"] / max(1, busy["tasks"])
        busy["tasks_per_s"] = busy["tasks"] / busy["wall_s"]
        print(f"{busy['tasks']} tasks ended in {busy['wall_s']:.1f} s "
              f"({busy['tasks_per_s']:.1f}/s): PostgreSQL "
              f"{busy['db_cpu_ms_per_task']:.2f} ms CPU and "
              f"{busy['commits_per_task']:.1f} commits per task, idle included")  # fmt: skip
        result["tasks"] = busy
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", action="store_true", help="measure a running installation")
    parser.add_argument("--seconds", type=float, default=20, help="idle window")
    parser.add_argument("--tasks", type=int, default=0, help="true tasks to run through the API")
    parser.add_argument("--url", default=os.environ.get("GPUCTL_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("GPUCTL_TOKEN", ""))
    parser.add_argument("--timeout", type=float, default=300)
    return parser.parse_args(argv)


if __name__ == "__main__":
    ROOT = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    options = parse_args(sys.argv[1:])
    if not options.live:
        sys.exit("in-process figures come from `python bench/run.py pg_ceiling`; --live here")
    print(json.dumps(live(options), indent=2))
