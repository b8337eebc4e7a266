"""Helpers for tests that start real platform processes against the test database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from gpuplatform.dburl import current_database_url

PYTHON = sys.executable
ROOT = settings.BASE_DIR


def process_env(**extra: str) -> dict[str, str]:
    environ = dict(os.environ)
    environ.update(
        DATABASE_URL=current_database_url(), GPUPLATFORM_TESTING="1", PYTHONUNBUFFERED="1"
    )
    environ.update(extra)
    return environ


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(*args: str, timeout: float = 60, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=process_env(**extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def web_server(
    startup_timeout: float = 30, log: Path | None = None, port: int | None = None, **extra_env: str
) -> Iterator[str]:
    """Run daphne, as `make run` does, on a free loopback port (or ``port``: a server started
    again where the last one was); yield its base URL. Its output goes to ``log`` when given
    (a pipe nobody reads would stall a chatty server)."""
    port = port or free_port()
    sink = open(log, "ab") if log else subprocess.PIPE
    proc = subprocess.Popen(
        [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "gpuplatform.asgi:application"],
        cwd=ROOT,
        env=process_env(**extra_env),
        stdout=sink,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                output = log.read_text() if log else proc.stdout.read().decode()
                raise RuntimeError(f"daphne exited: {output}")
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            sink.close()


def shell(code: str, **extra_env: str) -> str:
    """Run ``code`` in a platform process of its own (``manage.py shell -c``): how tests act
    as the node agent or the scheduler would, from outside the process under test. Returns
    its standard output; fails the test with its errors if it fails."""
    result = manage("shell", "-c", code, **extra_env)
    if result.returncode != 0:
        raise AssertionError(f"manage.py shell failed:\n{result.stderr}")
    return result.stdout
