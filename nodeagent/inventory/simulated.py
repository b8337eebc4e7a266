"""GPUs that exist only in the configuration, for machines without an NVIDIA driver.

They let the whole platform (scheduling, accounting, the dashboards) run on a laptop or in CI.
"""

import random
import time
import uuid
from collections.abc import Iterable, Mapping

from nodeagent.inventory.base import (
    GpuBackend,
    GpuInfo,
    GpuProcess,
    GpuSample,
    XidEvent,
    gpu_type_for,
)
from scheduling.config import SimulatedGpus

# What a simulated RTX 4090-class card reads idle and flat out; only the shape matters.
_IDLE_W, _BUSY_W, _LIMIT_W = 25.0, 420.0, 450.0
_IDLE_MHZ, _BUSY_MHZ = 210, 2520
_IDLE_C, _BUSY_C = 32, 74

# Fixed forever: every simulated GPU's UUID derives from it, and the database keys GPUs by UUID,
# so changing it would make every simulated GPU look new after a restart.
NAMESPACE = uuid.UUID("36410325-f5f6-4d8c-bcd2-7c490041fb7c")


class SimulatedBackend(GpuBackend):
    name = "simulated"

    def __init__(
        self,
        node_name: str,
        spec: SimulatedGpus,
        *,
        hidden: Iterable[int] = (),
        fake_processes: list[GpuProcess] | None = None,
    ) -> None:
        self.node_name = node_name
        self.spec = spec
        # Mutable on purpose: a test adds an index to make that GPU vanish from the next discover().
        self.hidden: set[int] = set(hidden)
        # Mutable on purpose too, and kept by reference: a test or demo appends a process (one the
        # platform did not start, or a task using more than it reserved) and the next
        # processes() sees it.
        self.fake_processes: list[GpuProcess] = fake_processes if fake_processes is not None else []
        # Faults injected by a test or an operator (telemetry.services.fault_inject), by index:
        # a temperature that overrides the simulated one, XIDs handed out once by
        # xid_events(), and GPUs that are "lost" (gone from discover(), sampled as lost).
        self.temperatures: dict[int, int] = {}
        self.pending_xids: list[tuple[int, int]] = []
        self.lost: set[int] = set()
        self._noise = random.Random(node_name)  # noqa: S311 - jitter for charts, not secrets

    def discover(self) -> list[GpuInfo]:
        gpu_type = self.spec.gpu_type or gpu_type_for(self.spec.model, self.spec.memory_mb)
        return [
            GpuInfo(
                index=index,
                uuid=simulated_uuid(self.node_name, index),
                model=self.spec.model,
                memory_mb=self.spec.memory_mb,
                pci_bus_id="00000000:%02X:00.0" % (index + 1),
                gpu_type=gpu_type,
                minor=index,  # /dev/nvidia<index>: stand-ins made with mknod in tests
            )
            for index in range(self.spec.count)
            if index not in self.hidden and index not in self.lost
        ]

    def processes(self) -> list[GpuProcess]:
        """The fake processes, as given: simulated GPUs run nothing of their own."""
        return list(self.fake_processes)

    def sample(self, *, reserved_mb: Mapping[str, int] | None = None) -> list[GpuSample]:
        """Readings that follow the work the platform placed here.

        A GPU with memory reserved by a running task reads busy (85-99 %) and holds that memory
        (plus what fake processes the platform did not start hold); any other GPU idles. The
        numbers jitter so that charts look alive; every sample says it is simulated.
        """
        reserved_mb = reserved_mb or {}
        at = time.time()
        foreign: dict[str, list[GpuProcess]] = {}
        for process in self.fake_processes:
            foreign.setdefault(process.gpu_uuid, []).append(process)
        samples = []
        for index in range(self.spec.count):
            if index in self.hidden:
                continue
            uuid_ = simulated_uuid(self.node_name, index)
            if index in self.lost:
                samples.append(GpuSample(gpu_uuid=uuid_, at=at, lost=True, simulated=True))
                continue
            reserved = reserved_mb.get(uuid_, 0)
            processes = foreign.get(uuid_, [])
            used = min(self.spec.memory_mb, reserved + sum(p.used_mb or 0 for p in processes))
            load = self._noise.uniform(0.85, 0.99) if reserved else 0.0
            temperature = round(_IDLE_C + (_BUSY_C - _IDLE_C) * load)
            samples.append(
                GpuSample(
                    gpu_uuid=uuid_,
                    at=at,
                    util_gpu=round(100 * load),
                    util_memory=round(60 * load),
                    memory_used_mb=used,
                    memory_total_mb=self.spec.memory_mb,
                    temperature_c=self.temperatures.get(index, temperature),
                    power_w=round(_IDLE_W + (_BUSY_W - _IDLE_W) * load, 1),
                    power_limit_w=_LIMIT_W,
                    sm_clock_mhz=_BUSY_MHZ if load else _IDLE_MHZ,
                    fan_pct=round(30 + 50 * load),
                    ecc_corrected=0,
                    ecc_uncorrected=0,
                    throttle_reasons=0 if load else 1,  # 1: GPU idle
                    processes=tuple((p.pid, p.used_mb) for p in processes),
                    simulated=True,
                )
            )
        return samples

    def xid_events(self) -> list[XidEvent]:
        events, self.pending_xids = self.pending_xids, []
        at = time.time()
        return [
            XidEvent(gpu_uuid=simulated_uuid(self.node_name, index), xid=xid, at=at)
            for index, xid in events
        ]

    def close(self) -> None:
        """Nothing to release."""


def simulated_uuid(node_name: str, index: int) -> str:
    """NVIDIA-style UUID, the same on every start for the same node and index."""
    return "GPU-" + str(uuid.uuid5(NAMESPACE, f"{node_name}/{index}"))
