"""The platform's own parts against the stock components they replace, on and off in one run.

Three parts replace a framework's own (``GPUPLATFORM_STOCK``, docs/configuration.md): the ASGI
handler (``asgi``: Django's ``ASGIHandler``), the garbage collector's settings (``gc``: the
interpreter's defaults) and the broker (``broker``: django-q2's ORM broker, polling). Each is
measured with the part and with the stock component, in alternating rounds (the order reversed
every other round, so that a machine getting busier or quieter weighs on both alike); each
figure is the median of its rounds, and the spread (slowest round against fastest, as a share
of the median) says how much the rounds disagreed. Rounds are compared in pairs, the part and
stock measured next to each other: the gain is the median of the pairs' gains, printed with
their range, and counts ("kept") only when the part won so many of the pairs that noise alone
would do so less than one time in twenty (a sign test: 5 of 5, 7 of 8).

Web parts: one daphne process (``gpuplatform.asgi``, as `make run` starts each of its two) on a
free loopback port against the bench database, ``Q_SYNC=0`` and ``LAUNCH_TASKS=0`` as in the
api bench, started afresh for each configuration in each round: warm-up, then CLIENTS client
processes POST one-task specs for POST_LIMIT_S, then one client POSTs BATCHES lists of
BATCH_TASKS specs. Figures: the web process's CPU per single-task POST (asgi), and per
1,000-task POST (gc).

The broker: a scheduler (``manage.py scheduler``) and one node agent taking its own queue, as the
latency bench starts them, started afresh for each configuration in each round; BROKER_TASKS
``true`` tasks submitted one at a time on the idle cluster. Figures: submit -> running
(``Task.started_at - Task.submitted_at``: a pass request and a launch each cross a queue), and
PostgreSQL transactions a second while the two clusters sit idle.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from django.db import connection
from django_q.conf import Conf
from django_q.models import OrmQ

from bench.bench_api import build_estate, reset, run_phase, server_env
from bench.bench_latency import child_env, run_one, through_the_broker
from bench.common import (
    CPUS,
    Proc,
    clear_tasks,
    close_other_sessions,
    median,
    stop_all,
    table,
    wait_for,
    web_server,
)
from scheduling.models import GPU, Node, Task
from tenants.models import Tenant

NEEDS_DATABASE = True
PREFIX = "bench-stock"  # its node and tenants

ROUNDS = 8  # of each configuration, alternating
CLIENTS = 8
WARMUP = 120
POSTS = 4_000  # at most; POST_LIMIT_S stops the phase first at today's speed
POST_LIMIT_S = 3.0
BATCH_TASKS = 1_000
BATCHES = 6
BROKER_ROUNDS = 5
BROKER_TASKS = 6  # per round, after BROKER_WARMUP
BROKER_WARMUP = 2
IDLE_S = 4.0
NODE = "bench-stock-1"
CONFIG = f"""\
heartbeat: {{interval: 1s, offline_after: 30s}}
nodes:
  - name: {NODE}
    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: 4}}
"""
# (part, what it replaces): the web parts share one server per configuration and round.
WEB_PARTS = ("asgi", "gc")
REPLACES = {
    "asgi": "Django's ASGIHandler",
    "gc": "the interpreter's GC defaults",
    "broker": "django-q2's ORM broker (polls every Conf.POLL s)",
}


# --- Rounds and verdicts -----------------------------------------------------------------------


def alternating(configs: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, configuration): each round runs every configuration, in reverse order every
    other round (A B C, C B A, A B C...)."""
    order = []
    for n in range(rounds):
        order += [(n, config) for config in (configs if n % 2 == 0 else configs[::-1])]
    return order


def wins_needed(pairs: int) -> int | None:
    """The fewest of ``pairs`` paired rounds one side must win for noise alone (each side
    winning a pair at even odds) to do that less than one time in twenty; None: never."""
    for wins in range(pairs + 1):
        if sum(math.comb(pairs, k) for k in range(wins, pairs + 1)) / 2**pairs < 0.05:
            return wins
    return None


def compare(ours: list[float], stock: list[float]) -> dict:
    """Lower is better for every figure here; ``ours[n]`` and ``stock[n]`` are round n's.
    ``verdict``: "kept" when the part won enough pairs (``wins_needed``), "stock is better"
    when stock did, otherwise "within noise"."""
    with_part, without = median(ours), median(stock)
    spread = max(
        (max(values) - min(values)) / median(values) if median(values) else 0.0
        for values in (ours, stock)
    )
    gains = [100 * (s - o) / s for o, s in zip(ours, stock, strict=True) if s]
    needed = wins_needed(len(gains))
    won, lost = sum(gain > 0 for gain in gains), sum(gain < 0 for gain in gains)
    if needed is None:
        verdict = "too few rounds to judge"
    elif won >= needed:
        verdict = f"kept: won {won} of {len(gains)} rounds"
    elif lost >= needed:
        verdict = f"stock is better: won {lost} of {len(gains)}"
    else:
        verdict = f"within noise ({won} of {len(gains)}): use stock"
    return {
        "with": with_part,
        "stock": without,
        "gain_pct": median(gains) if gains else 0.0,
        "gains_pct": gains,
        "spread_pct": 100 * spread,
        "rounds_with": ours,
        "rounds_stock": stock,
        "rounds_won": won,
        "verdict": verdict,
    }


# --- Web parts ---------------------------------------------------------------------------------


def drop_estate() -> None:
    GPU.objects.filter(node__name=f"{PREFIX}-0").delete()
    Node.objects.filter(name=f"{PREFIX}-0").delete()


def measure_web(pool, secrets: list[str], stock: str, tmp: Path) -> dict:
    """One server with ``GPUPLATFORM_STOCK=stock``: CPU per single POST and per batch POST."""
    reset()
    environ = {**server_env(), "GPUPLATFORM_STOCK": stock}
    with web_server("daphne", 1, tmp, environ, label=f"web-{stock or 'ours'}") as (port, proc):

        def phase(total: int, label: str, limit_s: float, clients: int = CLIENTS, batch: int = 0):
            return run_phase(pool, port, secrets, "POST", "/api/v1/tasks/", total, proc=proc,
                             label=label, limit_s=limit_s, clients=clients,
                             batch=batch)  # fmt: skip

        phase(WARMUP, "warm", 1.0)
        phase(1, "warm-batch", 30.0, clients=1, batch=BATCH_TASKS)
        post = phase(POSTS, "post", POST_LIMIT_S)
        batch = phase(BATCHES, "batch", 60.0, clients=1, batch=BATCH_TASKS)
    errors = post["errors"] + batch["errors"]
    if errors:
        print(f"  {stock or 'ours'}: {errors} errors, e.g. "
              f"{post['error_sample'] or batch['error_sample']}")  # fmt: skip
    return {
        "post_per_s": post["per_s"],
        "post_web_ms": post["server_cpu_ms_per_request"],
        "post_web_db_ms": post["server_cpu_ms_per_request"] + post["db_cpu_ms_per_request"],
        "batch_web_ms": batch["server_cpu_ms_per_request"],
        "errors": errors,
    }


def web_rounds() -> dict[str, list[dict]]:
    secrets = build_estate(PREFIX)
    connection.close()  # the client processes are forked: they must not share it
    configs = ["", *WEB_PARTS]
    runs: dict[str, list[dict]] = {config: [] for config in configs}
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="bench-stock-") as tmp, context.Pool(CLIENTS) as pool:
        for n, config in alternating(configs, ROUNDS):
            run = measure_web(pool, secrets, config, Path(tmp))
            runs[config].append(run)
            print(f"  round {n + 1}, {config or 'all ours'}: {run['post_per_s']:,.0f} POST/s, "
                  f"web {run['post_web_ms']:.2f} ms, web + PostgreSQL "
                  f"{run['post_web_db_ms']:.2f} ms per POST; web {run['batch_web_ms']:,.0f} ms "
                  f"per {BATCH_TASKS:,}-task POST", flush=True)  # fmt: skip
    reset()
    drop_estate()
    return runs


# --- The broker --------------------------------------------------------------------------------


@contextmanager
def enqueue_as(stock: bool):
    """This process queues its pass requests through the broker the clusters run."""
    saved = Conf.BROKER_CLASS
    if stock:
        Conf.BROKER_CLASS = None
    try:
        yield
    finally:
        Conf.BROKER_CLASS = saved


# PostgreSQL's backends publish their statistics at most once a second (PGSTAT_MIN_INTERVAL).
STATS_SETTLE_S = 1.5


def transactions_ended() -> int:
    """Transactions this database has ended so far (a statement outside one is one), read once
    the backends have published their statistics."""
    time.sleep(STATS_SETTLE_S)
    with connection.cursor() as cursor:
        # A statement of its own: in the reading one, the backend's cached view stayed stale.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def idle_transactions_per_s(procs: list[Proc]) -> float:
    """PostgreSQL transactions a second on the bench database while nothing is submitted, less
    the two of ``transactions_ended`` itself (heartbeats and samples are the same both ways)."""
    before = transactions_ended()
    began = time.monotonic()
    while time.monotonic() - began < IDLE_S:
        for p in procs:
            p.check()
        time.sleep(0.25)
    after = transactions_ended()
    return (after - before - 2) / (time.monotonic() - began)


def measure_broker(tenant: Tenant, stock: bool, tmp: Path, config: Path) -> dict:
    clear_tasks(OrmQ._meta.db_table)  # no wake-up booked by the last round's scheduler
    environ = {**child_env(tmp, config), "GPUPLATFORM_STOCK": "broker" if stock else ""}
    procs: list[Proc] = []
    latencies: list[float] = []
    try:
        procs.append(Proc("scheduler", [sys.executable, "manage.py", "scheduler"], environ, tmp))
        argv = [sys.executable, "manage.py", "node_agent", "--backend", "simulated",
                "--config", str(config), "--node", NODE]  # fmt: skip
        procs.append(Proc("agent", argv, environ, tmp))
        registered = Node.objects.filter(name=NODE, gpus__isnull=False).exists
        wait_for(f"node {NODE} to register", registered, 60, procs)
        with through_the_broker(), enqueue_as(stock):
            for n in range(BROKER_WARMUP):  # the first also waits for both clusters
                run_one(tenant, -1 - n, procs, timeout=60)
            idle = idle_transactions_per_s(procs)
            for n in range(BROKER_TASKS):
                task_id, ran = run_one(tenant, n, procs, timeout=20)
                if ran:
                    task = Task.objects.values("submitted_at", "started_at").get(pk=task_id)
                    latencies.append((task["started_at"] - task["submitted_at"]).total_seconds())
    except Exception:
        for p in procs:
            print(f"--- {p.name} log ({p.log}) ---\n{p.tail()}", flush=True)
        raise
    finally:
        stop_all(procs)
        close_other_sessions()
    return {"latency_s": median(latencies), "idle_per_s": idle, "tasks": len(latencies)}


def broker_rounds() -> dict[str, list[dict]]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuplatform-bench-stock-"))
    tmp.chmod(0o711)  # run as root, tasks run as their tenant's user and must reach their root
    config = tmp / "estate.yaml"
    config.write_text(CONFIG)
    tenant, _ = Tenant.objects.get_or_create(name="bench-stock-broker")
    runs: dict[str, list[dict]] = {"": [], "broker": []}
    try:
        for n, stock in alternating(["", "broker"], BROKER_ROUNDS):
            run = measure_broker(tenant, stock == "broker", tmp, config)
            runs[stock].append(run)
            print(f"  round {n + 1}, {'stock' if stock else 'ours'}: submit -> running "
                  f"{run['latency_s'] * 1000:.1f} ms (median of {run['tasks']}), idle "
                  f"{run['idle_per_s']:.1f} transactions/s", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        clear_tasks(OrmQ._meta.db_table)
    return runs


# --- Report --------------------------------------------------------------------------------------


def figure(runs: dict[str, list[dict]], part: str, key: str) -> dict:
    return compare([run[key] for run in runs[""]], [run[key] for run in runs[part]])


FIGURES: tuple[tuple[str, str, str, Callable[[float], str]], ...] = (
    # (part, key, what, format)
    ("asgi", "post_web_ms", "web CPU per 1-task POST", lambda v: f"{v:.2f} ms"),
    ("gc", "batch_web_ms", f"web CPU per {BATCH_TASKS:,}-task POST", lambda v: f"{v:,.1f} ms"),
    ("broker", "latency_s", "submit -> running, idle cluster", lambda v: f"{v * 1000:.1f} ms"),
)


def main() -> dict:
    load = os.getloadavg()[0]
    busy = " (other work is running: figures are noisy)" if load > 0.5 * CPUS else ""
    print(f"load average before the run: {load:.2f} on {CPUS} CPUs{busy}")
    print(
        f"web parts: one daphne process, {CLIENTS} clients, {ROUNDS} rounds of each "
        "configuration (all ours; then each part stock in turn), alternating",
        flush=True,
    )
    web = web_rounds()
    print(
        f"broker: scheduler and one node agent, {BROKER_ROUNDS} rounds each way, alternating; "
        f"{BROKER_TASKS} tasks a round; stock polls every {Conf.POLL} s",
        flush=True,
    )
    broker = broker_rounds()
    print()
    results = {}
    rows = []
    for part, key, what, fmt in FIGURES:
        runs = broker if part == "broker" else web
        result = figure(runs, part, key)
        result.update(figure=what, replaces=REPLACES[part])
        results[part] = result
        gains = result["gains_pct"]
        rows.append([part, what, fmt(result["with"]), fmt(result["stock"]),
                     f"{result['gain_pct']:+.0f}%", f"{min(gains):+.0f}% .. {max(gains):+.0f}%",
                     f"{result['spread_pct']:.0f}%", result["verdict"]])  # fmt: skip
    print(table(["part", "figure (lower is better)", "with", "stock", "gain", "gain by round",
                 "spread", "verdict"], rows, left=2))  # fmt: skip
    idle = figure(broker, "broker", "idle_per_s")
    rates = {config: median([run["post_per_s"] for run in web[config]]) for config in web}
    print(f"also: idle clusters {idle['with']:.1f} transactions/s with the broker, "
          f"{idle['stock']:.1f} stock (spread {idle['spread_pct']:.0f}%); single-task POSTs a "
          f"second: {rates['']:,.0f} all ours, "
          + ", ".join(f"{rates[part]:,.0f} {part} stock" for part in WEB_PARTS))  # fmt: skip
    print("with, stock: medians of the rounds; gain: the median of each round's gain (stock "
          "against ours, measured next to each other); spread: the slowest round against the "
          "fastest, as a share of the median (the larger of the two configurations'); kept: "
          "the part won so many rounds that noise alone would do so less than 1 time in "
          "20")  # fmt: skip
    return {"load_average": load, "parts": results, "idle_broker": idle, "web_runs": web,
            "broker_runs": broker}  # fmt: skip
