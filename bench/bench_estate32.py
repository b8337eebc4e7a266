"""Thirty-two GPU hosts: 32 node agents (8 simulated GPUs each, one process per node), the
scheduler and daphne, started as `make run` starts them, against one PostgreSQL.

32 agents may hold more connections than a stock server accepts (100): then, as root where the
machine has PostgreSQL's server binaries, the bench runs on a private PostgreSQL cluster of its
own (``tests/hosts/postgres.py``, max_connections 300, stock durability), whose CPU it also
counts; otherwise it says why it did not run.

- An idle estate: the CPU of every platform process over IDLE_S (percent of one core, all
  together and by role, as the throughput bench counts roles) and each agent's proportional
  memory (PSS).
- End to end: 2,000 `true` tasks from 8 tenants, each under a 32-GPU quota, through the API,
  with the CPU per finished task by role, twice. The first round runs cold: each of the 256
  GPUs' first task forks a supervisor of its own (a node keeps one per running task) and makes
  its tenant's cgroups, about 8 tasks per GPU for that to spread over. The second round, at
  once, finds them ready, as every line of the throughput benchmark does (its API phases
  warmed its 32 GPUs' supervisors): the round judged against the 4-node bench.
(A pass over a 10,000-task backlog on 256 GPUs is the ``history`` benchmark's, in-process.)

The agents share this machine's CPUs, which 32 hosts would not: every figure is the whole
estate's on one machine.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
from django.core.management import call_command
from django.db import connection
from django_q.models import OrmQ

from bench.bench_throughput import Api, make_tenant, platform_env
from bench.common import (
    FIGURES,
    Proc,
    clear_estate,
    close_other_sessions,
    free_port,
    median,
    stop_all,
    table,
    target,
    wait_for,
    web_server,
)
from bench.throughput.accounting import (
    BENCH_CPU,
    cpu_by_role,
    cpu_per_task,
    database_work,
    describe_work,
    postmaster_of_this_connection,
    role_spent,
    server_connection_cap,
    supervisor_census,
    work_per_task,
)
from bench.throughput.figures import STARTUP_LIMIT_S
from bench.throughput.scenarios import QUOTAS
from gpuplatform import connections as db_connections
from scheduling.models import Node, Task
from scheduling.quotas import quota_set
from scheduling.states import TERMINAL
from tenants.models import Quota
from tests.hosts import postgres

NEEDS_DATABASE = True
# Its throughput is judged beside the throughput benchmark's default line (4 nodes), when this
# run measured that too (bench/run.py runs it first).
RUNS_AFTER = ("throughput",)

NODES, GPUS_PER_NODE = 32, 8
POOL = "bench-estate32"
TENANTS, QUOTA_GPUS = 8, 32  # 8 x 32 = every GPU of the estate
TASKS = 2_000
ROUNDS = ("cold", "throughput")  # the second, warm, is the one judged (and kept as before)
THROUGHPUT_FIGURE = "tasks completed per second (the warm round)"
# Two whole periods of the agents' reconciliation (every 6 heartbeats: 30 s), which all 32
# agents, started together, run in the same few seconds: a window of one period holds one round
# or two, by phase.
IDLE_S = 60.0
SETTLE_S = 10.0
THROUGHPUT_LIMIT_S = 180.0
IDLE_TARGET_PCT = 5.0
PRIVATE_DATABASE = "gpuplatform_estate32"


def estate_yaml() -> str:
    nodes = "".join(
        f"  - name: bench-e32-{n}\n    pool: {POOL}\n"
        f"    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, "
        f"count: {GPUS_PER_NODE}}}\n"
        for n in range(1, NODES + 1)
    )
    return f"pools:\n  - name: default\n  - name: {POOL}\nnodes:\n{nodes}"


def tenants() -> list[str]:
    tokens = []
    for n in range(1, TENANTS + 1):
        tenant, (token,) = make_tenant(f"bench-e32-{n}", 1)
        quota = Quota.objects.filter(tenant=tenant, pool=None).first() or Quota(tenant=tenant)
        quota.max_gpus = QUOTA_GPUS
        quota_set(quota=quota)
        tokens.append(token)
    return tokens


def pss_mib(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_full_info().pss / 2**20
    except psutil.Error:
        return 0.0


def platform_pct(cpu: dict[str, float]) -> float:
    return sum(pct for role, pct in cpu.items() if role not in ("PostgreSQL", BENCH_CPU))


def measure_idle(procs: list[Proc], web_pid: int, postmaster: psutil.Process | None) -> dict:
    """Each role's CPU while nothing is submitted, in percent of one core."""
    time.sleep(SETTLE_S)
    before, began = cpu_by_role(web_pid, procs, postmaster), time.monotonic()
    time.sleep(IDLE_S)
    after, elapsed = cpu_by_role(web_pid, procs, postmaster), time.monotonic() - began
    cpu = {role: 100 * spent / elapsed for role, spent in role_spent(before, after).items()}
    agents = [pss_mib(p.proc.pid) for p in procs if p.name.startswith("agent-")]
    return {
        "cpu_pct": platform_pct(cpu),
        "cpu_pct_by_role": cpu,
        "postgres_pct": cpu["PostgreSQL"] if postmaster is not None else None,
        "agent_pss_mib": agents,
        "web_pss_mib": pss_mib(web_pid),
        "scheduler_pss_mib": sum(
            pss_mib(c.pid) for c in psutil.Process(procs[0].proc.pid).children(recursive=True)
        ) + pss_mib(procs[0].proc.pid),
    }  # fmt: skip


def submit_all(apis: list[Api], command: str, each: int) -> list[int]:
    ids: list[int] = []
    for start in range(0, each, 1_000):
        for t, api in enumerate(apis):
            specs = [{"name": f"e32-{t}-{i}", "command": command,
                      "resources": {"gpus": 1, "pool": POOL}}
                     for i in range(start, min(each, start + 1_000))]  # fmt: skip
            ids += api.submit(specs)
    return ids


def measure_throughput(
    apis: list[Api], procs: list[Proc], web_pid: int, postmaster: psutil.Process | None
) -> dict:
    with supervisor_census() as census:
        work_before = database_work()
        cpu_before = cpu_by_role(web_pid, procs, postmaster)
        began = time.time()
        ids = submit_all(apis, "true", TASKS // TENANTS)
        left = Task.objects.filter(pk__in=ids).exclude(state__in=TERMINAL)
        deadline = time.monotonic() + THROUGHPUT_LIMIT_S
        while left.exists() and time.monotonic() < deadline:
            for p in procs:
                p.check()
            time.sleep(0.5)
        finished = Task.objects.filter(pk__in=ids, state__in=TERMINAL)
        last = max((t.timestamp() for t in finished.values_list("finished_at", flat=True) if t),
                   default=time.time())  # fmt: skip
        done = finished.count()
        cpu_after = cpu_by_role(web_pid, procs, postmaster, census)
    return {"finished": done, "seconds": last - began, "per_s": done / max(last - began, 1e-9),
            "cpu_ms_per_task": cpu_per_task(cpu_before, cpu_after, done),
            "database": work_per_task(work_before, database_work(), done)}  # fmt: skip


def needed_connections() -> int:
    """The documented cap for this estate (one daphne), and this bench's own two."""
    from django.conf import settings

    cap = db_connections.budget(web_workers=1, db_pool_size=settings.DB_POOL_SIZE,
                                q_workers=settings.Q_CLUSTER["workers"], nodes=NODES)  # fmt: skip
    return cap.total + 2


def main() -> dict:
    needed, allowed = needed_connections(), server_connection_cap()
    if allowed >= needed:
        return run_estate()
    why = (f"{NODES} hosts hold up to {needed} PostgreSQL connections and the server allows "
           f"{allowed}")  # fmt: skip
    cannot = postgres.unavailable()
    if cannot is not None:
        reason = f"not run: {why} (raise max_connections: docs/scale.md), and {cannot}"
        print(reason)
        for figure in ("idle estate, CPU of every platform process", THROUGHPUT_FIGURE):
            target(f"32 hosts: {figure}", "not measured", reason, None)
        return {"skipped": reason}
    print(
        f"{why}: on a private PostgreSQL of this machine's (max_connections 300, otherwise "
        "its defaults: fsync and synchronous commit on), as the many-host harness runs one"
    )
    with private_database() as server_pid:
        return run_estate(psutil.Process(server_pid))


@contextmanager
def private_database():
    """This process's connection, and the platform's processes, on a throwaway PostgreSQL
    cluster of the machine's own binaries (``tests/hosts/postgres.py``), migrated; the bench
    database again afterwards."""
    root = Path(tempfile.mkdtemp(prefix="gpuplatform-bench-pg-"))
    root.chmod(0o755)  # the postgres user's cluster lives under it
    server = postgres.PrivatePostgres(root, "127.0.0.1", port=free_port())
    # Stock durability, not the harness's (it turns fsync and synchronous commit off).
    server.options = ["-c", "fsync=on", "-c", "synchronous_commit=on",
                      "-c", "full_page_writes=on"]  # fmt: skip
    saved = dict(connection.settings_dict)
    try:
        server.start()
        server.create_database(PRIVATE_DATABASE)
        connection.close()
        connection.settings_dict.update(HOST=server.address, PORT=str(server.port),
                                        NAME=PRIVATE_DATABASE, USER="postgres",
                                        PASSWORD=server.password)  # fmt: skip
        call_command("migrate", verbosity=0)
        call_command("createcachetable", verbosity=0)
        yield server.process.pid
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        if server.process is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def run_estate(postmaster: psutil.Process | None = None) -> dict:
    """The bench, on this process's database; ``postmaster``: the PostgreSQL server, when it is
    this bench's own or this machine's (its CPU is then counted too)."""
    postmaster = postmaster or postmaster_of_this_connection()
    scratch = Path(tempfile.mkdtemp(prefix="gpuplatform-bench-estate32-"))
    scratch.chmod(0o711)
    config = scratch / "estate.yaml"
    config.write_text(estate_yaml())
    environ = platform_env(scratch, config)
    clear_estate(OrmQ._meta.db_table)
    tokens = tenants()
    connection.close()
    procs: list[Proc] = []
    figures: dict = {}
    began = time.perf_counter()
    try:
        with ExitStack() as stack:
            stack.callback(close_other_sessions)
            stack.callback(lambda: stop_all(procs))
            procs.append(Proc("scheduler", [sys.executable, "manage.py", "scheduler"], environ,
                              scratch))  # fmt: skip
            for n in range(1, NODES + 1):
                argv = [sys.executable, "manage.py", "node_agent", "--backend", "simulated",
                        "--config", str(config), "--node", f"bench-e32-{n}"]  # fmt: skip
                procs.append(Proc(f"agent-{n}", argv, environ, scratch))
            server = web_server("daphne", 1, scratch, environ, label="web",
                                startup_timeout_s=STARTUP_LIMIT_S)  # fmt: skip
            port, web = stack.enter_context(server)
            nodes = Node.objects.filter(pool__name=POOL, gpus__isnull=False).distinct()
            wait_for(f"{NODES} nodes to register", lambda: nodes.count() == NODES, 600, procs,
                     poll_s=1.0)  # fmt: skip
            figures["startup_s"] = time.perf_counter() - began
            figures["idle"] = measure_idle(procs, web.pid, postmaster)
            print(f"idle: {figures['idle']}", flush=True)
            apis = [Api(port, token) for token in tokens]
            for api in apis:
                stack.callback(api.close)
            for key in ROUNDS:
                figures[key] = measure_throughput(apis, procs, web.pid, postmaster)
                print(f"{key}: {figures[key]}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(figures)
    return figures


def report(figures: dict) -> None:
    idle, cold, tput = figures["idle"], figures["cold"], figures["throughput"]
    agents = idle["agent_pss_mib"]
    print(f"{NODES} node agents x {GPUS_PER_NODE} simulated GPUs, scheduler, daphne; up in "
          f"{figures['startup_s']:.1f} s")  # fmt: skip
    print(table(["measure", "value"], [
        ["idle estate, CPU of every platform process", f"{idle['cpu_pct']:.1f}% of one core"],
        *[[f"  {role}", f"{pct:.2f}%"] for role, pct in idle["cpu_pct_by_role"].items()
          if role != "PostgreSQL"],
        ["idle estate, PostgreSQL's CPU", "not measured (a server elsewhere)"
         if idle.get("postgres_pct") is None else f"{idle['postgres_pct']:.1f}% of one core"],
        ["node agents' PSS, each: median / most", f"{median(agents):.1f} / {max(agents):.1f} MiB"],
        ["node agents' PSS, all 32", f"{sum(agents):,.0f} MiB"],
        ["scheduler / web PSS",
         f"{idle['scheduler_pss_mib']:.0f} / {idle['web_pss_mib']:.0f} MiB"],
        *throughput_rows(f"cold: the first {TASKS:,} after start-up", cold),
        *throughput_rows(f"warm: {TASKS:,} more, at once", tput),
    ]))  # fmt: skip
    print()
    print("target: idle estate <= 5% of one core:", target(
        "32 hosts: idle estate, CPU of every platform process", f"{idle['cpu_pct']:.1f}%",
        f"<= {IDLE_TARGET_PCT:.0f}% of one core", idle["cpu_pct"] <= IDLE_TARGET_PCT))  # fmt: skip
    four = four_node_rate()
    goal = ">= the throughput bench's quota line (4 nodes)"
    if four is not None:
        goal += f": {four:.1f} in this run"
    print("target: throughput at least the 4-node bench's:", target(
        f"32 hosts: {THROUGHPUT_FIGURE}", f"{tput['per_s']:.1f}", goal,
        None if four is None else tput["per_s"] >= four))  # fmt: skip


def throughput_rows(label: str, tput: dict) -> list[list[str]]:
    return [
        [f"{TASKS:,} `true` tasks, {TENANTS} tenants x {QUOTA_GPUS}-GPU quota, {label}",
         f"{tput['per_s']:.1f} tasks/s ({tput['finished']:,} in {tput['seconds']:.1f} s)"],
        ["  CPU per finished task, all", f"{tput['cpu_ms_per_task']['all']:.1f} ms"],
        *[[f"    {role}", f"{ms:.1f} ms"] for role, ms in sorted(
            tput["cpu_ms_per_task"].items(), key=lambda item: -item[1]) if role != "all"],
        # Most are the agents' reports: a transaction for what one node has to say at once.
        ["  PostgreSQL transactions per finished task",
         describe_work(tput["database"]) if "database" in tput else "not measured"],
    ]  # fmt: skip


def four_node_rate() -> float | None:
    """Tasks per second of the throughput benchmark's default line (4 nodes, tenants under
    quotas) in this run, or None where it did not run or failed."""
    ran = FIGURES.get("throughput")
    try:
        return float(ran["gpuplatform"]["throughput"][QUOTAS.key]["completion"]["per_s"])
    except (KeyError, TypeError):
        return None
