"""``/services/<task id>/`` under real daphne: each tenant reaches its own services and nobody
else's (404), HTTP and websockets are relayed, streams arrive in pieces, the platform says who
called, and a service with two replicas spreads requests and survives losing one."""

from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.gateway.conftest import run_service
from tests.live_app.conftest import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

# Every read has a limit: a proxy that buffered a stream fails the test instead of hanging it.
TIMEOUT = httpx.Timeout(30)


def bearer(actor) -> dict[str, str]:
    return {"Authorization": f"Bearer {actor.token}"}


def test_each_tenant_reaches_its_own_service_and_not_the_others(
    platform, node, owner, outsider, start_service
):
    ours = run_service(owner.tenant, node, start_service("ours").port)
    theirs = run_service(outsider.tenant, node, start_service("theirs").port)
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:
        mine = client.get(f"/services/{ours.pk}/whoami", headers=bearer(owner))
        assert mine.status_code == 200
        assert mine.json()["name"] == "ours"
        assert mine.json()["path"] == f"/services/{ours.pk}/whoami"  # the prefix kept
        other = client.get(f"/services/{theirs.pk}/whoami", headers=bearer(outsider))
        assert other.json()["name"] == "theirs"
        for actor, task in ((owner, theirs), (outsider, ours)):
            refused = client.get(f"/services/{task.pk}/whoami", headers=bearer(actor))
            assert refused.status_code == 404
            assert "theirs" not in refused.text and "ours" not in refused.text
        # Anonymous, a bad token and a task that does not exist read the same.
        assert client.get(f"/services/{ours.pk}/whoami").status_code == 404
        bad = {"Authorization": "Bearer gpup_nothing"}
        assert client.get(f"/services/{ours.pk}/whoami", headers=bad).status_code == 404
        missing = client.get("/services/999999/whoami", headers=bearer(owner))
        assert missing.status_code == 404


def test_a_portal_session_gets_in_and_the_service_sees_who_called(
    platform, node, owner, start_service
):
    task = run_service(owner.tenant, node, start_service("ours").port)
    cookie = session_cookie(owner.user)
    forged = {"X-Gpuplatform-User": "root", "x-gpuplatform-tenant": "someone-else"}
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:
        answer = client.get(
            f"/services/{task.pk}/whoami", headers={"Cookie": f"{cookie}; theme=dark", **forged}
        )
    assert answer.status_code == 200
    seen = answer.json()["headers"]
    assert seen["x-gpuplatform-user"] == "alice"
    assert seen["x-gpuplatform-tenant"] == "vision-lab"
    assert seen["x-forwarded-prefix"] == f"/services/{task.pk}"
    # The platform's session never reaches the service; the service's own cookies do.
    assert seen["cookie"] == "theme=dark"
    assert "authorization" not in seen


def test_the_token_is_not_passed_on(platform, node, owner, start_service):
    task = run_service(owner.tenant, node, start_service("ours").port)
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:
        seen = client.get(f"/services/{task.pk}/whoami", headers=bearer(owner)).json()["headers"]
    assert "authorization" not in seen
    assert seen["x-gpuplatform-user"] == "alice"


def test_a_body_goes_to_the_service_and_back(platform, node, owner, start_service):
    task = run_service(owner.tenant, node, start_service("ours").port)
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:
        answer = client.post(f"/services/{task.pk}/echo", headers=bearer(owner), content=b"hi")
        assert answer.json()["body"] == "hi"
        streamed = client.post(
            f"/services/{task.pk}/echo", headers=bearer(owner), content=iter([b"a" * 70000, b"b"])
        )
        assert streamed.json()["body"] == "a" * 70000 + "b"


def test_a_stream_arrives_in_pieces_before_the_service_has_finished(
    platform, node, owner, start_service
):
    service = start_service("ours")
    task = run_service(owner.tenant, node, service.port)
    url = f"/services/{task.pk}/stream"
    with (
        httpx.Client(base_url=platform, timeout=TIMEOUT) as client,
        client.stream("GET", url, headers=bearer(owner)) as answer,
    ):
        assert answer.headers["content-type"] == "text/event-stream"
        pieces = answer.iter_raw()
        first = next(pieces)
        # The service is still waiting to be released: this piece came through alone.
        assert first == b"data: first\n\n"
        httpx.get(f"http://127.0.0.1:{service.port}/release", timeout=TIMEOUT)
        assert b"".join(pieces) == b"data: second\n\n"


def test_a_websocket_is_echoed_through_the_proxy(platform, node, owner, outsider, echo_socket):
    task = run_service(owner.tenant, node, echo_socket)
    url = platform.replace("http://", "ws://") + f"/services/{task.pk}/api/kernels/1/channels"
    with connect(
        url, additional_headers=bearer(owner), origin=platform,
        subprotocols=["v1.kernel.websocket.jupyter.org"],
    ) as ws:  # fmt: skip
        assert ws.subprotocol == "v1.kernel.websocket.jupyter.org"
        hello = ws.recv(timeout=30)
        assert hello == (
            f"hello alice at /services/{task.pk}/api/kernels/1/channels "
            "(v1.kernel.websocket.jupyter.org)"
        )
        ws.send("ping")
        assert ws.recv(timeout=30) == "ping"
        ws.send(b"\x00\x01")
        assert ws.recv(timeout=30) == b"\x00\x01"
    # Another tenant's socket closes as a path nobody serves.
    with connect(url, additional_headers=bearer(outsider), origin=platform) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 4404


def test_no_replica_up_is_a_clear_503(platform, node, owner, start_service):
    task = run_service(owner.tenant, node, start_service("ours").port, health="starting")
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:
        answer = client.get(f"/services/{task.pk}/whoami", headers=bearer(owner))
    assert answer.status_code == 503
    assert "no replica up yet (its task is running)" in answer.text
    assert answer.headers["refresh"] == "5"  # a browser tries again by itself
    assert f"/portal/tasks/{task.pk}/" in answer.text


def test_a_service_that_ended_says_so_and_is_not_retried(platform, node, owner, start_service):
    task = run_service(owner.tenant, node, start_service("ours").port, state="failed")
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:
        answer = client.get(f"/services/{task.pk}/", headers=bearer(owner))
    assert answer.status_code == 503
    assert "not running: its task is failed" in answer.text
    assert "refresh" not in answer.headers


def test_two_replicas_share_requests_and_one_killed_leaves_the_other(
    platform, node, owner, start_service
):
    first, second = start_service("first"), start_service("second")
    task = run_service(owner.tenant, node, first.port)
    replica = run_service(owner.tenant, node, second.port, replica_of=task)
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:

        def names(path: int) -> list[str]:
            answers = [
                client.get(f"/services/{path}/whoami", headers=bearer(owner)) for _ in range(6)
            ]
            assert [a.status_code for a in answers] == [200] * 6
            return [a.json()["name"] for a in answers]

        assert sorted(set(names(task.pk))) == ["first", "second"]
        assert sorted(set(names(replica.pk))) == ["first", "second"]  # a replica's id: the same
        second.kill()
        assert set(names(task.pk)) == {"first"}


def test_a_path_without_the_trailing_slash_is_redirected(platform, owner):
    with httpx.Client(base_url=platform, timeout=TIMEOUT) as client:
        answer = client.get("/services/12?x=1")
    assert answer.status_code == 308
    assert answer.headers["location"] == "/services/12/?x=1"


def test_a_websocket_opens_with_the_portal_session_alone(platform, node, owner, echo_socket):
    task = run_service(owner.tenant, node, echo_socket)
    url = platform.replace("http://", "ws://") + f"/services/{task.pk}/socket"
    cookie = {"Cookie": session_cookie(owner.user)}
    kernel = ["v1.kernel.websocket.jupyter.org"]
    with connect(url, additional_headers=cookie, origin=platform, subprotocols=kernel) as ws:
        assert ws.recv(timeout=30).startswith(f"hello alice at /services/{task.pk}/socket")
    # Without it, the socket closes as a path nobody serves.
    with connect(url, origin=platform) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 4404


def test_a_websocket_to_a_service_with_no_replica_up_closes_with_4503(
    platform, node, owner, echo_socket
):
    task = run_service(owner.tenant, node, echo_socket, health="starting")
    url = platform.replace("http://", "ws://") + f"/services/{task.pk}/socket"
    with connect(url, additional_headers=bearer(owner), origin=platform) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 4503
