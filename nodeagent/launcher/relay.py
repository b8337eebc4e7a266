"""Supervisors report through their node agent, which writes many reports in one statement.

A supervisor used to open its own database session twice per task (to say its command started,
then how it ended) and run a dozen ORM statements each time: with many short tasks that was much
of the CPU the platform spent per task, and a PostgreSQL backend started per report. Now it
sends each report over a local socket to the node agent's ``Relay`` thread, which gathers what
arrives within a few milliseconds and writes it with ``reports.attempts_started`` and
``reports.attempts_finished``, then answers each supervisor. A running supervisor also asks it,
every few seconds, whether its attempt is still wanted (fencing), the same way.

Nothing is lost when the agent is down, slow or failing: ``send`` returns None whenever no
answer came (no listener, a timeout, a database error in the agent), and the supervisor then
writes the report itself, as before. The exit file is still written first.

The socket is in the abstract namespace (no path to outgrow ``sun_path``, nothing left behind by
a killed agent), named after the platform's data directory and the node. Anyone on the host may
connect to an abstract socket, so the agent believes a report only from a process of its own
user whose pid (from the kernel, SO_PEERCRED) is the supervisor's the report names, and which
carries an HMAC of the report under the platform's secret key, which tasks never see.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import threading
import time

from django.db import DatabaseError, OperationalError

from gpuplatform.db import close_old_connections
from nodeagent.launcher import logfaults, wire
from scheduling.agentapi.messages import Assignment, ExitReport, StartReport

logger = logging.getLogger(__name__)

GATHER_S = 0.005  # how long the first report of a batch waits for others
MAX_BATCH = 256


# --- Agent side ----------------------------------------------------------------------------------


_LISTENERS: set[socket.socket] = set()


def _close_listeners_in_child() -> None:
    # A process forked from the agent (a supervisor in tests) must not keep the address bound.
    for listener in _LISTENERS:
        listener.close()


os.register_at_fork(after_in_child=_close_listeners_in_child)


class Relay(threading.Thread):
    """The node agent's listener: gathers reports for up to GATHER_S, writes them together,
    answers each. Stopped by ``stop``."""

    def __init__(self, node_name: str) -> None:
        super().__init__(name=f"relay-{node_name}", daemon=True)
        self.node_name = node_name
        self.stopping = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Bound here, not in run: a supervisor started right after the agent finds it.
        self.listener.bind(wire.address(node_name))
        self.listener.listen(MAX_BATCH)
        self.listener.setblocking(False)
        _LISTENERS.add(self.listener)
        # ``stop`` writes here: the wait for reports has no timeout to notice it by.
        self._wake_r, self._wake_w = socket.socketpair()
        self.batches = 0
        self.reports = 0
        self.log_alerted_at: float | None = None  # ``log_trouble``: the node's alert, when

    def stop(self) -> None:
        self.stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # ended already
        self.join(timeout=10)

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        pending: list[tuple[socket.socket, dict]] = []
        first_at = 0.0
        try:
            while not self.stopping.is_set():
                # Idle, it sleeps until a supervisor connects or ``stop`` wakes it.
                wait = None if not pending else max(0.0, first_at + GATHER_S - time.monotonic())
                for key, _ in selector.select(wait):
                    if key.fileobj is self._wake_r:
                        continue  # stopping: the loop's condition says so
                    if key.fileobj is self.listener:
                        self._accept(selector)
                        continue
                    selector.unregister(key.fileobj)
                    message = self._read(key.fileobj)
                    if message is None:
                        key.fileobj.close()
                        continue
                    if not pending:
                        first_at = time.monotonic()
                    pending.append((key.fileobj, message))
                if pending and (
                    len(pending) >= MAX_BATCH or time.monotonic() >= first_at + GATHER_S
                ):
                    self._answer(pending)
                    pending = []
        finally:
            for conn, _ in pending:
                conn.close()  # unanswered: those supervisors report themselves
            selector.close()
            _LISTENERS.discard(self.listener)
            self.listener.close()
            self._wake_r.close()
            self._wake_w.close()
            close_old_connections()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            conn.settimeout(wire.RELAY_TIMEOUT_S)
            selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> dict | None:
        """The report, if it comes from the supervisor it names; None (and a warning) if not."""
        try:
            data = conn.recv(wire.MAX_MESSAGE)
            pid, uid = wire.peer(conn)
            message = json.loads(data)
            kind, claimed = message["kind"], message["supervisor"]
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            logger.warning("node %s: unreadable report refused: %r", self.node_name, exc)
            return None
        if (
            kind not in wire.KINDS.values()
            or uid != os.geteuid()
            or pid != claimed
            or not wire.genuine(message)
        ):
            logger.warning(
                "node %s: report refused from pid %s uid %s (claims to be supervisor %s)",
                self.node_name,
                pid,
                uid,
                claimed,
            )
            return None
        return message

    def _answer(self, pending: list[tuple[socket.socket, dict]]) -> None:
        from nodeagent.launcher import lifecycle  # Django's models: the agent's only
        from scheduling.agentapi import handoff

        hand = handoff.HandOff(self.node_name, launcher=lifecycle)
        try:
            replies = write_reports([message for _, message in pending], hand)
        except DatabaseError as exc:
            logger.warning("node %s: reports not written (%s): supervisors report", self.node_name,
                           exc)  # fmt: skip
            close_old_connections()
            replies = [{"ok": False}] * len(pending)
        troubles = [message["report"] for _, message in pending if message["kind"] == "log_trouble"]
        if troubles:
            self.log_trouble(troubles[-1])
        self.batches += 1
        # Reports, not questions: a supervisor asks whether its attempt is still wanted (its
        # lease) every few seconds while its command runs.
        self.reports += sum(1 for _, message in pending if message["kind"] != "fence")
        for (conn, _), reply in zip(pending, replies, strict=True):
            try:
                conn.sendall(json.dumps(reply).encode())
            except OSError:
                # It gave up waiting and reported itself (the write above was idempotent); an
                # attempt it was to take goes to the spawner.
                if "next" in reply:
                    hand.rest.append(Assignment.from_dict(reply["next"]["assignment"]))
            finally:
                conn.close()
        # After the answers: a supervisor told to go idle is back in the spawner's pool sooner.
        lifecycle.start_supervisors(hand.rest, may_fork=False)  # this process runs threads

    def log_trouble(self, report: dict) -> None:
        """Supervisors cannot write their logs: the node's alert, opened or refreshed at most
        every ``logfaults.ALERT_EVERY_S`` (one per node, however many tasks say so)."""
        now = time.monotonic()
        if self.log_alerted_at is not None and now < self.log_alerted_at + logfaults.ALERT_EVERY_S:
            return
        message = logfaults.alert_message(self.node_name, str(report["path"]), str(report["error"]))
        logger.error("%s", message)
        try:
            logfaults.raise_alert(self.node_name, message)
        except DatabaseError as exc:
            logger.warning("node %s: log alert not raised (%s)", self.node_name, exc)
            close_old_connections()
            return
        self.log_alerted_at = now


# A batch whose transaction PostgreSQL rolled back for a deadlock or a serialization failure is
# written again, up to this many times, before its supervisors are told to write their reports
# themselves: each of them then loads Django, which costs far more CPU than the retry. Every
# write here is idempotent.
CONFLICT_TRIES = 3


def again_on_conflict(write, *args, **kwargs):
    """``write(*args, **kwargs)``, again when PostgreSQL gave up on its transaction."""
    for _ in range(CONFLICT_TRIES - 1):
        try:
            return write(*args, **kwargs)
        except OperationalError as exc:
            from psycopg.errors import DeadlockDetected, SerializationFailure  # not in supervisors

            if not isinstance(exc.__cause__, DeadlockDetected | SerializationFailure):
                raise
            logger.info("reports written again after %s", type(exc.__cause__).__name__)
    return write(*args, **kwargs)


def write_reports(messages: list[dict], hand_off=None) -> list[dict]:
    """One statement for the starts, one transaction for the plain ends and the starts they
    carry (any other end on its own), whose GPUs are handed on to the next tasks with
    ``hand_off`` (a node agent's ``handoff.HandOff``), one query for the fences; an answer per
    message, in order: a ready supervisor's answer may name its next attempt (``next``,
    ``wire.signed``)."""
    from scheduling.agentapi import reports

    def of(kind: str) -> list[dict]:
        return [m["report"] for m in messages if m["kind"] == kind]

    starts = [StartReport.of(fields) for fields in of("started")]
    exits = [ExitReport.of(fields) for fields in of("finished")]
    fences = [fields["attempt_id"] for fields in of("fence")]
    # The starts that ends carry are written by ``attempts_finished``: those of plain ends in
    # the ends' own transaction, one fewer per batch.
    started = again_on_conflict(reports.attempts_started, starts) if starts else {}
    outcomes = (
        again_on_conflict(reports.attempts_finished, exits, hand_off=hand_off) if exits else {}
    )
    given = hand_off.given if hand_off is not None else {}
    answers = reports.fences(fences) if fences else {}

    def answer(kind: str, fields: dict) -> dict:
        if kind == "started":
            return {"ok": True, "started": started.get(fields["attempt_id"], False)}
        if kind == "fence":
            fence = answers.get(fields["attempt_id"], {"wanted": False, "age": None})
            return {"ok": True, **fence}
        if kind == "log_trouble":
            return {"ok": True}  # the relay's own (``Relay.log_trouble``)
        key = (fields["task_id"], fields["attempt_no"])
        reply = {"ok": True, "outcome": outcomes.get(key, "unknown")}
        if fields["task_id"] in given:
            assignment, sink = given[fields["task_id"]]
            reply["next"] = wire.signed({"assignment": assignment.as_dict(), "sink": sink})
        return reply

    return [answer(m["kind"], m["report"]) for m in messages]
