"""``gpuctl describe task`` prints a service's URL and health, and nothing of the kind for
other tasks."""

from __future__ import annotations

from gpuctl.commands.tasks import describe_task
from tests.cli.test_gpuctl import fields_of

SERVICE = {
    "id": 7, "name": "vllm", "state": "running", "gpus": "1", "attempts": [], "required_node": "",
    "service_url": "https://gpu.example/services/7/", "health": "healthy",
}  # fmt: skip


def test_a_service_shows_its_url_and_health():
    described = fields_of(describe_task(SERVICE, []))
    assert described["Service"] == "https://gpu.example/services/7/"
    assert described["Health"] == "healthy"


def test_a_service_without_a_health_check_says_so():
    described = fields_of(describe_task({**SERVICE, "health": ""}, []))
    assert described["Health"] == "no health check"
    stopped = fields_of(describe_task({**SERVICE, "state": "cancelled", "health": ""}, []))
    assert stopped["Health"] == "not running"


def test_a_batch_task_has_neither():
    described = fields_of(describe_task({**SERVICE, "service_url": None, "health": ""}, []))
    assert "Service" not in described and "Health" not in described
