"""The alert webhook: a JSON POST when an alert opens and when it resolves, retried later
(a delayed django-q2 row) when the receiver fails."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django_q.models import OrmQ

from monitoring import services, webhook
from scheduling.config import parse_config


class Receiver(BaseHTTPRequestHandler):
    received: list[dict] = []
    fail_next = 0

    def do_POST(self):  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Receiver.fail_next:
            Receiver.fail_next -= 1
            self.send_response(500)
        else:
            Receiver.received.append(body)
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Receiver.received, Receiver.fail_next = [], 0
    config = parse_config(
        {
            "nodes": [{"name": "workstation-1"}],
            "telemetry": {"webhook_url": f"http://127.0.0.1:{server.server_port}/hook"},
        },
        "test.yaml",
    )
    monkeypatch.setattr("scheduling.estate.config", lambda: config)
    yield Receiver
    server.shutdown()
    server.server_close()


def test_an_alert_is_posted_when_it_opens_and_when_it_resolves(
    receiver, workstation, django_capture_on_commit_callbacks
):
    gpu = workstation.gpus.get(index=1)
    with django_capture_on_commit_callbacks(execute=True):
        services.alert_raise(kind="gpu_over_temperature", severity="warning", message="hot",
                             gpu=gpu)  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        services.alert_raise(
            kind="gpu_over_temperature", severity="warning", message="hotter", gpu=gpu
        )  # fmt: skip  (a refresh: no second "opened")
    with django_capture_on_commit_callbacks(execute=True):
        services.alert_resolve(kind="gpu_over_temperature", gpu=gpu)

    assert [(m["event"], m["alert"]["message"]) for m in receiver.received] == [
        ("opened", "hot"),
        ("resolved", "hotter"),
    ]
    opened = receiver.received[0]["alert"]
    assert (opened["kind"], opened["gpu"], opened["node"]) == (
        "gpu_over_temperature",
        gpu.uuid,
        "workstation-1",
    )
    assert receiver.received[1]["alert"]["resolved_at"] is not None


def test_a_failed_post_is_retried_later_not_dropped(
    receiver, workstation, django_capture_on_commit_callbacks
):
    receiver.fail_next = 1
    with django_capture_on_commit_callbacks(execute=True):
        alert = services.alert_raise(kind="gpu_ecc", severity="critical", message="ecc",
                                     node=workstation)  # fmt: skip

    assert receiver.received == []
    [queued] = OrmQ.objects.all()
    assert queued.lock is not None and queued.task["args"] == (alert.pk, "opened", 2)

    assert webhook.send(alert.pk, "opened", 2) == "sent (204)"
    assert receiver.received[0]["alert"]["id"] == alert.pk


def test_no_webhook_configured_sends_nothing(workstation, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        services.alert_raise(kind="gpu_ecc", severity="critical", message="ecc", node=workstation)
    # The live dashboard's publish is the only thing left to do on commit.
    assert [c.__module__ for c in callbacks] == ["live.events"]
    assert not OrmQ.objects.exists()
