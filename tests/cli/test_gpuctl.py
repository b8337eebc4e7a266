"""gpuctl end to end: the real command (``python -m gpuctl``) in a subprocess against daphne
serving the test database.

One server serves the whole module: it only needs the test database to exist (it touches no
rows when it starts), while each test creates its own rows in a transactional test (committed,
so the server sees them, and flushed afterwards). Each test groups several checks.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from gpuctl.client import accept_language
from scheduling.models import Task, TaskAttempt
from scheduling.scheduler import schedule_pass
from tests.factories import AllocationFactory, QuotaFactory, TaskFactory
from tests.live import free_port, web_server

ROOT = settings.BASE_DIR
# Runs gpuctl with PyYAML made unimportable, as on a machine without it.
WITHOUT_YAML = (
    "import runpy, sys; sys.modules['yaml'] = None; "
    "sys.argv[0] = 'gpuctl'; runpy.run_module('gpuctl', run_name='__main__')"
)
# Runs gpuctl with Ctrl-C delivered as KeyboardInterrupt even where the test runner's parent
# ignores SIGINT (a background job), as it is at an interactive terminal.
WITH_SIGINT = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'gpuctl'; runpy.run_module('gpuctl', run_name='__main__')"
)

pytestmark = pytest.mark.slow
# Rows must be committed for the server to see them.
live_db = pytest.mark.django_db(transaction=True)


class Gpuctl:
    """Runs ``python -m gpuctl`` from the repository root with its own config file."""

    def __init__(self, tmp_path: Path) -> None:
        self.config = tmp_path / "gpuctl" / "config.json"
        self.tmp_path = tmp_path

    def env(self, **extra: str) -> dict[str, str]:
        # The C locale unless a test names one: gpuctl asks the server for the user's language.
        locale = ("GPUCTL_", "LC_ALL", "LC_MESSAGES", "LANG")
        environ = {k: v for k, v in os.environ.items() if not k.startswith(locale)}
        environ.update(GPUCTL_CONFIG=str(self.config), PYTHONUNBUFFERED="1", COLUMNS="200")
        environ.update(LANG="C.UTF-8")
        environ.update(extra)
        return environ

    def argv(self, args: tuple[str, ...], bootstrap: str | None = None) -> list[str]:
        head = [sys.executable, "-c", bootstrap] if bootstrap else [sys.executable, "-m", "gpuctl"]
        return [*head, *args]

    def __call__(
        self, *args: str, stdin: str | None = None, bootstrap: str | None = None, **env: str
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(args, bootstrap),
            cwd=ROOT,
            env=self.env(**env),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def ok(self, *args: str, **kwargs) -> str:
        result = self(*args, **kwargs)
        assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
        return result.stdout

    def popen(self, *args: str, bootstrap: str | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            self.argv(args, bootstrap),
            cwd=ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture(scope="module")
def server(django_db_setup) -> str:
    """The base URL of daphne, started once for the module against the test database."""
    with web_server() as base:
        yield base


@pytest.fixture
def fresh_server(django_db_setup) -> str:
    """daphne of this test's own: a server process keeps what it read for minutes (the runtime
    history behind expected starts, ``scheduling.forecasts.history``), across the flushes
    between the module's tests."""
    with web_server() as base:
        yield base


@pytest.fixture
def gpuctl(tmp_path) -> Gpuctl:
    return Gpuctl(tmp_path)


def fields_of(text: str) -> dict[str, str]:
    """``Key:  value`` lines of describe, as a dict."""
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line[:16])
    return {key.strip(): value.strip() for key, value in pairs}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_connection_errors_and_no_login(gpuctl):
    port = free_port()
    down = gpuctl("login", "--url", f"http://127.0.0.1:{port}", "--token", "gpup_a_b")
    assert down.returncode == 3
    assert down.stderr.strip() == (
        f"error: cannot connect to http://127.0.0.1:{port}: connection refused "
        "(is the server running? set --url or GPUCTL_URL)"
    )
    assert not gpuctl.config.exists()
    nobody = gpuctl("get", "tasks")
    assert nobody.returncode == 4
    assert nobody.stderr.strip() == "error: not logged in: run gpuctl login (or set GPUCTL_TOKEN)"
    assert gpuctl("get", "tasks", "--no-such-flag").returncode == 2
    assert gpuctl("--help").stdout.count("exit codes:") == 1


@live_db
def test_login_tokens_quota_usage_inventory(server, gpuctl, owner, workstation):
    QuotaFactory(tenant=owner.tenant, max_gpus=4, max_running_tasks=8)
    bad = gpuctl("login", "--url", server, "--token", "gpup_bogus123_" + "x" * 40)
    assert (bad.returncode, bad.stderr) == (4, "error: token rejected (401): invalid token\n")
    assert not gpuctl.config.exists()

    said = gpuctl.ok("login", "--url", f"{server}/api/v1/", "--token", owner.token)
    assert said.strip() == f"logged in to {server} as alice in tenant vision-lab"
    assert stat.S_IMODE(gpuctl.config.stat().st_mode) == 0o600
    assert json.loads(gpuctl.config.read_text()) == {"url": server, "token": owner.token}
    assert fields_of(gpuctl.ok("whoami"))["Tenant"] == "vision-lab"
    # The environment overrides the saved token.
    assert gpuctl("whoami", GPUCTL_TOKEN="gpup_bogus123_" + "y" * 40).returncode == 4

    created = gpuctl("token", "create", "ci", "--days", "7")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("gpup_")
    assert "only time the secret is shown" in created.stderr
    listed = gpuctl.ok("token", "list")
    assert listed.splitlines()[0].split()[:4] == ["ID", "NAME", "PREFIX", "STATUS"]
    assert any(line.split()[1:2] == ["ci"] and "active" in line for line in listed.splitlines())
    ci = next(t for t in json.loads(gpuctl.ok("token", "list", "-o", "json")) if t["name"] == "ci")
    assert "token" not in ci  # the secret is never listed
    assert json.loads(gpuctl.ok("whoami", "-o", "json", GPUCTL_TOKEN=secret))["username"] == "alice"
    assert gpuctl.ok("token", "revoke", str(ci["id"])) == f"token {ci['id']} revoked\n"
    assert "revoked" in gpuctl.ok("token", "list")
    revoked = gpuctl("whoami", GPUCTL_TOKEN=secret)
    assert (revoked.returncode, revoked.stderr) == (
        4,
        "error: token rejected (401): token revoked\n",
    )
    missing = gpuctl("token", "revoke", "999999")
    assert (missing.returncode, missing.stderr) == (5, "error: token 999999: not found\n")

    quota = gpuctl.ok("quota")
    assert fields_of(quota)["Tenant"] == "vision-lab"
    assert "(all pools)" in quota
    assert json.loads(gpuctl.ok("quota", "-o", "json"))["limits"][0]["max_gpus"] == 4
    usage = gpuctl.ok("usage", "--days", "3")
    assert "GPU-HOURS" in usage and usage.splitlines()[-1].split() == ["total", "0.00"]
    assert len(json.loads(gpuctl.ok("usage", "--days", "3", "-o", "json"))["days"]) == 3

    whole, shared, *_ = workstation.gpus.order_by("index")
    held = TaskFactory(tenant=owner.tenant, name="holds-all", state="running")
    AllocationFactory(task=held, gpu=whole, exclusive=True, memory_mb=whole.memory_mb)
    AllocationFactory(task=TaskFactory(tenant=owner.tenant), gpu=shared, memory_mb=4096)
    gpus = gpuctl.ok("get", "gpus")
    header, *rows = gpus.splitlines()
    assert header.split()[:8] == [
        *("ID", "NODE", "IDX", "TYPE", "MEMORY", "RESERVED", "FREE", "STATE")
    ]
    assert gpus.count("workstation-1") == 4
    # a GPU a task holds whole is available (to operators' eyes) but has nothing free
    assert [row.split()[4:8] for row in rows] == [
        ["24Gi", "24Gi", "0", "available"],
        ["24Gi", "4Gi", "20Gi", "available"],
        ["24Gi", "0", "24Gi", "available"],
        ["24Gi", "0", "24Gi", "available"],
    ]
    assert "workstation-1" in gpuctl.ok("get", "nodes")
    assert gpuctl("get", "node", "nope").returncode == 5


@live_db
def test_submit_run_get_and_bad_specs(server, gpuctl, owner, workstation, tmp_path):
    specs = write(
        tmp_path / "specs.yaml",
        """\
kind: task
name: prep
command: python prep.py
resources: {gpus: 0}
---
kind: sweep
name: lr
parameters: {lr: [0.1, 0.01]}
template:
  command: python train.py --lr {lr}
  resources: {gpus: 0}
""",
    )
    bad = write(tmp_path / "bad.yaml", "name: x\ncommand: run\nresources:\n  gpus: two\n")
    broken = write(tmp_path / "broken.yaml", "name: x\ncommand: [unclosed\n")
    gpuctl.ok("login", "--url", server, "--token", owner.token)

    submitted = gpuctl.ok("submit", "-f", str(specs))
    assert submitted.splitlines()[0].split()[:3] == ["ID", "NAME", "STATE"]
    assert [line.split()[1] for line in submitted.splitlines()[1:]] == ["prep", "lr-0", "lr-1"]
    assert Task.objects.filter(tenant=owner.tenant).count() == 3

    refused = gpuctl("submit", "-f", str(bad))
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        f"error: {bad}: resources.gpus: must be a whole number of GPUs or a range"
    )
    assert "Traceback" not in refused.stderr
    syntax = gpuctl("submit", "-f", str(broken))
    assert syntax.returncode == 1
    assert syntax.stderr.startswith(f"error: {broken}: not valid YAML: line ")
    assert gpuctl("submit", "-f", str(tmp_path / "missing.yaml")).returncode == 2

    one = {"name": "json-one", "command": "true", "resources": {"gpus": 0}}
    from_stdin = gpuctl("submit", "-f", "-", "-o", "json", stdin=json.dumps(one))
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert [t["name"] for t in json.loads(from_stdin.stdout)] == ["json-one"]

    ran = gpuctl(
        "run", "--gpus", "2", "--timeout", "1h", "--env", "LR=0.1", "-o", "json",
        "--", "python", "train.py", "--epochs", "3", "-o", "out dir",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    (made,) = json.loads(ran.stdout)
    task = Task.objects.get(pk=made["id"])
    assert (task.name, task.gpus_min, task.gpus_max) == ("python", 2, 2)
    assert task.command == "python train.py --epochs 3 -o 'out dir'"
    assert (task.timeout_s, task.env) == (3600, {"LR": "0.1"})

    table = gpuctl.ok("get", "tasks").splitlines()
    assert table[0].split() == ["ID", "NAME", "STATE", "GPUS", "NODE", "AGE", "REASON"]
    assert [line.split()[1] for line in table[1:]] == ["python", "json-one", "lr-1", "lr-0", "prep"]
    listed = json.loads(gpuctl.ok("get", "tasks", "-o", "json"))
    assert [t["id"] for t in listed] == sorted((t["id"] for t in listed), reverse=True)
    assert made.pop("warnings") == []  # only the submission's answer has them
    moved_on = ("state", "node", "reason", "reason_code", "reason_params", "attempt", "started_at")
    assert listed[0] == {**made, **{key: listed[0][key] for key in moved_on}}
    limited = gpuctl("get", "tasks", "-l", "2")
    assert len(limited.stdout.splitlines()) == 3
    assert "showing 2 of 5 tasks" in limited.stderr
    assert len(json.loads(gpuctl.ok("get", "tasks", "-A", "-o", "json"))) == 5
    assert len(json.loads(gpuctl.ok("get", "tasks", "--name", "lr-", "-o", "json"))) == 2
    assert json.loads(gpuctl.ok("get", "task", str(task.pk), "-o", "json"))["gpus"] == "2"
    assert gpuctl("get", "tasks", "--state", "runing").returncode == 2

    # A queue name the tenant never used is taken, with a warning that names likely intents.
    queued = {"name": "q1", "command": "true", "queue": "sweep", "resources": {"gpus": 0}}
    first = gpuctl("submit", "-f", "-", stdin=json.dumps(queued))
    assert first.returncode == 0, first.stderr
    assert "warning: task" in first.stderr and "queue 'sweep' is new" in first.stderr
    again = gpuctl("submit", "-f", "-", stdin=json.dumps({**queued, "name": "q2"}))
    assert (again.returncode, again.stderr) == (0, "")
    typo = gpuctl("submit", "-f", "-", stdin=json.dumps({**queued, "queue": "swep"}))
    assert typo.returncode == 0
    assert typo.stderr.strip().endswith(
        "queue 'swep' is new for tenant vision-lab: it starts a serial queue of its own; "
        "did you mean 'sweep'?"
    )

    assert "name: python\n" in gpuctl.ok("get", "task", str(task.pk), "-o", "yaml")
    no_yaml = gpuctl("get", "tasks", "-o", "yaml", bootstrap=WITHOUT_YAML)
    assert no_yaml.returncode == 2
    assert "-o yaml needs PyYAML" in no_yaml.stderr
    # Without PyYAML the file is sent as it is, and the server parses it.
    plain = gpuctl("submit", "-f", str(specs), "-o", "json", bootstrap=WITHOUT_YAML)
    assert plain.returncode == 0, plain.stderr
    assert [t["name"] for t in json.loads(plain.stdout)] == ["prep", "lr-0", "lr-1"]


@live_db
def test_waiting_reason_control_and_other_tenants(
    fresh_server, gpuctl, owner, outsider, workstation
):
    # No runtime history: the module's server may hold earlier tests' (it failed so, once).
    server = fresh_server
    gpuctl.ok("login", "--url", server, "--token", owner.token)
    (big,) = json.loads(gpuctl.ok("run", "--gpus", "4", "-o", "json", "--", "sleep", "600"))
    runs = [gpuctl.ok("run", "--gpus", "2", "-o", "json", "--", "sleep", "1") for _ in range(2)]
    first, second = (json.loads(r)[0]["id"] for r in runs)
    schedule_pass()
    assert Task.objects.get(pk=big["id"]).state == "scheduled"
    waiting = Task.objects.get(pk=second)
    assert waiting.state == "pending" and "2nd of 2 in line" in waiting.reason_text

    described = fields_of(gpuctl.ok("describe", "task", str(second)))
    assert (described["Task"], described["State"]) == (f"{second} sleep", "pending")
    assert described["Waiting"] == waiting.reason_text
    assert described["Position"] == "2nd in line"
    # The task ahead runs with no timeout and no history: nothing to go by.
    assert described["Expected start"].startswith("unknown: nothing to go by")
    assert described["GPUs wanted"] == "2 x any type (whole cards, exclusive)"
    assert described["Command"] == "sleep 1"
    detail = json.loads(gpuctl.ok("describe", "task", str(second), "-o", "json"))
    assert detail["position"] == 2
    assert [e["to_state"] for e in detail["events"]] == ["pending"]
    running = fields_of(gpuctl.ok("describe", "task", str(big["id"])))
    assert (running["State"], running["Node"]) == ("scheduled", "workstation-1")
    assert len(running["GPUs held"].split()) == 1  # the first of four UUIDs, the rest below it

    assert gpuctl.ok("cancel", str(first), str(second)) == (
        f"task {first} sleep: cancelled\ntask {second} sleep: cancelled\n"
    )
    again = gpuctl("cancel", str(second))
    assert again.returncode == 6
    assert again.stderr == f"error: task {second}: state: the task is already cancelled\n"
    assert "pending -> cancelled" in gpuctl.ok("describe", "task", str(second))

    theirs = gpuctl("get", "task", str(big["id"]), GPUCTL_TOKEN=outsider.token)
    assert (theirs.returncode, theirs.stderr) == (5, f"error: task {big['id']}: not found\n")
    assert gpuctl("cancel", str(big["id"]), GPUCTL_TOKEN=outsider.token).returncode == 5
    assert gpuctl("get", "tasks", GPUCTL_TOKEN=outsider.token).stderr == "no tasks found\n"


@live_db
def test_logs_tail_follow_and_interrupt(server, gpuctl, owner, workstation, tmp_path):
    log = write(tmp_path / "attempt-1.log", "".join(f"line {i}\n" for i in range(1, 6)))
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, name="train", state="running",
                       node=workstation, attempt=1)  # fmt: skip
    TaskAttempt.objects.create(task=task, number=1, node=workstation, log_path=str(log))
    never = TaskFactory(tenant=owner.tenant, owner=owner.user, name="later")
    gpuctl.ok("login", "--url", server, "--token", owner.token)

    assert gpuctl.ok("logs", str(task.pk)) == log.read_text()
    assert gpuctl.ok("logs", str(task.pk), "--tail", "2") == "line 4\nline 5\n"
    chunk = json.loads(gpuctl.ok("logs", str(task.pk), "--tail", "1", "-o", "json"))
    assert (chunk["attempt"], chunk["text"], chunk["finished"]) == (1, "line 5\n", False)
    missing = gpuctl("logs", str(never.pk))
    assert missing.returncode == 5
    assert "no log yet: it is pending" in missing.stderr
    assert gpuctl("logs", str(task.pk), "--attempt", "2").returncode == 5

    follower = gpuctl.popen("logs", "-f", str(task.pk), "--tail", "1")
    assert follower.stdout.readline() == "line 5\n"
    with log.open("a") as handle:
        handle.write("line 6\nline 7\n")
    time.sleep(1.5)
    TaskAttempt.objects.filter(task=task).update(outcome="succeeded", exit_code=0)
    Task.objects.filter(pk=task.pk).update(state="succeeded", exit_code=0)
    rest, stderr = follower.communicate(timeout=15)
    assert follower.returncode == 0, stderr
    assert rest == "line 6\nline 7\n"
    assert gpuctl("wait", str(task.pk)).returncode == 0
    Task.objects.filter(pk=never.pk).update(state="failed", exit_code=3)
    failed = gpuctl("wait", str(task.pk), str(never.pk))
    assert failed.returncode == 1
    assert f"error: task {never.pk} later failed (exit code 3)" in failed.stderr

    serving = TaskFactory(tenant=owner.tenant, owner=owner.user, name="serve", state="running",
                          node=workstation, attempt=1)  # fmt: skip
    endless = write(tmp_path / "serve.log", "ready\n")
    TaskAttempt.objects.create(task=serving, number=1, node=workstation, log_path=str(endless))
    interrupted = gpuctl.popen("logs", "-f", str(serving.pk), bootstrap=WITH_SIGINT)
    assert interrupted.stdout.readline() == "ready\n"
    interrupted.send_signal(signal.SIGINT)
    _, stderr = interrupted.communicate(timeout=15)
    assert (interrupted.returncode, stderr) == (130, "")


@live_db
def test_top_metrics_and_sampled_usage(server, gpuctl, owner, outsider, workstation):
    from datetime import timedelta

    from django.utils import timezone

    from telemetry import jobs
    from telemetry.models import GpuSample

    gpu = workstation.gpus.get(index=0)
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, name="busy-run", state="running")
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=3)
    AllocationFactory(task=task, gpu=gpu, started_at=start, exclusive=True, memory_mb=20480)
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpu, at=start + timedelta(seconds=s), task=task, tenant=owner.tenant,
                  util_gpu=75, memory_used_mb=20480, memory_total_mb=24576, temperature_c=66,
                  power_w=310.0, power_limit_w=450.0, simulated=True)
        for s in range(180)
    )  # fmt: skip
    jobs.rollup_minutes(start=start, end=timezone.now())
    gpuctl.ok("login", "--url", server, "--token", owner.token)

    top = gpuctl.ok("top", "--once")
    header, first, *others = top.splitlines()
    assert header.split()[:3] == ["NODE", "GPU", "UTIL"]
    assert "75%" in first and "vision-lab" in first and f"{task.pk}:busy-run" in first
    assert "66 °C" in first and "20Gi/24Gi" in first
    assert "simulated GPUs" in top
    assert json.loads(gpuctl.ok("top", "-o", "json"))[0]["task"] == task.pk

    history = gpuctl.ok("metrics", str(task.pk), "--step", "1m")
    assert history.startswith("source: 1m")
    assert history.count("75%") >= 3
    assert json.loads(gpuctl.ok("metrics", str(task.pk), "-o", "json"))["source"] == "raw"
    bad = gpuctl("metrics", str(task.pk), "--step", "soon")
    assert bad.returncode != 0 and "step" in bad.stderr

    usage = gpuctl.ok("usage", "--sampled", "--days", "1")
    assert usage.splitlines()[1].split() == ["DAY", "MEMBER", "HELD", "USED", "IDLE"]
    assert "alice" in usage

    gpuctl.ok("login", "--url", server, "--token", outsider.token)
    assert gpuctl("metrics", str(task.pk)).returncode == 5  # another tenant's task: not found
    assert "vision-lab" not in gpuctl.ok("top", "--once")


def test_a_list_says_when_its_count_is_only_a_lower_bound(monkeypatch):
    """The task list stops counting past its page (scheduling.api.TaskPage): gpuctl then says
    "at least", and reads on while the server says more follow."""
    from gpuctl.client import Client

    pages = {
        0: {"count": 3, "count_exact": False, "next": "more", "results": [1, 2]},
        2: {"count": 4, "count_exact": True, "next": None, "results": [3, 4]},
    }
    client = Client("http://127.0.0.1:1", "token")
    monkeypatch.setattr(client, "get", lambda path, params: pages[params["offset"]])

    assert client.list("tasks/", limit=2) == ([1, 2], 3, False)
    assert client.list("tasks/") == ([1, 2, 3, 4], 4, True)


def test_get_tasks_says_at_least_when_the_count_is_a_lower_bound(capsys):
    from gpuctl import cli
    from gpuctl.client import Listed
    from gpuctl.commands import tasks
    from gpuctl.context import Context

    task = {"id": 7, "name": "t", "state": "pending", "gpus": "1", "node": None, "reason": "",
            "submitted_at": "2026-11-27T00:00:00Z"}  # fmt: skip

    class Client:
        def __init__(self, exact: bool) -> None:
            self.exact = exact

        def list(self, path, params, *, limit):
            return Listed([task], 10_051, exact=self.exact)

    for exact, said in ((False, "showing 1 of at least 10051 tasks"), (True, "showing 1 of 10051")):
        ctx = Context(cli.build_parser().parse_args(["get", "tasks", "-l", "1"]))
        ctx._client = Client(exact)
        assert tasks.get_tasks(ctx) == 0
        assert said in capsys.readouterr().err


def test_the_accept_language_follows_the_posix_locale():
    assert accept_language({"LANG": "zh_CN.UTF-8"}) == "zh-CN"
    assert accept_language({"LC_ALL": "zh_TW.UTF-8", "LANG": "en_US.UTF-8"}) == "zh-TW"
    assert accept_language({"LC_MESSAGES": "zh_CN", "LANG": "en_US.UTF-8"}) == "zh-CN"
    assert accept_language({"LANG": "C.UTF-8"}) == accept_language({"LANG": "POSIX"}) == ""
    assert accept_language({}) == ""


@live_db
def test_reasons_come_in_the_users_language(server, gpuctl, owner):
    task = TaskFactory(
        tenant=owner.tenant, owner=owner.user, name="bad", state="failed", exit_code=2,
        reason="exited with 2", reason_code="exited", reason_params={"exit_code": 2},
    )  # fmt: skip
    gpuctl.ok("login", "--url", server, "--token", owner.token)
    chinese = fields_of(gpuctl.ok("describe", "task", str(task.pk), LANG="zh_CN.UTF-8"))
    assert chinese["Reason"] == "已退出，退出码 2"
    assert "已退出，退出码 2" in gpuctl.ok("get", "tasks", LC_ALL="zh_CN.UTF-8")
    english = fields_of(gpuctl.ok("describe", "task", str(task.pk)))
    assert english["Reason"] == "exited with 2"


@live_db
def test_logs_of_a_node_out_of_reach_say_so_and_follow_once_it_answers(
    server, gpuctl, owner, workstation, tmp_path, settings
):
    """The log lies on the node's disk only (this test process plays the node, with a log
    directory daphne does not share) and is read through the node's agent."""
    from nodeagent import peer

    address = f"127.0.0.1:{free_port()}"
    type(workstation).objects.filter(pk=workstation.pk).update(advertise_address=address)
    settings.TASK_LOG_DIR = tmp_path / "node-logs"
    log = settings.TASK_LOG_DIR / owner.tenant.name / "1" / "attempt-1.log"
    log.parent.mkdir(parents=True)
    log.write_text("line 1\n")
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, name="far", state="running",
                       node=workstation, attempt=1)  # fmt: skip
    TaskAttempt.objects.create(task=task, number=1, node=workstation, log_path=str(log))
    gpuctl.ok("login", "--url", server, "--token", owner.token)

    refused = gpuctl("logs", str(task.pk))
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"log unavailable: node workstation-1 at {address} is unreachable" in refused.stderr

    follower = gpuctl.popen("logs", "-f", str(task.pk))
    assert "(still trying)" in follower.stderr.readline()
    agent = peer.serve("workstation-1", address)
    try:
        assert follower.stdout.readline() == "line 1\n"
        TaskAttempt.objects.filter(task=task).update(outcome="succeeded", exit_code=0)
        Task.objects.filter(pk=task.pk).update(state="succeeded", exit_code=0)
        rest, stderr = follower.communicate(timeout=15)
        assert follower.returncode == 0, stderr
        assert rest == ""
        assert gpuctl.ok("logs", str(task.pk), "--tail", "1") == "line 1\n"
    finally:
        agent.stop()
