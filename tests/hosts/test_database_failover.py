"""The database fails over (issue 42, item 5): a primary and a synchronous streaming standby,
the platform given both in its URL (``target_session_attrs=read-write``); the primary is killed
while 8 clients submit, the standby promoted with ``pg_ctl promote``.

Each client submits with an ``Idempotency-Key`` and retries a failed submission with the same
key until it is acknowledged, as a careful API client does. Afterwards every acknowledged task
is in the (new primary's) database, no submission made two tasks, and submissions succeed
again soon after the promotion: the time is printed; the issue asks for 10 s, the assertion
allows more, the speed belongs to measurement, not to a test that must not flake.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.hosts.harness import Estate, wait_until
from tests.hosts.postgres import PORT, StandbyPostgres

CLIENTS = 8
BEFORE_KILL = 2  # seconds of submissions while both servers are up
KILLED_FOR = 1  # seconds between the kill and the promotion (the operator's, or Patroni's)
AFTER = 1  # seconds of submissions once every client got through again
RECOVERED_WITHIN = 30  # the generous bound asserted; the issue asks for 10 s


@dataclass
class Client:
    """One submitting client: what was acknowledged, and when."""

    number: int
    source: str  # the address it connects from
    acknowledged: dict[str, int] = field(default_factory=dict)  # key -> task id
    acked_at: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # answers no retry can fix (4xx)
    throttled: int = 0
    give_up: threading.Event = field(default_factory=threading.Event)

    def run(self, estate: Estate, stop: threading.Event) -> None:
        sequence = 0
        while not stop.is_set():
            sequence += 1
            key = str(uuid.uuid4())
            name = f"c{self.number}-{sequence}"
            while True:  # the same key until acknowledged, even after stop (not after give_up)
                if self.give_up.is_set():
                    return
                task_id = self.submit(estate, key, name)
                if task_id is not None:
                    self.acknowledged[key] = task_id
                    self.acked_at.append(time.monotonic())
                    break
                if self.refused:
                    return
                time.sleep(0.2)

    def submit(self, estate: Estate, key: str, name: str) -> int | None:
        body = json.dumps({"name": name, "command": "sleep 1", "resources": {"gpus": 1}})
        web = urllib.parse.urlsplit(estate.web)
        # From an address of the test's own: the bridge's first one is the primary's, which a
        # vanished primary takes with it.
        conn = http.client.HTTPConnection(
            web.hostname, web.port, timeout=20, source_address=(self.source, 0)
        )
        try:
            conn.request("POST", "/api/v1/tasks/", body=body.encode(), headers={
                "Authorization": f"Bearer {estate.token}",
                "Content-Type": "application/json", "Idempotency-Key": key,
            })  # fmt: skip
            answer = conn.getresponse()
            content = answer.read()
        except OSError as failed:  # refused, reset, timed out
            self.errors.append(repr(failed))
            return None
        finally:
            conn.close()
        if answer.status >= 400:
            detail = f"{answer.status} {content[:200]!r}"
            if answer.status == 429:  # the tenant's submission rate: wait as told, then retry
                self.throttled += 1
                time.sleep(min(float(answer.getheader("Retry-After") or 1), 2))
            elif answer.status < 500:
                self.refused.append(f"{name}: {detail}")
            else:
                self.errors.append(detail)
            return None
        created = json.loads(content)
        return (created[0] if isinstance(created, list) else created)["id"]


@pytest.fixture
def replicated(estate: Estate) -> Iterator[StandbyPostgres]:
    """A synchronous standby of the estate's PostgreSQL on a second address of the bridge, and
    the estate's URL naming both; afterwards the standby is gone and the first server up again
    as the estate's only one (the estate's own teardown then gives the next test a fresh
    database on it)."""
    primary = estate.postgres
    standby = None
    try:
        estate.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
        estate.sql("SELECT pg_reload_conf()")
        # The harness's server runs with synchronous_commit=off; this database's sessions wait
        # for the standby, as a production server's do.
        estate.sql('ALTER DATABASE "gpuplatform" SET synchronous_commit = on')
        standby = StandbyPostgres(primary, estate.network.add_bridge_address())
        standby.start()
        wait_until(
            lambda: estate.sql(
                "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync' "
                "AND state = 'streaming'"
            ),
            30,
            "the standby streaming synchronously",
        )
        estate.database_url = (
            f"postgres://postgres:{primary.password}@{primary.address}:{PORT},"
            f"{standby.address}:{PORT}/gpuplatform?target_session_attrs=read-write"
            "&connect_timeout=3"
        )
        yield standby
    finally:
        estate.network.unsilence()
        if standby is not None:
            standby.stop()
        primary.kill()  # dead already, unless the test failed before
        primary.start()
        estate.database_url = primary.url()
        estate.sql("ALTER SYSTEM RESET synchronous_standby_names")
        estate.sql("SELECT pg_reload_conf()")


@pytest.mark.parametrize("failure", ["killed", "vanished"])
def test_submissions_survive_the_primary_failing(
    estate: Estate, replicated: StandbyPostgres, failure: str
):
    """killed: the primary's processes die (SIGKILL); its machine still answers, so connections
    to it are reset and new ones refused. vanished: its machine goes silent (power lost, link
    cut): the server frozen and everything sent to its address dropped unanswered, so only the
    clients' own timeouts (DB_PEER_TIMEOUT, the URL's connect_timeout) end what waits on it."""
    assert estate.sql("SHOW synchronous_commit") == [("on",)]
    control = estate.hosts["control"]
    # The tenant's rate limit would pace the clients, not the fail-over: at 6000/min the 8 reached
    # it, and the time until every client was through again measured their 429s' Retry-After
    # (8-14 s, where 0.2 s and 5.7 s were the fail-over's own).
    control.start("web", API_THROTTLE_RATE="600000/min", API_THROTTLE_BURST="10000")
    control.start("scheduler")
    estate.hosts["gpu-1"].start("agent")
    estate.wait_for_web()
    # Submissions are checked against the estate's GPUs: none before the agent registers them.
    wait_until(
        lambda: estate.sql("SELECT 1 FROM scheduling_gpu WHERE state = 'available'"),
        60,
        "the node agent's GPUs registered",
    )

    source = estate.network.add_bridge_address()
    clients = [Client(n, source) for n in range(CLIENTS)]
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(estate, stop), daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    try:
        time.sleep(BEFORE_KILL)
        before = sum(len(c.acknowledged) for c in clients)
        killed = time.monotonic()
        if failure == "killed":
            estate.postgres.kill()
        else:
            estate.postgres.freeze()
            estate.network.silence(estate.postgres.address)
        time.sleep(KILLED_FOR)
        replicated.promote()
        promoted = time.monotonic()
        # The test's own queries go to the new primary (the hosts keep the URL naming both).
        estate.database_url = replicated.url()
        promoted_at = estate.sql("SELECT now()")[0][0]  # the new primary's clock

        def every_client_through() -> bool:
            return all(any(t > promoted for t in c.acked_at) for c in clients)

        wait_until(
            lambda: every_client_through() or any(c.refused for c in clients),
            RECOVERED_WITHIN + 30,
            "every client's submissions acknowledged again after the promotion",
        )
        time.sleep(AFTER)
    finally:
        stop.set()
        deadline = time.monotonic() + 40
        for thread in threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0.1))
        for client in clients:  # a submission still unacknowledged by now is left unknown
            client.give_up.set()
        for thread in threads:
            thread.join(timeout=30)

    refused = [r for c in clients for r in c.refused]
    assert not refused, f"submissions refused (no retry helps): {refused[:5]}"
    first_after = [min(t for t in c.acked_at if t > promoted) - promoted for c in clients]
    errors = [e for c in clients for e in c.errors]
    print(
        f"\n{failure}: {before} tasks acknowledged before; failed at +0, promoted at "
        f"+{promoted - killed:.1f} s; every client through again {max(first_after):.1f} s "
        f"after the promotion (first {min(first_after):.1f} s); "
        f"{sum(c.throttled for c in clients)} throttled; {len(errors)} failed "
        f"attempts retried: {sorted(set(e[:80] for e in errors))[:6]}"
    )
    assert max(first_after) < RECOVERED_WITHIN
    # Every request was answered (a task, or a 503 to retry): none waited out the client's 20 s
    # on a connection to the vanished server (before DB_PEER_TIMEOUT's client side, they did).
    assert not [e for e in errors if "timed out" in e]

    acknowledged = {key: tid for c in clients for key, tid in c.acknowledged.items()}
    rows = estate.sql("SELECT id, name FROM scheduling_task")
    present = {tid for tid, _ in rows}
    missing = sorted(set(acknowledged.values()) - present)
    assert not missing, f"acknowledged tasks missing after the fail-over: {missing}"
    names = [name for _, name in rows]
    doubled = sorted({name for name in names if names.count(name) > 1})
    assert not doubled, f"submissions that made more than one task: {doubled}"
    assert len(rows) == len(acknowledged)
    # The rest of the platform follows the new primary too: the scheduler places tasks (its
    # django-q2 broker and pass jobs), the node agent launches them and beats.
    wait_until(
        lambda: estate.sql(
            "SELECT 1 FROM scheduling_taskattempt WHERE started_at > %s", [promoted_at]
        ),
        RECOVERED_WITHIN,
        "a task placed and started after the promotion",
    )
    print(
        f"{failure}: a task started again {time.monotonic() - promoted:.1f} s after the promotion"
    )
    now = estate.sql("SELECT now()")[0][0]
    wait_until(
        lambda: estate.sql(
            "SELECT 1 FROM scheduling_node WHERE name = 'gpu-1' AND last_heartbeat > %s", [now]
        ),
        RECOVERED_WITHIN,
        "the node agent's heartbeat reaching the new primary",
    )
