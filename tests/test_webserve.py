"""`make run`'s web server: several daphne processes accepting from one socket."""

from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from tests.live import ROOT, free_port, process_env
from tests.nodeagent.launcher.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def webserve(*args: str, host: str = "127.0.0.1") -> Iterator[tuple[subprocess.Popen, int]]:
    port = free_port()
    argv = [sys.executable, "-m", "gpuplatform.webserve", "-b", host, "-p", str(port), *args]
    proc = subprocess.Popen(  # noqa: S603 - fixed argv
        argv, cwd=ROOT, env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        yield proc, port
    finally:
        children = psutil.Process(proc.pid).children() if proc.poll() is None else []
        proc.kill()
        proc.wait(timeout=10)
        for child in children:
            child.kill()


def livez(port: int, host: str = "127.0.0.1") -> int | None:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", "/livez", headers={"Host": "localhost"})
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def daphnes(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children()


def test_workers_share_the_socket_and_stop_with_the_launcher():
    with webserve("-w", "2") as (proc, port):
        wait_for(lambda: livez(port) == 200, timeout=30)
        children = daphnes(proc)
        assert len(children) == 2
        for child in children:  # each serves from the one listening socket it was handed
            listening = [c for c in child.net_connections("tcp") if c.status == "LISTEN"]
            assert [c.laddr.port for c in listening] == [port]
        assert all(livez(port) == 200 for _ in range(20))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not any(child.is_running() and child.status() != "zombie" for child in children)
    assert livez(port) is None  # nothing listens any more


def test_a_worker_that_dies_stops_the_launcher_with_an_error():
    with webserve("-w", "2") as (proc, port):
        wait_for(lambda: livez(port) == 200, timeout=30)
        first, second = daphnes(proc)
        first.kill()
        assert proc.wait(timeout=30) != 0
        assert b"stopping the others" in proc.stderr.read()
        wait_for(lambda: not second.is_running() or second.status() == "zombie", timeout=10)


def test_one_worker_is_daphne_itself_serving_the_socket_it_was_handed():
    with webserve("-w", "1") as (proc, port):
        wait_for(lambda: livez(port) == 200, timeout=30)
        assert "daphne" in " ".join(psutil.Process(proc.pid).cmdline())  # exec'd: no launcher
        assert daphnes(proc) == []
        listening = psutil.Process(proc.pid).net_connections("tcp")
        assert [c.laddr.port for c in listening if c.status == "LISTEN"] == [port]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert livez(port) is None


def test_bad_arguments_are_refused_by_name():
    result = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-m", "gpuplatform.webserve", "-w", "0"],
        cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--workers: must be at least 1" in result.stderr


def test_an_address_in_use_is_said_plainly():
    with webserve("-w", "1") as (proc, port):
        wait_for(lambda: livez(port) == 200, timeout=30)
        result = subprocess.run(  # noqa: S603 - fixed argv
            [sys.executable, "-m", "gpuplatform.webserve", "-p", str(port), "-w", "1"],
            cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert result.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_an_ipv6_address_is_served_by_one_daphne_that_binds_it():
    with webserve("-w", "2", host="::1") as (proc, port):
        wait_for(lambda: livez(port, "::1") == 200, timeout=30)
        assert b"not an IPv4 address" in proc.stderr.readline()
        assert "daphne" in " ".join(psutil.Process(proc.pid).cmdline())  # exec'd: no launcher
        assert daphnes(proc) == []
