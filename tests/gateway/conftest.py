"""Fixtures for the service gateway: small HTTP services in processes of their own (so one can
be killed), a websocket echo service, daphne serving the platform, and service rows pointing
at them (a running task, its attempt with the service's port), as the node agent writes them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.utils import timezone
from websockets.sync.server import serve

from scheduling.models import TaskAttempt
from tests.factories import NodeFactory, TaskFactory
from tests.live import web_server

SERVICE = Path(__file__).resolve().parents[2] / "scripts" / "echo_service.py"


@dataclass
class Service:
    name: str
    port: int
    proc: subprocess.Popen

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def start_service() -> Iterator[Callable[[str], Service]]:
    """Starts ``scripts/echo_service.py NAME`` and returns it; all are stopped afterwards."""
    started: list[Service] = []

    def start(name: str) -> Service:
        proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [sys.executable, str(SERVICE), name],
            stdout=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "PORT"},
        )
        service = Service(name, int(proc.stdout.readline()), proc)
        started.append(service)
        return service

    yield start
    for service in started:
        if service.proc.poll() is None:
            service.kill()


@pytest.fixture
def echo_socket() -> Iterator[int]:
    """A websocket service on a free loopback port: says which path, user and subprotocol it
    was opened with, then echoes every message back."""

    def handler(ws) -> None:
        user = ws.request.headers.get("X-Gpuplatform-User", "")
        ws.send(f"hello {user} at {ws.request.path} ({ws.subprotocol})")
        for message in ws:
            ws.send(message)

    with serve(handler, "127.0.0.1", 0, subprotocols=["v1.kernel.websocket.jupyter.org"]) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server.socket.getsockname()[1]
        server.shutdown()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def platform(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """daphne serving the platform (gateway included) on a free loopback port."""
    log = tmp_path_factory.mktemp("daphne") / "daphne.log"
    with web_server(log=log) as base:
        yield base


@pytest.fixture
def node(db):
    return NodeFactory(name="gpu-node-1")


def run_service(tenant, node, port: int, *, replica_of=None, health: str = "", **fields):
    """A running task of ``tenant`` whose attempt listens on ``port`` on ``node``."""
    fields.setdefault("state", "running")
    task = TaskFactory(tenant=tenant, node=node, replica_of=replica_of, **fields)
    TaskAttempt.objects.create(
        task=task, number=1, node=node, service_port=port, health=health,
        started_at=timezone.now(),
    )  # fmt: skip
    return task
