"""The node's spawner: a small long-lived process that forks task supervisors.

A supervisor forked from a launch worker is a copy of a process that has loaded all of Django:
a fork, a ``Popen`` from the child and the exits cost more CPU from such a process than from one
that has only read the settings, and the launch worker's double fork delayed every task between
submit and a running process. So the node agent runs this process beside it
(``python -m nodeagent.launcher.spawner NODE``). It reads the settings and imports the
supervisor's modules, never Django's apps or models, and forks one supervisor per request. A
supervisor forked here gets all it needs in its ``messages.Assignment``, reports and asks
through the node agent (``relay``), and loads Django's apps only if it must write to the
database itself (``Supervisor.db``).

Requests come over an abstract Unix socket, as the relay's reports do, and are believed only
from a process of the spawner's own user (SO_PEERCRED) that signed the request with the
platform's secret key, which tasks never see. A launch worker that cannot reach the spawner
forks the supervisor itself; one whose request went out but got no answer does not (the
supervisor may exist): reconciliation sees to a launch that never started (LAUNCH_PATIENCE).

Supervisors are detached as they are forked: a double fork (the first child exits at once;
SIGCHLD is ignored here, so the kernel reaps it) re-parents each to init, in a session of its
own, its standard streams /dev/null. So no supervisor is in the tree of the agent or of
whatever runs it (``make run``, a process manager): killing all of it, even with SIGKILL, leaves
supervisors and their tasks running, to be adopted by the restarted agent, as a container's
shim outlives its daemon. Nothing here or above sets PR_SET_CHILD_SUBREAPER (only a
supervisor does, for its own task), which would keep them in a platform process's tree.

A supervisor whose attempt ended plainly (succeeded or failed, recorded through the agent) does
not exit: it offers itself back here (``wait_for_work``) and the spawner hands it the next
assignment instead of forking, up to ``SUPERVISOR_REUSE`` attempts. A fork of this process,
its copy-on-write faults and the exit that frees them (perf: ``copy_page_range``,
``exit_mmap``) were most of what a supervisor cost. The spawner alone decides when an idle
supervisor is done (it closes its connection after ``IDLE_S``, or when the pool is full, or
when it stops), so an assignment is never sent to one that is leaving; a supervisor believes
only a spawner of its own user that signed the assignment.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import pwd
import signal
import socket
import sys
import time

from nodeagent.launcher import procs, unitcgroup, wire
from scheduling.agentapi.messages import Assignment

logger = logging.getLogger("scheduling.spawner")

READ_TIMEOUT_S = 0.5  # a client that does not send its request at once is dropped
POOL_MAX = 16  # idle supervisors kept per node (each holds its own private memory)
IDLE_S = 60.0  # an idle supervisor given no work for this long is let go


# --- The spawner ------------------------------------------------------------------------------


class Spawner:
    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(wire.address(node_name, "spawner"))
        self.listener.listen(128)
        self.listener.settimeout(1.0)  # so that a stop request is seen
        self.stopping = False
        self.spawned = 0
        self.reused = 0
        # Idle supervisors: (connection, pid, since), the most recently idle last.
        self.idle: collections.deque[tuple[socket.socket, int, float]] = collections.deque()

    def serve(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, InterruptedError):
                self.let_go_idle(IDLE_S)
                continue
            if not self.answer(conn):
                conn.close()
            self.let_go_idle(IDLE_S)
        self.let_go_idle(0)
        self.listener.close()

    def let_go_idle(self, older_than: float) -> None:
        """Close the connections of supervisors idle for ``older_than``: they exit."""
        cutoff = time.monotonic() - older_than
        while self.idle and self.idle[0][2] <= cutoff:
            self.idle.popleft()[0].close()

    def answer(self, conn: socket.socket) -> bool:
        """Serve one connection; True when it is kept (an idle supervisor's)."""
        try:
            pid, uid = wire.peer(conn)
            if uid != os.geteuid():
                logger.warning("node %s: request from pid %s uid %s refused", self.node_name,
                               pid, uid)  # fmt: skip
                return False
            conn.settimeout(READ_TIMEOUT_S)
            message = wire.receive_frame(conn)
            if not wire.genuine(message):
                logger.warning("node %s: unsigned request from pid %s refused", self.node_name,
                               pid)  # fmt: skip
                return False
            if "idle" in message:
                return self.keep_idle(conn, pid, message["idle"])
            assignment = Assignment.from_dict(message["assignment"])
            sink = str(message["sink"])
        except ConnectionError:
            return False  # closed before a whole request: nothing asked
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("node %s: unreadable request refused: %r", self.node_name, exc)
            return False
        child = self.hand_over(assignment, sink)
        if child is None:
            child = self.fork(assignment, sink, conn)
            self.spawned += 1
        try:
            wire.send_frame(conn, {"ok": True, "pid": child})
        except OSError:
            pass  # the worker gave up waiting; the supervisor runs and reports all the same
        return False

    def keep_idle(self, conn: socket.socket, pid: int, claimed) -> bool:
        """A supervisor (the peer ``pid`` itself) whose attempt is over waits for work."""
        if claimed != pid or len(self.idle) >= POOL_MAX:
            return False  # closed: it exits
        conn.settimeout(READ_TIMEOUT_S)
        self.idle.append((conn, pid, time.monotonic()))
        return True

    def hand_over(self, assignment, sink: str) -> int | None:
        """Give the assignment to the most recently idle supervisor (its pages are the
        warmest); its pid, or None when none is idle (or alive)."""
        if not self.idle:
            return None
        message = wire.signed({"assignment": assignment.as_dict(), "sink": sink})
        while self.idle:
            conn, pid, _ = self.idle.pop()
            with conn:
                try:
                    wire.send_frame(conn, message)
                except OSError:
                    continue  # it died while idle
            self.reused += 1
            return pid
        return None

    def fork(self, assignment, sink: str, conn: socket.socket) -> int:
        """Double fork: the supervisor is our grandchild, re-parented to init (or the nearest
        subreaper) as soon as its parent exits, so it is in no platform process's tree and
        outlives everything that kills a tree (a process manager killing the agent's tree
        with SIGKILL). Returns its pid."""
        from nodeagent.launcher import supervisor  # reads the settings as it loads: not at the top

        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                self.listener.close()
                conn.close()
                for idle, _, _ in self.idle:  # or they would not see the spawner let them go
                    idle.close()
                grandchild = os.fork()
                if grandchild == 0:
                    os.close(write)
                    os.setsid()
                    procs.detach_standard_streams()
                else:
                    os.write(write, grandchild.to_bytes(4, "little"))
                    os._exit(0)  # reaped by the kernel: SIGCHLD is ignored here
            except BaseException:
                os._exit(1)
            supervisor.become(assignment, sink, pooled=True)  # never returns
        os.close(write)
        try:
            data = os.read(read, 4)
        finally:
            os.close(read)
        return int.from_bytes(data, "little") if len(data) == 4 else pid


def warm() -> None:
    """Import and look up, once, what every supervisor would otherwise do for itself."""
    from django.conf import settings

    from nodeagent.launcher import (
        environ,
        identity,
        namespaces,
        procs,
        relay,
        supervisor,
        tracking,
    )
    from scheduling import paths

    procs.warm()
    tracking.hierarchy()
    settings.SECRET_KEY  # noqa: B018 - read (from SECRET_KEY_FILE) before any fork
    # The settings are read: the secrets' names are needed no more, here or in a supervisor,
    # which would drop them itself, each paying for it.
    environ.drop_secrets_from_environ()
    supervisor.exec_helper()  # looked up once, for every supervisor
    namespaces.unavailable()  # and the kernel asked once whether tasks get namespaces
    try:  # the name service's configuration, read by the first lookup in a process
        pwd.getpwuid(os.geteuid())  # read once here, not by each supervisor's getpwnam
    except KeyError:
        pass  # a user without a name: supervisors will say so when it matters
    del identity, paths, relay


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    (node_name,) = argv[1:]
    from nodeagent.launcher import supervisor

    supervisor.log_to_stderr()  # the spawner's own (a supervisor logs to its file: become)
    warm()
    # Where supervisors go to leave the agent's systemd unit, if it runs in one; said once.
    from django.conf import settings

    logger.info("node %s: %s", node_name, unitcgroup.prepared(settings.CGROUP_NAME, node_name)[1])
    procs.hide_from_same_user()
    procs.set_title(f"{procs.SPAWNER_NAME} node={node_name}")
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
    logger.info("node %s: spawner stopped after %d supervisors forked, %d reused", node_name,
                spawner.spawned, spawner.reused)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
