"""Deployment: the documented production settings pass `manage.py check --deploy` with no
warning, and forwarded headers (X-Forwarded-For/-Proto) are believed only from TRUSTED_PROXIES,
checked with daphne started exactly as `make run` starts it."""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from scripts.run import web_command
from tests.live import ROOT, free_port, process_env
from tests.test_settings import start_django

# docs/deployment.md "Production": what a deployment behind a TLS-terminating proxy sets.
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "a-long-random-production-secret-" + "x7Rq9vLmZ2pT" * 4,
    "ALLOWED_HOSTS": "gpu.example.org",
    "CSRF_TRUSTED_ORIGINS": "https://gpu.example.org",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
    "TRUSTED_PROXIES": "10.0.0.5",
}


def check_deploy(**environ: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in process_env().items() if k not in ("GPUPLATFORM_TESTING", "DEBUG")}
    env.update(environ)
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_production_settings_pass_check_deploy_without_a_warning():
    result = check_deploy(**PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNING" not in result.stderr + result.stdout


def test_check_deploy_warns_without_them():
    result = check_deploy(DEBUG="0", SECRET_KEY=PRODUCTION["SECRET_KEY"])
    assert result.returncode != 0
    assert "security.W004" in result.stderr  # no HSTS
    assert "security.W008" in result.stderr  # no HTTPS redirect


def test_the_proxy_ssl_header_needs_trusted_proxies():
    result = start_django(SECRET_KEY="k" * 50, SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")
    assert "SECURE_PROXY_SSL_HEADER: needs TRUSTED_PROXIES" in result.stderr


def test_make_run_never_lets_daphne_trust_forwarded_headers(monkeypatch):
    monkeypatch.delenv("WEB_SERVER", raising=False)
    assert "--proxy-headers" not in web_command("python", "127.0.0.1", "8000")
    monkeypatch.setenv("WEB_SERVER", "gunicorn")
    monkeypatch.setenv("TRUSTED_PROXIES", "10.0.0.5, 192.168.1.1/24")
    argv = web_command("python", "127.0.0.1", "8000")
    assert argv[argv.index("--forwarded-allow-ips") + 1] == "10.0.0.5/32,192.168.1.0/24"
    monkeypatch.delenv("TRUSTED_PROXIES")
    argv = web_command("python", "127.0.0.1", "8000")
    assert argv[argv.index("--forwarded-allow-ips") + 1] == ""  # not gunicorn's loopback


@contextmanager
def make_run_daphne(**environ: str) -> Iterator[int]:
    port = free_port()
    argv = web_command(sys.executable, "127.0.0.1", str(port))
    proc = subprocess.Popen(  # noqa: S603 - fixed argv
        argv, cwd=ROOT, env=process_env(**environ), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while get(port, "/livez")[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "daphne did not start"
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def get(port: int, path: str, **headers: str) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": "localhost", **headers})
        response = conn.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    except OSError:
        return 0, {}
    finally:
        conn.close()


HTTPS = {
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
    "SECURE_HSTS_SECONDS": "3600",
}


@pytest.mark.django_db(transaction=True)
def test_x_forwarded_proto_is_ignored_from_an_untrusted_peer():
    with make_run_daphne(TRUSTED_PROXIES="192.0.2.1", **HTTPS) as port:
        status, headers = get(port, "/api/v1/me/", **{"X-Forwarded-Proto": "https"})
        assert status == 301  # not believed: sent to HTTPS
        assert headers["Location"].startswith("https://")
        assert get(port, "/readyz")[0] == 200  # probes are never redirected


@pytest.mark.django_db(transaction=True)
def test_x_forwarded_proto_is_believed_from_a_trusted_proxy():
    with make_run_daphne(TRUSTED_PROXIES="127.0.0.1", **HTTPS) as port:
        status, headers = get(port, "/api/v1/me/", **{"X-Forwarded-Proto": "https"})
        assert status == 401  # served as HTTPS (no token): not redirected
        assert headers["Strict-Transport-Security"] == "max-age=3600"
        assert get(port, "/api/v1/me/")[0] == 301  # plain HTTP through the proxy
