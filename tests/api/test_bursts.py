"""A burst of submissions against real daphne degrades to 429 and 503 with Retry-After, never
to a 500, and every 201 is a task in the database."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from urllib.parse import urlsplit

import pytest

from scheduling.models import Task
from tests.live import web_server

CLIENTS = 32
POSTS_EACH = 6


def _client(base: str, token: str, start: threading.Barrier, index: int, seen: list) -> None:
    conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=60)
    start.wait(timeout=30)
    for n in range(POSTS_EACH):
        body = json.dumps({"name": f"burst-{index}-{n}", "command": "true"})
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        try:
            conn.request("POST", "/api/v1/tasks/", body=body, headers=headers)
            response = conn.getresponse()
            seen.append((response.status, response.getheader("Retry-After"), response.read()))
        except (OSError, http.client.HTTPException) as exc:
            seen.append((0, None, repr(exc).encode()))
            conn.close()
    conn.close()


@pytest.mark.django_db(transaction=True)
def test_a_burst_gets_201_429_or_503_with_retry_after_and_never_a_500(owner, workstation, tmp_path):
    seen: list[tuple[int, str | None, bytes]] = []
    start = threading.Barrier(CLIENTS)
    log = tmp_path / "daphne.log"
    with web_server(
        log=log,
        # Small on purpose: the burst must overflow every limit there is.
        WEB_MAX_IN_FLIGHT="4",
        DB_POOL_SIZE="1",
        DB_POOL_TIMEOUT="1",
        API_THROTTLE_RATE="10/s",
        API_THROTTLE_BURST="5",
    ) as base:
        threads = [
            threading.Thread(target=_client, args=(base, owner.token, start, i, seen))
            for i in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    statuses = Counter(status for status, _, _ in seen)
    assert sum(statuses.values()) == CLIENTS * POSTS_EACH
    assert set(statuses) <= {201, 429, 503}, (statuses, log.read_text()[-3000:])
    refusals = [(status, after, body) for status, after, body in seen if status != 201]
    assert all(after and after.isdigit() and int(after) >= 1 for _, after, _ in refusals)
    assert all(json.loads(body)["detail"] for _, _, body in refusals)
    # Both ways of refusing happened (the test would prove nothing otherwise), and every
    # accepted submission is a task.
    assert statuses[503] and statuses[429] and statuses[201], statuses
    assert Task.objects.filter(tenant=owner.tenant).count() == statuses[201]
    print(f"{CLIENTS} clients x {POSTS_EACH} POSTs: {dict(statuses)}")
