"""Which GPUs a node has: from NVML on real hardware, from the configuration when simulated."""

import logging
from typing import Any

from nodeagent.inventory.base import BackendUnavailable, GpuBackend, GpuInfo, gpu_type_for
from nodeagent.inventory.nvml import NvmlBackend
from nodeagent.inventory.simulated import SimulatedBackend, simulated_uuid
from scheduling.config import SimulatedGpus

__all__ = [
    "BackendUnavailable",
    "GpuBackend",
    "GpuInfo",
    "NvmlBackend",
    "SimulatedBackend",
    "gpu_type_for",
    "open_backend",
    "simulated_uuid",
]

logger = logging.getLogger(__name__)

BACKEND_KINDS = ("auto", "nvml", "simulated")


def open_backend(
    kind: str,
    *,
    node_name: str,
    simulate: SimulatedGpus | None,
    pynvml_module: Any = None,
) -> GpuBackend:
    """Open the GPU backend for this node.

    "nvml" insists on real GPUs, "simulated" on the node's simulate: section, and "auto" prefers
    real GPUs, falling back to simulation only where the driver is missing: a machine with GPUs
    never silently runs on imaginary ones.
    """
    if kind == "nvml":
        return NvmlBackend(pynvml_module)
    if kind == "simulated":
        return SimulatedBackend(node_name, _require_simulate(node_name, simulate))
    if kind == "auto":
        return _open_auto(node_name, simulate, pynvml_module)
    raise ValueError(f"unknown GPU backend {kind!r}; expected one of: {', '.join(BACKEND_KINDS)}")


def _open_auto(node_name: str, simulate: SimulatedGpus | None, pynvml_module: Any) -> GpuBackend:
    try:
        return NvmlBackend(pynvml_module)
    except BackendUnavailable as nvml_problem:
        if simulate is None:
            raise BackendUnavailable(
                f"no GPUs for node {node_name}: {nvml_problem}; and node {node_name} has no "
                "simulate: section in the configuration to fall back to"
            ) from nvml_problem
        logger.warning(
            "node %s: simulating %d x %s because %s",
            node_name,
            simulate.count,
            simulate.model,
            nvml_problem,
        )
        return SimulatedBackend(node_name, simulate)


def _require_simulate(node_name: str, simulate: SimulatedGpus | None) -> SimulatedGpus:
    if simulate is None:
        raise BackendUnavailable(f"node {node_name} has no simulate: section in the configuration")
    return simulate
