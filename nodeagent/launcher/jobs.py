"""The node's queue of launches and controls, run on a thread of the node agent.

The control plane queues a node's jobs with django-q2 (``async_task(..., cluster=<node>)``:
``scheduling.controls``) in its own transaction, so a job exists exactly when the placement
it launches was committed. A node once ran a django-q2 cluster of its own to take them: four
processes (sentinel, pusher, monitor, a worker) to run functions that only ask the spawner
for a supervisor or signal one. This thread takes them from the same queue with the same
broker (claimed rows, LISTEN wake-ups: ``gpuplatform.broker``), runs them, and acknowledges
them. Idle, it sleeps on the listener's socket: a notification, a row falling due, a lost
listener or ``stop`` wakes it, and it claims on its own only every BACKSTOP_S. A job claimed
by an agent that dies before acknowledging it is handed out again after the broker's retry
time; launches and controls are idempotent, so a second delivery is safe.
"""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, close_old_connections
from django_q.signing import BadSignature, SignedPackage

from gpuplatform import broker
from nodeagent.launcher import tasks

logger = logging.getLogger(__name__)

# The only functions a node runs from its queue: the control plane's names for them.
JOBS = {f"{tasks.__name__}.{name}": getattr(tasks, name) for name in tasks.__all__}
RETRY_AFTER_ERROR_S = 1.0
# The longest an idle job thread waits before claiming anyway. Every wake-up it needs comes
# from its listener's socket (a notification, the session's end, a dead peer: see
# gpuplatform.broker) or from ``stop``; this only bounds what nothing tells it.
BACKSTOP_S = 30.0


class NodeJobs(threading.Thread):
    """Take this node's jobs off its queue and run them, one at a time, until stopped."""

    def __init__(self, node_name: str) -> None:
        super().__init__(name=f"jobs-{node_name}", daemon=True)
        self.node_name = node_name
        self.broker = broker.queue_broker(node_name, idle_s=BACKSTOP_S)
        self.stopping = threading.Event()
        self.done = 0

    def run(self) -> None:
        logger.info("node %s: taking its jobs (queue %s)", self.node_name, self.broker.list_key)
        try:
            while not self.stopping.is_set():
                try:
                    claimed = self.broker.dequeue()  # waits for a wake-up when there is none
                    for ack_id, payload in claimed or ():
                        self.run_one(ack_id, payload)
                except DatabaseError as exc:  # what is not acknowledged is handed out again
                    logger.warning("node %s: job queue unreachable (%s)", self.node_name, exc)
                    close_old_connections()
                    self.stopping.wait(RETRY_AFTER_ERROR_S)
        finally:
            broker.close_listener(self.broker)
            close_old_connections()

    def run_one(self, ack_id, payload: str) -> None:
        try:
            job = SignedPackage.loads(payload)
            func = JOBS[job["func"]]
        except (BadSignature, KeyError, TypeError, ValueError) as exc:
            logger.error("node %s: job %s refused (%r)", self.node_name, ack_id, exc)
            self.broker.fail(ack_id)
            return
        try:
            result = func(*job.get("args", ()), node=self.node_name, **job.get("kwargs", {}))
            logger.info("node %s: %s: %s", self.node_name, job["func"], result)
        except Exception:  # one job's failure must not stop the node's others
            logger.exception("node %s: job %s failed", self.node_name, job["func"])
            close_old_connections()
        self.broker.acknowledge(ack_id)
        self.done += 1

    def stop(self) -> None:
        self.stopping.set()
        broker.interrupt(self.broker)  # a wait under way ends now, not at the backstop
