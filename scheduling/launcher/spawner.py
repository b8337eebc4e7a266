"""The node's spawner: a small long-lived process that forks task supervisors.

A supervisor forked from a launch worker is a copy of a process that has loaded all of Django
(about 100 MB). Measured on 2 cores: a fork, a ``Popen`` from the child and the exits cost 9 ms
of CPU from such a process against 5 ms from one that has only read the settings (25 MB), and
the launch worker's double fork alone took about 10 ms of the time from submit to a running
process. So the node agent runs this process beside its launch cluster
(``python -m scheduling.launcher.spawner NODE``). It reads the settings and imports the
supervisor's modules, never Django's apps or models, and forks one supervisor per request. A
supervisor forked here gets all it needs in its ``messages.Assignment``, reports and asks
through the node agent (``relay``), and loads Django's apps only if it must write to the
database itself (``Supervisor.db``).

Requests come over an abstract Unix socket, as the relay's reports do, and are believed only
from a process of the spawner's own user (SO_PEERCRED) that signed the request with the
platform's secret key, which tasks never see. A launch worker that cannot reach the spawner
forks the supervisor itself; one whose request went out but got no answer does not (the
supervisor may exist): reconciliation sees to a launch that never started (LAUNCH_PATIENCE).

Supervisors are detached as soon as they are forked (their own session; SIGCHLD is ignored
here, so the kernel reaps them): killing or restarting the spawner leaves them running.
"""

from __future__ import annotations

import gc
import hmac
import json
import logging
import os
import pwd
import signal
import socket
import struct
import sys

from scheduling.launcher.messages import Assignment
from scheduling.launcher.relay import address, signature

logger = logging.getLogger("scheduling.spawner")

REPLY_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 0.5  # a client that does not send its request at once is dropped
MAX_REQUEST = 4 << 20  # a command of 16 KiB and 100 environment values of 8 KiB fit easily
_LENGTH = struct.Struct("!I")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class NotSent(Exception):
    """The request never reached a spawner: the caller may start the supervisor itself."""


def _send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _receive(sock: socket.socket) -> dict:
    (length,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    if length > MAX_REQUEST:
        raise ValueError(f"a message of {length} bytes")
    message = json.loads(_exactly(sock, length))
    if not isinstance(message, dict):
        raise ValueError("not an object")
    return message


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed early")
        data += chunk
    return bytes(data)


# --- The launch worker's side ---------------------------------------------------------------


def request(assignment, sink: str, timeout: float = REPLY_TIMEOUT_S) -> int | None:
    """Ask the node's spawner to fork the supervisor of ``assignment`` (a
    ``messages.Assignment``), its output to ``sink``. Returns the supervisor's pid, or None when
    the request was sent and no answer came. Raises NotSent when no spawner took it."""
    message = {"assignment": assignment.as_dict(), "sink": str(sink)}
    message["sig"] = signature(message)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(address(assignment.node, "spawner"))
            _send(sock, message)
        except OSError as exc:
            raise NotSent(str(exc)) from exc
        try:
            reply = _receive(sock)
        except (OSError, ValueError) as exc:
            logger.warning("the spawner of node %s did not answer: %s", assignment.node, exc)
            return None
    return reply.get("pid") if reply.get("ok") else None


# --- The spawner ------------------------------------------------------------------------------


class Spawner:
    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address(node_name, "spawner"))
        self.listener.listen(128)
        self.listener.settimeout(1.0)  # so that a stop request is seen
        self.stopping = False
        self.spawned = 0

    def serve(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except InterruptedError:
                continue
            with conn:
                self.answer(conn)
        self.listener.close()

    def answer(self, conn: socket.socket) -> None:
        try:
            pid, uid, _ = _PEERCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
            if uid != os.geteuid():
                logger.warning("node %s: request from pid %s uid %s refused", self.node_name,
                               pid, uid)  # fmt: skip
                return
            conn.settimeout(READ_TIMEOUT_S)
            message = _receive(conn)
            if not hmac.compare_digest(str(message.get("sig", "")), signature(message)):
                logger.warning("node %s: unsigned request from pid %s refused", self.node_name,
                               pid)  # fmt: skip
                return
            assignment = Assignment.from_dict(message["assignment"])
            sink = str(message["sink"])
        except ConnectionError:
            return  # closed before a whole request: nothing asked
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("node %s: unreadable request refused: %r", self.node_name, exc)
            return
        child = self.fork(assignment, sink, conn)
        self.spawned += 1
        try:
            _send(conn, {"ok": True, "pid": child})
        except OSError:
            pass  # the worker gave up waiting; the supervisor runs and reports all the same

    def fork(self, assignment, sink: str, conn: socket.socket) -> int:
        from scheduling.launcher import supervisor  # reads the settings as it loads: not at the top

        pid = os.fork()
        if pid == 0:
            try:
                self.listener.close()
                conn.close()
                os.setsid()
            except BaseException:
                os._exit(1)
            supervisor.become(assignment, sink, logging_ready=True)  # never returns
        return pid


def warm() -> None:
    """Import and look up, once, what every supervisor would otherwise do for itself."""
    from django.conf import settings

    from scheduling.launcher import environ, identity, paths, procs, relay, supervisor, tracking

    procs.warm()
    tracking.hierarchy()
    settings.SECRET_KEY  # noqa: B018 - read (from SECRET_KEY_FILE) before any fork
    # The settings are read: the secrets' names are needed no more, here or in a supervisor,
    # which would drop them itself (0.1 ms and 26 page faults each, measured).
    environ.drop_secrets_from_environ()
    supervisor.exec_helper()  # looked up once, for every supervisor
    try:  # the name service's configuration, read by the first lookup in a process
        pwd.getpwuid(os.geteuid())  # a supervisor's getpwnam: 0.16 ms after this 0.08 (measured)
    except KeyError:
        pass  # a user without a name: supervisors will say so when it matters
    del identity, paths, relay


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    (node_name,) = argv[1:]
    from scheduling.launcher import procs, supervisor

    supervisor.log_to_stderr()  # the spawner's and, inherited, each supervisor's (become)
    warm()
    procs.hide_from_same_user()
    procs.set_title(f"gpup-spawner node={node_name}")
    try:
        spawner = Spawner(node_name)
    except OSError as exc:
        logger.error("node %s: cannot listen (%s): is another spawner running?", node_name, exc)
        return 1

    def stop(signum, frame):
        spawner.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps what we fork
    gc.freeze()  # what is loaded now is never collected: children do not copy it to walk it
    logger.info("node %s: spawner ready (pid %s)", node_name, os.getpid())
    spawner.serve()
    logger.info("node %s: spawner stopped after %d supervisors", node_name, spawner.spawned)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
