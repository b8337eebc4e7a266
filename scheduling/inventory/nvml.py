"""GPU discovery through NVML (the nvidia-ml-py package, imported as pynvml).

NVML answers in microseconds under the driver's lock; nvidia-smi costs 10-20 ms a call and is
never used. NVML state must not cross a fork, so a backend refuses to work in a child process:
open a new one there.
"""

import os
from typing import Any

from scheduling.inventory.base import (
    BackendUnavailable,
    GpuBackend,
    GpuInfo,
    GpuProcess,
    gpu_type_for,
)

_MIB = 1024 * 1024
# NVML_VALUE_NOT_AVAILABLE as an unsigned long long; nvidia-ml-py turns it into None, but not
# every release did.
_NOT_AVAILABLE = 2**64 - 1

# Why nvmlInit failed, phrased for the operator reading the node agent's log.
_INIT_REASONS = {
    "NVMLError_LibraryNotFound": "the NVML library (libnvidia-ml.so.1) was not found: "
    "no NVIDIA driver is installed",
    "NVMLError_DriverNotLoaded": "the NVIDIA driver is installed but not loaded",
    "NVMLError_NoPermission": "no permission to talk to the NVIDIA driver "
    "(check access to /dev/nvidia*)",
}


class NvmlBackend(GpuBackend):
    name = "nvml"

    def __init__(self, pynvml_module: Any = None) -> None:
        self._nvml = pynvml_module if pynvml_module is not None else _import_pynvml()
        self.problems: list[str] = []
        # Remembered from discover(): a GPU whose handle fails later can still be named by UUID.
        self._uuids: dict[int, str] = {}
        self._closed = False
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML: {_init_reason(self._nvml, exc)} ({exc})") from exc
        self._pid = os.getpid()

    def discover(self) -> list[GpuInfo]:
        """Return the GPUs NVML can describe; one that fails is skipped and put in problems."""
        self._check_usable()
        self.problems = []
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as exc:
            # Unlike one bad GPU, this means nothing can be known: saying "no GPUs" would make
            # the caller retire every GPU on the node.
            raise BackendUnavailable(f"NVML could not count GPUs: {exc}") from exc
        gpus = []
        for index in range(count):
            try:
                gpus.append(self._describe(index))
            except self._nvml.NVMLError as exc:
                self.problems.append(f"GPU {index}: {exc}")
        return sorted(gpus, key=lambda gpu: gpu.index)

    def _describe(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        model = _text(nvml.nvmlDeviceGetName(handle))
        memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        self._uuids[index] = uuid
        return GpuInfo(
            index=index,
            uuid=uuid,
            model=model,
            memory_mb=memory_mb,
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            gpu_type=gpu_type_for(model, memory_mb),
        )

    def processes(self) -> list[GpuProcess]:
        """Compute and graphics processes on every GPU, one entry per (GPU, pid).

        NVML takes ~4.5 ms per device for this under the driver's global lock: call it once per
        heartbeat, not in a loop. A GPU that fails is left out, named in unlisted_gpus (when its
        UUID is known) and described in process_problems.
        """
        self._check_usable()
        unlisted: set[str] = set()
        problems: list[str] = []
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML could not count GPUs: {exc}") from exc
        found: list[GpuProcess] = []
        for index in range(count):
            uuid = self._uuids.get(index)
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
                self._uuids[index] = uuid
                found.extend(self._device_processes(handle, uuid))
            except self._nvml.NVMLError as exc:
                problems.append(f"GPU {index} processes: {exc}")
                if uuid is not None:
                    unlisted.add(uuid)
        self.unlisted_gpus = frozenset(unlisted)
        self.process_problems = tuple(problems)
        return found

    def _device_processes(self, handle: Any, uuid: str) -> list[GpuProcess]:
        nvml = self._nvml
        infos = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        graphics = getattr(nvml, "nvmlDeviceGetGraphicsRunningProcesses", None)
        if graphics is not None:
            try:
                infos.extend(graphics(handle))
            except nvml.NVMLError as exc:
                # Compute GPUs (and some drivers) do not do graphics: nothing is missing.
                not_supported = getattr(nvml, "NVMLError_NotSupported", None)
                if not_supported is None or not isinstance(exc, not_supported):
                    raise
        # A process doing both compute and graphics is listed twice with the same memory.
        used: dict[int, int | None] = {}
        for info in infos:
            pid = int(info.pid)
            mb = _used_mb(info.usedGpuMemory)
            if pid not in used or (used[pid] is None and mb is not None):
                used[pid] = mb
        return [GpuProcess(gpu_uuid=uuid, pid=pid, used_mb=mb) for pid, mb in used.items()]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A shutdown after fork would tear down the parent's NVML session, not ours.
        if os.getpid() != self._pid:
            return
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            # Nothing left to release or retry; raising here would hide the error that made a
            # `with` block exit.
            self.problems.append(f"shutdown: {exc}")

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this NvmlBackend is closed; open a new one")
        if os.getpid() != self._pid:
            raise RuntimeError(
                "this NvmlBackend was opened in another process (NVML state does not survive "
                "fork); open a new one in this process"
            )


def _import_pynvml() -> Any:
    try:
        # Imported here so that simulated nodes and tests never need the package.
        import pynvml
    except ImportError as exc:
        raise BackendUnavailable(
            "NVML: the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
        ) from exc
    return pynvml


def _init_reason(nvml: Any, exc: Exception) -> str:
    for class_name, reason in _INIT_REASONS.items():
        cls = getattr(nvml, class_name, None)
        if cls is not None and isinstance(exc, cls):
            return reason
    return "initialisation failed"


def _used_mb(value: int | None) -> int | None:
    if value is None or value >= _NOT_AVAILABLE:
        return None
    return int(value) // _MIB


def _text(value: bytes | str) -> str:
    # nvidia-ml-py has returned bytes in some releases and str in others.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").strip()
    return value.strip()
