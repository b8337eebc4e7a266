"""The node's own django-q2 cluster, run by the node agent as a child process.

Launches and controls are routed to it with ``async_task(..., cluster=<node>)``. It dies with
the agent (PR_SET_PDEATHSIG), so a restarted agent never finds a second cluster of its name;
the supervisors it started are detached and live on regardless.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

from django.conf import settings

from scheduling.launcher import procs
from scheduling.launcher.environ import platform_environment

logger = logging.getLogger(__name__)

RESTART_DELAY_S = 2.0


def _die_with_parent() -> None:
    procs.prctl(procs.PR_SET_PDEATHSIG, signal.SIGTERM)


class NodeCluster:
    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> None:
        # No secret in its environment: supervisors are forked from its workers.
        environ = platform_environment(Q_CLUSTER_NAME=self.node_name)
        procs.warm()  # not in the child, between fork and exec
        self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [sys.executable, "manage.py", "qcluster"],
            cwd=settings.BASE_DIR,
            env=environ,
            preexec_fn=_die_with_parent,  # only a prctl call between fork and exec
        )
        self.started_at = time.monotonic()
        logger.info("node %s: launcher cluster started (pid %s)", self.node_name, self.proc.pid)

    def keep_alive(self) -> None:
        """Restart the cluster if it died (not more often than every RESTART_DELAY_S)."""
        if self.proc is None or self.proc.poll() is None:
            return
        if time.monotonic() - self.started_at < RESTART_DELAY_S:
            return
        code = self.proc.returncode
        logger.warning("node %s: launcher cluster exited with %s; restarting", self.node_name, code)
        self.start()

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
