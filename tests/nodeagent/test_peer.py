"""The node agent's server for the control plane: only signed requests reach a route, and the
logs route serves only this node's logs."""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest

from nodeagent import peer
from scheduling import logs, logwait, nodelink


@pytest.fixture
def node_logs(tmp_path, settings):
    settings.TASK_LOG_DIR = tmp_path / "node-logs"
    log = settings.TASK_LOG_DIR / "vision-lab" / "7" / "attempt-1.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"one\ntwo\nthree\n")
    server = peer.serve("node-b", "127.0.0.1:0")
    yield server, log
    server.stop()


def ask(server, target: str, header: str | None) -> tuple[int, dict, bytes]:
    host, port = nodelink.parse_address(server.address)
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", target, headers={"Authorization": header} if header else {})
        answer = conn.getresponse()
        return answer.status, dict(answer.headers), answer.read()
    finally:
        conn.close()


def target_for(path, **params) -> str:
    query = "&".join(f"{k}={v}" for k, v in sorted({"path": quote(str(path)), **params}.items()))
    return f"/logs/?{query}"


def test_a_signed_request_reads_a_byte_range_of_a_log(node_logs):
    server, log = node_logs
    answer = nodelink.get("node-b", server.address, "/logs/", {"path": log, "offset": 4})
    assert answer.status == 200 and answer.body == b"two\nthree\n"
    assert answer.headers[logs.OFFSET_HEADER] == "4" and answer.headers[logs.SIZE_HEADER] == "14"


def test_a_signed_request_reads_the_last_lines(node_logs):
    server, log = node_logs
    answer = nodelink.get("node-b", server.address, "/logs/", {"path": log, "tail": 1})
    assert answer.body == b"three\n" and answer.headers[logs.OFFSET_HEADER] == "8"


def test_an_unsigned_request_is_refused(node_logs):
    server, log = node_logs
    status, _, body = ask(server, target_for(log), None)
    assert status == 401 and b"Authorization" in body


def test_a_forged_signature_is_refused(node_logs):
    server, log = node_logs
    target = target_for(log)
    expires = int(time.time()) + 30
    status, _, body = ask(server, target, f"{nodelink.SCHEME} {expires}:{'0' * 64}")
    assert status == 401 and b"not valid" in body


def test_an_expired_signature_is_refused(node_logs):
    server, log = node_logs
    target = target_for(log)
    header = nodelink.authorization("node-b", "GET", target, now=time.time() - 600)
    status, _, body = ask(server, target, header)
    assert status == 401 and b"expired" in body


def test_a_request_signed_for_another_node_is_refused(node_logs):
    server, log = node_logs
    target = target_for(log)
    status, _, _ = ask(server, target, nodelink.authorization("node-a", "GET", target))
    assert status == 401


def test_a_node_answering_at_another_nodes_address_is_not_believed(node_logs):
    """node-b answers a request meant for node-a, but cannot sign as node-a."""
    server, log = node_logs
    with pytest.raises(nodelink.NodeUnreachable, match="is not node node-a's agent"):
        nodelink.get("node-a", server.address, "/logs/", {"path": log})


def test_whatever_else_answers_at_a_nodes_address_is_not_believed():
    """A 404 from something that is not the node's agent is not 'no log yet'."""

    class Stranger(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    stranger = ThreadingHTTPServer(("127.0.0.1", 0), Stranger)
    thread = threading.Thread(target=stranger.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{stranger.server_address[1]}"
        with pytest.raises(nodelink.NodeUnreachable, match=r"\(404\) is not node node-b's agent"):
            nodelink.get("node-b", address, "/logs/", {"path": "/x"})
    finally:
        stranger.shutdown()
        stranger.server_close()


@pytest.mark.parametrize("path", ["/etc/passwd", "{root}/../secret", "{root}"])
def test_a_signed_request_for_a_file_outside_the_logs_is_refused(node_logs, settings, path):
    server, _ = node_logs
    secret = settings.TASK_LOG_DIR.parent / "secret"
    secret.write_text("the platform's secret")
    path = path.format(root=settings.TASK_LOG_DIR)
    answer = nodelink.get("node-b", server.address, "/logs/", {"path": path})
    assert answer.status == 403 and b"secret" not in answer.body


def test_a_log_not_written_yet_is_a_404_and_an_unknown_route_too(node_logs, settings):
    server, _ = node_logs
    missing = settings.TASK_LOG_DIR / "vision-lab" / "8" / "attempt-1.log"
    assert nodelink.get("node-b", server.address, "/logs/", {"path": missing}).status == 404
    assert nodelink.get("node-b", server.address, "/nothing/", {}).status == 404


def test_a_node_nobody_listens_on_is_unreachable(node_logs):
    server, log = node_logs
    address = server.address
    server.stop()
    with pytest.raises(nodelink.NodeUnreachable, match=f"node node-b at {address} is unreachable"):
        nodelink.get("node-b", address, "/logs/", {"path": log})


def test_an_address_that_is_not_this_hosts_is_advertised_and_served_on_every_interface():
    """Behind NAT the advertised address is not one of this machine's."""
    server = peer.serve("node-b", "203.0.113.7:0")
    try:
        port = server.httpd.server_address[1]
        assert server.address == f"203.0.113.7:{port}"
        assert server.httpd.server_address[0] == "0.0.0.0"  # noqa: S104
        answer = nodelink.get("node-b", f"127.0.0.1:{port}", "/nothing/", {})
        assert answer.status == 404  # reached, and signed by node-b
    finally:
        server.stop()


def test_a_waiting_read_answers_when_the_log_grows_and_the_web_hears_it(node_logs):
    """``wait`` holds the read at the node until bytes come past the offset; the web's
    long-poll asks the agent so, from its event loop (``logwait.grew_at_node``)."""
    server, log = node_logs
    timer = threading.Timer(0.3, lambda: log.open("ab").write(b"four\n"))
    timer.start()
    began = time.monotonic()
    params = {"path": log, "offset": 14, "wait": 10}
    answer = nodelink.get("node-b", server.address, "/logs/", params)
    timer.join()
    print(f"the node's waiting read answered {time.monotonic() - began:.3f} s after it was asked")
    assert answer.status == 200 and answer.body == b"four\n"
    where = logs.Where(str(log), "node-b", server.address)
    assert asyncio.run(logwait.grew_at_node(where, 19, 1)) is False  # nothing more came
    timer = threading.Timer(0.3, lambda: log.open("ab").write(b"five\n"))
    timer.start()
    assert asyncio.run(logwait.grew_at_node(where, 19, 10)) is True
    timer.join()
    # Signed for another node, the agent refuses: the web's read then says why.
    other = logs.Where(str(log), "node-c", server.address)
    assert asyncio.run(logwait.grew_at_node(other, 19, 1)) is True
