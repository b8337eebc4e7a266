"""A TCP forwarder on a free loopback port that a test can cut and restore: a network partition
between one process and a server, on one machine.

Cut, it resets every connection it carries and holds each new one open without forwarding a
byte (a partitioned peer answers nothing; it does not refuse). Restored, it closes what it held
and forwards new connections again, as a link that comes back after the peers' TCP
connections timed out.
"""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = threading.Event()
        self._lock = threading.Lock()
        self._carried: list[socket.socket] = []
        self._held: list[socket.socket] = []
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcpproxy")
        self._thread.start()

    def disconnect(self) -> None:
        with self._lock:
            self.cut.set()
            carried, self._carried = self._carried, []
        for sock in carried:  # their pumps wake up and close them
            _shutdown(sock)

    def reconnect(self) -> None:
        with self._lock:
            held, self._held = self._held, []
            self.cut.clear()
        for sock in held:
            _close(sock)

    def close(self) -> None:
        self._closed = True
        self.disconnect()
        self.reconnect()
        _close(self.listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                if self.cut.is_set():
                    self._held.append(client)
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._carried += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.cut.is_set():
                    break
                sink.sendall(data)
        except OSError:
            pass
        _close(source)
        _close(sink)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    _shutdown(sock)
    sock.close()
