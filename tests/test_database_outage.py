"""A database outage, with real processes: daphne against a private PostgreSQL that the test
stops and starts again. The API answers 503 in its JSON error shape with Retry-After, other
pages a plain 503, readiness fails and liveness does not; once the database is back, everything
recovers without restarting daphne."""

from __future__ import annotations

import json
import re
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import psycopg
import pytest

from tests.live import manage, web_server


def fetch(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


@pytest.fixture
def private_postgresql():
    """A PostgreSQL server of this test's own (pgserver's binaries, a Unix socket in a fresh
    directory), with the platform migrated and bootstrapped. Yields (server, url, token)."""
    import pgserver

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    # A directory of its own outside pytest's (root-only) tmp_path: as root, pgserver runs the
    # server as its own system user, who must be able to reach the data directory.
    pgdata = Path(tempfile.mkdtemp(prefix="gpup-outage-"))
    server = pgserver.get_server(pgdata, cleanup_mode="delete")
    try:
        with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "gpuplatform"')
        url = server.get_uri("gpuplatform")
        migrated = manage("migrate", "--noinput", timeout=180, DATABASE_URL=url)
        assert migrated.returncode == 0, migrated.stderr
        booted = manage("bootstrap", DATABASE_URL=url)
        assert booted.returncode == 0, booted.stderr
        token = re.search(r"API token (gpup_\S+)", booted.stdout).group(1)
        yield server, url, token
    finally:
        server.cleanup()


def stop(server) -> None:
    from pgserver._commands import pg_ctl

    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)


def start(server) -> None:
    with server._lock:
        server.ensure_postgres_running()


def test_an_outage_answers_503_and_the_web_process_recovers_by_itself(private_postgresql, tmp_path):
    server, url, token = private_postgresql
    bearer = {"Authorization": f"Bearer {token}"}
    with web_server(log=tmp_path / "daphne.log", DATABASE_URL=url, DB_POOL_TIMEOUT="2") as base:
        assert fetch(f"{base}/api/v1/me/", **bearer)[0] == 200
        assert fetch(f"{base}/readyz")[0] == 200

        stop(server)
        status, headers, body = fetch(f"{base}/api/v1/me/", **bearer)
        assert status == 503, body
        assert headers["Content-Type"] == "application/json"
        assert json.loads(body) == {
            "detail": "the database is unreachable; retry later",
            "errors": {},
        }
        assert int(headers["Retry-After"]) > 0
        # A page that needs the database outside the API (a session to load): plain text.
        status, headers, body = fetch(f"{base}/admin/", Cookie="sessionid=abcdefgh12345678")
        assert status == 503, body
        assert headers["Content-Type"].startswith("text/plain")
        assert b"Traceback" not in body
        assert "Retry-After" in headers
        status, headers, body = fetch(f"{base}/readyz")
        assert status == 503
        assert json.loads(body)["checks"] == {"database": "unreachable"}
        assert fetch(f"{base}/healthz")[0] == 503
        began = time.monotonic()
        assert fetch(f"{base}/livez") == (200, fetch(f"{base}/livez")[1], b'{"status": "ok"}')
        assert time.monotonic() - began < 1, "liveness must not wait for the database"

        start(server)
        deadline = time.monotonic() + 30
        while fetch(f"{base}/api/v1/me/", **bearer)[0] != 200:
            assert time.monotonic() < deadline, "the API did not recover within 30 s"
            time.sleep(0.5)
        assert fetch(f"{base}/readyz")[0] == 200
        assert json.loads(fetch(f"{base}/api/v1/me/", **bearer)[2])["username"] == "alice"
    log = (tmp_path / "daphne.log").read_text()
    # One line per failed request, not a traceback each.
    assert "Service Unavailable: /admin/ (OperationalError: couldn't get a connection" in log
    assert "Traceback" not in log
