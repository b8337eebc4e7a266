"""The node's queue of launches and controls, run on a thread of the node agent.

The control plane queues a node's jobs with django-q2 (``async_task(..., cluster=<node>)``:
``scheduling.controls``) in its own transaction, so a job exists exactly when the placement
it launches was committed. A node once ran a django-q2 cluster of its own to take them: four
processes (sentinel, pusher, monitor, a worker) to run functions that only ask the spawner
for a supervisor or signal one. This thread takes them from the same queue as the scheduler
takes its own (``gpuplatform.jobrunner.JobRunner``, inline, no schedules: claimed rows,
LISTEN wake-ups, a failure recorded as django-q2 records one), runs them with the node's
name, and acknowledges them. Idle, it sleeps on the listener's socket: a notification, a row
falling due, a lost listener or ``stop`` wakes it, and it claims on its own only every
BACKSTOP_S. A job claimed by an agent that dies before acknowledging it is handed out again
after the broker's retry time; launches and controls are idempotent, so a second delivery
is safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuplatform.jobrunner import JobRunner
from nodeagent.launcher import tasks

logger = logging.getLogger(__name__)

# The only functions a node runs from its queue: the control plane's names for them.
JOBS = {f"{tasks.__name__}.{name}": getattr(tasks, name) for name in tasks.__all__}
# The longest an idle job thread waits before claiming anyway. Every wake-up it needs comes
# from its listener's socket (a notification, the session's end, a dead peer: see
# gpuplatform.broker) or from ``stop``; this only bounds what nothing tells it.
BACKSTOP_S = 30.0


class NodeJobs(threading.Thread):
    """Take this node's jobs off its queue and run them, one at a time, until stopped."""

    def __init__(self, node_name: str) -> None:
        super().__init__(name=f"jobs-{node_name}", daemon=True)
        self.node_name = node_name
        self.runner = JobRunner(
            node_name,
            workers=1,
            resolve=self.resolve,
            schedules=False,
            backstop_s=BACKSTOP_S,
            inline=True,  # the node's connections are counted: this thread's and its listener
            sole_consumer=True,  # no launch or control is lost to an outage
        )
        self.broker = self.runner.broker

    @property
    def done(self) -> int:
        return self.runner.done

    def resolve(self, name: str) -> Callable | None:
        """A node job runs with the node's name, and its result goes to the agent's log."""
        func = JOBS.get(name)
        if func is None:
            return None

        def run(*args, **kwargs):
            result = func(*args, node=self.node_name, **kwargs)
            logger.info("node %s: %s: %s", self.node_name, name, result)
            return result

        return run

    def run(self) -> None:
        self.runner.run()

    def stop(self) -> None:
        self.runner.stop()
