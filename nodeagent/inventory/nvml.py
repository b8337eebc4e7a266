"""GPU discovery through NVML (the nvidia-ml-py package, imported as pynvml).

NVML answers quickly under the driver's lock; nvidia-smi, a process per call, is never used.
NVML state must not cross a fork, so a backend refuses to work in a child process: open a new
one there.
"""

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from nodeagent.inventory.base import (
    BackendUnavailable,
    GpuBackend,
    GpuInfo,
    GpuProcess,
    GpuSample,
    XidEvent,
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
        self._event_set: Any = None
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
            minor=self._minor(handle),
        )

    def _minor(self, handle: Any) -> int | None:
        """/dev/nvidia<minor>: not the index, which follows PCI order, while the driver numbers
        its device nodes as it probes them. None where NVML does not say (not on Linux)."""
        try:
            return int(self._nvml.nvmlDeviceGetMinorNumber(handle))
        except self._nvml.NVMLError:
            return None

    def processes(self) -> list[GpuProcess]:
        """Compute and graphics processes on every GPU, one entry per (GPU, pid).

        NVML lists them slowly, under the driver's global lock: call it once per heartbeat,
        not in a loop. A GPU that fails is left out, named in unlisted_gpus (when its
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

    def sample(self, *, reserved_mb: Mapping[str, int] | None = None) -> list[GpuSample]:
        """Read every GPU once (a few cheap NVML calls each, no process listing: that is slow
        and stays on the heartbeat). A metric the GPU does not support reads None; a GPU that
        answers "lost" is sampled as lost."""
        self._check_usable()
        nvml = self._nvml
        at = time.time()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML could not count GPUs: {exc}") from exc
        samples = []
        lost_error = getattr(nvml, "NVMLError_GpuIsLost", ())
        for index in range(count):
            uuid = self._uuids.get(index)
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                if uuid is None:
                    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                    self._uuids[index] = uuid
                samples.append(self._sample_device(handle, uuid, at))
            except nvml.NVMLError as exc:
                if lost_error and isinstance(exc, lost_error) and uuid is not None:
                    samples.append(GpuSample(gpu_uuid=uuid, at=at, lost=True))
                else:
                    self.problems.append(f"GPU {index} sample: {exc}")
        return samples

    def _sample_device(self, handle: Any, uuid: str, at: float) -> GpuSample:
        nvml = self._nvml
        rates = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._memory(handle)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = self._optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        ecc = getattr(nvml, "NVML_VOLATILE_ECC", 0)
        return GpuSample(
            gpu_uuid=uuid,
            at=at,
            util_gpu=None if rates is None else int(rates.gpu),
            util_memory=None if rates is None else int(rates.memory),
            memory_used_mb=int(memory.used) // _MIB,
            memory_total_mb=int(memory.total) // _MIB,
            temperature_c=self._optional(
                nvml.nvmlDeviceGetTemperature, handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
            ),
            power_w=None if power_mw is None else power_mw / 1000,
            power_limit_w=None if limit_mw is None else limit_mw / 1000,
            sm_clock_mhz=self._optional(
                nvml.nvmlDeviceGetClockInfo, handle, getattr(nvml, "NVML_CLOCK_SM", 1)
            ),
            fan_pct=self._optional(nvml.nvmlDeviceGetFanSpeed, handle),
            ecc_corrected=self._optional(
                nvml.nvmlDeviceGetTotalEccErrors, handle, 0, ecc
            ),  # 0: NVML_MEMORY_ERROR_TYPE_CORRECTED
            ecc_uncorrected=self._optional(nvml.nvmlDeviceGetTotalEccErrors, handle, 1, ecc),
            throttle_reasons=self._optional(
                getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or nvml.nvmlDeviceGetCurrentClocksThrottleReasons,
                handle,
            ),
        )

    def _memory(self, handle: Any) -> Any:
        """Memory as nvidia-smi shows it: version 2 of the call (drivers since 510) leaves the
        driver's own reserve out of ``used``; version 1 counts it in. Older drivers and
        bindings answer version 1."""
        nvml = self._nvml
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
            except TypeError:
                pass  # bindings without the version argument
            except nvml.NVMLError as exc:
                if not isinstance(exc, _unsupported(nvml)):
                    raise
        return nvml.nvmlDeviceGetMemoryInfo(handle)

    def _optional(self, call: Callable[..., Any], *args: Any) -> Any:
        """The call's answer, or None where this GPU or driver does not support it (consumer
        cards have no ECC, passively cooled ones no fan). A lost GPU still raises."""
        try:
            return call(*args)
        except self._nvml.NVMLError as exc:
            if isinstance(exc, _unsupported(self._nvml)):
                return None
            raise

    def xid_events(self) -> list[XidEvent]:
        """XIDs since the last call, through NVML's event API (registered on first use, for
        every GPU that supports it); waits 0 ms, so it never blocks the sampler."""
        self._check_usable()
        nvml = self._nvml
        if self._event_set is None:
            self._event_set = nvml.nvmlEventSetCreate()
            for index, uuid in list(self._uuids.items()):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    nvml.nvmlDeviceRegisterEvents(
                        handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                    )
                except nvml.NVMLError as exc:
                    self.problems.append(f"GPU {index} ({uuid}) XID events: {exc}")
        events = []
        timeout = getattr(nvml, "NVMLError_Timeout", ())
        while True:
            try:
                data = nvml.nvmlEventSetWait(self._event_set, 0)
            except nvml.NVMLError as exc:
                if timeout and isinstance(exc, timeout):
                    return events
                raise
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            events.append(XidEvent(gpu_uuid=uuid, xid=int(data.eventData), at=time.time()))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._event_set is not None and os.getpid() == self._pid:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except self._nvml.NVMLError as exc:
                self.problems.append(f"event set: {exc}")
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


def _unsupported(nvml: Any) -> tuple[type[BaseException], ...]:
    return tuple(
        cls
        for cls in (
            getattr(nvml, "NVMLError_NotSupported", None),
            getattr(nvml, "NVMLError_FunctionNotFound", None),
        )
        if cls is not None
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
