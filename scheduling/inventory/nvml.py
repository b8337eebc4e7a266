"""GPU discovery through NVML (the nvidia-ml-py package, imported as pynvml).

NVML answers in microseconds under the driver's lock; nvidia-smi costs 10-20 ms a call and is
never used. NVML state must not cross a fork, so a backend refuses to work in a child process:
open a new one there.
"""

import os
from typing import Any

from scheduling.inventory.base import BackendUnavailable, GpuBackend, GpuInfo, gpu_type_for

_MIB = 1024 * 1024

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
        return GpuInfo(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            model=model,
            memory_mb=memory_mb,
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            gpu_type=gpu_type_for(model, memory_mb),
        )

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


def _text(value: bytes | str) -> str:
    # nvidia-ml-py has returned bytes in some releases and str in others.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").strip()
    return value.strip()
