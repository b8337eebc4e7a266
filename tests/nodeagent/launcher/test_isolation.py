"""Tenants walled off on the host: their own Unix users, cgroups, one attempt alive at a time,
and faults of the platform's own plumbing that never turn into reruns.

Most of these need root (Unix users, cgroups, mounting a tmpfs) and skip elsewhere with the
reason; CI runs them as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from django.db import connections

from gpuplatform.dburl import current_database_url, database_host
from monitoring.models import Alert, AlertKind
from nodeagent.launcher import identity, tracking
from scheduling import controls, scheduler
from scheduling.models import Node, TaskAttempt
from tests.conftest import TEST_USER_PREFIX
from tests.factories import TenantFactory
from tests.nodeagent.launcher.conftest import state_of, wait_for
from tests.nodeagent.launcher.test_launch import attempt_of, log_of, running, start
from tests.nodeagent.launcher.test_survival import agents, submit, via_clusters  # noqa: F401 - fixtures

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="Unix users, cgroups and tmpfs mounts need root"
)

PROBE = r"""exec python3 - <<'EOF'
import json, os, pathlib
found = {"uid": os.getuid(), "user": os.environ.get("USER")}
targets = json.loads(os.environ["PROBE_TARGETS"])
targets.append(f"/proc/{os.getppid()}/environ")
for path in targets:
    try:
        p = pathlib.Path(path)
        found[path] = ",".join(os.listdir(p)) if p.is_dir() else p.read_text(errors="replace")
    except OSError as exc:
        found[path] = f"denied {exc.strerror}"
print(json.dumps(found))
EOF"""


def probe_result(task) -> dict:
    return json.loads(log_of(task).strip().splitlines()[-1])


@needs_root
def test_a_task_reaches_nothing_of_another_tenant_or_the_platform(
    agents,  # noqa: F811
    lab,
    tmp_path,
    monkeypatch,
    settings,
):
    var = tmp_path / "var"
    var.mkdir()
    secret_file = var / "secret_key"
    # The key this process signs django-q2 jobs with; the agent must use the same one.
    secret = settings.SECRET_KEY
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    monkeypatch.setenv("GPUPLATFORM_VAR_DIR", str(var))
    monkeypatch.setenv("SECRET_KEY_FILE", str(secret_file))
    settings.VAR_DIR = var
    (agent,) = agents({"workstation-1": 4})

    first = submit(lab, "echo private > notes.txt; echo first-tenant-log-line; sleep 600")
    wait_for(state_of(first, "running"))
    wait_for(lambda: "first-tenant-log-line" in log_of(first))
    first_root = Path(settings.TASKS_ROOT) / lab.name
    other = TenantFactory(name="nlp-lab")
    targets = [
        attempt_of(first).log_path,
        str(first_root),
        str(first_root / "notes.txt"),
        str(var / "secret_key"),
        str(var / "run" / str(agent.proc.pid) / "database_url"),
        str(var / "run"),
        str(Path(settings.TASK_LOG_DIR)),
        f"/proc/{agent.proc.pid}/environ",
        f"/proc/{attempt_of(first).supervisor_pid}/environ",
    ]
    second = submit(other, PROBE, env={"PROBE_TARGETS": json.dumps(targets)})
    wait_for(state_of(second, "succeeded"))
    found = probe_result(second)

    own = pwd.getpwnam(identity.tenant_user_name("nlp-lab"))
    assert (found["uid"], found["user"]) == (own.pw_uid, own.pw_name)
    assert found["uid"] not in (0, pwd.getpwnam(identity.tenant_user_name("vision-lab")).pw_uid)
    # Its parent's environment as it sees it: the supervisor's, or the namespace's init's.
    (parent,) = set(found) - {*targets, "uid", "user"}
    for path in [*targets, parent]:
        assert found[path].startswith("denied"), f"{path}: {found[path][:200]}"
    everything = json.dumps(found)
    for hidden in (secret, current_database_url(), "private", "first-tenant-log-line"):
        assert hidden not in everything

    # The tenant's root is its own and private; what the task made is its own.
    info = first_root.stat()
    assert (info.st_uid, oct(info.st_mode & 0o777)) == (
        pwd.getpwnam(identity.tenant_user_name("vision-lab")).pw_uid,
        "0o700",
    )
    assert (first_root / "notes.txt").stat().st_uid == info.st_uid
    first.refresh_from_db()
    assert first.state == "running"  # its supervisor is alive, not a zombie with no environment
    # Neither the supervisor nor the node's spawner it was forked from shows a secret in its
    # environment: the agent gave the spawner files instead (and /proc shows both environments
    # blank besides: their process titles, gpup-supervisor task=.. attempt=.. and gpup-spawner
    # .., took over that memory).
    children = psutil.Process(agent.proc.pid).children(recursive=True)
    assert any("spawner" in " ".join(process.cmdline()) for process in children)
    for process in [psutil.Process(attempt_of(first).supervisor_pid), *children]:
        inherited = process.environ()
        assert not {"DATABASE_URL", "SECRET_KEY"} & set(inherited)
        assert secret not in json.dumps(inherited)
        assert current_database_url() not in json.dumps(inherited)
    # The files, which only root may read.
    database_url = var / "run" / str(agent.proc.pid) / "database_url"
    assert database_url.read_text() == current_database_url()
    assert (database_url.stat().st_uid, oct(database_url.stat().st_mode & 0o777)) == (0, "0o600")
    node = Node.objects.get(name="workstation-1")
    assert node.isolation.startswith("tenant users; GPUs fenced by")
    assert node.process_tracking.startswith("cgroup")


def test_an_unprivileged_node_says_it_is_in_single_user_mode(launcher, node, monkeypatch):
    from nodeagent.agent import NodeAgent
    from scheduling.config import EstateConfig

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    simulate = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 1}
    config = EstateConfig.model_validate({"nodes": [{"name": "laptop", "simulate": simulate}]})
    NodeAgent(config=config, node_name="laptop", backend_kind="simulated").register()
    laptop = Node.objects.get(name="laptop")
    assert laptop.isolation == identity.SINGLE_USER_NOTE
    assert "single-user mode: tenants are not isolated on this host" in laptop.isolation


@needs_root
def test_a_tenant_user_is_made_with_no_login_and_a_private_home(launcher, node, lab):
    task = start(lab, "id -un; echo $HOME; touch made-here")
    wait_for(state_of(task, "succeeded"))
    name, home = log_of(task).split()
    entry = pwd.getpwnam(name)
    assert name == identity.tenant_user_name("vision-lab") == f"{TEST_USER_PREFIX}vision-lab"
    assert entry.pw_shell == identity.NOLOGIN and entry.pw_uid != 0
    assert home == str(launcher / "tasks" / "vision-lab")
    assert (Path(home) / "made-here").stat().st_uid == entry.pw_uid


@needs_root
def test_a_tenant_whose_unix_user_is_root_never_runs(launcher, node, lab):
    lab.unix_user = "root"
    lab.save()
    task = start(lab, "id -u")
    wait_for(state_of(task, "failed"))
    assert "tasks never run with root's rights" in task.reason
    assert not Path(attempt_of(task).log_path).exists()


def test_long_tenant_names_make_valid_user_names():
    name = identity.tenant_user_name("a" * 63)
    assert len(name) <= 32 and name.startswith(f"{TEST_USER_PREFIX}aaaa")
    assert name != identity.tenant_user_name("a" * 62 + "b")


# --- cgroups ---------------------------------------------------------------------------------


@needs_root
def test_every_process_of_an_attempt_is_in_its_cgroup_and_dies_with_a_cancel(launcher, node, lab):
    from nodeagent.launcher import cgroups

    task = start(lab, "setsid sleep 300 & (setsid sh -c 'sleep 301 &') ; sleep 302")
    attempt = running(task)
    group = cgroups.AttemptCgroup.find(
        cgroups.detect(), *tracking.cgroup_parts(node.name, task.pk, 1)
    )
    wait_for(lambda: len(group.pids()) >= 3)
    members = group.pids()
    assert attempt.pid in members
    controls.task_cancel(task=task)
    wait_for(state_of(task, "cancelled"))
    assert not [pid for pid in members if psutil.pid_exists(pid)]
    assert cgroups.AttemptCgroup.find(group.hierarchy, *group.parts) is None


@needs_root
def test_a_task_over_its_memory_limit_is_killed_and_says_so(launcher, node, lab):
    task = start(
        lab,
        'python3 -c "b = bytearray(256 << 20); import time; time.sleep(5)"',
        memory_mb=64,
    )
    wait_for(state_of(task, "failed"), timeout=30)
    assert task.exit_code == 137
    assert "out of memory" in task.reason


@needs_root
def test_a_pids_limit_stops_a_fork_bomb(launcher, node, lab):
    task = start(lab, "for i in $(seq 20); do sleep 30 & done; wait", pids=5)
    wait_for(state_of(task, "succeeded", "failed"), timeout=60)
    assert "fork" in log_of(task).lower() or "resource" in log_of(task).lower()


# --- Never two copies ------------------------------------------------------------------------

TICKER = (
    "setsid sleep 1000 & "
    'while true; do echo "$GPUPLATFORM_ATTEMPT $(date +%s.%N)" >> ticks; sleep 0.05; done'
)


def attempts_alive(task_id: int) -> set[str]:
    alive = set()
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get("GPUPLATFORM_TASK_ID") == str(task_id) and proc.status() != "zombie":
                alive.add(env.get("GPUPLATFORM_ATTEMPT"))
        except psutil.Error:
            continue
    return alive


@pytest.mark.slow
def test_killing_a_supervisor_never_leaves_two_attempts_alive(agents, lab, settings):  # noqa: F811
    agents({"workstation-1": 4})
    task = submit(lab, TICKER)
    first = running(task)
    ticks = Path(settings.TASKS_ROOT) / lab.name / "ticks"
    wait_for(lambda: ticks.exists() and ticks.stat().st_size > 100)
    os.kill(first.supervisor_pid, signal.SIGKILL)
    seen = []
    deadline = time.monotonic() + 60
    next_pass = 0.0
    while time.monotonic() < deadline:
        alive = attempts_alive(task.pk)
        seen.append(alive)
        assert len(alive) <= 1, f"attempts {alive} of one task alive at once"
        if alive == {"2"} and {"2"} not in seen[:-1]:
            # Every process of the first attempt is gone once the second runs alone: none can
            # come back. Watch a few seconds more, not the whole minute.
            deadline = min(deadline, time.monotonic() + 3)
        if time.monotonic() > next_pass:  # the scheduler's part: place the requeued task
            scheduler.schedule_pass()
            next_pass = time.monotonic() + 1
        time.sleep(0.1)
    assert {"2"} in seen, "the task never started again"
    assert attempt_of(task).outcome == "lost"
    lines = [line.split() for line in ticks.read_text().splitlines() if line.strip()]
    last_of_first = max(float(t) for a, t in lines if a == "1")
    first_of_second = min(float(t) for a, t in lines if a == "2")
    assert last_of_first < first_of_second
    controls.task_cancel(task=task)
    wait_for(state_of(task, "cancelled"))


# --- A full log disk ---------------------------------------------------------------------------


@pytest.fixture
def small_log_disk(launcher):
    logs = launcher / "logs"
    logs.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(logs)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the logs: {mounted.stderr.strip()}")
    yield logs
    subprocess.run(["umount", "-l", str(logs)], check=False)


@needs_root
def test_a_task_on_a_full_log_disk_runs_once_and_keeps_its_exit_status(small_log_disk, node, lab):
    prints_5mb = "python3 -c \"import sys; [print('x' * 99) for _ in range(50000)]\"; exit 0"
    task = start(lab, prints_5mb)
    wait_for(state_of(task, "succeeded", "failed"), timeout=60)
    assert (task.state, task.exit_code) == ("succeeded", 0)
    assert TaskAttempt.objects.filter(task=task).count() == 1
    assert "output not kept: the log disk is full (" in task.reason
    alert = Alert.objects.get(kind=AlertKind.TASK_LOG_IO, node__name="workstation-1", task=None)
    assert "No space left on device" in alert.message and str(small_log_disk) in alert.message

    # The disk is full now: the next task cannot even reserve its exit file, and its status
    # still reaches the database.
    second = start(lab, "echo more; exit 3", name="second")
    wait_for(state_of(second, "failed"), timeout=60)
    assert second.exit_code == 3
    assert TaskAttempt.objects.filter(task=second).count() == 1


def fill(path: Path) -> None:
    with open(path, "wb") as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()


class DatabaseLink:
    """A TCP relay between supervisors and PostgreSQL that a test can cut and restore."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()  # refused, as a server that is down would
                continue
            upstream = socket.create_connection(self.target)
            self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up.clear()
        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.open.clear()

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.cut()
        self.server.close()


@needs_root
def test_an_exit_status_survives_a_database_outage_and_an_unwritable_disk(
    small_log_disk, node, lab
):
    db = connections["default"].settings_dict
    if database_host(db).startswith("/"):  # the embedded server (on a machine without one)
        pytest.skip("the database is reached through a Unix socket; the outage is a TCP link")
    link = DatabaseLink(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    real = (db["HOST"], db["PORT"])
    db["HOST"], db["PORT"] = "127.0.0.1", str(link.port)  # the supervisor forked next uses it
    try:
        task = start(lab, "sleep 3; exit 3")
        attempt = running(task)
        connections.close_all()
        link.cut()
        # Neither the exit file nor the log can be written now, nor the database reached.
        Path(attempt.log_path).with_name("attempt-1.exit.json").unlink()
        fill(small_log_disk / "filler")
        wait_for(lambda: not psutil.pid_exists(attempt.pid), timeout=30)
        time.sleep(5)  # the supervisor keeps trying meanwhile
        assert psutil.pid_exists(attempt.supervisor_pid)
        link.restore()
        wait_for(state_of(task, "failed"), timeout=30)
    finally:
        link.close()
        connections.close_all()
        db["HOST"], db["PORT"] = real
    assert task.exit_code == 3
    assert TaskAttempt.objects.filter(task=task).count() == 1


def test_a_supervisor_started_afresh_gets_no_secret_in_its_environment(
    launcher, node, lab, settings, monkeypatch
):
    monkeypatch.setenv("SECRET_KEY", "s3cret-platform-key")
    settings.SUPERVISOR_START = "exec"
    task = start(lab, "sleep 2; echo ran")
    attempt = running(task)
    environ = psutil.Process(attempt.supervisor_pid).environ()
    assert "DATABASE_URL" not in environ and "SECRET_KEY" not in environ
    assert "s3cret-platform-key" not in json.dumps(environ)
    # It was started with the runtime files' names instead (its title now covers /proc's copy).
    database_url = Path(settings.VAR_DIR) / "run" / str(os.getpid()) / "database_url"
    assert database_url.read_text() == current_database_url()
    assert oct(database_url.stat().st_mode & 0o777) == "0o600"
    wait_for(state_of(task, "succeeded"))
    assert log_of(task) == "ran\n"


def test_an_agent_forgets_the_runtime_files_of_processes_that_are_gone(settings, tmp_path):
    from nodeagent.launcher import environ

    settings.VAR_DIR = tmp_path
    gone = subprocess.Popen(["true"])
    gone.wait()
    for pid in (gone.pid, os.getpid()):
        (tmp_path / "run" / str(pid)).mkdir(parents=True)
    environ.forget_secret_files_of_dead_processes()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [str(os.getpid())]
