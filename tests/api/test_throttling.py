"""Throttling that protects neighbours: an even pace per tenant (GCRA, shared in PostgreSQL),
refused before the body is read or the view queries anything; requests without a valid token
paced by client address, the forwarded address believed only from trusted proxies; and a
process that refuses a known offender at its ASGI entry, without Django or the database.
(bench/bench_neighbours.py measures the neighbour's latency under a flood, end to end.)"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from gpuplatform import throttle
from tests.api.conftest import api_client, assert_error_shape, bearer

TASKS = "/api/v1/tasks/"
ME = "/api/v1/me/"


def test_the_pace_allows_a_burst_then_one_request_per_interval(db, settings):
    settings.API_THROTTLE_BURST = 3
    rate = "10/s"  # one every 0.1 s
    now = 1_000_000.0
    assert [throttle.consume("k", rate, now).allowed for _ in range(4)] == [True] * 3 + [False]
    refused = throttle.consume("k", rate, now)
    assert 0 < refused.wait_s <= 0.1
    assert not throttle.consume("k", rate, now + 0.05).allowed
    assert throttle.consume("k", rate, now + 0.1).allowed
    assert not throttle.consume("k", rate, now + 0.1).allowed
    assert throttle.consume("other", rate, now).allowed


def test_a_step_of_the_pace_does_not_wait_for_the_disk_but_a_callers_transaction_does(
    transactional_db,
):
    with CaptureQueriesContext(connection) as queries:
        assert throttle.consume("k", "10/s").allowed
    assert "synchronous_commit" in queries.captured_queries[0]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")  # that statement's transaction alone
        assert cursor.fetchone()[0] == "on"
        with transaction.atomic():
            throttle.consume("k", "10/s")
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"


def test_a_refused_request_costs_no_body_parsing_and_no_view_query(owner, settings):
    settings.API_THROTTLE_RATE = "1/min"
    client = bearer(owner.token)
    assert client.get(ME).status_code == 200
    with CaptureQueriesContext(connection) as queries:
        response = client.post(TASKS, "{not json", content_type="application/json")
    assert_error_shape(response, 429)  # not 400: the body was never read
    # The token lookup and the pace, nothing else (last_used_at was written a moment ago).
    assert len(queries) == 2, [q["sql"][:80] for q in queries]


def test_requests_without_a_valid_token_are_paced_by_address(db, owner, settings):
    settings.API_ANON_THROTTLE_RATE = "3/min"
    anonymous = api_client()
    forged = bearer("gpup_AAAAAAAA_" + "x" * 40)
    codes = [c.get(ME).status_code for c in (anonymous, forged, anonymous, forged)]
    assert codes == [401, 401, 401, 429]
    response = anonymous.get(ME)
    assert_error_shape(response, 429)
    assert int(response["Retry-After"]) >= 1
    # Another address is not affected, nor is a valid token from this one.
    assert api_client().get(ME, REMOTE_ADDR="192.0.2.7").status_code == 401
    assert bearer(owner.token).get(ME).status_code == 200


def test_a_forwarded_address_counts_only_from_a_trusted_proxy(db, settings):
    settings.API_ANON_THROTTLE_RATE = "2/min"
    client = api_client()
    # Not trusted: a client cannot pick a fresh address per request to escape its pace.
    codes = [client.get(ME, HTTP_X_FORWARDED_FOR=f"198.51.100.{i}").status_code for i in range(3)]
    assert codes == [401, 401, 429]
    settings.TRUSTED_PROXY_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    codes = [
        client.get(
            ME, REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR=f"spoof, 203.0.113.{i}"
        ).status_code
        for i in range(3)
    ]
    assert codes == [401, 401, 401]  # three clients behind the proxy, one request each


def test_the_proxy_rewrite_takes_the_rightmost_untrusted_hop(settings):
    settings.TRUSTED_PROXY_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    assert throttle.client_address("10.0.0.1", "1.2.3.4, 5.6.7.8, 10.0.0.9") == "5.6.7.8"
    assert throttle.client_address("192.0.2.1", "1.2.3.4") == "192.0.2.1"
    assert throttle.client_address("10.0.0.1", None) == "10.0.0.1"


def test_the_entry_point_refuses_a_known_offender_without_calling_django(settings):
    prefix = "gpup_AAAAAAAA"
    throttle.PACER.authenticated(prefix)
    calls = []

    async def django(scope, receive, send):
        calls.append(scope["path"])

    sent = []

    async def send(message):
        sent.append(message)

    def request():
        header = f"Bearer {prefix}_{'x' * 40}".encode()
        scope = {"type": "http", "path": ME, "client": ("127.0.0.1", 5000),
                 "headers": [(b"authorization", header)]}  # fmt: skip
        asyncio.run(throttle.EarlyThrottle(django)(scope, None, send))

    request()
    assert calls == [ME]  # not known to be over its rate: on to Django
    verdict = throttle.Verdict(False, 5.0, time.time() + 5)
    throttle.PACER.refused(throttle.token_key(prefix), verdict, "1/s")
    began = time.monotonic()
    request()
    assert calls == [ME]
    assert sent[0]["status"] == 429
    assert (b"retry-after", b"5") in sent[0]["headers"]
    # Held as long as MAX_HOLD_S: a client ignoring Retry-After cannot spin the server.
    assert time.monotonic() - began >= throttle.MAX_HOLD_S * 0.9


def test_a_remembered_clients_allowed_request_lets_neighbours_go_first():
    flooder, neighbour = "gpup_FLOODxxx", "gpup_QUIETxxx"
    for prefix in (flooder, neighbour):
        throttle.PACER.authenticated(prefix)
    # Over its pace a moment ago, and its next slot has come: this request may go on.
    verdict = throttle.Verdict(False, 0.0, time.time() - 1)
    throttle.PACER.refused(throttle.token_key(flooder), verdict, "1/s")
    events = []

    async def django(scope, receive, send):
        who = scope["who"]
        events.append(f"{who} starts")
        await asyncio.sleep(0.1)
        events.append(f"{who} ends")

    async def send(message):
        pass

    app = throttle.EarlyThrottle(django)

    def scope(who: str, prefix: str) -> dict:
        header = f"Bearer {prefix}_{'x' * 40}".encode()
        return {"type": "http", "path": ME, "client": ("127.0.0.1", 5000), "who": who,
                "headers": [(b"authorization", header)]}  # fmt: skip

    async def both():
        first = asyncio.create_task(app(scope("neighbour", neighbour), None, send))
        await asyncio.sleep(0.01)
        await app(scope("flooder", flooder), None, send)
        await first

    asyncio.run(both())
    assert events == ["neighbour starts", "neighbour ends", "flooder starts", "flooder ends"]


def test_the_wait_is_said_in_proper_english():
    """ "1 seconds" was the text of every 429 whose wait rounds to a second."""
    one, _ = throttle.too_many_requests_body(0.2)
    three, _ = throttle.too_many_requests_body(2.5)
    assert json.loads(one)["detail"] == "Request was throttled. Expected available in 1 second."
    assert json.loads(three)["detail"].endswith("in 3 seconds.")
