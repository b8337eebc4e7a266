"""End to end throughput, the platform run as `make run` runs it, beside task-spooler and Slurm.

gpuplatform: daphne (two processes, as `make run` starts it), the scheduler (``manage.py
scheduler``) and 4 node agents of 8 simulated GPUs each (every agent taking its node's own
queue, as in production) run as subprocesses against the bench database (emptied
first of the tasks, nodes and GPUs earlier benchmarks left) with production settings (no
GPUPLATFORM_TESTING: the PostgreSQL channel layer, LAUNCH_TASKS on), this process's SECRET_KEY
(django-q2 signs with it) and the API throttle raised out of the way (it is a policy, not a
capacity). All traffic goes over HTTP with tenant tokens. Phases, in order:

0. Idle estate: once up and warm, nothing submitted for IDLE_S; each role's CPU and
   PostgreSQL's transactions and write-ahead log per second (``measure_idle``).
1. Idle latency: one task at a time, ``date +%s.%N``, submitted by one POST; "submit -> process
   exists" is the stamp the task's own process wrote (read from its log) minus the wall clock
   just before the POST. The stamp is taken rather than ``Task.started_at`` (written after the
   supervisor reports) or ``TaskAttempt.pid_started`` (psutil's start time, 10 ms ticks plus a
   boot-time offset): it is the one measure the peers can give too, read the same way, to the
   microsecond. Each task ends, and the broker drains, before the next.
2. API: 8 client processes (one keep-alive connection and one token each, all of one tenant,
   as a team's sweep script would send them, so the tenant's own serialisation counts) POST one
   ``true`` task per request; requests/s, p99 and every non-2xx answer (500s named). Twice: the
   tasks run meanwhile (every GPU free); then into a busy estate, 32 ``sleep`` tasks of a third
   tenant holding every GPU (``estate_held``), so that they queue, as a burst does on a working
   estate, and the holders are cancelled through the API afterwards. Issue 9's 300 a second is
   judged on the second: in the first, the tasks' own lives share the CPUs with the
   submissions. What is still pending a while after each is cancelled.
3. Throughput, in two lines (``bench/throughput/scenarios.py``), each from an idle estate:
   first what users do, the default: 4 tenants, each under an 8-GPU quota, each submitting 500
   tasks in one POST (80% one GPU, 10% two GPUs, 10% sharing a GPU by ``gpu_memory: 4Gi``),
   every one of which must succeed; then one tenant with no quota, 2,000 one-GPU tasks in two
   POSTs of 1,000 (what the peers run). Each POST is also measured as a batch, tasks/s, with
   how many processes were runnable on the machine meanwhile, to tell waiting for the CPU from
   waiting for a lock. Completed per second runs from the first POST to the last
   ``Task.finished_at``; mean busy GPUs is the GPUs' busy spans (``Allocation.started_at`` to
   ``released_at``, a GPU shared by memory counted once) over the time tasks waited: from the
   first POST's answer (its tasks are committed, visible to the scheduler) to the last
   ``Task.scheduled_at`` (or the time limit). Each line's CPU per finished task is split by
   role (``bench/throughput/accounting.py``), and set against the CPU a task may cost for the
   platform to match task-spooler on these CPUs ("what is left").

A thread counts this database's sessions in ``pg_stat_activity`` throughout (its own included);
the peak is printed per phase. Each phase stops at a time limit, and a run stopped there says so
("1,234 of 2,000 finished in 60 s"), its rate computed over the limit.

Peers, when installed (as root with apt-get, the bench installs them, with daemons kept from
starting by a temporary policy-rc.d; otherwise "not measured: why"), each in a scratch directory
removed at the end, every daemon stopped whatever happens: task-spooler (``tsp -S 32``, its own
``TS_SOCKET``; 2,000 ``tsp -n true``) and Slurm (``slurmctld`` + ``slurmd``, one node of 32 CPUs
standing for 32 GPU slots, ``AuthType=auth/none``, free ports, otherwise untuned; two job arrays
of 1,000 ``true``), with the same latency probe (``date +%s.%N``, ``tsp`` / ``sbatch --wrap``);
their figures, and each line of ours as a ratio to each, print last.
"""

from __future__ import annotations

import http.client
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django_q.models import OrmQ

from bench.bench_latency import idle, through_the_broker
from bench.common import (
    CPUS,
    MAKE_RUN_WEB_WORKERS,
    ClientJob,
    Proc,
    api_client,
    clear_estate,
    clear_tasks,
    close_other_sessions,
    median,
    merge_clients,
    percentile,
    stop_all,
    wait_for,
    web_server,
)
from bench.throughput.accounting import (
    STATS_SETTLE_S,
    ConnectionSampler,
    SupervisorCensus,
    cpu_by_role,
    cpu_per_task,
    database_work,
    passes_run,
    postmaster_of_this_connection,
    role_spent,
    run_queue,
    server_connection_cap,
    supervisor_census,
    work_per_task,
)
from bench.throughput.figures import (
    API_LIMIT_S,
    API_REQUESTS,
    CLIENTS,
    DRAIN_LIMIT_S,
    HOLD,
    IDLE_S,
    LATENCY_LIMIT_S,
    LATENCY_MIN,
    LATENCY_TASKS,
    NODES,
    POLL_S,
    POOL,
    SLOTS,
    STAMP,
    STARTUP_LIMIT_S,
    THROUGHPUT_LIMIT_S,
    THROUGHPUT_POLL_S,
    WARMUP,
    Latency,
    completion,
    estate_yaml,
    gpu_spans,
    mean_busy,
    parse_stamp,
    pass_times,
    reuse_gaps,
)
from bench.throughput.peers import cleanup, measure_slurm, measure_tsp, sigterm_as_exit
from bench.throughput.report import plain, report
from bench.throughput.scenarios import SCENARIOS, Scenario
from gpuplatform.dburl import current_database_url
from scheduling.controls import task_cancel
from scheduling.models import (
    Allocation,
    Node,
    PassRequest,
    SchedulerState,
    Task,
    TaskAttempt,
)
from scheduling.quotas import quota_set
from scheduling.states import TERMINAL, IllegalTransition, TaskState
from tenants import services as tenant_services
from tenants.models import Membership, Quota, Role, Tenant

NEEDS_DATABASE = True

# --- gpuplatform ---------------------------------------------------------------------------------


def platform_env(tmp: Path, config: Path) -> dict[str, str]:
    """As `make run` runs the platform (production settings), against the bench database."""
    environ = dict(os.environ)
    for name in ("Q_CLUSTER_NAME", "NODE_NAME", "GPU_BACKEND", "GPUPLATFORM_TESTING", "Q_SYNC",
                 "DEBUG", "LAUNCH_TASKS", "SECRET_KEY_FILE"):  # fmt: skip
        environ.pop(name, None)
    environ.update(
        DATABASE_URL=current_database_url(),
        DJANGO_SETTINGS_MODULE="gpuplatform.settings",
        # This process's own: django-q2 signs what it queues (a pass after a cancel) with it,
        # and every cluster must be able to read it.
        SECRET_KEY=settings.SECRET_KEY,
        SECURE_COOKIES="0",
        GPUPLATFORM_CONFIG=str(config),
        GPUPLATFORM_VAR_DIR=str(tmp / "var"),
        GPUPLATFORM_TASKS_ROOT=str(tmp / "tasks"),
        GPUPLATFORM_TASK_LOG_DIR=str(tmp / "logs"),
        API_THROTTLE_RATE="1000000/min",
        API_THROTTLE_BURST="1000000",
        PYTHONUNBUFFERED="1",
    )
    return environ


class Api:
    """The bench's own HTTP client (one keep-alive connection, in this process)."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": "application/json"}  # fmt: skip

    def post(self, path: str, body: object = None, *, ok: tuple[int, ...]) -> bytes:
        payload = None if body is None else json.dumps(body)
        self.conn.request("POST", path, body=payload, headers=self.headers)
        response = self.conn.getresponse()
        data = response.read()
        if response.status not in ok:
            raise RuntimeError(f"POST {path} answered {response.status}: {data[:300]!r}")
        return data

    def submit(self, specs: list[dict] | dict) -> list[int]:
        data = self.post("/api/v1/tasks/", specs, ok=(201,))
        return [task["id"] for task in json.loads(data)]

    def cancel(self, task_id: int) -> None:
        self.post(f"/api/v1/tasks/{task_id}/cancel/", ok=(200, 409))  # 409: it ended meanwhile

    def close(self) -> None:
        self.conn.close()


def spec(name: str, command: str) -> dict:
    return {"name": name, "command": command, "resources": {"gpus": 1, "pool": POOL}}


def make_tenant(name: str, members: int) -> tuple[Tenant, list[str]]:
    tenant, _ = Tenant.objects.get_or_create(name=name)
    tokens = []
    for i in range(members):
        user, _ = get_user_model().objects.get_or_create(username=f"{name}-{i}")
        Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": Role.MEMBER})
        tokens.append(tenant_services.apitoken_create(user=user, tenant=tenant, name="bench")[1])
    return tenant, tokens


def scenario_tenants(scenario: Scenario) -> list[str]:
    """A token for each of ``scenario``'s tenants, each under its GPU quota (cluster-wide)."""
    tokens = []
    for n in range(1, scenario.tenants + 1):
        tenant, (token,) = make_tenant(f"bench-throughput-{scenario.key}-{n}", 1)
        quota = Quota.objects.filter(tenant=tenant, pool=None).first() or Quota(tenant=tenant)
        quota.max_gpus = scenario.quota_gpus
        quota_set(quota=quota)
        tokens.append(token)
    return tokens


def unfinished(tenant: Tenant) -> int:
    return Task.objects.filter(tenant=tenant).exclude(state__in=TERMINAL).count()


def settle(tasks) -> tuple[int, int]:
    """Cancel those of ``tasks`` still waiting and give the running ones a minute to end, so
    that the next phase starts on an idle estate; how many were cancelled, and left unfinished."""
    cancelled = 0
    with through_the_broker():
        for task in tasks.filter(state=TaskState.PENDING):
            try:
                task_cancel(task=task)
            except IllegalTransition:
                continue  # it ended meanwhile
            cancelled += 1
    unfinished = tasks.exclude(state__in=TERMINAL)
    until = time.monotonic() + 60
    while (left := unfinished.count()) and time.monotonic() < until:
        time.sleep(POLL_S)
    return cancelled, left


def stamp_of(task_id: int) -> float | None:
    path = TaskAttempt.objects.filter(task_id=task_id).values_list("log_path", flat=True).first()
    try:
        return parse_stamp(Path(path).read_text()) if path else None
    except OSError:
        return None


def measure_latency(api: Api, procs: list[Proc], *, count: int, limit_s: float, minimum: int,
                    timeout_s: float = 60) -> Latency:  # fmt: skip
    latency = Latency()
    until = time.monotonic() + limit_s
    n = 0
    while (
        len(latency.samples) < count
        and latency.lost <= count
        and (len(latency.samples) < minimum or time.monotonic() < until)
    ):
        submitted = time.time()
        (task_id,) = api.submit(spec(f"latency-{n}", STAMP))
        n += 1
        rows = Task.objects.filter(pk=task_id, state__in=TERMINAL)
        wait_for(f"task {task_id} to end", rows.exists, timeout_s, procs)
        stamp = stamp_of(task_id)
        if stamp is None:  # its supervisor was killed from outside (a test's clean-up)
            latency.lost += 1
        else:
            latency.samples.append(stamp - submitted)
        wait_for("the cluster to be idle", lambda task_id=task_id: idle(task_id), 60, procs)
    return latency


SCHEDULER_FIGURES = ("passes", "last_pass_at", "last_placed", "last_waiting", "last_idle_gpus",
                     "wake_at")  # fmt: skip


@contextmanager
def estate_held(api: Api, procs: list[Proc]) -> Iterator[None]:
    """Every GPU of the estate busy with a long task (``api``'s tenant) while the block runs,
    so that what is submitted meanwhile queues, as a burst does on a working estate; the
    holders are cancelled through the API after it."""
    ids = api.submit([spec(f"hold-{i}", HOLD) for i in range(SLOTS)])
    holders = Task.objects.filter(pk__in=ids)
    try:
        running = holders.filter(state=TaskState.RUNNING)
        wait_for(f"{SLOTS} holders to run", lambda: running.count() == SLOTS, 60, procs)
    except TimeoutError as exc:
        states = Counter(holders.values_list("state", flat=True))
        others = list(holders.exclude(state=TaskState.RUNNING)
                      .values_list("id", "state", "reason", "node__name")[:5])  # fmt: skip
        held = Allocation.objects.filter(released_at=None).values_list("task_id", "task__state")
        raise TimeoutError(f"{exc}: {dict(states)}; e.g. {others}; allocations held: "
                           f"{Counter(state for _, state in held)}; scheduler: "
                           f"{SchedulerState.objects.values(*SCHEDULER_FIGURES).first()}; "
                           f"{PassRequest.objects.first()}\n"
                           + "\n".join(f"--- {p.name}:\n{p.tail(8)}" for p in procs)
                           ) from None  # fmt: skip
    try:
        yield
    finally:
        for task_id in ids:
            api.cancel(task_id)
        ended = Task.objects.filter(pk__in=ids, state__in=TERMINAL)
        wait_for("the holders to end", lambda: ended.count() == SLOTS, 60, procs)


def measure_api(pool, port: int, tokens: list[str], tenant: Tenant, procs: list[Proc],
                web_pid: int, hold: Api | None = None) -> dict:  # fmt: skip
    """8 clients POST one ``true`` task each request; with ``hold``, into an estate whose
    GPUs that tenant keeps busy (``estate_held``), so the tasks queue until the clients stop."""
    postmaster = postmaster_of_this_connection()
    start_at = time.perf_counter() + 0.3
    jobs = [ClientJob(port, token, "POST", "/api/v1/tasks/", API_REQUESTS, start_at, API_LIMIT_S,
                      f"api-{i}", command="true", pool=POOL)
            for i, token in enumerate(tokens)]  # fmt: skip
    # Where the CPU goes while the clients submit (their tasks run meanwhile, one pass or
    # hand-off and one launch each; or, into a busy estate, wait, and only the passes that
    # reason about them run): the clients' own processes count as the rest.
    with estate_held(hold, procs) if hold is not None else nullcontext():
        passes_before = passes_run()
        with supervisor_census() as census:
            cpu_before = cpu_by_role(web_pid, procs, postmaster)
            parts = pool.map(api_client, jobs)
            cpu_after = cpu_by_role(web_pid, procs, postmaster, census)
        passes = passes_run() - passes_before
    merged = merge_clients(parts)
    latencies, statuses, wall, errors = (merged.latencies, merged.statuses, merged.wall_s,
                                         merged.errors)  # fmt: skip
    # Let what was accepted run; cancel what still waits, so the next phase starts idle.
    until = time.monotonic() + DRAIN_LIMIT_S
    while unfinished(tenant) and time.monotonic() < until:
        time.sleep(POLL_S)
    cancelled, left = settle(Task.objects.filter(tenant=tenant))
    accepted = len(latencies) - errors
    return {
        "requests": len(latencies),
        "planned": API_REQUESTS * len(tokens),
        "per_s": len(latencies) / wall if wall > 0 else 0.0,
        "p50_s": percentile(latencies, 50) if latencies else None,
        "p99_s": percentile(latencies, 99) if latencies else None,
        "errors": errors,
        "http_500": sum(n for code, n in statuses.items() if code >= 500),
        "statuses": dict(statuses),
        "error_sample": merged.error_sample,
        "cancelled_after": cancelled,
        "left_running": left,
        "cpu_ms_per_accepted": cpu_per_task(cpu_before, cpu_after, accepted),
        "passes": passes,
        "passes_per_accepted": passes / max(accepted, 1),
    }


def measure_throughput(scenario: Scenario, apis: list[Api], procs: list[Proc],
                       web_pid: int) -> dict:  # fmt: skip
    """``scenario``'s tenants (``apis``, one each) submit their tasks, one POST after another;
    every figure runs from the first POST until the last of them finished (or the limit)."""
    postmaster = postmaster_of_this_connection()
    work_before = database_work()  # first: its settling wait stays out of the CPU's window
    census = SupervisorCensus()
    census.start()
    cpu_before = cpu_by_role(web_pid, procs, postmaster)
    scheduler_log = next(p.log for p in procs if p.name == "scheduler")
    log_offset = scheduler_log.stat().st_size
    passes_before = passes_run()
    first = time.time()
    batches, crowds = [], []
    ids: list[int] = []
    window_start = None
    # Each tenant's first POST, then each one's second (if any): as they would come at once.
    posts = scenario.batches(POOL)
    for round_ in itertools.zip_longest(*posts):
        for api, specs in zip(apis, round_, strict=True):
            if specs is None:
                continue
            with run_queue() as crowd:
                began = time.perf_counter()
                ids += api.submit(specs)
                batches.append(len(specs) / (time.perf_counter() - began))
            crowds.append(crowd)
            window_start = window_start or time.time()
    deadline = first + THROUGHPUT_LIMIT_S
    rows = Task.objects.filter(pk__in=ids)  # not the tenants' latency probes
    # Polled through the (tenant, state) index: the same count as rows' (the tenants submit
    # nothing else meanwhile), where probing the 2,000 ids cost PostgreSQL 5.5 ms a poll, about
    # a third of a millisecond per task of what this bench reports as the platform's CPU.
    tenant_ids = list(rows.order_by().values_list("tenant_id", flat=True).distinct())
    active = [state for state in TaskState if state not in TERMINAL]
    ours = Task.objects.filter(tenant_id__in=tenant_ids, state__in=active, pk__gte=min(ids))
    while (left := ours.count()) and time.time() < deadline:
        for p in procs:
            p.check()
        # Each count still costs PostgreSQL 5-7 ms while 2,000 tasks churn the index: every
        # THROUGHPUT_POLL_S that was ~0.5 ms per task of what this bench charges to the
        # platform. So the poll waits longer while much is left (a second at 1,000).
        time.sleep(min(1.0, max(THROUGHPUT_POLL_S, left / 1000)))
    stopped = time.time()
    census.stop()
    cpu_after = cpu_by_role(web_pid, procs, postmaster, census)
    work_after = database_work()  # after the CPU's window, for the same reason
    passes = passes_run() - passes_before
    with open(scheduler_log, "rb") as log:
        log.seek(log_offset)
        logged_passes = pass_times(log.read().decode(errors="replace"))
    finishes = [t.timestamp() for t in rows.filter(state__in=TERMINAL)
                .values_list("finished_at", flat=True) if t is not None]  # fmt: skip
    states = Counter(rows.values_list("state", flat=True))
    scheduled = [t.timestamp() for t in rows.exclude(scheduled_at=None)
                 .values_list("scheduled_at", flat=True)]  # fmt: skip
    total = scenario.tasks
    window_end = max(scheduled) if len(scheduled) == total else stopped
    # A GPU shared by memory is busy once, however many hold it.
    spans = gpu_spans([
        (g, s.timestamp(), r.timestamp() if r else None)
        for g, s, r in Allocation.objects.filter(task_id__in=ids).values_list(
            "gpu_id", "started_at", "released_at"
        )
    ])  # fmt: skip
    intervals = [(began, released) for _, began, released in spans]
    done = completion(first, finishes, total, stopped)
    # Supervisor processes, told apart by pid and start: a supervisor runs the next task on
    # its GPUs when a hand-off gives it one, and the spawner gives other attempts to its idle
    # supervisors before it forks one (nodeagent.launcher.spawner).
    attempts = TaskAttempt.objects.filter(task_id__in=ids).exclude(supervisor_pid=None)
    supervisors = attempts.values_list("supervisor_pid", "supervisor_started").distinct().count()
    return {
        "scenario": scenario.label,
        "completion": done,
        "cpu_ms_per_task": cpu_per_task(cpu_before, cpu_after, done.finished),
        "db_per_task": work_per_task(work_before, work_after, done.finished),
        "left": left,
        "states": dict(states),
        "batches_per_s": batches,
        # Runnable processes while each batch was answered: median, most.
        "batch_runnable": [(median(c), max(c)) if c else (0, 0) for c in crowds],
        "busy": mean_busy(intervals, window_start, window_end),
        "reuse_gaps": reuse_gaps(spans, window_start, window_end),
        "busy_window_s": window_end - window_start,
        "passes": passes,
        "pass_ms": [ms for placed, ms in logged_passes if placed],
        "pass_placed": sum(placed for placed, _ in logged_passes),
        "supervisors": supervisors,
    }


def measure_idle(procs: list[Proc], web_pid: int, sampler: ConnectionSampler) -> dict:
    """What the estate costs while nothing is submitted and nothing runs, per second: each
    role's CPU (percent of one core), and PostgreSQL's transactions, those that wrote, and its
    write-ahead log, less this bench's own: its connection sampler pauses while the CPU is
    measured (its counts cost PostgreSQL about 1.5 ms each, 4 a second), and the statements it
    makes in ``database_work``'s settling waits, and those reads, are subtracted. What remains is
    the platform's heartbeats, GPU samples, and its clusters' and scheduler's wake-ups."""
    postmaster = postmaster_of_this_connection()
    work_before, samples_before = database_work(), len(sampler.samples)
    sampler.paused.set()
    began = time.monotonic()
    cpu_before = cpu_by_role(web_pid, procs, postmaster)
    while time.monotonic() - began < IDLE_S:
        for p in procs:
            p.check()
        time.sleep(0.5)
    cpu_after = cpu_by_role(web_pid, procs, postmaster)
    cpu_s = time.monotonic() - began
    sampler.paused.clear()
    samples = len(sampler.samples) - samples_before
    work_after = database_work()
    work_s = time.monotonic() - began + STATS_SETTLE_S  # database_work settles before reading
    cpu = {role: 100 * spent / cpu_s for role, spent in role_spent(cpu_before, cpu_after).items()}
    return {
        "seconds": cpu_s,
        "cpu_pct": cpu,
        "transactions_per_s": (work_after[2] - work_before[2] - 2 - samples) / work_s,
        "writes_per_s": (work_after[1] - work_before[1] - 1) / work_s,
        "wal_kb_per_s": (work_after[0] - work_before[0]) / 1024 / work_s,
    }


def measure_platform(pool, tmp: Path) -> dict:
    tmp.mkdir()
    tmp.chmod(0o711)  # run as root, tasks run as their tenant's user and must reach their root
    config = tmp / "estate.yaml"
    config.write_text(estate_yaml())
    environ = platform_env(tmp, config)
    # Whatever benchmarks before this one left (tasks, nodes, GPUs) would be in every pass.
    clear_estate(OrmQ._meta.db_table)
    _, (token,) = make_tenant("bench-throughput", 1)
    _, (hold_token,) = make_tenant("bench-throughput-hold", 1)
    api_tenant, api_tokens = make_tenant("bench-throughput-api", CLIENTS)
    scenario_tokens = {
        # The unlimited tenant is the latency probes' own (no quota).
        scenario.key: [token] if scenario.quota_gpus is None else scenario_tenants(scenario)
        for scenario in SCENARIOS
    }
    connection.close()  # nothing of ours crosses the clients' fork, or the sampler's thread
    sampler = ConnectionSampler()
    procs: list[Proc] = []
    figures: dict = {"throughput": {}}
    began = time.perf_counter()
    with ExitStack() as stack:  # leaving: web, the rest, the sampler, then stray sessions
        stack.callback(close_other_sessions)
        sampler.start()
        stack.callback(sampler.stop)
        stack.callback(lambda: stop_all(procs))
        procs.append(Proc("scheduler", [sys.executable, "manage.py", "scheduler"], environ, tmp))
        for n in range(1, NODES + 1):
            argv = [sys.executable, "manage.py", "node_agent", "--backend", "simulated",
                    "--config", str(config), "--node", f"bench-tput-{n}"]  # fmt: skip
            procs.append(Proc(f"agent-{n}", argv, environ, tmp))
        port, web = stack.enter_context(web_server(
            "daphne", MAKE_RUN_WEB_WORKERS, tmp, environ, label="web",
            startup_timeout_s=STARTUP_LIMIT_S))  # fmt: skip
        nodes = Node.objects.filter(pool__name=POOL, gpus__isnull=False).distinct()
        wait_for(f"{NODES} nodes to register", lambda: nodes.count() == NODES, STARTUP_LIMIT_S,
                 procs)  # fmt: skip
        api = Api(port, token)
        stack.callback(api.close)
        sampler.phase = "warm-up"
        # The first also waits for every cluster to come up.
        measure_latency(api, procs, count=WARMUP, limit_s=0, minimum=WARMUP,
                        timeout_s=STARTUP_LIMIT_S)  # fmt: skip
        figures["startup_s"] = time.perf_counter() - began
        sampler.phase = "idle estate"
        figures["idle"] = measure_idle(procs, web.pid, sampler)
        sampler.phase = "idle latency"
        figures["latency"] = measure_latency(
            api, procs, count=LATENCY_TASKS, limit_s=LATENCY_LIMIT_S, minimum=LATENCY_MIN
        )
        sampler.phase = "API, 8 clients"
        figures["api"] = measure_api(pool, port, api_tokens, api_tenant, procs, web.pid)
        sampler.phase = "API, 8 clients, estate busy"
        hold = Api(port, hold_token)
        stack.callback(hold.close)
        figures["api_queued"] = measure_api(pool, port, api_tokens, api_tenant, procs, web.pid,
                                            hold=hold)  # fmt: skip
        for scenario in SCENARIOS:
            sampler.phase = f"{scenario.tasks:,} tasks, {scenario.label}"
            apis = [Api(port, each) for each in scenario_tokens[scenario.key]]
            for each in apis:
                stack.callback(each.close)
            figures["throughput"][scenario.key] = measure_throughput(scenario, apis, procs,
                                                                     web.pid)  # fmt: skip
            # A line stopped at its time limit leaves tasks: the next must start idle.
            figures["throughput"][scenario.key]["cancelled_after"], _ = settle(Task.objects.all())
        sampler.phase = "stopping"
    figures["connections"] = sampler.peaks()
    figures["connection_roles"] = sampler.role_peaks()
    figures["max_connections"] = server_connection_cap()
    clear_tasks(OrmQ._meta.db_table)
    return figures


def main() -> dict:
    load = os.getloadavg()[0]
    print(f"load average before the run: {load:.2f} on {CPUS} CPUs (other work on the "
          "machine makes every figure here noisy)", flush=True)  # fmt: skip
    context = multiprocessing.get_context("fork")
    scratch = Path(tempfile.mkdtemp(prefix="gpuplatform-bench-throughput-"))
    scratch.chmod(0o711)  # run as root, tasks run as their tenant's user and must reach their root
    with sigterm_as_exit(), cleanup(lambda: shutil.rmtree(scratch, ignore_errors=True)):
        connection.close()
        # Forked before any thread or connection exists. The workers must die of the SIGTERM
        # the pool's exit sends them: with the handler above inherited, one killed while it held
        # the pool's queue lock once left another waiting for it forever (and this bench too).
        reset = (signal.SIGTERM, signal.SIG_DFL)
        with context.Pool(CLIENTS, initializer=signal.signal, initargs=reset) as pool:
            ours = measure_platform(pool, scratch / "platform")
        peers = {}
        for name, measure in (("tsp", measure_tsp), ("slurm", measure_slurm)):
            try:
                peers[name] = measure(scratch / name)
            except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                peers[name] = {"skipped": f"failed: {exc!r}"[:500]}
        tsp, slurm = peers["tsp"], peers["slurm"]
    print()
    targets = report(ours, tsp, slurm)
    return {
        "load_average": load,
        "gpuplatform": plain(ours),
        "tsp": plain(tsp),
        "slurm": plain(slurm),
        "targets": {label: met for label, met in targets},
    }
