"""gpuctl and services: run's service flags build the spec's service block, and describe
prints a service's URL, port, health and replicas."""

from __future__ import annotations

import json

from gpuctl.commands.tasks import describe_task
from tests.cli.test_gpuctl import Gpuctl, fields_of


def test_run_s_service_flags_make_the_service_block(tmp_path):
    gpuctl = Gpuctl(tmp_path)
    argv = ["run", "--dry-run", "-o", "json", "--port", "auto", "--health", "/health"]
    done = gpuctl(*argv, "--replicas", "2", "--", "serve --port $PORT")
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)
    assert spec["service"] == {"port": "auto", "health": "/health", "replicas": 2}
    fixed = gpuctl("run", "--dry-run", "-o", "json", "--port", "8100", "--", "serve")
    assert json.loads(fixed.stdout)["service"] == {"port": 8100}
    plain = gpuctl("run", "--dry-run", "-o", "json", "--", "true")
    assert "service" not in json.loads(plain.stdout)


def task(**service) -> dict:
    return {
        "id": 7, "name": "llm", "state": "running", "task_class": "online", "gpus": "1",
        "submitted_at": "2026-11-28T12:00:00Z", "started_at": "2026-11-28T12:00:01Z",
        "required_node": "", "service_url": "/services/7/", "service": service or None,
    }  # fmt: skip


def test_describe_prints_a_service_s_port_health_and_replicas():
    replicas = [
        {"id": 7, "state": "running", "node": "ws-1", "service_port": 20417, "health": "healthy"},
        {"id": 8, "state": "running", "node": "ws-1", "service_port": 20418, "health": "starting"},
    ]
    text = describe_task(
        task(
            port="auto", service_port=20417, health="healthy", replica_of=None,
            health_detail="GET /health answered 200 at 12:00:03 UTC", replicas_wanted=2,
            health_check={"path": "/health", "interval": 10}, replicas=replicas,
            healthy="healthy 1/2",
        ),
        [],
    )  # fmt: skip
    shown = fields_of(text)
    assert shown["Service URL"] == "/services/7/"
    assert shown["Port"] == "20417 (asked: auto)"
    assert shown["Health"] == "healthy: GET /health answered 200 at 12:00:03 UTC"
    assert shown["Health check"] == "GET /health every 10s"
    assert shown["Replicas"] == "healthy 1/2"
    assert "8 running ws-1 port 20418 starting" in text


def test_describe_of_a_task_that_is_no_service_has_no_service_lines():
    assert "Port" not in fields_of(describe_task(task(), []))
