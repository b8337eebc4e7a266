"""The node's local sockets, as their clients use them: a supervisor's reports to the node
agent (``relay``), and requests to the node's spawner (``spawner``) from a launch worker or from
a supervisor between attempts.

Both services listen on abstract Unix sockets named after the platform's data directory and the
node, and believe a message only from a process of their own user (SO_PEERCRED) that signed it
with the platform's secret key, which tasks never see. The servers (``relay.Relay``,
``spawner.Spawner``) import this module; their clients import nothing else of the launcher.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import struct

from django.conf import settings

from scheduling.agentapi.messages import Assignment

logger = logging.getLogger(__name__)

RELAY_TIMEOUT_S = 5.0  # then the supervisor reports itself
MAX_MESSAGE = 64 * 1024
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def address(node_name: str, service: str = "relay") -> str:
    """The abstract socket of one of a node's services (``relay``, ``spawner``)."""
    digest = hashlib.sha256(f"{settings.VAR_DIR}\0{node_name}".encode()).hexdigest()[:24]
    return f"\0gpuplatform-{service}-{digest}"


def peer(sock: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end of a Unix socket, from the kernel."""
    pid, uid, _ = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return pid, uid


def signature(message: dict) -> str:
    """An HMAC of the whole report but its signature."""
    subject = json.dumps({k: v for k, v in message.items() if k != "sig"}, sort_keys=True)
    return hmac.new(settings.SECRET_KEY.encode(), subject.encode(), hashlib.sha256).hexdigest()


def signed(message: dict) -> dict:
    """``message`` with its signature (``sig``), for the relay or the spawner to believe."""
    return {**message, "sig": signature(message)}


def genuine(message: dict) -> bool:
    """Whether ``message`` carries the signature of what it says (``signed``)."""
    return hmac.compare_digest(str(message.get("sig", "")), signature(message))


# --- A supervisor's reports to its node agent (the relay) -------------------------------------


KINDS = {
    "StartReport": "started",
    "ExitReport": "finished",
    "FenceQuery": "fence",
    "LogTrouble": "log_trouble",
}


def send(node_name: str, report, timeout: float = RELAY_TIMEOUT_S) -> dict | None:
    """Send this supervisor's ``messages.StartReport``, ``ExitReport``, ``FenceQuery`` or
    ``LogTrouble`` to the agent of ``node_name`` and wait for its answer; None if there is none
    (then write or ask the database yourself)."""
    message = signed(
        {
            "kind": KINDS[type(report).__name__],
            "supervisor": os.getpid(),
            "report": report.as_dict(),
        }
    )
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(timeout)
            sock.connect(address(node_name))
            sock.sendall(json.dumps(message).encode())
            data = sock.recv(MAX_MESSAGE)
    except OSError:
        return None
    try:
        reply = json.loads(data)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) and reply.get("ok") else None


SPAWNER_TIMEOUT_S = 2.0
MAX_REQUEST = 4 << 20  # a command of 16 KiB and 100 environment values of 8 KiB fit easily
_LENGTH = struct.Struct("!I")


class NotSent(Exception):
    """The request never reached a spawner: the caller may start the supervisor itself."""


def send_frame(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_LENGTH.pack(len(data)) + data)


def receive_frame(sock: socket.socket) -> dict:
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


# --- The spawner's clients: a launch worker, and a supervisor between attempts -----------------


def request(assignment, sink: str, timeout: float = SPAWNER_TIMEOUT_S) -> int | None:
    """Ask the node's spawner to fork the supervisor of ``assignment`` (a
    ``messages.Assignment``), its output to ``sink``. Returns the supervisor's pid, or None when
    the request was sent and no answer came. Raises NotSent when no spawner took it."""
    message = signed({"assignment": assignment.as_dict(), "sink": str(sink)})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(address(assignment.node, "spawner"))
            send_frame(sock, message)
        except OSError as exc:
            raise NotSent(str(exc)) from exc
        try:
            reply = receive_frame(sock)
        except (OSError, ValueError) as exc:
            logger.warning("the spawner of node %s did not answer: %s", assignment.node, exc)
            return None
    return reply.get("pid") if reply.get("ok") else None


def wait_for_work(node_name: str, offered=lambda: None) -> tuple[Assignment, str] | None:
    """Offer this supervisor, whose attempt is over, to the node's spawner and wait for the
    next assignment and its sink; None when the spawner lets us go (or is not ours).
    ``offered`` is called once the offer is queued at the spawner, which answers its
    connections in order: from then on the next assignment finds us."""
    message = signed({"idle": os.getpid()})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(SPAWNER_TIMEOUT_S)
            sock.connect(address(node_name, "spawner"))
            _, uid = peer(sock)
            if uid != os.geteuid():
                logger.warning("node %s: the spawner's address is held by uid %s", node_name, uid)
                return None
            send_frame(sock, message)
            offered()
            sock.settimeout(None)  # the spawner decides how long we wait (IDLE_S)
            work = receive_frame(sock)
            if not genuine(work):
                logger.warning("node %s: unsigned assignment refused", node_name)
                return None
            return Assignment.from_dict(work["assignment"]), str(work["sink"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # let go (closed), or the spawner is gone
