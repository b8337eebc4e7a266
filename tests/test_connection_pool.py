"""Database connections are bounded in web processes, and only there: a flood of API requests
against real daphne never holds more than DB_POOL_SIZE PostgreSQL connections, while
processes that fork (qcluster, node agent, supervisors) never get a pool."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from gpuplatform.dburl import current_database_url
from tests.live import ROOT, process_env, web_server

CLIENTS = 16
REQUESTS_EACH = 12
POOL_SIZE = 4


def settings_in(code: str) -> dict:
    """The database settings a fresh interpreter gets after running ``code``."""
    script = (
        f"{code}\nimport json\nfrom django.conf import settings\n"
        "db = settings.DATABASES['default']\n"
        "print(json.dumps({'pool': db['OPTIONS'].get('pool'), 'age': db['CONN_MAX_AGE']},\n"
        "                 default=lambda o: f'{o.__module__}.{o.__qualname__}'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=process_env(DJANGO_SETTINGS_MODULE="gpuplatform.settings", DB_POOL_SIZE="6"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_only_the_web_entry_points_get_a_pool():
    web = settings_in("import gpuplatform.asgi")
    assert web["pool"]["max_size"] == 6
    assert "connection_class" not in web["pool"]  # psycopg's own
    assert web["age"] == 0
    assert settings_in("import gpuplatform.wsgi")["pool"]["max_size"] == 6
    # manage.py commands (qcluster, node_agent) load the settings the plain way.
    plain = settings_in("import django; django.setup()")
    assert plain["pool"] is None
    assert plain["age"] == 60


def _client(base: str, token: str, statuses: Counter, lock: threading.Lock) -> None:
    netloc = urlsplit(base).netloc
    conn = http.client.HTTPConnection(netloc, timeout=60)
    for _ in range(REQUESTS_EACH):
        conn.request("GET", "/api/v1/tasks/?limit=50", headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        with lock:
            statuses[response.status] += 1
    conn.close()


# With the platform's ASGI handler, and with Django's own (GPUPLATFORM_STOCK).
@pytest.mark.parametrize("stock", ["", "asgi"])
@pytest.mark.django_db(transaction=True)
def test_a_flood_of_16_clients_stays_within_the_pool(owner, tmp_path, stock):
    ours = connection.cursor().connection.info.backend_pid
    database = connection.settings_dict["NAME"]
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    peak = 0
    names: set[str] = set()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        with psycopg.connect(current_database_url(), autocommit=True) as watcher:
            while not done.is_set():
                # The web process's sessions: not this test process's (its own connection, or
                # a listener an earlier test of this process has not yet let go).
                rows = watcher.execute(
                    "SELECT application_name FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid() AND pid <> %s AND application_name <> %s",
                    (database, ours, settings.APPLICATION_NAME),
                ).fetchall()
                peak = max(peak, len(rows))
                names.update(name for (name,) in rows)
                time.sleep(0.02)

    with web_server(
        log=tmp_path / "daphne.log",
        DB_POOL_SIZE=str(POOL_SIZE),
        API_THROTTLE_RATE="100000/s",
        API_THROTTLE_BURST="100000",
        GPUPLATFORM_STOCK=stock,
    ) as base:
        watcher = threading.Thread(target=sample)
        watcher.start()
        try:
            with ThreadPoolExecutor(CLIENTS) as clients:
                for future in [
                    clients.submit(_client, base, owner.token, statuses, lock)
                    for _ in range(CLIENTS)
                ]:
                    future.result()
        finally:
            done.set()
            watcher.join()
    assert statuses == {200: CLIENTS * REQUESTS_EACH}, (tmp_path / "daphne.log").read_text()[-3000:]
    assert 0 < peak <= POOL_SIZE, names
    assert names == {"gpuplatform web"}  # what pg_stat_activity tells an operator
    print(f"peak {peak} PostgreSQL connections for {CLIENTS} clients, pool of {POOL_SIZE}")
