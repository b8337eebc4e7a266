"""The node agent's own child process: its spawner, which forks the supervisors its launches
ask for (``spawner``). It dies with the agent (PR_SET_PDEATHSIG), so a restarted agent never
finds a second one of its node; the supervisors are detached and live on regardless.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

from django.conf import settings

from nodeagent.launcher import procs
from nodeagent.launcher.environ import platform_environment

logger = logging.getLogger(__name__)

RESTART_DELAY_S = 2.0


def _die_with_parent() -> None:
    procs.prctl(procs.PR_SET_PDEATHSIG, signal.SIGTERM)


class NodeChild:
    """One child process of the agent, restarted when it dies (not more often than every
    RESTART_DELAY_S)."""

    def __init__(self, node_name: str, what: str, argv: list[str], **environ: str) -> None:
        self.node_name = node_name
        self.what = what
        self.argv = argv
        self.environ = environ
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> None:
        # No secret in its environment: supervisors are forked from it or its workers.
        environ = platform_environment(**self.environ)
        procs.warm()  # not in the child, between fork and exec
        self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
            [sys.executable, *self.argv],
            cwd=settings.BASE_DIR,
            env=environ,
            preexec_fn=_die_with_parent,  # only a prctl call between fork and exec
        )
        self.started_at = time.monotonic()
        logger.info("node %s: %s started (pid %s)", self.node_name, self.what, self.proc.pid)

    def keep_alive(self) -> None:
        if self.proc is None or self.proc.poll() is None:
            return
        if time.monotonic() - self.started_at < RESTART_DELAY_S:
            return
        code = self.proc.returncode
        logger.warning("node %s: %s exited with %s; restarting", self.node_name, self.what, code)
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


def spawner(node_name: str) -> NodeChild:
    return NodeChild(node_name, "spawner", ["-m", "nodeagent.launcher.spawner", node_name])
