"""Many hosts on one machine: the platform's processes started inside network namespaces.

``Estate`` is one run's network (``netns.Network``), its PostgreSQL (``postgres.
PrivatePostgres``, on the bridge, password auth), the platform's tables (migrated once) and
four hosts, each a namespace with its own ``GPUPLATFORM_VAR_DIR``:

- ``control``: web (daphne, on the host's own address) and a scheduler (``manage.py scheduler``);
- ``sched-2``: a second scheduler;
- ``gpu-1``, ``gpu-2``: a node agent each, with simulated GPUs (``GPU_BACKEND=simulated``).

Tests start the roles they need (``Host.start``), kill a host's processes (``Host.kill``: a
SIGKILL to everything in its namespace) or cut its link (``Host.cut``), and read the database
directly (``Estate.sql``). ``Estate.stop_hosts`` kills every host's processes; ``Estate.remove``
then removes the cluster, the namespaces, the veths and the bridge.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg

from tests.hosts.disks import Disks, unmount_under
from tests.hosts.netns import Network, remove_run
from tests.hosts.postgres import PrivatePostgres

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
WEB_PORT = 8000
GPUS_PER_HOST = 8
SCHEDULER_HOSTS = ("control", "sched-2")
GPU_HOSTS = ("gpu-1", "gpu-2")
HOSTS = (*SCHEDULER_HOSTS, *GPU_HOSTS)
DATABASE = "gpuplatform"  # each test's own copy of TEMPLATE (Estate.fresh_database)
TEMPLATE = "gpuplatform_template"

ESTATE_YAML = """\
heartbeat: {{interval: 1s, offline_after: 10s, fence_after: 5s, lost_after: 20s}}
scheduling: {{busy_pass_gap_ms: 100}}
nodes:
{nodes}
"""
NODE_YAML = (
    "  - name: {name}\n"
    "    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: {count}}}\n"
)

# Variables of the environment the tests run in that must not leak into a host's processes:
# each host is configured from scratch, as a machine of its own would be.
SCRUBBED = re.compile(
    r"^(DATABASE_URL|NODE_NAME|NODE_ADVERTISE_ADDRESS|Q_CLUSTER_NAME|GPU_BACKEND|"
    r"GPUPLATFORM_.*|LAUNCH_.*|Q_.*|CHANNEL_LAYER|WEB_.*|PORT|HOST)$"
)


def wait_until(check: Callable[[], object], timeout: float, what: str, every: float = 0.1):
    """Poll ``check`` until it returns something true; fail saying ``what`` was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(every)


class Host:
    """One machine of the estate: a namespace, an address, a var directory, its processes."""

    def __init__(self, estate: Estate, name: str) -> None:
        self.estate, self.name = estate, name
        self.address = estate.network.add_host(name)
        self.var_dir = estate.root / "hosts" / name
        self.var_dir.mkdir(parents=True)
        estate.disks.add(name)
        self.processes: dict[str, subprocess.Popen] = {}

    def env(self, **extra: str) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not SCRUBBED.match(k)}
        environ.update(
            DATABASE_URL=self.estate.database_url,
            GPUPLATFORM_TESTING="1",
            GPUPLATFORM_VAR_DIR=str(self.var_dir),
            GPUPLATFORM_SYSTEM_DIR=str(self.var_dir / "system"),
            GPUPLATFORM_CONFIG=str(self.estate.config),
            Q_SYNC="0",  # work goes through the broker, between processes and hosts
            LAUNCH_TASKS="1",  # placed tasks are launched, as in production (not by reconciliation)
            CHANNEL_LAYER="postgres",
            PYTHONUNBUFFERED="1",
            LOG_LEVEL="INFO",
            ALLOWED_HOSTS=self.estate.hosts_allowed,
            # lost_after (20 s) must exceed fence_after (5 s) + this + a margin (5 s)
            TASK_STOP_GRACE="5",
        )
        environ.update(extra)
        return environ

    def log(self, role: str) -> Path:
        return self.var_dir / f"{role}.log"

    def start(self, role: str, **extra_env: str) -> subprocess.Popen:
        """Start ``role`` (web, scheduler or agent) inside this host; its output goes to
        ``log(role)``."""
        argv = {
            "web": [PYTHON, "-m", "daphne", "-b", self.address, "-p", str(WEB_PORT),
                    "gpuplatform.asgi:application"],
            "scheduler": [PYTHON, "manage.py", "scheduler"],
            "agent": [PYTHON, "manage.py", "node_agent", "--backend", "simulated"],
        }[role]  # fmt: skip
        environ = self.env(**extra_env)
        if role == "agent":
            environ["NODE_NAME"] = self.name
        with open(self.log(role), "ab") as sink:
            proc = subprocess.Popen(  # noqa: S603 - fixed argv
                [*self.estate.exec_prefix(self.name), *argv],
                cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.processes[role] = proc
        return proc

    def output(self, role: str) -> str:
        path = self.log(role)
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """The host dies: SIGKILL to every process in its namespace."""
        self.estate.network.kill_all(self.name)
        self.reap()

    def kill_role(self, role: str) -> None:
        """SIGKILL one role's whole process group (a process and all it forked)."""
        proc = self.processes[role]
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def reap(self) -> None:
        for proc in self.processes.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.processes.clear()

    def cut(self) -> None:
        self.estate.network.cut(self.name)

    def mend(self) -> None:
        self.estate.network.mend(self.name)


OWNER = "owner"  # in a run's directory: its run id and the test process's pid


def remove_abandoned_runs() -> list[str]:
    """Remove what earlier runs whose test process is gone left behind (a run killed with
    SIGKILL cleans nothing): namespaces, bridge, PostgreSQL and files. A run still going
    (its process alive) is left alone. Returns the runs removed."""
    removed = []
    for root in Path(tempfile.gettempdir()).glob("gpup-hosts-*"):
        try:
            run, pid = (root / OWNER).read_text().split()
        except (OSError, ValueError):
            continue
        if psutil.pid_exists(int(pid)):
            continue
        remove_run(run)
        unmount_under(root)
        try:  # SIGQUIT: PostgreSQL's immediate shutdown
            os.kill(int((root / "pgdata" / "postmaster.pid").read_text().split()[0]), 3)
        except (OSError, ValueError, IndexError):
            pass
        shutil.rmtree(root, ignore_errors=True)
        removed.append(run)
    return removed


class Estate:
    """One run's network, database and hosts (see the module's docstring)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpup-hosts-"))
        self.root.chmod(0o755)  # the postgres user's cluster lives under it
        self.network: Network | None = None
        self.postgres: PrivatePostgres | None = None
        self.disks: Disks | None = None
        self.hosts: dict[str, Host] = {}
        self.token = ""

    def build(self) -> None:
        remove_abandoned_runs()
        self.network = Network()
        (self.root / OWNER).write_text(f"{self.network.run} {os.getpid()}\n")
        self.network.create()
        self.disks = Disks(self.root)
        self.postgres = PrivatePostgres(self.root, self.network.gateway)
        self.postgres.start()
        self.postgres.create_database(TEMPLATE)
        self.database_url = self.postgres.url(TEMPLATE)
        self.hosts_allowed = ",".join(
            str(self.network.subnet.network_address + 10 + i) for i in range(1, len(HOSTS) + 1)
        )
        self.config = self.root / "estate.yaml"
        self.config.write_text(
            ESTATE_YAML.format(
                nodes="".join(NODE_YAML.format(name=n, count=GPUS_PER_HOST) for n in GPU_HOSTS)
            )
        )
        for name in HOSTS:
            self.hosts[name] = Host(self, name)
        self.manage("control", "migrate", "--no-input", timeout=300)
        self.manage("control", "createcachetable")
        boot = self.manage("control", "bootstrap")
        self.token = re.search(r"API token (gpup_\S+)", boot).group(1)
        # The demo tenant may use every GPU of the estate (bootstrap gives it 4).
        self.sql("UPDATE tenants_quota SET max_gpus = %s", [GPUS_PER_HOST * len(GPU_HOSTS)])
        self.fresh_database()

    def fresh_database(self) -> None:
        """Give the next test a database of its own: a copy of the migrated template (no task,
        node or flag of an earlier test), the one before dropped. Hosts' processes must be
        stopped (``stop_hosts``)."""
        with psycopg.connect(self.postgres.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{DATABASE}" TEMPLATE "{TEMPLATE}"')
        self.database_url = self.postgres.url(DATABASE)

    def manage(self, host: str, *args: str, timeout: float = 120, **extra_env: str) -> str:
        """Run ``manage.py`` inside ``host``; its standard output (fails with its errors)."""
        result = subprocess.run(  # noqa: S603 - fixed argv
            [*self.exec_prefix(host), PYTHON, "manage.py", *args],
            cwd=ROOT, env=self.hosts[host].env(**extra_env), capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} on {host}:\n{result.stderr}")
        return result.stdout

    def exec_prefix(self, host: str) -> list[str]:
        """The argv prefix that runs a command on ``host``: its disk, then its network."""
        return [*self.disks.prefix(host, ROOT), *self.network.exec_prefix(host)]

    @property
    def web(self) -> str:
        return f"http://{self.hosts['control'].address}:{WEB_PORT}"

    def sql(self, query: str, params: object = None) -> list[tuple]:
        """Run ``query`` on the estate's database (from the machine, over the bridge)."""
        with psycopg.connect(self.database_url, autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def wait_for_web(self, timeout: float = 60) -> None:
        def answers() -> bool:
            proc = self.hosts["control"].processes.get("web")
            if proc is not None and proc.poll() is not None:
                raise AssertionError("daphne exited:\n" + self.hosts["control"].output("web"))
            try:
                with urllib.request.urlopen(f"{self.web}/healthz", timeout=2):  # noqa: S310
                    return True
            except OSError:
                return False

        try:
            wait_until(answers, timeout, "the control host's web server answering", every=0.3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.hosts['control'].output('web')}") from None

    def stop_hosts(self) -> None:
        """Kill every host's processes, mend every link and start the next test's logs afresh
        (between tests)."""
        for name, host in self.hosts.items():
            self.network.mend(name)
            host.kill()
            for log in host.var_dir.glob("*.log"):
                log.unlink()

    def logs(self, lines: int = 40) -> str:
        """The last ``lines`` of every process's output, host by host (for a failed test)."""
        parts = []
        for name, host in self.hosts.items():
            for log in sorted(host.var_dir.glob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name} {log.stem} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    def remove(self) -> None:
        """Everything this run made, whatever state it is in."""
        try:
            if self.network is not None:
                self.network.remove()
        finally:
            if self.disks is not None:
                self.disks.remove()
            try:
                if self.postgres is not None:
                    self.postgres.stop()
            finally:
                shutil.rmtree(self.root, ignore_errors=True)
