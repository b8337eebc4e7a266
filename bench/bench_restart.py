"""Restarts never rerun work: every platform process killed with SIGKILL while tasks run.

The platform runs as `make run` runs it (``scripts/run.py``: web, scheduler, one node agent
with 20 simulated GPUs, its cluster and its spawner) against the bench database. 50 one-GPU
tasks are submitted, each printing a line every 0.1 s for RUN_S seconds: 20 run, 30 wait.
Then every process of the platform's user under ``scripts/run.py``, and the runner itself, is
killed with SIGKILL at once (a fault injector's crash of the whole platform, its supervisors
included wherever they are in that tree; tasks run as their tenant's user when root), and
``scripts/run.py`` is started again. Figures, once all 50 have ended: of the 20 that ran at
the kill, how many were adopted (one attempt, succeeded, every line in their log), how many
tasks were rerun (more than one attempt), lost (not succeeded) or doubled (two attempts alive at
once).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.bench_latency import child_env, through_the_broker
from bench.common import (
    Proc,
    clear_estate,
    close_other_sessions,
    free_port,
    stop_all,
    table,
    target,
    wait_for,
)
from gpuplatform.procid import ProcessId
from scheduling.models import Node, Task, TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.states import TERMINAL
from scheduling.submission import task_submit
from tenants.models import Tenant

NEEDS_DATABASE = True

NODE = "bench-restart-1"
GPUS = 20
TASKS = 50
RUN_S = 30  # long enough to outlast the restart
LINES = RUN_S * 10
COMMAND = (
    f'python3 -c "import time\nfor i in range({LINES}):\n    print(i, flush=True)\n'
    '    time.sleep(0.1)"'
)
CONFIG = f"""\
heartbeat: {{interval: 1s, offline_after: 30s}}
nodes:
  - name: {NODE}
    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: {GPUS}}}
"""


def start_platform(tmp: Path, environ: dict[str, str], label: str) -> Proc:
    proc = Proc(label, [sys.executable, "scripts/run.py"], environ, tmp)
    up = f"{label}: gpuplatform is up"
    wait_for(up, lambda: "gpuplatform is up" in proc.log.read_text(errors="replace"), 180,
             [proc], poll_s=0.2)  # fmt: skip
    return proc


def kill_platform(runner: Proc) -> dict[str, int]:
    """SIGKILL ``scripts/run.py`` and every process of our user under it, all at once."""
    me = os.getuid()
    try:
        top = psutil.Process(runner.proc.pid)
        tree = [top, *top.children(recursive=True)]
    except psutil.Error:
        tree = []
    mine = []
    for proc in tree:
        try:
            if proc.uids().real == me:
                mine.append(proc)
        except psutil.Error:
            pass
    supervisors = 0
    for proc in mine:
        try:
            supervisors += proc.name().startswith("gpup-supervis")
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    runner.proc.wait()
    psutil.wait_procs(mine, timeout=10)
    return {"killed": len(mine), "supervisors_killed": supervisors}


def supervisors_alive(tasks: set[int]) -> int:
    """How many of these tasks' running attempts still have their supervisor."""
    rows = TaskAttempt.objects.filter(task_id__in=tasks, outcome="", supervisor_pid__isnull=False)
    return sum(
        ProcessId(pid, started).alive()
        for pid, started in rows.values_list("supervisor_pid", "supervisor_started")
    )


def figures(tasks: list[int], running_at_kill: set[int]) -> dict[str, object]:
    attempts: dict[int, list[TaskAttempt]] = {task: [] for task in tasks}
    for attempt in TaskAttempt.objects.filter(task_id__in=tasks).order_by("number"):
        attempts[attempt.task_id].append(attempt)
    states = dict(Task.objects.filter(pk__in=tasks).values_list("pk", "state"))
    adopted, whole_logs = 0, 0
    for task in running_at_kill:
        mine = attempts[task]
        if len(mine) == 1 and mine[0].outcome == "succeeded":
            adopted += 1
            try:
                lines = Path(mine[0].log_path).read_text().splitlines()
            except OSError:
                lines = []
            whole_logs += lines == [str(i) for i in range(LINES)]
    rerun = sum(len(mine) > 1 for mine in attempts.values())
    lost = sum(state != "succeeded" for state in states.values())
    doubled = 0
    for mine in attempts.values():
        spans = [(a.started_at, a.ended_at) for a in mine if a.started_at is not None]
        pairs = zip(spans, spans[1:], strict=False)
        doubled += any(later[0] < (earlier[1] or later[0]) for earlier, later in pairs)
    reasons = sorted({reason for mine in attempts.values() for reason in [_reason(mine)] if reason})
    return {"adopted": adopted, "whole_logs": whole_logs, "rerun": rerun, "lost": lost,
            "doubled": doubled, "reasons": reasons}  # fmt: skip


def _reason(attempts: list[TaskAttempt]) -> str:
    if len(attempts) < 2:
        return ""
    return (
        Task.objects.get(pk=attempts[0].task_id)
        .events.filter(to_state="lost")
        .values_list("reason", flat=True)
        .first()
        or ""
    )


def main() -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpuplatform-bench-restart-"))
    tmp.chmod(0o711)  # run as root, tasks run as their tenant's user and must reach their root
    config = tmp / "estate.yaml"
    config.write_text(CONFIG)
    environ = child_env(tmp, config)
    environ.update(PORT=str(free_port()), WEB_WORKERS="1", STOP_GRACE="20")
    clear_estate()  # tasks placed on an earlier benchmark's node would never run
    tenant, _ = Tenant.objects.get_or_create(name="bench-restart")
    procs: list[Proc] = []
    try:
        procs.append(start_platform(tmp, environ, "run-1"))
        registered = Node.objects.filter(name=NODE, gpus__isnull=False).exists
        wait_for(f"node {NODE} to register", registered, 120, procs, 0.1)
        with through_the_broker():
            tasks = [
                task_submit(tenant=tenant, spec=TaskSpec(name=f"restart-{n}", command=COMMAND)).pk
                for n in range(TASKS)
            ]
        running = Task.objects.filter(pk__in=tasks, state="running")
        wait_for(f"{GPUS} tasks to run", lambda: running.count() == GPUS, 120, procs, 0.1)
        running_at_kill = set(running.values_list("pk", flat=True))
        pending_at_kill = Task.objects.filter(pk__in=tasks, state="pending").count()
        began = time.perf_counter()
        killed = kill_platform(procs[0])
        alive = supervisors_alive(running_at_kill)
        procs = [start_platform(tmp, environ, "run-2")]
        restarted_s = time.perf_counter() - began
        ended = Task.objects.filter(pk__in=tasks, state__in=TERMINAL)
        wait_for("every task to end", lambda: ended.count() == TASKS, 600, procs, 0.5)
        reconciled = [
            line.split("reconciled its tasks: ", 1)[1]
            for line in procs[0].log.read_text(errors="replace").splitlines()
            if "reconciled its tasks" in line
        ]
    except Exception:
        for p in procs:
            print(f"--- {p.name} log ({p.log}) ---\n{p.tail()}", flush=True)
        raise
    finally:
        stop_all(procs, 30)
        close_other_sessions()
    result = figures(tasks, running_at_kill)
    shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"scripts/run.py: web (1 worker), scheduler, node agent {NODE} ({GPUS} simulated GPUs); "
        f"{TASKS} tasks of {RUN_S} s, {len(running_at_kill)} running and {pending_at_kill} "
        f"pending when every process of the platform's user under scripts/run.py was killed "
        f"with SIGKILL ({killed['killed']} processes, {killed['supervisors_killed']} of them "
        f"supervisors; {alive} supervisors alive after it); scripts/run.py up again after "
        f"{restarted_s:.1f} s"
    )
    if reconciled:
        print(f"the restarted agent's first reconciliation: {reconciled[0]}")
    n = len(running_at_kill)
    verdicts = {
        "adopted": target(
            "restart under SIGKILL: running tasks adopted",
            f"{result['adopted']}/{n}",
            f"{n}/{n}",
            result["adopted"] == n,
        ),
        "rerun": target(
            "restart under SIGKILL: tasks rerun", str(result["rerun"]), "0", result["rerun"] == 0
        ),
        "lost": target(
            "restart under SIGKILL: tasks lost", str(result["lost"]), "0", result["lost"] == 0
        ),
        "doubled": target(
            "restart under SIGKILL: tasks run twice at once",
            str(result["doubled"]),
            "0",
            result["doubled"] == 0,
        ),
    }
    print(
        table(
            ["figure", "value", "target"],
            [
                [
                    "adopted (of those running at the kill)",
                    f"{result['adopted']}/{n}",
                    f"{n}/{n}: {verdicts['adopted']}",
                ],
                ["  of them with every line in their log", f"{result['whole_logs']}/{n}", ""],
                ["rerun (more than one attempt)", result["rerun"], f"0: {verdicts['rerun']}"],
                ["lost (not succeeded)", result["lost"], f"0: {verdicts['lost']}"],
                ["doubled (two attempts at once)", result["doubled"], f"0: {verdicts['doubled']}"],
            ],
        )
    )
    for reason in result["reasons"]:
        print(f"why a task was not adopted: {reason}")
    return {
        "running_at_kill": n,
        "pending_at_kill": pending_at_kill,
        **killed,
        "supervisors_alive_after_kill": alive,
        "restarted_s": restarted_s,
        "reconciled": reconciled[:1],
        **result,
        "target_met": result["adopted"] == n
        and not (result["rerun"] or result["lost"] or result["doubled"]),
    }
