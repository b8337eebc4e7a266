"""A task's log read through the API when it lies on another host's disk: a real node agent
with a var directory and log directory of its own, not the web's, serves it (nodeagent.peer);
once that agent is gone the API says the log cannot be read, never that it is empty."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from django_q.tasks import async_task
from rest_framework.test import APIClient

from scheduling import controls
from scheduling.models import Node, TaskAttempt
from tests.live import PYTHON, ROOT, process_env
from tests.nodeagent.launcher.conftest import state_of, wait_for
from tests.nodeagent.launcher.test_survival import submit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("unshare"),
        reason="the node's own disk is a tmpfs in a mount namespace: needs root and unshare",
    ),
]

CONFIG = """
heartbeat: {interval: 1s, offline_after: 30s}
nodes:
  - name: node-b
    simulate: {model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: 2}
"""
# Lines a little apart, so some are read before the task ends, as `gpuctl logs -f` reads them.
TICKER = "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.3; done"
API = "/api/v1/"


@pytest.fixture
def via_clusters(monkeypatch):
    """Launches go to node-b's own cluster, as in production (test_survival's fixture)."""
    monkeypatch.setattr(controls, "async_task", functools.partial(async_task, sync=False))
    monkeypatch.setenv("Q_SYNC", "0")


@pytest.fixture
def node_b(launcher, via_clusters, tmp_path, settings):
    """node-b's agent, its disk under tmp_path/node-b; the web's log directory elsewhere."""
    settings.TASK_LOG_DIR = tmp_path / "web" / "logs"
    config = tmp_path / "estate.yaml"
    config.write_text(CONFIG)
    var = tmp_path / "node-b"
    var.mkdir()
    agent = [PYTHON, "manage.py", "node_agent", "--backend", "simulated", "--config",
             str(config), "--node", "node-b"]  # fmt: skip
    # Its disk is its own: a tmpfs mounted in a mount namespace of its own, which its
    # supervisors and tasks inherit and this process never sees.
    own_disk = 'mount -t tmpfs -o mode=0711 node-b "$1" && shift && exec "$@"'
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", own_disk, "sh",
         str(var), *agent],
        cwd=ROOT,
        env=process_env(
            GPUPLATFORM_VAR_DIR=str(var),
            GPUPLATFORM_TASK_LOG_DIR=str(var / "logs"),
            NODE_ADVERTISE_ADDRESS="127.0.0.1:0",
        ),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: Node.objects.filter(name="node-b", gpus__isnull=False).exists())
        yield proc, var
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def api(owner) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner.token}")
    return client


def test_a_log_on_another_hosts_disk_is_followed_through_the_api(node_b, api, owner):
    _, var = node_b
    node = Node.objects.get(name="node-b")
    assert node.advertise_address.startswith("127.0.0.1:")
    task = submit(owner.tenant, TICKER)
    wait_for(state_of(task, "running", "succeeded"))
    log = Path(TaskAttempt.objects.get(task=task).log_path)
    assert log.is_relative_to(var / "logs")
    assert not log.exists(), "the web host sees node-b's disk: the test proves nothing"
    url = f"{API}tasks/{task.pk}/log/"
    text, offset, reads, early = "", 0, 0, False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # as gpuctl logs -f polls
        answer = api.get(url, {"offset": offset})
        assert answer.status_code == 200, answer.content
        chunk = answer.json()
        assert chunk["offset"] == offset
        text += chunk["text"]
        offset = chunk["next_offset"]
        reads += 1
        early = early or (chunk["text"] and not chunk["finished"])
        if chunk["finished"]:
            break
        time.sleep(0.1)
    assert text == "".join(f"line {i}\n" for i in range(1, 7))
    assert early, "every line came in one read: the follow was not exercised"
    tail = api.get(url, {"tail": 2}).json()
    assert tail["text"] == "line 5\nline 6\n" and tail["size"] == len(text)
    assert tail["finished"]


def test_a_log_whose_node_cannot_be_reached_is_said_to_be_unavailable(node_b, api, owner):
    proc, _ = node_b
    task = submit(owner.tenant, "echo hello from node-b")
    wait_for(state_of(task, "succeeded"))
    url = f"{API}tasks/{task.pk}/log/"
    assert api.get(url, {"offset": 0}).json()["text"] == "hello from node-b\n"
    proc.terminate()
    proc.wait(timeout=30)
    answer = api.get(url, {"offset": 0})
    assert answer.status_code == 503, answer.content
    body = answer.json()
    assert body["unavailable"] is True
    assert "node node-b" in body["detail"] and "unreachable" in body["detail"]


def _body(answer) -> dict:
    """The JSON of an answer, streamed (a long-poll that waited: the test client runs its
    async body to its end) or not."""
    if answer.streaming:
        with pytest.warns(Warning, match="asynchronous iterators"):
            return json.loads(b"".join(answer))
    return answer.json()


def test_a_long_poll_of_another_hosts_log_answers_when_the_line_comes(node_b, api, owner):
    """``wait``: the web asks node-b's agent to wait for the log to grow; one read brings the
    line the task writes seconds later, and the end once the attempt is over."""
    task = submit(owner.tenant, "echo start; sleep 2; echo later; sleep 1")
    # Until node-b's launcher has recorded the attempt, the log is a 404 (not started yet).
    wait_for(state_of(task, "running", "succeeded"))
    url = f"{API}tasks/{task.pk}/log/"
    deadline = time.monotonic() + 60
    first = {"text": ""}
    while first["text"] != "start\n" and time.monotonic() < deadline:
        first = _body(api.get(url, {"offset": 0, "wait": 5}))
    assert first["text"] == "start\n" and not first["finished"]
    began = time.monotonic()
    later = _body(api.get(url, {"offset": first["next_offset"], "wait": 20}))
    print(f"\nthe long-poll of node-b's log answered after {time.monotonic() - began:.2f} s")
    assert later["text"] == "later\n", later
    offset, finished = later["next_offset"], later["finished"]
    while not finished and time.monotonic() < deadline:
        end = _body(api.get(url, {"offset": offset, "wait": 20}))
        assert end["text"] == ""
        finished = end["finished"]
    assert finished
