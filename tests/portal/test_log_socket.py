"""The task page's log websocket: session-authenticated, tenant-scoped, and pushing what the
task writes to its log file as it writes it."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connections
from django.test import Client

from gpuplatform.asgi import application
from portal.consumers import CLOSE_BAD_REQUEST, CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from scheduling.models import TaskAttempt
from tests.factories import NodeFactory, TaskFactory

ORIGIN = (b"origin", b"http://localhost")

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest_asyncio.fixture(autouse=True)
async def _close_connections():
    yield
    await sync_to_async(connections.close_all)()


def _cookie(user) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    return (b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode())


def _running_task(actor, log):
    node = NodeFactory(name="ws-node")
    task = TaskFactory(tenant=actor.tenant, owner=actor.user, state="running", attempt=1)
    TaskAttempt.objects.create(task=task, number=1, node=node, log_path=str(log))
    return task


async def _socket(path: str, *headers) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, path, headers=[ORIGIN, *headers])


async def _next(communicator, kind: str) -> dict:
    while True:
        message = json.loads(await communicator.receive_from(timeout=5))
        if message["type"] == kind:
            return message


async def test_lines_written_to_the_log_are_pushed_to_the_page(owner, tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"epoch 1\n")
    task = await sync_to_async(_running_task)(owner, log)
    cookie = await sync_to_async(_cookie)(owner.user)
    communicator = await _socket(f"/ws/portal/tasks/{task.pk}/log/", cookie)
    connected, _ = await communicator.connect()
    assert connected
    state = await _next(communicator, "state")
    assert state["state"] == "running" and "running" in state["html"]
    assert (await _next(communicator, "attempt"))["attempt"] == 1
    assert (await _next(communicator, "chunk"))["text"] == "epoch 1\n"
    with log.open("ab") as handle:
        handle.write("epoch 2 损失 0.5\n".encode())
    assert (await _next(communicator, "chunk"))["text"] == "epoch 2 损失 0.5\n"
    await communicator.disconnect()


async def test_an_ended_tasks_socket_says_it_all_then_stops_looking(owner, tmp_path):
    """Nothing more can come from a task that ended: its page's socket stops polling the
    database and the log (it used to every half second for as long as the page stayed open)."""
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"done\n")
    task = await sync_to_async(_running_task)(owner, log)
    await sync_to_async(
        lambda: (
            type(task).objects.filter(pk=task.pk).update(state="succeeded"),
            TaskAttempt.objects.filter(task=task).update(outcome="succeeded"),
        )
    )()
    cookie = await sync_to_async(_cookie)(owner.user)
    communicator = await _socket(f"/ws/portal/tasks/{task.pk}/log/", cookie)
    connected, _ = await communicator.connect()
    assert connected
    assert (await _next(communicator, "state"))["state"] == "succeeded"
    assert (await _next(communicator, "chunk"))["text"] == "done\n"
    assert (await _next(communicator, "ended"))["attempt"] == 1
    with log.open("ab") as handle:
        handle.write(b"written after the end\n")  # a socket still polling would send it
    assert await communicator.receive_nothing(timeout=1.5)
    await communicator.disconnect()


async def test_another_tenants_task_closes_like_a_404(owner, outsider, tmp_path):
    task = await sync_to_async(_running_task)(owner, tmp_path / "x.log")
    cookie = await sync_to_async(_cookie)(outsider.user)
    communicator = await _socket(f"/ws/portal/tasks/{task.pk}/log/", cookie)
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_output() == {
        "type": "websocket.close",
        "code": CLOSE_NOT_FOUND,
    }


async def test_an_anonymous_socket_is_refused(owner, tmp_path):
    task = await sync_to_async(_running_task)(owner, tmp_path / "x.log")
    communicator = await _socket(f"/ws/portal/tasks/{task.pk}/log/")
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_output() == {
        "type": "websocket.close",
        "code": CLOSE_UNAUTHENTICATED,
    }


# --- Who the socket is for: tenants.access.caller_for, as the API's and the portal's -----------


async def test_an_api_token_follows_its_tenants_task_log(teammate, tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"from a script\n")
    task = await sync_to_async(_running_task)(teammate, log)
    bearer = (b"authorization", f"Bearer {teammate.token}".encode())
    communicator = await _socket(f"/ws/portal/tasks/{task.pk}/log/", bearer)
    connected, _ = await communicator.connect()
    assert connected
    assert (await _next(communicator, "chunk"))["text"] == "from a script\n"
    await communicator.disconnect()


async def test_another_tenants_token_closes_like_a_404(owner, outsider, tmp_path):
    task = await sync_to_async(_running_task)(owner, tmp_path / "x.log")
    bearer = (b"authorization", f"Bearer {outsider.token}".encode())
    communicator = await _socket(f"/ws/portal/tasks/{task.pk}/log/", bearer)
    connected, _ = await communicator.connect()
    assert connected
    assert (await communicator.receive_output())["code"] == CLOSE_NOT_FOUND


async def test_a_refused_token_closes_as_anonymous(owner, tmp_path):
    task = await sync_to_async(_running_task)(owner, tmp_path / "x.log")
    bearer = (b"authorization", b"Bearer gpup_AAAAAAAA_" + b"x" * 40)
    communicator = await _socket(f"/ws/portal/tasks/{task.pk}/log/", bearer)
    connected, _ = await communicator.connect()
    assert connected
    assert (await communicator.receive_output())["code"] == CLOSE_UNAUTHENTICATED


@pytest.mark.parametrize("attempt", ["x", "²", "-1", "2147483648"])
async def test_an_attempt_it_cannot_read_closes_as_a_bad_request(owner, tmp_path, attempt):
    task = await sync_to_async(_running_task)(owner, tmp_path / "x.log")
    cookie = await sync_to_async(_cookie)(owner.user)
    path = f"/ws/portal/tasks/{task.pk}/log/?attempt={attempt}"
    communicator = await _socket(path, cookie)
    connected, _ = await communicator.connect()
    assert connected
    assert (await communicator.receive_output())["code"] == CLOSE_BAD_REQUEST
