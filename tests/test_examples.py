"""The examples/ directory: gpu_burn.py runs and stops as documented, every YAML example is a
valid spec (and the sweep runs as written), and submit_many.py speaks the task API and explains
its errors.

gpu_burn.py runs on the CPU here (CUDA_VISIBLE_DEVICES=""), so no GPU is needed; submit_many.py
talks to a closed port and to a small fake of the /api/v1/tasks/ contract.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scheduling.models import Task, TaskAttempt
from scheduling.spec import parse_specs, parse_yaml
from tests.api.conftest import bearer
from tests.nodeagent.launcher.conftest import launcher, node, state_of, wait_for  # noqa: F401 - fixtures

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GPU_BURN = EXAMPLES / "gpu_burn.py"
SUBMIT_MANY = EXAMPLES / "submit_many.py"

pytestmark = pytest.mark.slow  # real processes


def run_example(script: Path, *args: str, env: dict | None = None, timeout: float = 60):
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )


# --- gpu_burn.py ------------------------------------------------------------------------------


def test_gpu_burn_runs_on_the_cpu_when_given_no_gpu_and_prints_its_task():
    env = {"GPUPLATFORM_TASK_ID": "42", "GPUPLATFORM_ATTEMPT": "2"}
    result = run_example(GPU_BURN, "--seconds", "1", env=env)

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "GPUPLATFORM_TASK_ID=42" in out
    assert "GPUPLATFORM_ATTEMPT=2" in out
    assert "CUDA_VISIBLE_DEVICES=\n" in out
    assert "running on the CPU" in out
    assert "CUDA_VISIBLE_DEVICES is empty" in out  # and why
    assert "TFLOP/s" in out
    assert out.rstrip().endswith("done")


def test_gpu_burn_pure_python_fallback():
    result = run_example(GPU_BURN, "--seconds", "1", "--backend", "python")

    assert result.returncode == 0, result.stderr
    assert "running on the CPU (python)" in result.stdout
    assert "cpu (pure Python)" in result.stdout


def test_gpu_burn_fail_with_sets_the_exit_status():
    result = run_example(GPU_BURN, "--seconds", "0.5", "--fail-with", "3")

    assert result.returncode == 3
    assert "exiting with 3" in result.stdout


def test_gpu_burn_rejects_bad_arguments():
    result = run_example(GPU_BURN, "--seconds", "-1")

    assert result.returncode == 2
    assert "--seconds" in result.stderr


def test_gpu_burn_stops_on_sigterm_with_143():
    process = subprocess.Popen(
        [sys.executable, str(GPU_BURN), "--seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    try:
        lines = []
        for line in process.stdout:  # wait until it burns, so the handler is surely installed
            lines.append(line)
            if line.startswith("burning"):
                break
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert process.returncode == 143
    assert "stopping" in rest.splitlines()
    assert "done" not in rest


# --- YAML specs -------------------------------------------------------------------------------

EXPECTED_TASKS = {
    "deepseek-7b.yaml": ["deepseek-7b"],
    "train-sweep.yaml": [f"train-sweep-{i}" for i in range(4)] + ["train-sweep-eval"],
}


def test_every_yaml_example_is_known_here():
    assert sorted(p.name for p in EXAMPLES.glob("*.y*ml")) == sorted(EXPECTED_TASKS)


@pytest.mark.parametrize("filename", sorted(EXPECTED_TASKS))
def test_yaml_example_parses_and_expands(filename):
    tasks = parse_yaml((EXAMPLES / filename).read_text())

    assert [task.name for task in tasks] == EXPECTED_TASKS[filename]


def test_deepseek_spec_is_an_online_service_on_one_whole_gpu():
    (task,) = parse_yaml((EXAMPLES / "deepseek-7b.yaml").read_text())

    assert task.task_class == "online"
    assert task.priority == 90
    assert (task.gpus_min, task.gpus_max, task.gpu_memory_mb) == (1, 1, None)
    assert "HF_HOME" in task.env
    assert task.command == (
        "python -m vllm.entrypoints.openai.api_server --model deepseek-ai/deepseek-llm-7b-chat"
        " --host $GPUPLATFORM_SERVICE_HOST --port $PORT --gpu-memory-utilization 0.90"
    )
    assert task.service == {
        "port": "auto",
        "health": {
            "path": "/health", "interval": 10, "timeout": 2, "start_period": 300, "failures": 3
        },
        "replicas": 1,
    }  # fmt: skip


def test_sweep_runs_serially_and_the_evaluation_waits_for_all_of_it():
    *sweep, evaluation = parse_yaml((EXAMPLES / "train-sweep.yaml").read_text())

    assert {task.queue for task in sweep} == {"sweep"}
    grid = {(task.env["LEARNING_RATE"], task.env["BATCH_SIZE"]) for task in sweep}
    assert grid == {("0.01", "32"), ("0.01", "64"), ("0.001", "32"), ("0.001", "64")}
    assert all("gpu_burn.py" in task.command and "--lr " in task.command for task in sweep)
    assert evaluation.queue == ""
    assert set(evaluation.after) == {task.name for task in sweep}


def test_the_sweep_example_runs_as_written_through_the_api(
    launcher,  # noqa: F811
    node,  # noqa: F811
    owner,
):
    """`gpuctl submit -f examples/train-sweep.yaml`, the README's own example: the file as it
    is, through the API, with real processes in the tenant's directory (not this checkout)."""
    text = (EXAMPLES / "train-sweep.yaml").read_text()

    response = bearer(owner.token).post("/api/v1/tasks/", text, content_type="application/yaml")

    assert response.status_code == 201, response.content
    tasks = [Task.objects.get(pk=row["id"]) for row in response.json()]
    for task in tasks:
        wait_for(state_of(task, "succeeded", "failed", "cancelled"), timeout=120)
    assert [(task.name, task.state) for task in tasks] == [
        *((f"train-sweep-{i}", "succeeded") for i in range(4)),
        ("train-sweep-eval", "succeeded"),
    ], [task.reason for task in tasks]
    log = Path(TaskAttempt.objects.get(task=tasks[0]).log_path).read_text()
    assert "running on the CPU" in log and log.rstrip().endswith("done")


# --- submit_many.py ---------------------------------------------------------------------------


def test_submit_many_help():
    result = run_example(SUBMIT_MANY, "--help")

    assert result.returncode == 0
    for option in ("--url", "--token", "--n", "--gpus", "--gpu-memory", "--queue", "--wait"):
        assert option in result.stdout


def test_submit_many_dry_run_builds_valid_specs():
    result = run_example(
        SUBMIT_MANY,
        *("--dry-run", "--n", "3", "--gpus", "1-2", "--gpu-memory", "4Gi", "--queue", "q"),
        *("--priority", "high", "--retries", "2", "--timeout", "10m"),
        env={"GPUPLATFORM_TOKEN": ""},
    )

    assert result.returncode == 0, result.stderr
    tasks = parse_specs(json.loads(result.stdout))
    assert [task.name for task in tasks] == ["burn-0", "burn-1", "burn-2"]
    assert all(task.gpu_memory_mb == 4096 and task.gpus_max == 2 for task in tasks)
    assert all(task.queue == "q" and task.retries == 2 and task.priority == 90 for task in tasks)
    assert "gpu_burn.py" in tasks[0].command


def test_submit_many_without_a_token_is_a_usage_error():
    result = run_example(SUBMIT_MANY, env={"GPUPLATFORM_TOKEN": ""})

    assert result.returncode == 2
    assert "GPUPLATFORM_TOKEN" in result.stderr


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends


def test_submit_many_against_a_closed_port_exits_2_and_says_so():
    url = f"http://127.0.0.1:{closed_port()}"
    result = run_example(SUBMIT_MANY, "--url", url, "--token", "gpup_x", timeout=30)

    assert result.returncode == 2
    assert f"cannot connect to {url}: connection refused" in result.stderr
    assert "make run" in result.stderr
    assert "Traceback" not in result.stderr


class FakeApi(BaseHTTPRequestHandler):
    """The task API contract: POST a list of specs, GET a task; a state per poll."""

    token = "gpup_good"
    tasks: dict[int, dict] = {}
    answer_400: dict | None = None

    def log_message(self, *args):  # keep test output quiet
        pass

    def reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorised(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.token}":
            return True
        self.reply(401, {"detail": "Invalid token."})
        return False

    def do_POST(self):
        if not self.authorised():
            return
        specs = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.answer_400 is not None:
            self.reply(400, self.answer_400)
            return
        created = []
        for spec in specs:
            task_id = len(self.tasks) + 1
            fail = "--fail-with" in spec["command"]
            states = ["running", "failed" if fail and task_id == 2 else "succeeded"]
            self.tasks[task_id] = {"id": task_id, "name": spec["name"], "states": states}
            created.append({"id": task_id, "name": spec["name"], "state": "pending"})
        self.reply(201, created)

    def do_GET(self):
        if not self.authorised():
            return
        task = self.tasks.get(int(self.path.rstrip("/").rsplit("/", 1)[1]))
        if task is None:
            self.reply(404, {"detail": "Not found."})
            return
        state = task["states"].pop(0) if len(task["states"]) > 1 else task["states"][0]
        body = {"id": task["id"], "name": task["name"], "state": state, "exit_code": None}
        if state in ("succeeded", "failed"):
            body.update(
                started_at="2025-01-01T10:00:00Z",
                finished_at="2025-01-01T10:00:05.5Z",
                exit_code=0 if state == "succeeded" else 3,
            )
        self.reply(200, body)


@contextmanager
def fake_api(answer_400: dict | None = None) -> Iterator[str]:
    handler = type("Api", (FakeApi,), {"tasks": {}, "answer_400": answer_400})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_submit_many_waits_and_prints_a_table():
    with fake_api() as url:
        args = ("--url", url, "--token", "gpup_good", "--n", "3", "--wait", "--poll", "0.05")
        result = run_example(SUBMIT_MANY, *args)

    assert result.returncode == 0, result.stderr
    assert "submitted 3 task(s)" in result.stdout
    header, *rows = result.stdout.split("id  ", 1)[1].splitlines()
    assert header.split() == ["name", "state", "wall", "exit", "reason"]
    assert [row.split()[:4] for row in rows] == [
        [str(i + 1), f"burn-{i}", "succeeded", "5.5s"] for i in range(3)
    ]


def test_submit_many_exits_1_when_a_task_failed():
    with fake_api() as url:
        args = ("--url", url, "--token", "gpup_good", "--n", "3", "--wait", "--poll", "0.05")
        result = run_example(SUBMIT_MANY, *args, "--command", "python3 x.py --fail-with 3")

    assert result.returncode == 1
    assert "burn-1: running -> failed" in result.stdout


def test_submit_many_explains_a_refused_token():
    with fake_api() as url:
        result = run_example(SUBMIT_MANY, "--url", url, "--token", "gpup_bad")

    assert result.returncode == 2
    assert "refused the token (401 Unauthorized): Invalid token." in result.stderr


def test_submit_many_lists_the_field_errors_of_a_400():
    errors = {"[0].resources.gpus": ['must be a whole number of GPUs or a range like "1-4"']}
    with fake_api(answer_400=errors) as url:
        result = run_example(SUBMIT_MANY, "--url", url, "--token", "gpup_good", "--gpus", "x")

    assert result.returncode == 2
    assert "refused the spec (400 Bad Request)" in result.stderr
    assert '  [0].resources.gpus: must be a whole number of GPUs or a range like "1-4"' in (
        result.stderr
    )


class FakeService(BaseHTTPRequestHandler):
    """The platform's task detail (with or without ``service_url``) and an OpenAI-style server
    behind it, on one port: what the deepseek client calls."""

    with_url = True
    seen: list

    def log_message(self, *args):  # quiet
        pass

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append(("GET", self.path, self.headers.get("Authorization")))
        port = self.server.server_address[1]
        service = {"service_port": port}
        url = {"service_url": "/services/7/"} if self.with_url else {}
        self._json(200, {"id": 7, "state": "running", "service": service, **url})

    def do_POST(self):  # noqa: N802
        self.seen.append(("POST", self.path, self.headers.get("Authorization")))
        self.rfile.read(int(self.headers["Content-Length"]))
        answer = {"choices": [{"message": {"content": "a scheduler"}}], "usage": {}}
        self._json(200, {**answer, "usage": {"completion_tokens": 2}})


@pytest.mark.parametrize("with_url", [True, False], ids=["service_url", "port-fallback"])
def test_the_deepseek_client_calls_the_service_through_its_service_url(with_url, capsys):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import deepseek_client
    finally:
        sys.path.remove(str(EXAMPLES))
    handler = type("Svc", (FakeService,), {"with_url": with_url, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    platform = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code = deepseek_client.main(["--task", "7", "--platform", platform, "--token", "gpup_t"])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0
    assert "a scheduler" in capsys.readouterr().out
    posted = "/services/7/v1/chat/completions" if with_url else "/v1/chat/completions"
    assert handler.seen == [
        ("GET", "/api/v1/tasks/7/", "Bearer gpup_t"),
        ("POST", posted, "Bearer gpup_t"),
    ]
