"""What `make run` promises, end to end with real processes: bootstrap, a node agent that
registers 4 simulated GPUs, and daphne serving the admin and the token-authenticated API."""

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import urllib.parse
import urllib.request
from io import StringIO

import psutil
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django_q.models import Schedule

from tenants.models import ApiToken
from tests.live import PYTHON, ROOT, free_port, manage, process_env, web_server
from tests.nodeagent.launcher.conftest import wait_for


def bootstrap() -> dict[str, str]:
    out = StringIO()
    call_command("bootstrap", stdout=out)
    text = out.getvalue()
    return {
        "admin_password": re.search(r"operator\s+admin / (\S+)", text).group(1),
        "token": re.search(r"API token (gpup_\S+)", text).group(1),
    }


@pytest.mark.django_db(transaction=True)
def test_an_operator_sees_four_simulated_gpus_and_the_token_works():
    secrets = bootstrap()
    agent = manage("node_agent", "--once", "--backend", "simulated")
    assert agent.returncode == 0, agent.stderr
    assert "registered 4 GPU(s) via simulated" in agent.stdout

    with web_server() as base:
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login_page = browser.open(f"{base}/admin/login/").read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page).group(1)
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": csrf,
                "username": "admin",
                "password": secrets["admin_password"],
                "next": "/admin/",
            }
        ).encode()
        request = urllib.request.Request(
            f"{base}/admin/login/", data=form, headers={"Referer": f"{base}/admin/login/"}
        )
        assert browser.open(request).geturl() == f"{base}/admin/"
        gpu_page = browser.open(f"{base}/admin/scheduling/gpu/").read().decode()
        assert "4 GPUs" in gpu_page
        for index in range(4):
            assert f"workstation-1/gpu{index}" in gpu_page

        api = urllib.request.Request(
            f"{base}/api/v1/me/", headers={"Authorization": f"Bearer {secrets['token']}"}
        )
        me = json.loads(urllib.request.urlopen(api).read())
        assert (me["username"], me["tenant"]) == ("alice", "demo")

        anonymous = urllib.request.Request(f"{base}/api/v1/me/")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(anonymous)
        assert refused.value.code == 401


@pytest.mark.django_db
def test_bootstrap_shows_secrets_once_and_changes_nothing_the_second_time():
    bootstrap()
    second = StringIO()
    call_command("bootstrap", stdout=second)
    assert second.getvalue() == ""
    assert User.objects.count() == 2
    assert ApiToken.objects.count() == 1
    assert Schedule.objects.filter(func="scheduling.tasks.mark_silent_nodes").count() == 1


# What `make run` starts on one workstation: the runner; one daphne (WEB_WORKERS); the
# scheduler (its jobs on Q_WORKERS threads); the node agent (which runs its node's launch jobs on
# a thread) and its spawner. Issue 41 found 18, each of them a Python process of tens of MiB;
# with django-q2's cluster as the scheduler it was 10.
MAKE_RUN_PROCESSES = 5


def _tree(pid: int) -> list[psutil.Process]:
    try:
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    except psutil.Error:
        return []


@pytest.mark.django_db(transaction=True)
def test_make_run_on_one_workstation_starts_no_more_processes_than_it_needs(tmp_path):
    environ = process_env(
        PORT=str(free_port()), Q_SYNC="0", LAUNCH_TASKS="1", Q_LOG_LEVEL="INFO", STOP_GRACE="20",
        GPUPLATFORM_TASKS_ROOT=str(tmp_path / "tasks"),
        GPUPLATFORM_TASK_LOG_DIR=str(tmp_path / "logs"),
    )  # fmt: skip
    for name in ("WEB_WORKERS", "WEB_SERVER", "Q_WORKERS", "Q_CLUSTER_NAME",
                 "NODE_NAME", "GPU_BACKEND", "GPUPLATFORM_CONFIG"):  # fmt: skip
        environ.pop(name, None)  # make run's defaults: configs/scheduler.yaml's workstation
    log = tmp_path / "run.log"
    with open(log, "wb") as sink:
        runner = subprocess.Popen(  # noqa: S603 - fixed argv
            [PYTHON, "scripts/run.py"], cwd=ROOT, env=environ, stdin=subprocess.DEVNULL,
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    started: list[psutil.Process] = []
    try:

        def everything_started():
            """the scheduler running and the spawner ready (the web server's processes start
            first, at once)"""
            text = log.read_text(errors="replace")
            assert runner.poll() is None, text
            return "job runner on queue gpuplatform running" in text and "spawner ready" in text

        wait_for(everything_started, timeout=180, every=0.2)
        started = _tree(runner.pid)
        roles = [" ".join(proc.cmdline()[:4]) for proc in started]
        assert len(started) <= MAKE_RUN_PROCESSES, roles
        assert len(started) >= MAKE_RUN_PROCESSES, roles  # every role: nothing had died meanwhile
    finally:
        started = started or _tree(runner.pid)
        runner.send_signal(signal.SIGTERM)
        try:
            runner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
        _, alive = psutil.wait_procs(started[1:], timeout=10)
        for proc in alive:  # psutil checks each is still the process it was
            proc.kill()
