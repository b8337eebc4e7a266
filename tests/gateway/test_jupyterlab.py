"""A real JupyterLab behind the gateway, started with the portal's notebook command: its page
loads under the service's path, a kernel starts over the API (JupyterLab's XSRF check passes
through the gateway) and runs code over its websocket. JupyterLab is no requirement of the
platform: this runs where ``JUPYTER_PYTHON`` names an interpreter that has it, else skips."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import httpx
import pytest
from websockets.sync.client import connect

from portal.forms import NOTEBOOK_COMMAND
from tests.gateway.conftest import run_service
from tests.live import free_port

pytestmark = pytest.mark.django_db(transaction=True)
PYTHON = os.environ.get("JUPYTER_PYTHON", "")
TIMEOUT = httpx.Timeout(60)


def _has_jupyterlab() -> bool:
    if not PYTHON:
        return False
    found = subprocess.run([PYTHON, "-c", "import jupyterlab"], check=False)  # noqa: S603
    return found.returncode == 0


@pytest.fixture
def notebook(node, owner, tmp_path):
    if not _has_jupyterlab():
        pytest.skip("set JUPYTER_PYTHON to an interpreter with JupyterLab to run this")
    port = free_port()
    task = run_service(owner.tenant, node, port, name="notebook")
    env = {**os.environ, "PORT": str(port), "GPUPLATFORM_TASK_ID": str(task.pk),
           "HOME": str(tmp_path), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}  # fmt: skip
    command = NOTEBOOK_COMMAND.format(python=PYTHON)
    proc = subprocess.Popen(  # noqa: S603 - the portal's own command
        ["/bin/sh", "-c", command], cwd=tmp_path, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(600):  # JupyterLab starts in seconds; the test waits, never times it
            try:
                httpx.get(f"http://127.0.0.1:{port}/services/{task.pk}/api", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield task
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_jupyterlab_opens_and_runs_code_through_the_gateway(platform, owner, notebook):
    base = f"/services/{notebook.pk}/"
    auth = {"Authorization": f"Bearer {owner.token}"}
    with httpx.Client(base_url=platform, timeout=TIMEOUT, headers=auth) as client:
        lab = client.get(base + "lab")
        assert lab.status_code == 200
        assert f'"baseUrl": "{base}"' in lab.text
        xsrf = client.cookies.get("_xsrf") or ""
        started = client.post(base + "api/kernels", json={}, headers={"X-XSRFToken": xsrf})
        assert started.status_code == 201, started.text
        kernel = started.json()["id"]
        cookies = "; ".join(f"{name}={value}" for name, value in client.cookies.items())
    url = platform.replace("http://", "ws://") + f"{base}api/kernels/{kernel}/channels"
    with connect(url, additional_headers={**auth, "Cookie": cookies}, origin=platform) as ws:
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "t",
                       "username": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": "print(6 * 7)", "silent": False},
        }))  # fmt: skip
        while True:
            message = json.loads(ws.recv(timeout=60))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "stream":
                assert message["content"]["text"] == "42\n"
                break
