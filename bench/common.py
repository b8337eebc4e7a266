"""What every benchmark shares: timing statistics, plain-text tables and target lines, and the
platform's processes (scheduler, node agents, web server) started for a run and always stopped.
"""

from __future__ import annotations

import gc
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil

ROOT = Path(__file__).resolve().parent.parent
CPUS = os.cpu_count() or 1  # what the figures are measured on


@contextmanager
def as_a_web_process() -> Iterator[None]:
    """Python's garbage collector set as a web process sets it once it has started
    (``gpuplatform.gctune.settle``), for in-process timings of what a web process serves; set
    back afterwards, since the benchmarks share this process. With the interpreter's defaults,
    an occasional render paid for a full collection, which a web process does not. With
    ``GPUPLATFORM_STOCK=gc`` a web process keeps the interpreter's defaults, and so does this."""
    from django.conf import settings

    from gpuplatform import gctune

    if "gc" in settings.GPUPLATFORM_STOCK:
        yield
        return
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    gctune.settle()
    try:
        yield
    finally:
        if not frozen:  # what was frozen before stays so (it cannot be told apart)
            gc.unfreeze()
        gc.set_threshold(*threshold)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(len(ordered) * q / 100))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, left: int = 1) -> str:
    """Columns padded to their widest cell: the first ``left`` left-aligned, the rest right."""
    cells = [[str(c) for c in header], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[col]) for row in cells) for col in range(len(header))]
    lines = []
    for index, row in enumerate(cells):
        parts = [
            cell.ljust(width) if col < left else cell.rjust(width)
            for col, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def verdict(met: bool | None) -> str:
    if met is None:
        return "not measured"
    return "met" if met else "NOT met"


@dataclass(frozen=True)
class Target:
    """One figure of a run against its target: a row of docs/benchmarks.md (bench/report.py)."""

    figure: str  # what was measured, e.g. "task list p99, 8 clients"
    value: str  # as measured, formatted for reading
    goal: str  # the target, e.g. "< 50 ms"
    met: bool | None  # None: not measured in this run


TARGETS: list[Target] = []  # every target of this process's run, in the order they were judged
# Each benchmark's figures once it has run, by name (bench/run.py): one judged beside another's
# reads them here, and declares it in RUNS_AFTER so that the other runs first.
FIGURES: dict[str, object] = {}


def target(figure: str, value: str, goal: str, met: bool | None) -> str:
    """Record a figure against its target for the run's report (bench/run.py writes them to
    docs/benchmarks.md) and return its verdict for the benchmark's own printed line."""
    TARGETS.append(Target(figure, value, goal, met))
    return verdict(met)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def clear_estate(*extra_tables: str) -> None:
    """Empty every task table (and ``extra_tables``) and remove every node and GPU: what the
    benchmarks before left would be in every pass, and tasks would be placed on nodes whose
    agents are gone."""
    from scheduling.models import GPU, Node

    clear_tasks(*extra_tables)
    GPU.objects.all().delete()
    Node.objects.all().delete()


def clear_tasks(*extra_tables: str) -> None:
    """Empty every task table (and ``extra_tables``) between benchmark rounds."""
    from django.db import connection

    from scheduling.models import (
        Allocation,
        PassRequest,
        SchedulerState,
        Task,
        TaskAttempt,
        TaskEvent,
    )

    tables = [
        Allocation._meta.db_table,
        TaskEvent._meta.db_table,
        TaskAttempt._meta.db_table,
        Task.depends_on.through._meta.db_table,
        Task._meta.db_table,
        SchedulerState._meta.db_table,
        PassRequest._meta.db_table,
        *extra_tables,
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")  # noqa: S608 - model names


# --- Platform processes ------------------------------------------------------------------------


class Proc:
    """A platform process in its own process group, its output in a file."""

    def __init__(self, name: str, argv: list[str], environ: dict[str, str], tmp: Path) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        with open(self.log, "wb") as sink:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                argv,
                cwd=ROOT,
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)


def stop_all(procs: list[Proc], grace_s: float = 20.0) -> None:
    """SIGTERM each leader, SIGKILL whatever of its group is left after ``grace_s``."""
    for p in procs:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"{p.name} did not stop within {grace_s:.0f} s: killing it", flush=True)
        try:
            os.killpg(p.proc.pid, signal.SIGKILL)  # the group: workers, the node's cluster
        except (ProcessLookupError, PermissionError):
            pass
        p.proc.wait()


def wait_for(what: str, predicate: Callable[[], object], timeout: float, procs: list[Proc],
             poll_s: float = 0.01):  # fmt: skip
    """Poll ``predicate`` until it returns something true; fail if a process died meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for p in procs:
            p.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(poll_s)


def close_other_sessions() -> None:
    """Sessions left on the bench database (a supervisor still reporting) would keep it from
    being dropped."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --- Web servers ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


GTHREAD_THREADS = 4  # threads per gunicorn gthread worker


# The daphne processes the api and throughput benchmarks serve a busy estate with. `make run`
# starts WEB_WORKERS (scripts/run.py), one by default since issue 41 (bench_idle).
MAKE_RUN_WEB_WORKERS = 2


def server_argv(kind: str, port: int, workers: int) -> list[str]:
    """daphne as scripts/run.py starts it (``workers`` processes on one socket,
    gpuplatform.webserve); gunicorn with sync workers, or gthread workers (``kind="gthread"``:
    each keeps connections alive and serves several in threads)."""
    if kind == "daphne":
        return [sys.executable, "-m", "gpuplatform.webserve", "-b", "127.0.0.1", "-p", str(port),
                "-w", str(workers)]  # fmt: skip
    threads = ["-k", "gthread", "--threads", str(GTHREAD_THREADS)] if kind == "gthread" else []
    return [sys.executable, "-m", "gunicorn", "-k", "sync", "-w", str(workers), *threads,
            "-b", f"127.0.0.1:{port}", "gpuplatform.wsgi:application"]  # fmt: skip


@contextmanager
def web_server(
    kind: str,
    workers: int,
    tmp: Path,
    env: dict[str, str],
    label: str = "",
    startup_timeout_s: float = 30.0,
    grace_s: float = 10.0,
) -> Iterator[tuple[int, subprocess.Popen]]:
    """Start the server in its own process group, output to a file; always stop it."""
    port = free_port()
    log = tmp / f"{label or kind}-{workers}.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(  # noqa: S603 - fixed argv
            server_argv(kind, port, workers),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {proc.returncode}:\n{tail(log)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2):  # noqa: S310
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} did not answer in {startup_timeout_s:.0f} s:\n"
                                       f"{tail(log)}") from None  # fmt: skip
                time.sleep(0.2)
        yield port, proc
    finally:
        stop_server(kind, proc, grace_s)


def stop_server(kind: str, proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the server, SIGKILL it after ``grace_s``, then any of its workers left."""
    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        workers = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        print(f"{kind} did not stop within {grace_s:.0f} s: killing it", flush=True)
        proc.kill()
        proc.wait()
    # psutil checks each is still the process it was (not a reused pid) before killing it.
    _, alive = psutil.wait_procs(workers, timeout=2)
    for worker in alive:
        try:
            worker.kill()
        except psutil.Error:
            pass


# --- API clients (forked child processes that never touch the database) ------------------------


class ClientJob(NamedTuple):
    port: int
    token: str
    method: str
    path: str
    count: int
    start_at: float  # time.perf_counter() at which to begin (the same clock across a fork)
    limit_s: float
    tag: str
    command: str = "python train.py --epochs 1"  # of each submitted 1-GPU task
    pool: str = ""
    batch: int = 0  # 0: one spec per POST; N: a list of N specs per POST


def api_client(job: ClientJob) -> dict:
    """Send ``count`` requests on one keep-alive connection; one latency per request."""
    headers = {"Authorization": f"Bearer {job.token}", "Accept": "application/json"}
    if job.method == "POST":
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection("127.0.0.1", job.port, timeout=30)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    sample = ""
    connects = 0
    while (wait := job.start_at - time.perf_counter()) > 0:
        time.sleep(wait)
    began, cpu = time.perf_counter(), time.process_time()
    deadline = began + job.limit_s
    for n in range(job.count):
        if time.perf_counter() > deadline:
            break
        body = None
        if job.method == "POST":
            resources: dict[str, object] = {"gpus": 1}
            if job.pool:
                resources["pool"] = job.pool
            specs = [
                {"name": f"{job.tag}-{n}-{i}" if job.batch else f"{job.tag}-{n}",
                 "command": job.command, "resources": resources}
                for i in range(job.batch or 1)
            ]  # fmt: skip
            body = json.dumps(specs if job.batch else specs[0])
        t0 = time.perf_counter()
        try:
            if conn.sock is None:
                connects += 1
            conn.request(job.method, job.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            status, data = 0, repr(exc).encode()
        latencies.append(time.perf_counter() - t0)
        statuses[status] += 1
        if not 200 <= status < 300 and not sample:
            sample = f"{status}: {data[:300].decode(errors='replace')}"
    ended, cpu = time.perf_counter(), time.process_time() - cpu
    conn.close()
    return {"latencies": latencies, "statuses": dict(statuses), "began": began, "ended": ended,
            "sample": sample, "connects": connects, "cpu_s": cpu}  # fmt: skip


@dataclass
class ClientsResult:
    """What ``api_client`` processes measured, together."""

    latencies: list[float]  # sorted
    statuses: Counter
    wall_s: float
    errors: int  # answers other than 2xx
    error_sample: str


def merge_clients(parts: list[dict]) -> ClientsResult:
    statuses: Counter[int] = Counter()
    for part in parts:
        statuses.update(part["statuses"])
    return ClientsResult(
        latencies=sorted(lat for part in parts for lat in part["latencies"]),
        statuses=statuses,
        wall_s=max(p["ended"] for p in parts) - min(p["began"] for p in parts),
        errors=sum(n for status, n in statuses.items() if not 200 <= status < 300),
        error_sample=next((p["sample"] for p in parts if p["sample"]), ""),
    )
