"""The node agent's GPU sampler: its own thread, its own database connection, its own pace.

A slow or failing NVML read or database write delays only the next sample, never the heartbeat
or the launcher, which run on the agent's main thread and its job thread.

A node none of whose GPUs a task holds (nothing pending a simulated fault, no sample alert
open) is sampled every ``telemetry.unheld_sample_interval`` instead of every
``sample_interval``: those samples feed the dashboard and the history, never a tenant's usage
or an idle-GPU alert, and an idle node no longer writes a row per GPU every second. The agent
calls ``wake()`` when its job thread or its relay did something (a launch, a report), so a
task's GPUs are sampled at the full rate from its start.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, connection

from gpuplatform import events
from gpuplatform.db import close_old_connections
from gpuplatform.outage import OutageLog
from nodeagent.inventory import BackendUnavailable, GpuBackend
from scheduling.models import Node
from telemetry import alerts, services

logger = logging.getLogger(__name__)


class Sampler:
    """Samples every GPU of one node each ``interval_s``: ``tick()`` is one step (tests call
    it), ``start()``/``stop()`` run it on a daemon thread."""

    def __init__(
        self,
        *,
        node_name: str,
        backend: GpuBackend,
        interval_s: float = 1.0,
        unheld_interval_s: float | None = None,
    ) -> None:
        self.node_name = node_name
        self.backend = backend
        self.interval_s = interval_s
        # None: every tick at interval_s (never slower than that either way).
        self.unheld_interval_s = max(interval_s, unheld_interval_s or interval_s)
        self.unheld = False  # what the last tick found: no GPU held, nothing else pending
        self.stopping = threading.Event()
        self._woken = threading.Event()
        self.ticks = 0
        self.errors = 0
        self._thread: threading.Thread | None = None

    def tick(self) -> int:
        """Sample once, store, act on XIDs and alerts; returns how many samples were stored."""
        state = services.node_state(node_name=self.node_name)
        if state is None:
            self.unheld = False
            return 0  # not registered yet: the heartbeat does that
        self.unheld = not (
            state.faults_pending
            or state.alerts_open
            or any(h.task_id is not None for h in state.holders.values())
        )
        node = Node(pk=state.node_id, name=self.node_name)
        simulated = self.backend.name == "simulated"
        if simulated and state.faults_pending:
            services.faults_apply(node=node, backend=self.backend)
        holders = state.holders
        reserved = {uuid: h.reserved_mb for uuid, h in holders.items() if h.reserved_mb}
        samples = self.backend.sample(reserved_mb=reserved)
        xids = self.backend.xid_events()
        rows = services.record_samples(node=node, samples=samples, holders=holders)
        events.publish(
            events.SAMPLES,
            node_id=node.pk,
            samples=rows,
            tenants_by_gpu={h.gpu_id: h.tenant_ids for h in holders.values()},
        )
        if xids:
            services.xids_handle(node=node, events=xids, simulated=simulated)
        alerts.check_samples(node=node, rows=rows, open_alerts=state.alerts_open)
        self.ticks += 1
        return len(rows)

    def run(self) -> None:
        next_at = time.monotonic()
        outage = OutageLog(logger, logging.ERROR)  # an outage is said once, and its end
        while not self.stopping.is_set():
            try:
                close_old_connections()
                self.tick()
                outage.reached("node %s: sampling again after %.0f s", self.node_name)
            except (DatabaseError, BackendUnavailable, RuntimeError) as exc:
                self.errors += 1
                outage.failed("node %s: GPU sample failed, will retry: %s", self.node_name, exc)
                close_old_connections()
            except Exception:  # the sampler must outlive any one bad sample
                self.errors += 1
                logger.exception("node %s: GPU sample failed", self.node_name)
            # Fixed rate, not fixed delay: samples stay on the second; a late tick skips ahead.
            interval = self.unheld_interval_s if self.unheld else self.interval_s
            next_at += interval
            now = time.monotonic()
            if next_at < now:
                next_at = now + interval
            if self._woken.wait(next_at - now):
                self._woken.clear()
                next_at = time.monotonic()  # woken: sample now, then at the pace it finds
        connection.close()

    def wake(self) -> None:
        """Something may now hold a GPU here (a launch, a report): an unheld node samples at
        once instead of at its next unheld tick."""
        if self.unheld:
            self._woken.set()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run, name=f"gpu-sampler-{self.node_name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self._woken.set()
        if self._thread is not None:
            self._thread.join(timeout)
