"""The node agent: registers its node and GPUs, heartbeats, and notices GPUs that vanish.

Split into one-step methods (``register``, ``tick``) that tests call directly; ``run`` is the
loop around them, stopped by SIGTERM or SIGINT.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection

from gpuplatform import connections as db_connections
from gpuplatform import env
from gpuplatform.db import close_old_connections
from gpuplatform.outage import OutageLog
from nodeagent.inventory import GpuBackend, GpuInfo, open_backend
from nodeagent.launcher import (
    cgroups,
    environ,
    gpufence,
    gpuwatch,
    identity,
    lifecycle,
    namespaces,
    tracking,
)
from nodeagent.launcher.cluster import spawner
from nodeagent.launcher.jobs import NodeJobs
from nodeagent.launcher.relay import Relay
from scheduling import services
from scheduling.config import EstateConfig, NodeConfig
from scheduling.models import NodeState

logger = logging.getLogger(__name__)

# What PostgreSQL accepts, and how many nodes other than this one are not offline.
_CONNECTIONS_AND_NODES = (
    f"SELECT {db_connections.SERVER_ALLOWS},"  # noqa: S608 - a constant expression
    " (SELECT count(*) FROM scheduling_node WHERE name <> %s AND state <> %s)"
)

RECONCILE_EVERY = 6  # heartbeats
WATCH_EVERY_S = 1.0  # how soon a dead supervisor is noticed (locally: lifecycle.SupervisorWatch)
JOBS_STOP_S = 5.0  # a job under way is let finish (a launch takes milliseconds)


class AgentError(Exception):
    pass


def resolve_node_name(config: EstateConfig, requested: str | None) -> str:
    """The node this agent speaks for: the one asked for, the only one configured, or this host."""
    if requested:
        return requested
    if len(config.nodes) == 1:
        return config.nodes[0].name
    hostname = socket.gethostname().split(".")[0].lower()
    if config.node(hostname) is None:
        names = ", ".join(node.name for node in config.nodes)
        raise AgentError(
            f"this host ({hostname}) is not among the configured nodes ({names}); "
            "start the agent with --node NAME or set NODE_NAME"
        )
    return hostname


class NodeAgent:
    def __init__(
        self,
        *,
        config: EstateConfig,
        node_name: str,
        backend: GpuBackend | None = None,
        backend_kind: str = "auto",
        sample: bool = True,
    ) -> None:
        node = config.node(node_name)
        # A node absent from the configuration may still join with real GPUs, in the default pool.
        self.node_config = node or NodeConfig(name=node_name)
        self.config = config
        self.backend = backend or open_backend(
            backend_kind, node_name=node_name, simulate=self.node_config.simulate
        )
        self.sample = sample
        self.memory = gpuwatch.MemoryWatch(node_name, self.backend)
        self.stopping = threading.Event()
        self._last_seen: tuple[GpuInfo, ...] | None = None
        self.ticks = 0
        # Where the control plane reaches this agent (nodeagent.peer); blank until it serves.
        self.advertise_address = ""

    @property
    def name(self) -> str:
        return self.node_config.name

    def register(self) -> list[GpuInfo]:
        gpus = self.backend.discover()
        gpufence.publish(self.name, gpus)  # before the GPUs are offered: supervisors read it
        pool = next((p for p in self.config.pools if p.name == self.node_config.pool), None)
        services.node_register(
            name=self.name,
            pool_name=self.node_config.pool,
            pool_description=pool.description if pool else "",
            hostname=socket.gethostname(),
            backend=self.backend.name,
            gpus=gpus,
            isolation=tracking.isolation(),
            process_tracking=tracking.describe(),
            advertise_address=self.advertise_address or None,
        )
        self._last_seen = tuple(gpus)
        self.memory.clean = False  # GPUs (re)registered: their memory is checked in full
        return gpus

    def tick(self) -> None:
        """One heartbeat. Reconciles this node's tasks on the first tick and every
        RECONCILE_EVERY after, before the heartbeat: what must not run here is gone before the
        node's GPUs are offered. Re-registers when discovery changed or the node row went
        missing. The first also checks PostgreSQL's connection limit (``check_connections``)."""
        if self.ticks % RECONCILE_EVERY == 0:
            self.reconcile()
        gpus = tuple(self.backend.discover())
        if gpus != self._last_seen:
            logger.info(
                "node %s: %s, registering %d GPU(s)",
                self.name,
                "starting" if self._last_seen is None else "GPU set changed",
                len(gpus),
            )
            self.register()
        elif not services.node_heartbeat(name=self.name):
            logger.warning("node %s: unknown to the database, registering again", self.name)
            self.register()
        # Skips the database while no process holds GPU memory; in full with reconciliation.
        self.memory.check(again=self.ticks % RECONCILE_EVERY == 0)
        if self.ticks == 0:
            self.check_connections()
        self.ticks += 1

    def check_connections(self) -> str | None:
        """Warn when PostgreSQL accepts fewer connections than the estate (the nodes not
        offline, this one counted) may hold (``gpuplatform.connections``): each node holds a
        handful, and a stock server runs out at a few nodes more than a workstation lab has.
        Returns the warning."""
        with connection.cursor() as cursor:
            # An offline node's agent holds none.
            cursor.execute(_CONNECTIONS_AND_NODES, [self.name, NodeState.OFFLINE])
            allows, others = cursor.fetchone()
        try:  # as `make run` starts them (a bad value is make run's to refuse, not ours)
            web_workers = env.integer("WEB_WORKERS", 1, minimum=1)
        except ImproperlyConfigured:
            web_workers = 1
        cap = db_connections.budget(
            web_workers=web_workers,
            db_pool_size=settings.DB_POOL_SIZE,
            q_workers=settings.Q_CLUSTER["workers"],
            nodes=others + 1,
        )
        problem = db_connections.shortfall(cap, allows)
        if problem:
            logger.warning("node %s: %s", self.name, problem)
        return problem

    def reconcile(self) -> dict[str, int]:
        """Tasks the database thinks run here: re-adopt, finish from their exit file, or mark
        lost and requeue (see nodeagent.launcher.lifecycle.reconcile_node)."""
        counts = lifecycle.reconcile_node(self.name, startup=self.ticks == 0)
        if any(counts.values()):
            logger.info("node %s reconciled its tasks: %s", self.name, counts)
        return counts

    def run(self, *, launcher: bool = True) -> None:
        """Heartbeat until stopped; with ``launcher``, also launch and control the tasks placed
        here (the spawner, the queue's jobs, the supervisors' reports)."""
        self._install_signal_handlers()
        peer = self._peer()  # first: an agent that cannot serve its logs stops here
        identity.secure_platform_dirs()
        environ.forget_secret_files_of_dead_processes()
        if settings.CGROUP_FAVOR_DYNMODS and tracking.hierarchy() is not None:
            logger.info("node %s: cgroup favordynmods: %s", self.name, cgroups.favor_dynmods())
        if not identity.privileged():
            logger.warning(
                "node %s: %s (the agent is not root: every task runs as this user)",
                self.name,
                identity.SINGLE_USER_NOTE,
            )
        # Tasks may still run here from before a restart: their supervisors' successors need
        # the GPUs' device nodes before the first heartbeat registers them.
        gpufence.publish(self.name, self.backend.discover())
        relay = self._relay() if launcher else None
        # The spawner first: launches find it from the first job on.
        children = [spawner(self.name)] if launcher else []
        for child in children:
            child.start()
        jobs = self._jobs() if launcher else None
        sampler = self._sampler()
        interval = self.config.heartbeat.interval_s
        telemetry = self.config.telemetry
        logger.info(
            "node agent %s starting: GPUs via %s, heartbeat every %ss, samples every %s, "
            "tasks tracked by %s; %s",
            self.name,
            self.backend.name,
            interval,
            f"{telemetry.sample_interval_s}s ({telemetry.unheld_sample_interval_s}s while no "
            "task holds a GPU)"
            if self.sample
            else "(off)",
            tracking.describe(),
            namespaces.describe(),
        )
        next_tick = 0.0
        reached = time.monotonic()  # the database, last
        fenced = False
        watch = lifecycle.SupervisorWatch(self.name)
        outage = OutageLog(logger, logging.ERROR)  # an outage is said once, and its end
        seen = None  # what the job thread and the relay had done at the last look
        while not self.stopping.is_set():
            try:
                heartbeat = time.monotonic() >= next_tick
                done = (jobs.done if jobs else 0, relay.reports if relay else 0, jobs)
                if done != seen and sampler is not None:
                    sampler.wake()  # a task may hold GPUs here now: sampled at the full rate
                if done != seen or (heartbeat and self.ticks % RECONCILE_EVERY == 0):
                    watch.changed()  # a launch, a control, a report, a reconciliation
                seen = done
                if heartbeat or watch.stale:
                    close_old_connections()  # before the database, not every second
                if heartbeat:
                    next_tick = time.monotonic() + interval
                    self.tick()  # the first tick registers
                    reached, fenced = time.monotonic(), False
                    outage.reached("node %s: heartbeat stored again after %.0f s", self.name)
                watch.look()  # the supervisors' processes; the database only when changed
                for child in children:
                    child.keep_alive()
                if jobs is not None and not jobs.is_alive():
                    logger.error("node %s: its job thread ended; starting another", self.name)
                    jobs = self._jobs()
            except DatabaseError as exc:
                # The database may be restarting: keep the agent alive and try again next tick.
                outage.failed("node %s: heartbeat failed, will retry: %s", self.name, exc)
                close_old_connections()
                fenced = fenced or self._fenced(time.monotonic() - reached)
            self.stopping.wait(min(WATCH_EVERY_S, interval))
        if sampler is not None:
            sampler.stop()
        if jobs is not None:
            jobs.stop()
            jobs.join(timeout=JOBS_STOP_S)
        for child in reversed(children):
            child.stop()
        if relay is not None:
            relay.stop()
        if peer is not None:
            peer.stop()
        self.backend.close()
        logger.info("node agent %s stopped", self.name)

    def _jobs(self) -> NodeJobs:
        """Run the launches and controls queued for this node on a thread (launcher.jobs)."""
        jobs = NodeJobs(self.name)
        jobs.start()
        return jobs

    def _fenced(self, silent_s: float) -> bool:
        """Say once per outage that the node's lease lapsed: its supervisors stop their tasks
        themselves (``launcher.lease``); the agent only tells the operator. True once said."""
        fence_after = self.config.heartbeat.fence_after_s
        if silent_s < fence_after:
            return False
        logger.error(
            "node %s: no heartbeat written for %d s (heartbeat.fence_after is %d s): the node's "
            "lease lapsed, its supervisors stop their tasks before the scheduler requeues them",
            self.name,
            silent_s,
            fence_after,
        )
        return True

    def _relay(self) -> Relay | None:
        """Take the supervisors' reports on a thread of its own (launcher.relay)."""
        try:
            relay = Relay(self.name)
        except OSError as exc:  # another agent of this node holds it: supervisors write
            logger.error("node %s: cannot take supervisors' reports: %s", self.name, exc)
            return None
        relay.start()
        return relay

    def _peer(self):
        """Serve this node's logs to the control plane (nodeagent.peer) before the first
        registration records where. AgentError when it cannot listen there."""
        from nodeagent import peer

        try:
            server = peer.serve(self.name, settings.NODE_ADVERTISE_ADDRESS)
        except OSError as exc:
            # Refused, not skipped: without the server the web would find no log of this node.
            where = settings.NODE_ADVERTISE_ADDRESS or peer.LOOPBACK
            raise AgentError(
                f"NODE_ADVERTISE_ADDRESS: cannot serve logs on {where}: {exc}"
            ) from exc
        self.advertise_address = server.address
        logger.info(
            "node %s: serving its logs to the control plane on %s", self.name, server.address
        )
        return server

    def _sampler(self):
        """Start GPU sampling on its own thread (nodeagent.sampler): the heartbeat loop above
        never waits for a GPU read or a sample write."""
        if not self.sample:
            return None
        from nodeagent.sampler import Sampler  # the scheduling app does not need telemetry

        sampler = Sampler(
            node_name=self.name,
            backend=self.backend,
            interval_s=self.config.telemetry.sample_interval_s,
            unheld_interval_s=self.config.telemetry.unheld_sample_interval_s,
        )
        sampler.start()
        return sampler

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, frame: object) -> None:
            self.stopping.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
