"""The real thing: daphne on a free port with the PostgreSQL channel layer, and events
published by another process (as the node agent and the scheduler do)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from websockets.sync.client import connect

from tests.live import shell, web_server
from tests.live_app.conftest import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

RECEIVE_TIMEOUT = 20  # generous: two cores shared; a wait, never a timed assertion


def publish_from_another_process(code: str) -> str:
    return shell(code, CHANNEL_LAYER="postgres")


@contextmanager
def open_socket(base: str, *, cookie: str | None = None, token: str | None = None):
    headers = {"Origin": base}
    if cookie:
        headers["Cookie"] = cookie
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with connect(base.replace("http", "ws") + "/ws/live/", additional_headers=headers) as socket:
        assert json.loads(socket.recv(timeout=RECEIVE_TIMEOUT))["type"] == "hello"
        # A round trip: the consumer is in its groups and listening before anyone sends.
        socket.send(json.dumps({"type": "catch_up", "since": 0}))
        assert json.loads(socket.recv(timeout=RECEIVE_TIMEOUT))["type"] == "catch_up"
        yield socket


def next_message(socket, kind: str) -> dict:
    while True:
        message = json.loads(socket.recv(timeout=RECEIVE_TIMEOUT))
        if message["type"] == kind:
            return message


@pytest.fixture(scope="module")
def daphne(django_db_setup, tmp_path_factory):
    """One daphne for the module (it holds no state between tests but the layer's groups,
    which each socket leaves when it closes)."""
    log = tmp_path_factory.mktemp("daphne") / "daphne.log"
    with web_server(log=log, CHANNEL_LAYER="postgres") as base:
        yield base


def test_an_operator_receives_samples_and_task_events_from_another_process(
    daphne, operator, estate
):
    gpu0, gpu1 = estate["gpus"]
    with open_socket(daphne, cookie=session_cookie(operator)) as socket:
        publish_from_another_process(
            "from live.events import publish_samples\n"
            f"publish_samples(node_id={estate['node'].pk}, samples=["
            f"{{'gpu_uuid': '{gpu0.uuid}', 'at': 1.0, 'util_gpu': 42}},"
            f"{{'gpu_uuid': '{gpu1.uuid}', 'at': 1.0, 'util_gpu': 43}}])\n"
            "from scheduling import transitions\n"
            "from scheduling.models import Task\n"
            f"transitions.task_transition(task=Task.objects.get(pk={estate['ours'].pk}),"
            " to_state='cancelled', reason='from elsewhere')\n"
        )
        samples = next_message(socket, "samples")
        assert sorted((row[0], row[2]) for row in samples["rows"]) == [
            (gpu0.pk, 42),
            (gpu1.pk, 43),
        ]
        events = next_message(socket, "events")["events"]
        assert [(e["id"], e["state"], e["reason"]) for e in events] == [
            (estate["ours"].pk, "cancelled", "from elsewhere")
        ]


def test_a_tenants_socket_never_hears_another_tenants_task_or_gpu(daphne, teammate, estate):
    gpu0, gpu1 = estate["gpus"]
    with open_socket(daphne, token=teammate.token) as socket:
        # First what the lab must not hear (the outsider's task and GPU), then its own.
        publish_from_another_process(
            "from live.events import publish_samples\n"
            "from scheduling import transitions\n"
            "from scheduling.models import Task\n"
            f"transitions.task_transition(task=Task.objects.get(pk={estate['theirs'].pk}),"
            " to_state='cancelled')\n"
            f"publish_samples(node_id={estate['node'].pk}, samples=["
            f"{{'gpu_uuid': '{gpu1.uuid}', 'at': 1.0, 'util_gpu': 99}}])\n"
            f"publish_samples(node_id={estate['node'].pk}, samples=["
            f"{{'gpu_uuid': '{gpu0.uuid}', 'at': 2.0, 'util_gpu': 7}}])\n"
            f"transitions.task_transition(task=Task.objects.get(pk={estate['ours'].pk}),"
            " to_state='cancelled')\n"
        )
        first = json.loads(socket.recv(timeout=RECEIVE_TIMEOUT))
        assert (first["type"], [row[0] for row in first["rows"]]) == ("samples", [gpu0.pk])
        second = json.loads(socket.recv(timeout=RECEIVE_TIMEOUT))
        assert (second["type"], [e["id"] for e in second["events"]]) == (
            "events",
            [estate["ours"].pk],
        )


def test_an_anonymous_socket_is_refused_by_daphne(daphne, db):
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        with connect(
            daphne.replace("http", "ws") + "/ws/live/", additional_headers={"Origin": daphne}
        ):
            pass
    assert refused.value.response.status_code == 403


def test_the_publisher_survives_a_layer_without_listeners(estate):
    # Nobody connected: the INSERT matches no group row and the change goes through.
    out = publish_from_another_process(
        "from scheduling import transitions\nfrom scheduling.models import Task\n"
        f"print(transitions.task_transition(task=Task.objects.get(pk={estate['ours'].pk}),"
        " to_state='cancelled').state)"
    )
    assert out.splitlines()[-1] == "cancelled"


def test_a_web_process_with_sockets_open_holds_no_more_connections_than_documented(
    daphne, operator, estate
):
    from contextlib import ExitStack

    from django.conf import settings
    from django.db import connection

    from gpuplatform import connections

    def sessions() -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE 'gpuplatform web%%'"
                " GROUP BY 1"
            )
            return dict(cursor.fetchall())

    cookie = session_cookie(operator)
    with ExitStack() as stack:
        sockets = [stack.enter_context(open_socket(daphne, cookie=cookie)) for _ in range(12)]
        publish_from_another_process(
            "from live.events import publish_samples\n"
            f"publish_samples(node_id={estate['node'].pk}, samples=["
            f"{{'gpu_uuid': '{estate['gpus'][0].uuid}', 'at': 2.0, 'util_gpu': 7}}])\n"
        )
        for socket in sockets:
            next_message(socket, "samples")
        held = sessions()
    channels = connections.CHANNEL_POOL_SIZE + connections.CHANNEL_LISTENERS
    assert 1 <= held.get("gpuplatform web channels", 0) <= channels, held
    assert held.get("gpuplatform web", 0) <= settings.DB_POOL_SIZE, held
