"""The task page's log when the log lies on another node: pushed from that node's agent, and
said to be unavailable (never empty) while the node cannot be reached."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from gpuplatform.asgi import application
from nodeagent import peer
from scheduling import logs
from scheduling.models import TaskAttempt
from tests.factories import NodeFactory, TaskFactory
from tests.live import free_port
from tests.portal.conftest import browser
from tests.portal.test_log_socket import ORIGIN, _cookie

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest_asyncio.fixture(autouse=True)
async def _close_connections():
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def far_log(tmp_path, settings):
    """A log in node-far's log directory, and node-far's address with nobody listening yet."""
    settings.TASK_LOG_DIR = tmp_path / "node-far"
    log = settings.TASK_LOG_DIR / "vision-lab" / "1" / "attempt-1.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"epoch 1\n")
    return log, f"127.0.0.1:{free_port()}"


def _running_task(actor, log, address):
    node = NodeFactory(name="node-far", advertise_address=address)
    task = TaskFactory(tenant=actor.tenant, owner=actor.user, state="running", attempt=1)
    TaskAttempt.objects.create(task=task, number=1, node=node, log_path=str(log))
    return task


async def _next(communicator, kind: str) -> dict:
    while True:
        message = json.loads(await communicator.receive_from(timeout=5))
        assert message["type"] != "chunk" or kind == "chunk", message
        if message["type"] == kind:
            return message


async def _follow(owner, task) -> WebsocketCommunicator:
    cookie = await sync_to_async(_cookie)(owner.user)
    path = f"/ws/portal/tasks/{task.pk}/log/"
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, cookie])
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def test_a_node_out_of_reach_is_said_so_then_its_log_comes(owner, far_log, monkeypatch):
    log, address = far_log
    # This process plays both the web and node-far: the web must not read node-far's
    # directory itself.
    monkeypatch.setattr(logs.Where, "local", property(lambda where: not where.address))
    task = await sync_to_async(_running_task)(owner, log, address)
    communicator = await _follow(owner, task)
    said = await _next(communicator, "unavailable")
    assert said["attempt"] == 1
    assert f"node node-far at {address} is unreachable" in said["reason"]
    agent = await sync_to_async(peer.serve)("node-far", address)
    try:
        assert (await _next(communicator, "chunk"))["text"] == "epoch 1\n"
        with log.open("ab") as handle:
            handle.write(b"epoch 2\n")
        assert (await _next(communicator, "chunk"))["text"] == "epoch 2\n"
    finally:
        await communicator.disconnect()
        await sync_to_async(agent.stop)()


async def test_a_download_from_a_node_out_of_reach_is_a_503_that_says_why(owner, far_log):
    log, address = far_log
    log.unlink()  # as on another host: not here
    task = await sync_to_async(_running_task)(owner, log, address)
    answer = await sync_to_async(lambda: browser(owner).get(f"/portal/tasks/{task.pk}/log/"))()
    assert answer.status_code == 503
    assert "node node-far" in answer.content.decode() and "unreachable" in answer.content.decode()
