"""A service's health over its attempt (nodeagent.launcher.serving.HealthWatch): starting until
the first good answer, failures within the start-up time not counted, then healthy or
unhealthy, and given up after ``failures`` failed checks in a row. Against a real HTTP server;
time is passed in, so nothing here waits for it."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nodeagent.launcher.serving import HealthWatch, check_host, port_free

HEALTH = {"path": "/health", "interval": 10, "timeout": 2, "start_period": 60, "failures": 2}


class Answers(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("Svc", (Answers,), {"status": 200})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, handler
    httpd.shutdown()
    httpd.server_close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_failures_during_start_up_do_not_count_then_it_turns_healthy(server):
    httpd, handler = server
    watch = HealthWatch(httpd.server_address[1], HEALTH, started=0.0)
    handler.status = 503
    assert watch.due(0.0) and not watch.tick(0.0)  # still starting: no change
    assert (watch.health, watch.failures) == ("starting", 0)
    assert "GET /health answered 503 at" in watch.detail()
    assert not watch.due(5.0) and watch.due(10.0)
    handler.status = 200
    assert watch.tick(10.0) and watch.health == "healthy"


def test_past_start_up_it_is_unhealthy_and_given_up_after_its_failures_in_a_row(server):
    httpd, handler = server
    watch = HealthWatch(httpd.server_address[1], HEALTH, started=0.0)
    watch.tick(0.0)
    handler.status = 500
    assert watch.tick(10.0) and (watch.health, watch.failures, watch.give_up) == (
        "unhealthy",
        1,
        False,
    )
    handler.status = 204
    assert watch.tick(20.0) and (watch.health, watch.failures) == ("healthy", 0)
    handler.status = 404
    watch.tick(30.0)
    assert not watch.give_up
    watch.tick(40.0)
    assert watch.give_up and watch.reason_params("ws-1")["failures"] == 2


def test_a_service_that_never_listens_is_unhealthy_once_its_start_up_is_over():
    watch = HealthWatch(closed_port(), {**HEALTH, "start_period": 5}, started=0.0)
    watch.tick(0.0)
    assert watch.health == "starting"
    assert watch.tick(10.0) and watch.health == "unhealthy"
    assert "GET /health: Connection refused at" in watch.detail()


def test_a_port_something_listens_on_is_not_free(server):
    httpd, _ = server
    assert not port_free("127.0.0.1", httpd.server_address[1])
    assert port_free("127.0.0.1", closed_port())
    assert (check_host("0.0.0.0"), check_host("10.0.0.5")) == ("127.0.0.1", "10.0.0.5")  # noqa: S104
