"""The task API over HTTP: POST /api/v1/tasks/ (one task, 1,000 tasks) and GET ?limit=50.

The web server runs as `make run` starts it (daphne, ``gpuplatform.asgi``, two processes on
one socket, each borrowing its database connections from its own bounded pool), and as one
process for comparison, on a free loopback port against the bench database, with
``Q_SYNC=0`` (a submission's pass request is queued in the broker, as in production; no
scheduler runs, so nothing is placed) and ``LAUNCH_TASKS=0``, the throttle raised out of the
way. One node of 8 simulated GPUs makes a 1-GPU spec acceptable. CLIENTS
processes, one tenant and token each, send their share of the requests over one keep-alive
``http.client.HTTPConnection`` apiece: a warm-up, then POSTS submissions, then GETS listings (a
phase stops at PHASE_LIMIT_S, so a slow server cannot stretch the run); each request's latency
is recorded; then one client sends BATCHES submissions of BATCH_TASKS specs each. The same
load then goes to the WSGI app (``gpuplatform.wsgi``) under gunicorn, the alternative NOTES.md
suggests, with sync workers and with gthread workers, when gunicorn is installed. Tasks, the
broker queue and the cache (throttle history) are emptied between servers. Clients share the
CPUs with the server and PostgreSQL; CPU time per request is measured for each, the number of
database connections each server opened and the most it held at once, against its cap.
Targets are issue 9's: 300 single-task submissions a second from 8 clients with no error, a
1,000-task batch at 2,000 tasks a second, connections within the cap.
"""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import os
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import psycopg
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django_q.models import OrmQ

from bench.common import (
    CPUS,
    GTHREAD_THREADS,
    MAKE_RUN_WEB_WORKERS,
    ClientJob,
    api_client,
    clear_tasks,
    merge_clients,
    ms,
    percentile,
    table,
    target,
    web_server,
)
from gpuplatform.dburl import current_database_url
from nodeagent.inventory import simulated_uuid
from scheduling.models import GPU, Node, Pool, Task
from tenants import services as tenant_services
from tenants.models import Membership, Role, Tenant

NEEDS_DATABASE = True

CLIENTS = 8  # client processes = connections = tenants (issue 9: "8 clients")
POSTS = 2_000
GETS = 2_000
WARMUP = 120  # of each kind, not recorded
PHASE_LIMIT_S = 7.0  # a phase stops early here, so a slow server cannot stretch the run
WARMUP_LIMIT_S = 1.0
GET_PATH = "/api/v1/tasks/?limit=50"
POST_PATH = "/api/v1/tasks/"
BATCH_TASKS = 1_000  # one POST of this many specs (the most one submission may hold)
BATCHES = 3  # sent one after another by one client
# (kind, worker processes): daphne's processes share one socket (gpuplatform.webserve, as
# `make run` starts WEB_WORKERS of them); gunicorn's sync workers close the connection after
# each answer, its gthread workers keep it alive (each worker then serves several connections
# in threads).
SERVERS = (("daphne", 1), ("daphne", 2), ("gunicorn", 2), ("gunicorn", 4), ("gthread", 2))
TARGET_SUBMITS_PER_S = 300  # issue 9: 8 clients, one task each, 0 errors
TARGET_BATCH_TASKS_PER_S = 2_000  # issue 9: a 1,000-task batch
TARGET_P99_S = 0.050  # listings only
STOP_GRACE_S = 10.0


# --- Servers -------------------------------------------------------------------------------------


def server_env() -> dict[str, str]:
    environ = dict(os.environ)
    environ.pop("DEBUG", None)
    environ.update(
        DATABASE_URL=current_database_url(),
        DJANGO_SETTINGS_MODULE="gpuplatform.settings",
        GPUPLATFORM_TESTING="1",
        Q_SYNC="0",
        LAUNCH_TASKS="0",
        API_THROTTLE_RATE="1000000/min",
        API_THROTTLE_BURST="1000000",  # the pace allows this many at once
    )
    return environ


def cpu_by_pid(proc: subprocess.Popen) -> tuple[dict[int, float], dict[int, float]]:
    """CPU seconds so far of the server's processes, and of PostgreSQL's backends serving the
    bench database (their titles name it)."""
    server: dict[int, float] = {}
    try:
        parent = psutil.Process(proc.pid)
        for p in [parent, *parent.children(recursive=True)]:
            server[p.pid] = sum(p.cpu_times()[:2])
    except psutil.Error:
        pass
    database: dict[int, float] = {}
    title = f" {connection.settings_dict['NAME']} "
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or [""]
        if cmdline[0].startswith("postgres:") and title in cmdline[0]:
            try:
                database[p.pid] = sum(p.cpu_times()[:2])
            except psutil.Error:
                pass
    return server, database


def _spent(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def machine_busy() -> tuple[float, float]:
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle, sum(times)


# --- The estate and the load -------------------------------------------------------------------


def build_estate(prefix: str = "bench-api") -> list[str]:
    """One node of 8 GPUs (``<prefix>-0``); CLIENTS tenants, each with a member and a token,
    named after ``prefix``. Returns the tokens."""
    pool, _ = Pool.objects.get_or_create(name="default")
    node = Node.objects.create(name=f"{prefix}-0", pool=pool, backend="simulated")
    GPU.objects.bulk_create(
        GPU(node=node, index=i, uuid=simulated_uuid(node.name, i),
            model="NVIDIA GeForce RTX 4090", gpu_type="rtx4090-24g", memory_mb=24 * 1024)
        for i in range(8)
    )  # fmt: skip
    secrets = []
    user_model = get_user_model()
    for i in range(CLIENTS):
        tenant = Tenant.objects.create(name=f"{prefix}-{i}")
        user = user_model.objects.create_user(username=f"{prefix}-{i}", password=None)
        Membership.objects.create(user=user, tenant=tenant, role=Role.MEMBER)
        _, secret = tenant_services.apitoken_create(user=user, tenant=tenant, name="bench")
        secrets.append(secret)
    return secrets


def reset() -> None:
    """Empty tasks, the broker's queue, the scheduler's flag and the cache between servers."""
    clear_tasks(OrmQ._meta.db_table, settings.CACHES["default"]["LOCATION"])
    connection.close()  # no connection of ours crosses a fork


def run_phase(pool, port: int, secrets: list[str], method: str, path: str, total: int,
              proc: subprocess.Popen, label: str, limit_s: float, clients: int = CLIENTS,
              batch: int = 0) -> dict:  # fmt: skip
    start_at = time.perf_counter() + 0.2
    jobs = [
        ClientJob(port, secrets[i % len(secrets)], method, path,
                  total // clients + (i < total % clients), start_at, limit_s, f"{label}-{i}",
                  batch=batch)
        for i in range(clients)
    ]  # fmt: skip
    result = pool.map_async(api_client, jobs)
    time.sleep(max(0.0, start_at - time.perf_counter()))
    (server_before, db_before), (busy_before, all_before) = cpu_by_pid(proc), machine_busy()
    parts = result.get()
    (server_after, db_after), (busy_after, all_after) = cpu_by_pid(proc), machine_busy()

    merged = merge_clients(parts)
    latencies, statuses, wall, errors = (merged.latencies, merged.statuses, merged.wall_s,
                                         merged.errors)  # fmt: skip
    return {
        "tasks_per_s": (len(latencies) - errors) * max(1, batch) / wall,
        "requests": len(latencies),
        "planned": total,
        "wall_s": wall,
        "per_s": len(latencies) / wall,
        "p50_s": percentile(latencies, 50),
        "p90_s": percentile(latencies, 90),
        "p99_s": percentile(latencies, 99),
        "max_s": latencies[-1],
        "errors": errors,
        "statuses": dict(statuses),
        "error_sample": merged.error_sample,
        "connects": sum(p["connects"] for p in parts),
        "server_cpu_ms_per_request": _spent(server_before, server_after) * 1000 / len(latencies),
        "db_cpu_ms_per_request": _spent(db_before, db_after) * 1000 / len(latencies),
        "client_cpu_ms_per_request": sum(p["cpu_s"] for p in parts) * 1000 / len(latencies),
        "machine_busy_pct": 100 * (busy_after - busy_before) / max(1e-9, all_after - all_before),
    }


def check_tasks(expected: int) -> dict:
    """What the submissions left in the database: all pending, passes only queued."""
    states = dict(Counter(Task.objects.values_list("state", flat=True)))
    # Each queued pass also books a check, a moment later, that it started: not a pass.
    queued = sum(row.name() != "scheduling-stall-check" for row in OrmQ.objects.all())
    connection.close()
    return {"tasks": sum(states.values()), "expected": expected, "states": states,
            "passes_queued": queued}  # fmt: skip


def measure_server(pool, kind: str, workers: int, secrets: list[str], tmp: Path) -> dict:
    reset()
    sessions = db_sessions()
    began = time.perf_counter()
    with (
        web_server(kind, workers, tmp, server_env(), grace_s=STOP_GRACE_S) as (port, proc),
        ConnectionPeak() as peak,
    ):
        startup_s = time.perf_counter() - began
        phase = functools.partial(run_phase, pool, port, secrets, proc=proc)
        warm = phase("POST", POST_PATH, WARMUP, label="warm", limit_s=WARMUP_LIMIT_S)
        warm_get = phase("GET", GET_PATH, WARMUP, label="warm", limit_s=WARMUP_LIMIT_S)
        post = phase("POST", POST_PATH, POSTS, label="bench", limit_s=PHASE_LIMIT_S)
        get = phase("GET", GET_PATH, GETS, label="bench", limit_s=PHASE_LIMIT_S)
        batch = phase("POST", POST_PATH, BATCHES, label="batch", limit_s=60.0, clients=1,
                      batch=BATCH_TASKS)  # fmt: skip
        requests = sum(p["requests"] for p in (warm, warm_get, post, get, batch))
    sessions = db_sessions() - sessions  # the server has exited: its backends' stats are in
    accepted = sum(p["requests"] - p["errors"] for p in (warm, post))
    db = check_tasks(expected=accepted + (batch["requests"] - batch["errors"]) * BATCH_TASKS)
    db["sessions"], db["sessions_per_request"] = sessions, sessions / requests
    db["peak_connections"], db["connection_cap"] = peak.peak, connection_cap(kind, workers)
    return {"server": kind, "workers": workers, "startup_s": startup_s, "post": post,
            "get": get, "batch": batch, "database": db}  # fmt: skip


def connection_cap(kind: str, workers: int) -> int:
    """The most PostgreSQL connections the server may open: DB_POOL_SIZE per process."""
    return workers * settings.DB_POOL_SIZE


class ConnectionPeak:
    """The most connections to the bench database at once, sampled every 20 ms from a
    connection of its own (not counted) while the server runs."""

    def __init__(self) -> None:
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ConnectionPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        with psycopg.connect(current_database_url(), autocommit=True) as watcher:
            name = watcher.info.dbname
            while not self._done.is_set():
                (count,) = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid()",
                    (name,),
                ).fetchone()
                self.peak = max(self.peak, count)
                time.sleep(0.02)


def db_sessions() -> int:
    """Connections ever opened to the bench database (PostgreSQL >= 14 counts them)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        sessions = cursor.fetchone()[0]
    connection.close()  # not to be counted among the server's connections
    return sessions


def gunicorn_version() -> str | None:
    if importlib.util.find_spec("gunicorn") is None:
        return None
    from importlib.metadata import version

    return version("gunicorn")


def label_of(run: dict) -> str:
    if run["server"] == "daphne":
        default = " as make run" if run["workers"] == MAKE_RUN_WEB_WORKERS else ""
        return f"daphne (ASGI, {run['workers']} process{'es' * (run['workers'] > 1)}{default})"
    if run["server"] == "gthread":
        return f"gunicorn -w {run['workers']} --threads {GTHREAD_THREADS} (WSGI, gthread)"
    return f"gunicorn -w {run['workers']} (WSGI, sync)"


def met_targets(run: dict) -> bool:
    """Issue 9's API targets: single-task submissions per second with 0 errors, a batch's
    tasks per second, connections within the cap."""
    post, batch, db = run["post"], run["batch"], run["database"]
    return (
        post["errors"] == 0
        and batch["errors"] == 0
        and post["per_s"] >= TARGET_SUBMITS_PER_S
        and batch["tasks_per_s"] >= TARGET_BATCH_TASKS_PER_S
        and db["peak_connections"] <= db["connection_cap"]
    )


def main() -> dict:
    secrets = build_estate()
    version = gunicorn_version()
    servers = [(kind, n) for kind, n in SERVERS if version or kind == "daphne"]
    skipped = None if version else "gunicorn is not installed (pip install gunicorn)"

    load = os.getloadavg()[0]
    connection.close()  # the client processes are forked: they must not share it
    runs = []
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp, context.Pool(CLIENTS) as pool:
        for kind, workers in servers:
            runs.append(measure_server(pool, kind, workers, secrets, Path(tmp)))
    reset()  # leave an empty queue behind: the next benchmark wants an idle cluster

    print(f"{CLIENTS} client processes (one keep-alive connection and one tenant each), "
          f"{WARMUP} + {WARMUP} warm-up requests, then {POSTS:,} POST {POST_PATH} (1-GPU JSON "
          f"spec) and {GETS:,} GET {GET_PATH}, then one client sends {BATCHES} POSTs of "
          f"{BATCH_TASKS:,} specs each; {CPUS} CPUs shared by clients, server "
          f"and PostgreSQL; database {connection.settings_dict['NAME']}")  # fmt: skip
    print("server environment: Q_SYNC=0 (a pass is queued, not run), LAUNCH_TASKS=0, no "
          "scheduler, API_THROTTLE_RATE=1000000/min")  # fmt: skip
    busy = " (other work is running: figures are pessimistic)" if load > 0.5 * CPUS else ""
    print(f"load average before the run: {load:.2f}{busy}")
    if version:
        print(f"gunicorn {version}: sync workers answer 'Connection: close', so each of their "
              "requests includes a new TCP connect (counted in its latency); gthread workers "
              "keep connections alive")  # fmt: skip
    print()
    header = ["server", "request", "requests", "req/s", "p50", "p90", "p99", "max", "errors",
              "connects", "target"]  # fmt: skip
    rows = []
    for run in runs:
        for name, phase, goal, clients in (
            ("POST", run["post"], f">= {TARGET_SUBMITS_PER_S}/s, 0 errors", CLIENTS),
            ("GET", run["get"], "p99 < 50 ms", CLIENTS),
            (f"POST x{BATCH_TASKS:,}", run["batch"], f">= {TARGET_BATCH_TASKS_PER_S:,} tasks/s", 1),
        ):
            errors = f"{phase['errors']:,} errors"
            cell = goal
            if name == "POST":
                met = phase["errors"] == 0 and phase["per_s"] >= TARGET_SUBMITS_PER_S
                value = f"{phase['per_s']:,.0f}/s, {errors}"
            elif name == "GET":
                met = phase["errors"] == 0 and phase["p99_s"] < TARGET_P99_S
                value = f"p99 {ms(phase['p99_s'])}, {errors}"
            else:
                met = phase["errors"] == 0 and phase["tasks_per_s"] >= TARGET_BATCH_TASKS_PER_S
                value = f"{phase['tasks_per_s']:,.0f} tasks/s, {errors}"
                cell = f"{phase['tasks_per_s']:,.0f} tasks/s; {goal}"
            phase["target_met"] = met
            judged = target(f"{label_of(run)}: {name}, {clients} client(s)", value, goal, met)
            done = f"{phase['requests']:,}" + ("*" if phase["requests"] < phase["planned"] else "")
            rows.append([label_of(run), name, done, f"{phase['per_s']:,.0f}",
                         ms(phase["p50_s"]), ms(phase["p90_s"]), ms(phase["p99_s"]),
                         ms(phase["max_s"]), f"{phase['errors']:,}", f"{phase['connects']:,}",
                         f"{cell}: {judged}"])  # fmt: skip
    print(table(header, rows, left=2))
    if any(run[n]["requests"] < run[n]["planned"] for run in runs for n in ("post", "get")):
        print(f"* stopped at the {PHASE_LIMIT_S:.0f} s limit of a phase before all its requests")
    print()
    print(f"CPU per request (user + system) and the ceiling it implies on {CPUS} CPUs if the "
          f"clients ran elsewhere; {TARGET_SUBMITS_PER_S}/s leaves "
          f"{CPUS * 1000 / TARGET_SUBMITS_PER_S:.1f} ms of CPU per request in all")  # fmt: skip
    rows = []
    unseen = False
    for run in runs:
        # Backends that live for one request come and go between the samples: not counted.
        fleeting = run["database"]["sessions_per_request"] >= 0.5
        unseen = unseen or fleeting
        for name in ("post", "get"):
            phase = run[name]
            own = phase["server_cpu_ms_per_request"] + phase["db_cpu_ms_per_request"]
            phase["ceiling_per_s"] = CPUS * 1000 / own if own > 0 else float("nan")
            db_ms = "n/a +" if fleeting else f"{phase['db_cpu_ms_per_request']:.2f}"
            ceiling = f"{'< ' if fleeting else ''}{phase['ceiling_per_s']:,.0f}"
            rows.append([label_of(run), name.upper(), f"{phase['server_cpu_ms_per_request']:.2f}",
                         db_ms, f"{phase['client_cpu_ms_per_request']:.2f}",
                         f"{phase['machine_busy_pct']:.0f}%", ceiling])  # fmt: skip
    header = ["server", "request", "server ms", "PostgreSQL ms", "clients ms", "machine busy",
              "ceiling req/s"]  # fmt: skip
    print(table(header, rows, left=2))
    if unseen:
        print("+ a new PostgreSQL connection per request: each backend lives for one request "
              "and its CPU (connection start included) is not counted")  # fmt: skip
    print()
    for run in runs:
        db = run["database"]
        states = ", ".join(f"{n:,} {s}" for s, n in sorted(db["states"].items()))
        print(f"{label_of(run)}: up in {run['startup_s']:.1f} s; {db['tasks']:,} tasks in the "
              f"database ({states}; {db['expected']:,} accepted); {db['passes_queued']} pass "
              f"request(s) queued in the broker, none run; {db['sessions']:,} PostgreSQL "
              f"connections opened ({db['sessions_per_request']:.2f} per request), at most "
              f"{db['peak_connections']} at once (cap: {db['connection_cap']}, workers x "
              f"DB_POOL_SIZE)")  # fmt: skip
        for name in ("post", "get", "batch"):
            if run[name]["errors"]:
                print(f"  {name.upper()} errors {run[name]['statuses']}, e.g. "
                      f"{run[name]['error_sample']}")  # fmt: skip
    if skipped:
        print(f"WSGI comparison skipped: {skipped}")

    for run in runs:
        run["target_met"] = met_targets(run)
    winners = [label_of(run) for run in runs if run["target_met"]]
    best = max(runs, key=lambda run: run["post"]["per_s"])
    daphne = runs[0]
    line = (
        f"conclusion: targets (>= {TARGET_SUBMITS_PER_S} submissions/s with 0 errors, "
        f">= {TARGET_BATCH_TASKS_PER_S:,} tasks/s in a batch, connections within the cap) met by "
        f"{', '.join(winners) if winners else 'no server measured'}; fastest submissions: "
        f"{label_of(best)} at {best['post']['per_s']:,.0f}/s"
    )
    if best is not daphne:
        line += f" ({best['post']['per_s'] / daphne['post']['per_s']:.1f}x daphne)"
    print(line)
    cost = best["post"]["server_cpu_ms_per_request"] + best["post"]["db_cpu_ms_per_request"]
    budget = CPUS * 1000 / TARGET_SUBMITS_PER_S
    if not winners and cost > budget:
        print(f"  a submission costs {cost:.1f} ms of server + PostgreSQL CPU even there; "
              f"{TARGET_SUBMITS_PER_S}/s on {CPUS} CPUs allows {budget:.1f} ms: the request "
              "path, not the server, is the limit")  # fmt: skip
    return {
        "clients": CLIENTS,
        "posts": POSTS,
        "gets": GETS,
        "gunicorn": version,
        "skipped": skipped,
        "target_submits_per_s": TARGET_SUBMITS_PER_S,
        "target_batch_tasks_per_s": TARGET_BATCH_TASKS_PER_S,
        "target_p99_s": TARGET_P99_S,
        "load_average": load,
        "met_by": winners,
        "runs": runs,
    }
