"""gpuplatform.asgi_handler: each HTTP request's middleware, view and signals run in one
thread of a bounded pool; answers, streamed ones included, arrive whole."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.signals import request_finished, request_started
from django.http import FileResponse, HttpResponse
from django.test import override_settings
from django.urls import path

from gpuplatform.asgi_handler import ASGIHandler

SEEN: list[tuple[str, str]] = []  # (what, thread name)


def record(what: str) -> None:
    SEEN.append((what, threading.current_thread().name))


def recording_middleware(get_response):
    def middleware(request):
        record("middleware")
        return get_response(request)

    return middleware


def hello(request):
    record("view")
    return HttpResponse(f"hello {request.method} {request.body.decode()}")


def download(request):
    record("view")
    return FileResponse(open(__file__, "rb"), content_type="text/plain")  # noqa: SIM115


urlpatterns = [path("hello/", hello), path("download/", download)]


@contextmanager
def handler(pool_size: int = 2):
    SEEN.clear()

    def started(**kwargs):
        record("started")

    def finished(**kwargs):
        record("finished")

    request_started.connect(started)
    request_finished.connect(finished)
    try:
        with override_settings(
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[f"{__name__}.recording_middleware"],
            DB_POOL_SIZE=pool_size,
        ):
            yield ASGIHandler()
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)


async def call(app, path: str, body: bytes = b"", method: str = "POST") -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await communicator.receive_output(5)
    assert start["type"] == "http.response.start"
    content = b""
    while True:
        message = await communicator.receive_output(5)
        content += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(5)
    return start["status"], content


@pytest.mark.asyncio
async def test_a_request_is_served_in_one_thread_from_started_to_finished():
    with handler() as app:
        status, content = await call(app, "/hello/", b"spec")
    assert (status, content) == (200, b"hello POST spec")
    assert [what for what, _ in SEEN] == ["started", "middleware", "view", "finished"]
    threads = {thread for _, thread in SEEN}
    assert len(threads) == 1, SEEN
    assert threads.pop().startswith("django-http")


@pytest.mark.asyncio
async def test_requests_share_a_pool_of_db_pool_size_threads():
    with handler(pool_size=2) as app:
        for _ in range(6):
            assert (await call(app, "/hello/"))[0] == 200
    # Django's own handler started a thread for every request.
    assert len({thread for _, thread in SEEN}) <= 2, SEEN


@pytest.mark.asyncio
async def test_a_streamed_file_is_sent_whole_and_then_closed():
    with handler() as app:
        status, content = await call(app, "/download/", method="GET")
    with open(__file__, "rb") as source:
        assert (status, content) == (200, source.read())
    assert [what for what, _ in SEEN] == ["started", "middleware", "view", "finished"]


@pytest.mark.asyncio
async def test_an_unknown_path_is_a_404_through_the_same_path():
    with handler() as app:
        status, _ = await call(app, "/nowhere/", method="GET")
    assert status == 404
    assert [what for what, _ in SEEN] == ["started", "middleware", "finished"]
