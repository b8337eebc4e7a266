"""gpuctl waits out a database fail-over: a 503 that says when to retry (Retry-After) is
retried for a request that cannot do anything twice (a GET, or a submission carrying its
Idempotency-Key); any other request, or a 503 without Retry-After, fails at once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuctl.client import ApiError, Client


class Server:
    """Answers 503 (with ``retry_after``, if any) ``outage`` times, then 200."""

    def __init__(self, outage: int, retry_after: str | None) -> None:
        self.outage, self.retry_after, self.seen = outage, retry_after, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.seen.append((self.command, self.headers.get("Idempotency-Key")))
                if len(owner.seen) <= owner.outage:
                    body = {"detail": "the database is unreachable; retry later", "errors": {}}
                    self.send_response(503)
                    if owner.retry_after is not None:
                        self.send_header("Retry-After", owner.retry_after.split()[0])
                    if owner.retry_after and "field" in owner.retry_after:
                        body["errors"] = {"attempt": ["log unavailable: node unreachable"]}
                else:
                    body = {"ok": True}
                    self.send_response(200)
                data = json.dumps(body).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = answer

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server(request) -> Iterator[Server]:
    outage, retry_after = request.param
    running = Server(outage, retry_after)
    yield running
    running.httpd.shutdown()
    running.httpd.server_close()


@pytest.mark.parametrize("server", [(3, "0")], indirect=True)
def test_a_read_and_a_keyed_submission_wait_out_the_outage(server):
    client = Client(server.url, "token")
    assert client.request("GET", "tasks/").json() == {"ok": True}
    server.seen.clear()
    answer = client.request("POST", "tasks/", json_body={}, headers={"Idempotency-Key": "k1"})
    assert answer.json() == {"ok": True}
    assert server.seen == [("POST", "k1")] * 4  # the same key each time


@pytest.mark.parametrize("server", [(1, "0")], indirect=True)
def test_a_write_without_a_key_is_not_repeated(server):
    with pytest.raises(ApiError) as failed:
        Client(server.url, "token").request("POST", "tasks/", json_body={})
    assert failed.value.status == 503
    assert len(server.seen) == 1


@pytest.mark.parametrize("server", [(1, None), (1, "1 naming a field")], indirect=True)
def test_a_503_about_one_object_fails_at_once(server):
    """No Retry-After, or a field named (a log whose node is out of reach): the caller
    decides."""
    with pytest.raises(ApiError) as failed:
        Client(server.url, "token").request("GET", "tasks/1/log/")
    assert failed.value.status == 503
    assert len(server.seen) == 1
