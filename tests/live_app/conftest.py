"""Fixtures for the live plane: session cookies for sockets, operators, a busy estate."""

from __future__ import annotations

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.test import Client

from tests.factories import AllocationFactory, NodeFactory, TaskFactory, UserFactory, make_gpus

ORIGIN = (b"origin", b"http://localhost")  # AllowedHostsOriginValidator wants one (NOTES.md)


def session_cookie(user) -> str:
    """A logged-in session for ``user``, as the value of a Cookie header."""
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def socket_headers(user=None, token: str | None = None) -> list[tuple[bytes, bytes]]:
    headers = [ORIGIN]
    if user is not None:
        headers.append((b"cookie", session_cookie(user).encode()))
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return headers


@pytest_asyncio.fixture
async def _close_connections():
    """Sockets' threads keep connections open; closing them lets the test database go."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def operator(db):
    return UserFactory(username="olga", is_staff=True)


@pytest.fixture
def estate(lab, outsider):
    """Two GPUs on one node: gpu0 runs a lab task, gpu1 an outsider's."""
    node = NodeFactory(name="gpu-node-1")
    gpu0, gpu1 = make_gpus(node, count=2)
    ours = TaskFactory(tenant=lab, name="ours", state="running", node=node)
    theirs = TaskFactory(tenant=outsider.tenant, name="theirs", state="running", node=node)
    AllocationFactory(task=ours, gpu=gpu0, exclusive=True, memory_mb=gpu0.memory_mb)
    AllocationFactory(task=theirs, gpu=gpu1, exclusive=True, memory_mb=gpu1.memory_mb)
    return {"node": node, "gpus": (gpu0, gpu1), "ours": ours, "theirs": theirs}
