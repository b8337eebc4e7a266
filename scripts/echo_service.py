"""A small HTTP service for trying the service gateway (``/services/<id>/``), and for its tests
and bench: ``python scripts/echo_service.py NAME`` listens on 127.0.0.1 at ``$PORT`` (a free
port without it), prints the port, and answers under any path:

- ``.../whoami``: JSON with its name, the path and the headers it was sent;
- ``POST .../echo``: JSON with its name and the body it was sent (chunked or not);
- ``.../stream``: a chunked answer, ``first`` at once and ``second`` only once ``.../release``
  was asked (so a test sees the first piece before the service has finished);
- ``.../bytes?n=N``: N bytes (a download);
- anything else: a small HTML page (what the browser test opens).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

RELEASED = threading.Event()
BLOCK = b"x" * 65536


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes
    name = "service"

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, data: dict) -> None:
        self._answer(200, json.dumps(data).encode(), "application/json")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                chunk = self.rfile.read(size + 2)[:size]
                if size == 0:
                    return body
                body += chunk
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path.endswith("/whoami"):
            headers = {k.lower(): v for k, v in self.headers.items()}
            self._json({"name": self.name, "path": self.path, "headers": headers})
        elif url.path.endswith("/release"):
            RELEASED.set()
            self._json({"released": True})
        elif url.path.endswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b"data: first\n\n")
            RELEASED.wait(60)
            RELEASED.clear()
            self._chunk(b"data: second\n\n")
            self._chunk(b"")
        elif url.path.endswith("/bytes"):
            size = int(parse_qs(url.query).get("n", ["0"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            while size > 0:
                self.wfile.write(BLOCK[: min(size, len(BLOCK))])
                size -= len(BLOCK)
        else:
            page = f"<!doctype html><title>{self.name}</title><h1>Hello from {self.name}</h1>"
            self._answer(200, page.encode(), "text/html; charset=utf-8")

    def do_POST(self) -> None:
        body = self._body()
        self._json({"name": self.name, "body": body.decode("latin-1"), "path": self.path})


def main() -> None:
    Handler.name = sys.argv[1] if len(sys.argv) > 1 else "service"
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT") or 0)), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
