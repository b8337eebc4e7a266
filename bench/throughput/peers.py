"""The peers the platform is compared with, task-spooler and Slurm: installed when they can be,
each run in a scratch directory of its own, every daemon stopped whatever happens."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil

from bench.common import Proc, free_port, stop_all, wait_for
from bench.throughput.figures import (
    BATCH,
    HOSTNAME,
    LATENCY_TASKS,
    PEER_LATENCY_LIMIT_S,
    PEER_LATENCY_MIN,
    POLL_S,
    SLOTS,
    SLURM_THROUGHPUT_LIMIT_S,
    STAMP,
    TASKS,
    TSP_THROUGHPUT_LIMIT_S,
    Latency,
    completion,
    parse_stamp,
)


def slurm_conf(scratch: Path, *, host: str, ctld_port: int, node_port: int, cpus: int) -> str:
    """One controller and one node on this host, everything under ``scratch``, no munge."""
    return f"""\
# Written by gpuplatform's bench/bench_throughput.py; removed with its directory.
ClusterName=gpuplatform-bench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={scratch}/state
SlurmdSpoolDir={scratch}/spool
SlurmctldPidFile={scratch}/slurmctld.pid
SlurmdPidFile={scratch}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# The node claims {cpus} CPUs (the GPU slots of the estate) whatever the host has.
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=bench Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


# --- Clean-up that happens whatever happens ------------------------------------------------------


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C (finally blocks run, daemons stop) instead of killing us."""

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def cleanup(action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` on leaving, and at interpreter exit if leaving never happened."""
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            done = True
            action()

    atexit.register(once)
    try:
        yield
    finally:
        once()
        atexit.unregister(once)


def kill_ours(name: str, ours: Callable[[psutil.Process], bool]) -> int:
    """SIGKILL the processes called ``name`` that ``ours`` recognises (by a path in our scratch
    directory: never another user's daemon of the same name)."""
    killed = 0
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != name:
            continue
        try:
            if ours(proc):
                proc.kill()
                killed += 1
        except psutil.Error:
            pass
    return killed


# --- Installing the peers -----------------------------------------------------------------------


@contextmanager
def no_service_starts() -> Iterator[None]:
    """Debian's maintainer scripts start a package's daemons unless policy-rc.d says no; the
    bench wants none running but its own, so it says no while it installs (if no policy exists)."""
    policy = Path("/usr/sbin/policy-rc.d")
    if policy.exists():
        yield
        return
    policy.write_text(
        "#!/bin/sh\n# gpuplatform bench: no daemon starts while it installs\nexit 101\n"
    )
    policy.chmod(0o755)
    try:
        yield
    finally:
        policy.unlink(missing_ok=True)


def ensure_installed(binaries: Sequence[str], packages: Sequence[str]) -> str | None:
    """None when every binary is on PATH (installing the packages if need be); else why not."""
    if all(shutil.which(b) for b in binaries):
        return None
    if os.geteuid() != 0:
        return f"not installed ({', '.join(packages)}), and not root to install it"
    if shutil.which("apt-get") is None:
        return f"not installed ({', '.join(packages)}), and no apt-get"
    environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    print(f"installing {' '.join(packages)} with apt-get...", flush=True)
    with no_service_starts():
        for attempt in (install, ["apt-get", "update", "-q"], install):
            done = subprocess.run(  # noqa: S603 - fixed argv
                attempt, env=environ, capture_output=True, text=True, timeout=600, check=False
            )
            if attempt is install and done.returncode == 0:
                break
    missing = [b for b in binaries if not shutil.which(b)]
    if missing:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return f"not installed: apt-get install {' '.join(packages)} failed ({' '.join(last)})"
    return None


def run_quiet(argv: list[str], environ: dict[str, str], timeout: float = 30) -> str:
    done = subprocess.run(  # noqa: S603 - fixed argv
        argv, env=environ, capture_output=True, text=True, timeout=timeout, check=True
    )
    return done.stdout


# --- task-spooler ------------------------------------------------------------------------------


def measure_tsp(scratch: Path) -> dict:
    why = ensure_installed(["tsp"], ["task-spooler"])
    if why:
        return {"skipped": why}
    scratch.mkdir()
    socket_path = str(scratch / "socket")
    environ = {**os.environ, "TS_SOCKET": socket_path, "TMPDIR": str(scratch)}
    tsp = functools.partial(run_quiet, environ=environ)

    def stop() -> None:
        try:
            tsp(["tsp", "-K"], timeout=10)
        except (OSError, subprocess.SubprocessError):
            pass  # killed below, or never started
        kill_ours("tsp", lambda proc: proc.environ().get("TS_SOCKET") == socket_path)

    with cleanup(stop):
        tsp(["tsp", "-S", str(SLOTS)])  # starts its server
        latency = Latency()
        until = time.monotonic() + PEER_LATENCY_LIMIT_S
        while len(latency.samples) < LATENCY_TASKS and (
            len(latency.samples) < PEER_LATENCY_MIN or time.monotonic() < until
        ):
            submitted = time.time()
            job = tsp(["tsp", *STAMP.split()]).strip()
            tsp(["tsp", "-w", job])
            output = Path(tsp(["tsp", "-o", job]).strip())
            stamp = parse_stamp(output.read_text())
            if stamp is None:
                latency.lost += 1
            else:
                latency.samples.append(stamp - submitted)
        tsp(["tsp", "-C"])  # forget the finished probes

        first = time.time()
        for _ in range(TASKS):
            tsp(["tsp", "-n", "true"])
        deadline = first + TSP_THROUGHPUT_LIMIT_S
        while True:
            listing = tsp(["tsp", "-l"]).splitlines()[1:]
            waiting = sum(1 for line in listing if line.split()[1:2] in (["queued"], ["running"]))
            now = time.time()
            if not waiting or now > deadline:
                break
            time.sleep(POLL_S / 5)
    finishes = [now] * (TASKS - waiting)
    return {"version": tsp_version(), "latency": latency,
            "throughput": completion(first, finishes, TASKS, now)}  # fmt: skip


def tsp_version() -> str:
    done = subprocess.run(["tsp", "-V"], capture_output=True, text=True, check=False)  # noqa: S607
    if done.returncode != 0:
        return "?"
    return (done.stdout or done.stderr).strip().splitlines()[0].split(" - ")[0]


# --- Slurm -------------------------------------------------------------------------------------


SLURM_BINARIES = ["slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel"]


def slurm_auth_none() -> bool:
    """Slurm 22.05 still ships auth/none (dropped in later releases): no munge needed."""
    plugins = ("/usr/lib/*-linux-gnu/slurm-wlm", "/usr/lib64/slurm", "/usr/lib/slurm")
    return any(any(Path("/").glob(f"{d.lstrip('/')}/auth_none.so")) for d in plugins)


def measure_slurm(scratch: Path) -> dict:
    why = ensure_installed(SLURM_BINARIES, ["slurm-wlm"])
    if why:
        return {"skipped": why}
    if os.geteuid() != 0:
        return {"skipped": "slurmd must run as root to start jobs"}
    if not slurm_auth_none():
        return {"skipped": "this Slurm has no auth/none plugin (a munge set-up is not automated)"}
    version = run_quiet(["slurmctld", "-V"], dict(os.environ)).strip()
    for sub in ("state", "spool", "out", "jobs"):
        (scratch / sub).mkdir(parents=True)
    jobs = scratch / "jobs"
    conf = scratch / "slurm.conf"
    conf.write_text(slurm_conf(scratch, host=HOSTNAME, ctld_port=free_port(),
                               node_port=free_port(), cpus=SLOTS))  # fmt: skip
    environ = {**os.environ, "SLURM_CONF": str(conf)}
    slurm = functools.partial(run_quiet, environ=environ)
    daemons = [
        Proc("slurmctld", ["slurmctld", "-D", "-c", "-f", str(conf)], environ, scratch),
        Proc("slurmd", ["slurmd", "-D", "-f", str(conf)], environ, scratch),
    ]

    def stop() -> None:
        # Jobs first, and gone, before slurmd: a step daemon whose slurmd was killed under it
        # hangs on (seen: 15 left behind), so any still there are killed too, found by the
        # working directory every job of ours was given.
        try:
            slurm(["scancel", "--user", "root"], timeout=15)
            until = time.monotonic() + 15
            while slurm(["squeue", "-h"], timeout=15).strip() and time.monotonic() < until:
                time.sleep(0.2)
        except (OSError, subprocess.SubprocessError):
            pass
        stop_all(daemons, grace_s=15)
        kill_ours("slurmstepd", lambda proc: Path(proc.cwd()).is_relative_to(jobs))

    with cleanup(stop):
        wait_for("Slurm's node to be idle",
                 lambda: slurm(["sinfo", "-h", "-o", "%t"]).strip() == "idle", 60, daemons,
                 poll_s=0.2)  # fmt: skip
        latency = Latency()
        until = time.monotonic() + PEER_LATENCY_LIMIT_S
        n = 0
        while len(latency.samples) < LATENCY_TASKS and (
            len(latency.samples) < PEER_LATENCY_MIN or time.monotonic() < until
        ):
            out = scratch / "out" / f"latency-{n}.out"
            n += 1
            submitted = time.time()
            slurm(["sbatch", "-Q", "--parsable", "-D", str(jobs), "-o", str(out), "--wrap", STAMP])
            stamp = None
            with_deadline = time.monotonic() + 30
            while stamp is None and time.monotonic() < with_deadline:
                stamp = parse_stamp(out.read_text()) if out.exists() else None
                time.sleep(0.005)
            if stamp is None:
                latency.lost += 1
            else:
                latency.samples.append(stamp - submitted)
        # The last probe's job may still be completing: let it leave the queue.
        wait_for("the probes to leave Slurm's queue",
                 lambda: not slurm(["squeue", "-h", "-r", "-o", "%i"]).strip(), 30, daemons,
                 poll_s=0.1)  # fmt: skip

        first = time.time()
        for _ in range(TASKS // BATCH):  # two submissions, as the platform's two API calls
            slurm(["sbatch", "-Q", "--parsable", "-D", str(jobs), f"--array=0-{BATCH - 1}",
                   "-o", "/dev/null", "--wrap", "true"])  # fmt: skip
        deadline = first + SLURM_THROUGHPUT_LIMIT_S
        while True:
            left = len(slurm(["squeue", "-h", "-r", "-o", "%i"]).split())
            now = time.time()
            if not left or now > deadline:
                break
            time.sleep(0.1)
    finishes = [now] * (TASKS - left)
    return {"version": version, "latency": latency,
            "throughput": completion(first, finishes, TASKS, now)}  # fmt: skip
