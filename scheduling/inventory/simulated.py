"""GPUs that exist only in the configuration, for machines without an NVIDIA driver.

They let the whole platform (scheduling, accounting, the dashboards) run on a laptop or in CI.
"""

import uuid
from collections.abc import Iterable

from scheduling.config import SimulatedGpus
from scheduling.inventory.base import GpuBackend, GpuInfo, GpuProcess, gpu_type_for

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
            )
            for index in range(self.spec.count)
            if index not in self.hidden
        ]

    def processes(self) -> list[GpuProcess]:
        """The fake processes, as given: simulated GPUs run nothing of their own."""
        return list(self.fake_processes)

    def close(self) -> None:
        """Nothing to release."""


def simulated_uuid(node_name: str, index: int) -> str:
    """NVIDIA-style UUID, the same on every start for the same node and index."""
    return "GPU-" + str(uuid.uuid5(NAMESPACE, f"{node_name}/{index}"))
