"""/ws/live/ in-process (the in-memory layer): who may connect, which groups they hear, how
samples are held back for a slow browser, how a reconnecting page catches up."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.utils import timezone

from gpuplatform.asgi import application
from live import events
from scheduling import reasons, transitions
from tests.live_app.conftest import ORIGIN, socket_headers

headers = sync_to_async(socket_headers)

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("_close_connections"),
]


async def connect(headers) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    hello = await communicator.receive_json_from()
    assert hello["type"] == "hello"
    return communicator


async def transition(task, to_state: str) -> None:
    await sync_to_async(transitions.task_transition)(task=task, to_state=to_state, reason="test")


def sample(gpu, util: int, at: float | None = None) -> dict:
    return {
        "gpu_uuid": gpu.uuid,
        "at": at or time.time(),
        "util_gpu": util,
        "memory_used_mb": 1000,
        "memory_total_mb": gpu.memory_mb,
        "temperature_c": 50,
        "power_w": 200.0,
    }


async def publish_samples(node, *samples) -> None:
    await sync_to_async(events.publish_samples)(node_id=node.pk, samples=list(samples))


async def test_an_anonymous_socket_is_refused():
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN])
    connected, _ = await communicator.connect()
    assert not connected


async def test_a_bad_token_is_refused(lab):
    communicator = WebsocketCommunicator(
        application, "/ws/live/", headers=await headers(token="gp_not-a-real-token")
    )
    connected, _ = await communicator.connect()
    assert not connected


async def test_a_user_of_no_tenant_is_refused(db):
    from tests.factories import UserFactory

    nobody = await sync_to_async(UserFactory)(username="nobody")
    communicator = WebsocketCommunicator(
        application, "/ws/live/", headers=await headers(user=nobody)
    )
    connected, _ = await communicator.connect()
    assert not connected


async def test_an_operator_hears_every_tenants_task_changes(operator, estate):
    socket = await connect(await headers(user=operator))
    await transition(estate["theirs"], "cancelled")
    message = await socket.receive_json_from(timeout=5)
    assert message["type"] == "events"
    [event] = [e for e in message["events"] if e["kind"] == "task"]
    assert (event["id"], event["state"]) == (estate["theirs"].pk, "cancelled")
    await socket.disconnect()


async def test_a_member_hears_their_tenants_tasks_and_never_anothers(teammate, estate):
    socket = await connect(await headers(user=teammate.user))
    await transition(estate["theirs"], "cancelled")  # the outsider's: must not arrive
    await transition(estate["ours"], "cancelled")
    message = await socket.receive_json_from(timeout=5)
    assert [(e["kind"], e["id"]) for e in message["events"]] == [("task", estate["ours"].pk)]
    assert await socket.receive_nothing()
    await socket.disconnect()


async def test_a_token_socket_follows_the_tokens_tenant(outsider, estate):
    socket = await connect(await headers(token=outsider.token))
    await transition(estate["ours"], "cancelled")  # the lab's: must not arrive
    await transition(estate["theirs"], "cancelled")
    message = await socket.receive_json_from(timeout=5)
    assert [e["id"] for e in message["events"]] == [estate["theirs"].pk]
    await socket.disconnect()


async def test_a_change_that_rolls_back_is_never_heard(operator, estate):
    socket = await connect(await headers(user=operator))

    def cancel_then_roll_back():
        with transaction.atomic():
            transitions.task_transition(task=estate["ours"], to_state="cancelled")
            transaction.set_rollback(True)

    await sync_to_async(cancel_then_roll_back)()
    assert await socket.receive_nothing()
    await socket.disconnect()


async def test_a_member_gets_the_samples_of_their_tasks_gpus_only(teammate, operator, estate):
    member = await connect(await headers(user=teammate.user))
    ops = await connect(await headers(user=operator))
    gpu0, gpu1 = estate["gpus"]
    await publish_samples(estate["node"], sample(gpu0, 10), sample(gpu1, 90))
    mine = await member.receive_json_from(timeout=5)
    assert mine["type"] == "samples"
    assert [row[0] for row in mine["rows"]] == [gpu0.pk]
    everything = await ops.receive_json_from(timeout=5)
    assert sorted(row[0] for row in everything["rows"]) == sorted([gpu0.pk, gpu1.pk])
    await member.disconnect()
    await ops.disconnect()


async def test_a_slow_browser_drops_old_samples_and_gets_the_newest_after_acking(
    operator, estate, settings
):
    settings.LIVE_UNACKED_FRAMES = 2
    socket = await connect(await headers(user=operator))
    gpu0, _ = estate["gpus"]
    for util in range(10):
        await publish_samples(estate["node"], sample(gpu0, util))
    first = await socket.receive_json_from(timeout=5)
    second = await socket.receive_json_from(timeout=5)
    assert [first["seq"], second["seq"]] == [1, 2]
    assert await socket.receive_nothing()  # two unacknowledged: the rest wait, coalesced
    await socket.send_json_to({"type": "ack", "seq": 2})
    third = await socket.receive_json_from(timeout=5)
    assert third["seq"] == 3
    assert [row[2] for row in third["rows"]] == [9]  # only the newest of what waited
    await socket.disconnect()


async def test_a_reconnecting_page_catches_up_on_what_it_missed(teammate, estate):
    since = time.time() - 1
    await transition(estate["ours"], "cancelled")
    await transition(estate["theirs"], "cancelled")
    socket = await connect(await headers(user=teammate.user))
    await socket.send_json_to({"type": "catch_up", "since": since})
    answer = await socket.receive_json_from(timeout=5)
    assert answer["type"] == "catch_up"
    assert [(e["kind"], e["id"], e["state"]) for e in answer["events"]] == [
        ("task", estate["ours"].pk, "cancelled")
    ]
    assert answer["reload"] is False
    # Away longer than the catch-up window: what changed before it is not in the answer.
    await socket.send_json_to({"type": "catch_up", "since": time.time() - 3 * 3600})
    assert (await socket.receive_json_from(timeout=5))["reload"] is True
    await socket.disconnect()


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"type": "catch_up", "since": "yesterday"}, "since"),
        ({"type": "ack", "seq": 7}, "seq"),
        ({"type": "subscribe"}, "type"),
        ([1, 2], "type"),
    ],
)
async def test_bad_messages_get_an_error_naming_the_field(operator, message, field):
    socket = await connect(await headers(user=operator))
    await socket.send_json_to(message)
    answer = await socket.receive_json_from(timeout=5)
    assert (answer["type"], answer["field"]) == ("error", field)
    await socket.send_to(text_data="not json")
    answer = await socket.receive_json_from(timeout=5)
    assert (answer["type"], answer["field"]) == ("error", "message")
    await socket.disconnect()


async def test_the_node_agents_sampler_publishes_each_tick(operator, workstation):
    from nodeagent.inventory import SimulatedBackend
    from nodeagent.sampler import Sampler
    from scheduling.config import SimulatedGpus

    spec = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 4}
    backend = SimulatedBackend("workstation-1", SimulatedGpus.model_validate(spec))
    socket = await connect(await headers(user=operator))
    await sync_to_async(Sampler(node_name="workstation-1", backend=backend).tick)()
    frame = await socket.receive_json_from(timeout=5)
    assert frame["type"] == "samples"
    gpu_ids = await sync_to_async(lambda: sorted(workstation.gpus.values_list("pk", flat=True)))()
    assert sorted(row[0] for row in frame["rows"]) == gpu_ids
    await socket.disconnect()


async def test_a_catch_up_brings_the_samples_of_the_gap(teammate, estate):
    from telemetry.models import GpuSample

    gpu0, gpu1 = estate["gpus"]
    since = time.time() - 60

    def store():
        GpuSample.objects.bulk_create(
            [
                GpuSample(gpu=gpu, at=timezone.now() - timedelta(seconds=30), util_gpu=util)
                for gpu, util in ((gpu0, 11), (gpu1, 99))
            ]
        )

    await sync_to_async(store)()
    socket = await connect(await headers(user=teammate.user))
    await socket.send_json_to({"type": "catch_up", "since": since})
    answer = await socket.receive_json_from(timeout=5)
    # Only the GPU the lab's task holds.
    assert [(row[0], row[2]) for row in answer["samples"]] == [(gpu0.pk, 11)]
    await socket.disconnect()


async def test_each_reader_hears_a_tasks_reason_in_their_own_language(operator, estate):
    english = await connect(await headers(user=operator))
    chinese = await connect([*await headers(user=operator), (b"accept-language", b"zh-hans")])
    reason = reasons.Reason("cancelled_by", {"by": "olga"})
    await sync_to_async(transitions.task_transition)(
        task=estate["theirs"], to_state="cancelled", reason=reason
    )
    heard = {}
    for language, socket in (("en", english), ("zh", chinese)):
        message = await socket.receive_json_from(timeout=5)
        [event] = [e for e in message["events"] if e["kind"] == "task"]
        assert (event["reason_code"], event["reason_params"]) == ("cancelled_by", {"by": "olga"})
        heard[language] = event["reason"]
        await socket.disconnect()
    assert heard == {"en": "cancelled by olga", "zh": "已被 olga 取消"}


async def test_each_reader_hears_a_passs_pending_reasons_in_their_own_language(operator, estate):
    english = await connect(await headers(user=operator))
    chinese = await connect([*await headers(user=operator), (b"accept-language", b"zh-hans")])
    task = estate["theirs"]
    scope = {"code": "scope_tenant", "params": {"tenant": "lab"}}
    params = {"scope": scope, "limit": 3}
    text = "tenant lab has no room left in its quota of 3 GPUs"
    # As a pass's UPDATE ... RETURNING gives them: the parameters as jsonb's text.
    row = (task.pk, task.tenant_id, text, "wait_quota_gpus", json.dumps(params))
    await sync_to_async(events.publish_reasons)([row])
    heard = {}
    for language, socket in (("en", english), ("zh", chinese)):
        message = await socket.receive_json_from(timeout=5)
        [event] = [e for e in message["events"] if e["kind"] == "reasons"]
        heard[language] = event["reasons"]
        await socket.disconnect()
    assert heard == {
        "en": [[task.pk, text]],
        "zh": [[task.pk, "租户 lab 的配额（3 块 GPU）已无余量"]],
    }
