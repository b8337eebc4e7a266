"""The node's lease, as each supervisor holds it: a node cut off from the database stops its
tasks before the scheduler requeues them elsewhere (``heartbeat.fence_after`` and
``heartbeat.lost_after``, see docs/scheduling.md), so a partition never runs a task twice."""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("scheduling.supervisor")

FENCE_EVERY_S = 5.0  # at most; a quarter of heartbeat.fence_after when that is shorter
FIRST_FENCE_S = 1.0  # a command over sooner never asks
CLOSE_WAIT_S = 0.05


class Lease:
    """The node's lease as a supervisor holds it. Each fence answer that says the attempt is
    still wanted renews it from its node's last heartbeat in the database (the answer's
    ``age``): the scheduler counts ``lost_after`` from that same heartbeat, so a supervisor
    cut off from the database stops its command at ``fence_after`` (then SIGTERM, grace,
    SIGKILL), before the task can be requeued elsewhere. Held by the supervisor, not the agent:
    it holds when the agent is down or hung too.

    Asked on a thread of its own: a partition answers nothing (a query waits, it is not
    refused), and the watch loop must see the lease lapse on time. ``ask`` returns
    ``{"wanted", "age"}`` or None (no answer). ``fence_after``: the estate's
    ``heartbeat.fence_after`` as the assignment carried it; None, and the thread reads the
    configuration (its parser, imported in a supervisor, costs more CPU than a short task)."""

    def __init__(self, ask, started: float, fence_after: int | None = None) -> None:
        self.ask = ask
        self.started = started
        self.renewed = started  # the attempt was just placed on a node that heartbeats
        self.fence_after = fence_after  # else known once the thread has read the estate's
        self.superseded = False
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def lapsed(self, now: float) -> bool:
        """Whether the lease lapsed by ``now``. The first call FIRST_FENCE_S after the start
        starts asking: a command over sooner costs no thread (nor its supervisor's reuse)."""
        if self._thread is None and now - self.started >= FIRST_FENCE_S:
            self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
            self._thread.start()
        return self.fence_after is not None and now - self.renewed > self.fence_after

    def asking(self) -> bool:
        """Whether a question is still out (after ``close``): the process must not fork."""
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)  # at once unless a question is out

    def _run(self) -> None:
        if self.fence_after is None:
            try:
                from scheduling import estate

                self.fence_after = estate.config().heartbeat.fence_after_s
            except Exception:  # noqa: BLE001 - a broken file was refused at the agent's start
                logger.exception("cannot read heartbeat.fence_after: the lease is not enforced")
        every = min(FENCE_EVERY_S, (self.fence_after or FENCE_EVERY_S * 4) / 4)
        while True:
            sent = time.monotonic()
            try:
                answer = self.ask()
            except Exception:  # noqa: BLE001 - no answer; asked again next time
                logger.exception("fence query failed")
                answer = None
            if self._closed.is_set():
                return
            if answer is not None:
                if not answer["wanted"]:
                    self.superseded = True
                    return
                self.renewed = sent - (answer["age"] or 0.0)
            if self._closed.wait(max(0.0, every - (time.monotonic() - sent))):
                return
