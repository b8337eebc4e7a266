"""Where a phase's resources go: CPU by role, PostgreSQL sessions by role and the database's
work, and how many processes were runnable."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
from django.conf import settings
from django.db import connection, connections

from bench.common import MAKE_RUN_WEB_WORKERS, Proc
from bench.throughput.figures import NODES, SAMPLE_S
from gpuplatform import connections as db_connections
from gpuplatform.procid import CLOCK_TICKS, read_proc, same_start, stat_fields
from nodeagent.launcher.procs import SPAWNER_NAME, SUPERVISOR_NAME
from scheduling.models import SchedulerState, TaskAttempt


class ConnectionSampler(threading.Thread):
    """Counts this database's sessions every SAMPLE_S by the role their ``application_name``
    names (gpuplatform/connections.py), with the phase each sample falls in."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[str, Counter[str]]] = []
        self.phase = "start-up"
        self.stopping = threading.Event()
        self.paused = threading.Event()  # set: no statement of its own (measure_idle)

    def run(self) -> None:
        try:
            with connections["default"].cursor() as cursor:
                while not self.stopping.is_set():
                    if self.paused.is_set():
                        self.stopping.wait(SAMPLE_S)
                        continue
                    cursor.execute(
                        "SELECT application_name, count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() GROUP BY 1"
                    )
                    by_role: Counter[str] = Counter()
                    for name, count in cursor.fetchall():
                        by_role[connection_role(name)] += count
                    self.samples.append((self.phase, by_role))
                    self.stopping.wait(SAMPLE_S)
        finally:
            connections["default"].close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)

    def peaks(self) -> dict[str, int]:
        """The most sessions at once in each phase, the bench's own included."""
        out: dict[str, int] = {}
        for phase, by_role in self.samples:
            out[phase] = max(out.get(phase, 0), sum(by_role.values()))
        return out

    def role_peaks(self) -> dict[str, int]:
        """The most sessions each role held at once, over the whole run, and the platform's
        (every role but the bench's own) at its peak."""
        out: Counter[str] = Counter()
        for _, by_role in self.samples:
            for role, count in by_role.items():
                out[role] = max(out[role], count)
            out[PLATFORM] = max(out[PLATFORM], sum(by_role.values()) - by_role[BENCH_ROLE])
        return dict(out)


RUNNABLE_SAMPLE_S = 0.005


def runnable() -> int:
    """Processes (threads) running or ready to run on this machine now (/proc/stat)."""
    with open("/proc/stat", "rb") as stat:
        for line in stat:
            if line.startswith(b"procs_running "):
                return int(line.split()[1])
    return 0


@contextmanager
def run_queue() -> Iterator[list[int]]:
    """Samples ``runnable()`` every RUNNABLE_SAMPLE_S while the block runs, into the list it
    yields: how many processes the web server and its PostgreSQL backend shared the CPUs with
    (a batch is answered as fast as their share of them allows)."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(runnable())
            done.wait(RUNNABLE_SAMPLE_S)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()


BENCH_ROLE, PLATFORM = "this bench", "platform"
CONNECTION_ROLES = ("web", "scheduler", "nodes")


def connection_role(application_name: str) -> str:
    """The budget's role of a session (``connections.budget_role``), this bench's own, or the
    session's own name."""
    if application_name == "gpuplatform run":  # bench/run.py
        return BENCH_ROLE
    return db_connections.budget_role(application_name) or application_name or "unnamed"


def connection_budget() -> db_connections.Budget:
    """The documented cap for the processes this bench starts."""
    return db_connections.budget(
        web_workers=MAKE_RUN_WEB_WORKERS,
        db_pool_size=settings.DB_POOL_SIZE,
        q_workers=settings.Q_CLUSTER["workers"],
        nodes=NODES,
    )


# Where the CPU of the 2,000-task phase goes, by role. Two snapshots (start and end of the
# phase) suffice: a process that ends is counted in its parent's children_user/children_system
# once reaped, and each role's processes are one parent's tree. A spawner's supervisors are
# not in its tree (a double fork detaches them: ``cpu_by_role``); each holds its tasks, once
# reaped, and supervises attempt after attempt (SUPERVISOR_REUSE). One that exits during the
# phase is reaped by init, which adds its time to nobody's (``SupervisorCensus`` keeps most of
# it); the kernel's own threads are what the machine spent beyond the roles.
SPAWNERS = "spawners, supervisors and tasks"
SUPERVISORS = "supervisors"  # cpu_by_role's own key: by process, not a sum
# This process: the clients' requests and the polling for the end, which the machine's total
# (and so each line's rate) includes; kept apart so that the rest is the kernel's and nobody's.
BENCH_CPU = "this bench (clients, polling)"
CPU_ROLES = ("web (daphne)", "scheduler", "node agents", SPAWNERS, "PostgreSQL")  # the platform
CPU_REST = "the rest"
CPU_ROWS = (*CPU_ROLES, BENCH_CPU, CPU_REST)  # where a phase's CPU went, all of it


@dataclass(frozen=True, slots=True)
class _Row:
    """A process as ``/proc/<pid>/stat`` shows it."""

    comm: bytes
    ppid: int
    cpu_s: float  # its own CPU and that of the children it reaped
    started: float  # as psutil's create_time() and ``procid.start_time`` say


class ProcessTable:
    """Every process on the machine, from one raw read of its ``stat`` each: psutil's objects,
    and its ``children()`` (a walk of every process for each call), cost this bench more than
    some of the roles it measured, with 32 hosts' supervisors."""

    def __init__(self) -> None:
        boot = psutil.boot_time()
        self.rows: dict[int, _Row] = {}
        self.children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = read_proc(f"/proc/{entry.name}/stat")
            except OSError:
                continue  # ended meanwhile: its parent has it (or will, once it reaps it)
            fields = stat_fields(stat)
            pid, ppid = int(entry.name), int(fields[1])
            self.rows[pid] = _Row(
                comm=stat[stat.index(b"(") + 1 : stat.rindex(b")")],
                ppid=ppid,
                cpu_s=sum(int(f) for f in fields[11:15]) / CLOCK_TICKS,
                started=int(fields[19]) / CLOCK_TICKS + boot,
            )
            self.children.setdefault(ppid, []).append(pid)

    def tree_cpu(self, pid: int) -> float:
        """CPU seconds of ``pid`` and of every process under it (0 when it is gone)."""
        total, todo = 0.0, [pid] if pid in self.rows else []
        while todo:
            member = todo.pop()
            total += self.rows[member].cpu_s
            todo += self.children.get(member, ())
        return total


def _machine_busy_s() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _supervisor_keys() -> set[tuple[int, float]]:
    """Every supervisor that ran an attempt in the bench's database, alive or not: (pid, start
    time)."""
    rows = TaskAttempt.objects.exclude(supervisor_pid=None).values_list(
        "supervisor_pid", "supervisor_started"
    )
    return set(rows)


CENSUS_S = 0.25
# Supervisors' and spawners' process names (setproctitle), as the kernel keeps them: 15 bytes.
SUPERVISOR_COMM = SUPERVISOR_NAME.encode()[:15]
SPAWNER_COMM = SPAWNER_NAME.encode()[:15]


class SupervisorCensus(threading.Thread):
    """What each supervisor process had spent (it and the tasks it reaped) when last seen,
    sampled every CENSUS_S while a phase runs. A supervisor leaves when it has served
    SUPERVISOR_REUSE attempts or finds its spawner's pool full; init reaps it, and what it spent
    would vanish with it, unseen by any role: most of what these figures once called the rest.
    It misses what one spends in its last CENSUS_S."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[tuple[int, float], float] = {}  # (pid, start time) -> CPU seconds
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(CENSUS_S):
            for pid, row in ProcessTable().rows.items():
                if row.comm.startswith(SUPERVISOR_COMM):
                    self.seen[(pid, row.started)] = row.cpu_s

    def stop(self) -> None:
        self.stopping.set()
        self.join()

    def last_seen(self, pid: int, started: float) -> float | None:
        for (seen_pid, created), cpu in self.seen.items():
            if seen_pid == pid and same_start(created, started):
                return cpu
        return None


@contextmanager
def supervisor_census() -> Iterator[SupervisorCensus]:
    """A ``SupervisorCensus`` running while the block runs; give it to ``cpu_by_role`` at the
    block's end."""
    census = SupervisorCensus()
    census.start()
    try:
        yield census
    finally:
        census.stop()


def cpu_by_role(
    web_pid: int,
    procs: list[Proc],
    postmaster: psutil.Process | None,
    census: SupervisorCensus | None = None,
) -> dict:
    """CPU seconds spent so far by each role's processes, and by the whole machine.

    A spawner's supervisors are detached (a double fork puts them out of its tree, see
    ``Spawner.fork``) and reaped by init, so what one spent vanishes with it rather than joining
    its parent's children's times, as a reaped child's does. They are found through the attempts
    they recorded, and kept apart, by process (``SUPERVISORS``), for ``role_spent``; one that
    has left counts what the ``census`` last saw of it."""
    spent = dict.fromkeys((*CPU_ROLES, BENCH_CPU, "machine"), 0.0)
    supervisors: dict[tuple[int, float], float] = {}
    spent[SUPERVISORS] = supervisors
    spent["machine"] = _machine_busy_s()
    table = ProcessTable()
    roots = [("web (daphne)", web_pid)] + [
        ("scheduler" if p.name == "scheduler" else "node agents", p.proc.pid) for p in procs
    ]
    for role, pid in roots:
        if role != "node agents":
            spent[role] += table.tree_cpu(pid)
            continue
        if pid not in table.rows:
            continue
        spent[role] += table.rows[pid].cpu_s  # its threads: relay, jobs, sampler, heartbeat
        for child in table.children.get(pid, ()):
            if table.rows[child].comm.startswith(SPAWNER_COMM):
                spent[SPAWNERS] += table.rows[child].cpu_s
            else:
                spent[role] += table.tree_cpu(child)
    for pid, started in _supervisor_keys():
        row = table.rows.get(pid)
        if row is not None and same_start(row.started, started):
            supervisors[(pid, started)] = table.tree_cpu(pid)
        elif census is not None and (last := census.last_seen(pid, started)) is not None:
            supervisors[(pid, started)] = last
    if (own := table.rows.get(os.getpid())) is not None:
        spent[BENCH_CPU] = own.cpu_s
    if postmaster is not None:
        spent["PostgreSQL"] = table.tree_cpu(postmaster.pid)
    return spent


def postmaster_of_this_connection() -> psutil.Process | None:
    """The PostgreSQL server process, when it runs on this machine."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    try:
        return psutil.Process(backend).parent()
    except psutil.Error:
        return None  # a server elsewhere (or in another pid namespace)


def role_spent(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds each role spent between two ``cpu_by_role`` readings. A supervisor counts
    what it spent since the first (all it spent, if it started since); one that ended between
    them counts what the census last saw of it, or nothing without one, so its role's figure is
    low rather than wrong by all the supervisor had spent before the window."""
    spent = {role: after[role] - before[role] for role in (*CPU_ROLES, BENCH_CPU)}
    was = before[SUPERVISORS]
    spent[SPAWNERS] += sum(cpu - was.get(key, 0.0) for key, cpu in after[SUPERVISORS].items())
    return spent


def cpu_per_task(before: dict, after: dict, finished: int) -> dict[str, float]:
    """Milliseconds of CPU per finished task, per role, the rest, and in all."""
    spent = role_spent(before, after)
    machine = after["machine"] - before["machine"]
    spent[CPU_REST] = max(0.0, machine - sum(spent.values()))
    per = {role: 1000 * seconds / max(finished, 1) for role, seconds in spent.items()}
    per["all"] = 1000 * machine / max(finished, 1)
    return per


def passes_run() -> int:
    """Scheduling passes so far (``SchedulerState.passes``, counted by every pass)."""
    return SchedulerState.objects.values_list("passes", flat=True).first() or 0


# PostgreSQL's backends publish their statistics at most once a second (PGSTAT_MIN_INTERVAL),
# and one that goes idle within that second publishes 10 s later (PGSTAT_IDLE_INTERVAL). With a
# shorter wait, a phase's count took in part of the phase before it and missed its own end.
STATS_SETTLE_S = 10.5


def database_work(settle_s: float = STATS_SETTLE_S) -> tuple[int, int, int]:
    """The server's position in its write-ahead log (bytes), its next transaction id, and the
    transactions this database has ended (a statement outside a transaction is one), read once
    the backends have published their statistics (``settle_s``).

    What they grow by over a phase are counts, not timings: the machine's speed moves them only
    through the work that depends on timing (how many passes ran, how many reports the agents
    wrote together, the samplers' writes once a second). A transaction that writes takes an id,
    one that only reads takes none. The log and the ids are the server's: another database's
    writes count too, and so does what an idle estate does during the wait (a few transactions
    a second). So do the transactions that run no statement: PostgreSQL delivers each NOTIFY to
    every idle listening session of the database in a transaction of its own."""
    time.sleep(settle_s)
    with connection.cursor() as cursor:
        # A statement of its own: in the reading one, the backend's cached view stayed stale.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, txid_current(),"
            "       xact_commit + xact_rollback"
            "  FROM pg_stat_database WHERE datname = current_database()"
        )
        wal, xid, ended = cursor.fetchone()
    return int(wal), int(xid), int(ended)


def work_per_task(before: tuple[int, ...], after: tuple[int, ...], finished: int) -> dict:
    """Transactions, those of them that wrote, and kB of WAL per finished task between two
    ``database_work()``, less their own (two transactions, one of them writing)."""
    per = max(finished, 1)
    return {
        "transactions": (after[2] - before[2] - 2) / per,
        "writes": (after[1] - before[1] - 1) / per,
        "wal_kb": (after[0] - before[0]) / 1024 / per,
    }


def describe_work(work: dict) -> str:
    """``work_per_task``'s figures as the benches print them."""
    return (f"{work['transactions']:.2f} ({work['writes']:.2f} writing), "
            f"{work['wal_kb']:.1f} kB of WAL")  # fmt: skip


def server_connection_cap() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {db_connections.SERVER_ALLOWS}")
        return cursor.fetchone()[0]
