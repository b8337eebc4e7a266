"""An idle platform's weight: what `make run` costs while nobody uses it.

``scripts/run.py`` starts as `make run` starts it (web, scheduler, the node agent of
``configs/scheduler.yaml``'s one workstation with 4 simulated GPUs and its spawner) on a free
port against the bench database, with the settings' own worker counts. Once
it is up, its node registered and SETTLE_S more seconds have passed, every process in its tree
(the runner itself included) and every live supervisor (none when idle: they live outside the
tree) is counted; their CPU time is summed over IDLE_S seconds of idleness and their
proportional set size (PSS: shared pages divided among the processes that share them) at the
end. PostgreSQL is not counted. Targets (issue 41): at most 300 MiB PSS and 1% of a core.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import psutil

from bench.bench_latency import child_env
from bench.common import (
    ROOT,
    Proc,
    close_other_sessions,
    free_port,
    stop_all,
    table,
    target,
    wait_for,
)
from gpuplatform.procid import ProcessId
from scheduling.models import Node, TaskAttempt

NEEDS_DATABASE = True

CONFIG = ROOT / "configs" / "scheduler.yaml"  # make run's estate: workstation-1, 4 GPUs
SETTLE_S = 20.0  # after start-up: first reconciliation, first samples, imports done
IDLE_S = 60.0
TARGET_PSS_MIB = 300.0
TARGET_CPU_PERCENT = 1.0
MIB = 1024 * 1024


def role_of(proc: psutil.Process, parent_role: str | None) -> str:
    """What a process of the tree is, from its command line or, for the processes django-q2
    forks (renamed by setproctitle), its parent's."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        cmdline = ""
    if "scripts/run.py" in cmdline:
        return "runner"
    if "webserve" in cmdline or "daphne" in cmdline or "gunicorn" in cmdline:
        return "web"
    if "node_agent" in cmdline:
        return "node agent"
    if "nodeagent.launcher.spawner" in cmdline or "gpup-spawner" in cmdline:
        return "spawner"
    if ("manage.py scheduler" in cmdline or "qcluster" in cmdline) and parent_role == "runner":
        return "scheduler"
    return parent_role or "other"


def platform_processes(runner_pid: int) -> dict[psutil.Process, str]:
    """Every process in the runner's tree with its role, and the live supervisors."""
    top = psutil.Process(runner_pid)
    found: dict[psutil.Process, str] = {}
    queue: list[tuple[psutil.Process, str | None]] = [(top, None)]
    while queue:
        proc, parent_role = queue.pop()
        role = role_of(proc, parent_role)
        found[proc] = role
        try:
            queue.extend((child, role) for child in proc.children())
        except psutil.Error:
            pass
    attempts = TaskAttempt.objects.filter(outcome="", supervisor_pid__isnull=False)
    for pid, started in attempts.values_list("supervisor_pid", "supervisor_started"):
        if ProcessId(pid, started).alive():
            try:
                found.setdefault(psutil.Process(pid), "supervisors")
            except psutil.Error:
                pass
    return found


def cpu_s(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def memory(proc: psutil.Process) -> tuple[int, int]:
    """(PSS, USS): its share of every page it maps, and the pages only it maps."""
    try:
        info = proc.memory_full_info()
    except psutil.Error:
        return 0, 0
    return info.pss, info.uss


def title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:60] or proc.name()
    except psutil.Error:
        return "?"


def measure(runner_pid: int, idle_s: float) -> list[dict]:
    """Each process: its role, PSS and USS (MiB) at the end, CPU (% of one core) over
    ``idle_s``."""
    before = {proc: cpu_s(proc) for proc in platform_processes(runner_pid)}
    began = time.monotonic()
    time.sleep(idle_s)
    after = platform_processes(runner_pid)
    wall = time.monotonic() - began
    found = []
    for proc, role in after.items():
        now = cpu_s(proc)
        start = before.get(proc)  # a process new in the window: all of its CPU time
        used = (now or 0.0) - (start or 0.0) if now is not None else 0.0
        pss, uss = memory(proc)
        found.append({"role": role, "pid": proc.pid, "title": title(proc), "pss": pss / MIB,
                      "uss": uss / MIB, "cpu": 100 * max(0.0, used) / wall})  # fmt: skip
    return found


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):  # noqa: S310
            return True
    except OSError:
        return False


def main() -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpuplatform-bench-idle-"))
    tmp.chmod(0o711)
    environ = child_env(tmp, CONFIG)
    # As `make run` runs: its channel layer and save limit. Worker counts (WEB_WORKERS,
    # Q_WORKERS) and GPUPLATFORM_STOCK are the caller's: unset, make run's own.
    environ.pop("Q_SAVE_LIMIT", None)
    port = free_port()
    environ.update(PORT=str(port), CHANNEL_LAYER="postgres", STOP_GRACE="20")
    procs: list[Proc] = []
    try:
        runner = Proc("run", [sys.executable, "scripts/run.py"], environ, tmp)
        procs.append(runner)
        wait_for("the web server to answer", lambda: answers(port), 180, procs, poll_s=0.5)
        registered = Node.objects.filter(name="workstation-1", gpus__isnull=False).exists
        wait_for("workstation-1 to register", registered, 120, procs, 0.2)
        time.sleep(SETTLE_S)
        runner.check()
        found = measure(runner.proc.pid, IDLE_S)
        runner.check()
    except Exception:
        for p in procs:
            print(f"--- {p.name} log ({p.log}) ---\n{p.tail()}", flush=True)
        raise
    finally:
        stop_all(procs, 30)
        close_other_sessions()
    shutil.rmtree(tmp, ignore_errors=True)

    found.sort(key=lambda p: (p["role"], p["pid"]))
    print(table(["role", "pid", "process", "PSS MiB", "USS MiB", "CPU % of a core"],
                [(p["role"], p["pid"], p["title"], f"{p['pss']:.1f}", f"{p['uss']:.1f}",
                  f"{p['cpu']:.2f}") for p in found], left=3))  # fmt: skip
    roles: dict[str, dict[str, float]] = defaultdict(lambda: {"n": 0, "pss": 0.0, "cpu": 0.0})
    for p in found:
        roles[p["role"]]["n"] += 1
        roles[p["role"]]["pss"] += p["pss"]
        roles[p["role"]]["cpu"] += p["cpu"]
    rows = [
        (role, int(r["n"]), f"{r['pss']:.1f}", f"{r['cpu']:.2f}")
        for role, r in sorted(roles.items(), key=lambda item: -item[1]["pss"])
    ]
    count = len(found)
    mib = sum(p["pss"] for p in found)
    cpu = sum(p["cpu"] for p in found)
    rows.append(("all", count, f"{mib:.1f}", f"{cpu:.2f}"))
    print()
    print(table(["role", "processes", "PSS MiB", "CPU % of a core"], rows))
    memory_verdict = target(
        "idle make run: PSS of its processes (database excluded)",
        f"{mib:.0f} MiB",
        f"<= {TARGET_PSS_MIB:.0f} MiB",
        mib <= TARGET_PSS_MIB,
    )
    cpu_verdict = target(
        f"idle make run: CPU over {IDLE_S:.0f} s",
        f"{cpu:.2f}% of a core",
        f"<= {TARGET_CPU_PERCENT:g}%",
        cpu <= TARGET_CPU_PERCENT,
    )
    print(
        f"idle footprint: {count} processes, {mib:.0f} MiB PSS ({memory_verdict}: <= "
        f"{TARGET_PSS_MIB:.0f} MiB), {cpu:.2f}% of a core ({cpu_verdict}: <= "
        f"{TARGET_CPU_PERCENT:g}%) over {IDLE_S:.0f} s, {SETTLE_S:.0f} s after start-up; "
        f"{os.cpu_count()} CPUs"
    )
    return {"processes": count, "pss_mib": round(mib, 1), "cpu_percent": round(cpu, 3),
            "roles": {role: dict(r) for role, r in roles.items()}}  # fmt: skip
