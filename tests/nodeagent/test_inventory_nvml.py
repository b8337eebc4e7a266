"""NvmlBackend against a fake pynvml that behaves like nvidia-ml-py, plus one real-GPU check."""

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from nodeagent.inventory import BackendUnavailable, GpuInfo, NvmlBackend
from scheduling.agentapi.messages import GpuProcess

GIB = 1024**3


# Names follow pynvml's, which NvmlBackend looks up on the module.
class NVMLError(Exception):
    # Like pynvml's, str() is NVML's own wording for the error.
    text = "Unknown Error"

    def __str__(self) -> str:
        return self.text


class NVMLError_LibraryNotFound(NVMLError):
    text = "NVML Shared Library Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    text = "Driver Not Loaded"


class NVMLError_NoPermission(NVMLError):
    text = "Insufficient Permissions"


class NVMLError_GpuIsLost(NVMLError):
    text = "GPU is lost"


class NVMLError_Unknown(NVMLError):
    pass


@dataclass
class FakeGpu:
    name: bytes | str
    uuid: bytes | str
    total_bytes: int
    bus_id: bytes | str
    lost: bool = False
    minor: int | None = None  # None: NVML says "not supported"


@dataclass
class FakeNvml:
    """The slice of pynvml that NvmlBackend uses; records calls for the assertions."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: NVMLError | None = None
    calls: list[str] = field(default_factory=list)

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_GpuIsLost = NVMLError_GpuIsLost

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> bytes | str:
        return self._alive(handle).name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> bytes | str:
        return self._alive(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        gpu = self._alive(handle)
        return SimpleNamespace(total=gpu.total_bytes, free=gpu.total_bytes, used=0)

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        return SimpleNamespace(busId=self._alive(handle).bus_id, bus=1)

    def nvmlDeviceGetMinorNumber(self, handle: FakeGpu) -> int:
        if self._alive(handle).minor is None:
            raise NVMLError_Unknown()
        return handle.minor

    @staticmethod
    def _alive(handle: FakeGpu) -> FakeGpu:
        if handle.lost:
            raise NVMLError_GpuIsLost()
        return handle


def rtx_4090(n: int, *, as_bytes: bool = True, lost: bool = False) -> FakeGpu:
    def encode(text: str) -> bytes | str:
        return text.encode() if as_bytes else text

    return FakeGpu(
        name=encode("NVIDIA GeForce RTX 4090"),
        uuid=encode(f"GPU-0000000{n}-aaaa-bbbb-cccc-dddddddddddd"),
        total_bytes=24564 * 1024 * 1024,
        bus_id=encode(f"00000000:0{n + 1}:00.0"),
        lost=lost,
        minor=n,
    )


def test_it_describes_each_gpu_from_bytes_answers() -> None:
    nvml = FakeNvml(gpus=[rtx_4090(0), rtx_4090(1)])

    gpus = NvmlBackend(nvml).discover()

    assert gpus[1] == GpuInfo(
        index=1,
        uuid="GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
        model="NVIDIA GeForce RTX 4090",
        memory_mb=24564,
        pci_bus_id="00000000:02:00.0",
        gpu_type="rtx4090-24g",
        minor=1,
    )
    assert [gpu.index for gpu in gpus] == [0, 1]


def test_it_gives_each_gpu_its_device_minor_not_its_index() -> None:
    # The driver numbers /dev/nvidia<minor> as it probes; NVML's index follows PCI order.
    first, second = rtx_4090(0), rtx_4090(1)
    first.minor, second.minor = 3, None  # None: NVML cannot tell (not on Linux)
    gpus = NvmlBackend(FakeNvml(gpus=[first, second])).discover()
    assert [(gpu.index, gpu.minor) for gpu in gpus] == [(0, 3), (1, None)]


def test_it_accepts_str_answers_from_newer_nvidia_ml_py() -> None:
    nvml = FakeNvml(gpus=[rtx_4090(0, as_bytes=False)])

    (gpu,) = NvmlBackend(nvml).discover()

    assert gpu.model == "NVIDIA GeForce RTX 4090"
    assert gpu.uuid == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert gpu.pci_bus_id == "00000000:01:00.0"


def test_it_rounds_memory_bytes_down_to_whole_mib() -> None:
    gpu = rtx_4090(0)
    gpu.total_bytes = 80 * GIB - 1

    (found,) = NvmlBackend(FakeNvml(gpus=[gpu])).discover()

    assert found.memory_mb == 80 * 1024 - 1


def test_it_skips_a_lost_gpu_and_reports_it() -> None:
    nvml = FakeNvml(gpus=[rtx_4090(0), rtx_4090(1), rtx_4090(2, lost=True), rtx_4090(3)])
    backend = NvmlBackend(nvml)

    gpus = backend.discover()

    assert [gpu.index for gpu in gpus] == [0, 1, 3]
    assert backend.problems == ["GPU 2: GPU is lost"]


def test_it_clears_old_problems_when_the_gpu_comes_back() -> None:
    nvml = FakeNvml(gpus=[rtx_4090(0, lost=True)])
    backend = NvmlBackend(nvml)
    backend.discover()

    nvml.gpus[0].lost = False

    assert len(backend.discover()) == 1
    assert backend.problems == []


def test_it_refuses_to_report_no_gpus_when_it_cannot_count_them() -> None:
    nvml = FakeNvml(gpus=[rtx_4090(0)])

    def broken_count() -> int:
        raise NVMLError_Unknown()

    nvml.nvmlDeviceGetCount = broken_count  # type: ignore[method-assign]

    with pytest.raises(BackendUnavailable, match="could not count GPUs: Unknown Error"):
        NvmlBackend(nvml).discover()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (NVMLError_LibraryNotFound(), "no NVIDIA driver is installed"),
        (NVMLError_DriverNotLoaded(), "driver is installed but not loaded"),
        (NVMLError_NoPermission(), "no permission to talk to the NVIDIA driver"),
        (NVMLError_Unknown(), "initialisation failed (Unknown Error)"),
    ],
)
def test_it_turns_each_init_failure_into_backend_unavailable(error: NVMLError, reason: str) -> None:
    with pytest.raises(BackendUnavailable, match="^NVML: ") as caught:
        NvmlBackend(FakeNvml(init_error=error))

    assert reason in str(caught.value)
    assert isinstance(caught.value.__cause__, NVMLError)


def test_it_shuts_nvml_down_exactly_once() -> None:
    nvml = FakeNvml(gpus=[rtx_4090(0)])

    with NvmlBackend(nvml) as backend:
        backend.discover()
    backend.close()

    assert nvml.calls == ["init", "shutdown"]


def test_it_refuses_to_discover_after_close() -> None:
    backend = NvmlBackend(FakeNvml())
    backend.close()

    with pytest.raises(RuntimeError, match="closed"):
        backend.discover()


@pytest.mark.gpu
def test_it_finds_the_real_gpus_through_the_driver() -> None:
    import pynvml  # the real nvidia-ml-py, not the fake above

    try:
        backend = NvmlBackend(pynvml)
    except BackendUnavailable as exc:
        pytest.skip(f"no NVIDIA driver: {exc}")

    with backend:
        gpus = backend.discover()

    for gpu in gpus:
        print(gpu)
    for problem in backend.problems:
        print("problem:", problem)
    assert len(gpus) >= 1
    for gpu in gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.memory_mb > 0
        assert gpu.model
        assert gpu.pci_bus_id


# --- Processes on each GPU ---------------------------------------------------------------------

MIB = 1024**2


class NVMLError_NotSupported(NVMLError):
    text = "Not Supported"


def proc(pid: int, used_bytes: int | None) -> Any:
    # nvidia-ml-py's nvmlProcessInfo_t, with usedGpuMemory None where NVML says "not available".
    return SimpleNamespace(pid=pid, usedGpuMemory=used_bytes)


@dataclass
class FakeNvmlWithProcesses(FakeNvml):
    """Adds the running-process queries; a GPU index missing from a dict runs nothing."""

    compute: dict[int, list[Any]] = field(default_factory=dict)
    graphics: dict[int, list[Any]] = field(default_factory=dict)
    graphics_error: NVMLError | None = None

    NVMLError_NotSupported = NVMLError_NotSupported

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[Any]:
        return self.compute.get(self.gpus.index(self._alive(handle)), [])

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeGpu) -> list[Any]:
        if self.graphics_error is not None:
            raise self.graphics_error
        return self.graphics.get(self.gpus.index(self._alive(handle)), [])


def uuid_of(n: int) -> str:
    return f"GPU-0000000{n}-aaaa-bbbb-cccc-dddddddddddd"


def test_it_lists_compute_processes_per_gpu_in_mib() -> None:
    nvml = FakeNvmlWithProcesses(
        gpus=[rtx_4090(0), rtx_4090(1)],
        compute={0: [proc(100, 2048 * MIB), proc(101, 512 * MIB + 1)], 1: [proc(100, 10 * MIB)]},
    )

    backend = NvmlBackend(nvml)

    assert backend.processes() == [
        GpuProcess(gpu_uuid=uuid_of(0), pid=100, used_mb=2048),
        GpuProcess(gpu_uuid=uuid_of(0), pid=101, used_mb=512),
        GpuProcess(gpu_uuid=uuid_of(1), pid=100, used_mb=10),
    ]
    assert backend.unlisted_gpus == frozenset()
    assert backend.process_problems == ()


def test_it_keeps_unknown_usage_as_none() -> None:
    nvml = FakeNvmlWithProcesses(
        gpus=[rtx_4090(0)], compute={0: [proc(7, None), proc(8, 2**64 - 1)]}
    )

    assert NvmlBackend(nvml).processes() == [
        GpuProcess(gpu_uuid=uuid_of(0), pid=7, used_mb=None),
        GpuProcess(gpu_uuid=uuid_of(0), pid=8, used_mb=None),
    ]


def test_it_adds_graphics_processes_once_each() -> None:
    nvml = FakeNvmlWithProcesses(
        gpus=[rtx_4090(0)],
        compute={0: [proc(5, None)]},
        # pid 5 does compute and graphics: listed by both with the same memory.
        graphics={0: [proc(5, 300 * MIB), proc(6, 100 * MIB)]},
    )

    assert NvmlBackend(nvml).processes() == [
        GpuProcess(gpu_uuid=uuid_of(0), pid=5, used_mb=300),
        GpuProcess(gpu_uuid=uuid_of(0), pid=6, used_mb=100),
    ]


def test_it_does_without_graphics_processes_where_not_supported() -> None:
    nvml = FakeNvmlWithProcesses(
        gpus=[rtx_4090(0)],
        compute={0: [proc(5, 300 * MIB)]},
        graphics_error=NVMLError_NotSupported(),
    )
    backend = NvmlBackend(nvml)

    assert backend.processes() == [GpuProcess(gpu_uuid=uuid_of(0), pid=5, used_mb=300)]
    assert backend.process_problems == ()


def test_it_skips_a_gpu_whose_processes_fail_and_names_it() -> None:
    nvml = FakeNvmlWithProcesses(
        gpus=[rtx_4090(0), rtx_4090(1), rtx_4090(2)],
        compute={0: [proc(1, MIB)], 1: [proc(2, MIB)], 2: [proc(3, MIB)]},
    )
    backend = NvmlBackend(nvml)
    backend.discover()  # remembers each index's UUID
    nvml.gpus[1].lost = True

    found = backend.processes()

    assert [p.pid for p in found] == [1, 3]
    assert backend.unlisted_gpus == {uuid_of(1)}
    assert backend.process_problems == ("GPU 1 processes: GPU is lost",)
    # Listing processes leaves discovery's own problems alone.
    assert backend.problems == []


def test_it_clears_process_problems_when_the_gpu_answers_again() -> None:
    nvml = FakeNvmlWithProcesses(gpus=[rtx_4090(0, lost=True)], compute={0: [proc(1, MIB)]})
    backend = NvmlBackend(nvml)
    assert backend.processes() == []
    # Never discovered, so its UUID is unknown: only the problem names it.
    assert backend.unlisted_gpus == frozenset()
    assert backend.process_problems == ("GPU 0 processes: GPU is lost",)

    nvml.gpus[0].lost = False

    assert len(backend.processes()) == 1
    assert backend.process_problems == ()


def test_it_refuses_to_list_processes_after_close() -> None:
    backend = NvmlBackend(FakeNvmlWithProcesses())
    backend.close()

    with pytest.raises(RuntimeError, match="closed"):
        backend.processes()


# Holds a CUDA context and 256 MiB on the first GPU until its stdin closes; the driver API through
# ctypes, so the test needs no CUDA Python package.
CUDA_HOLDER = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), 256 * 1024 * 1024) == 0
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.gpu
def test_it_lists_the_real_gpu_processes_through_the_driver() -> None:
    import subprocess
    import sys

    import pynvml

    try:
        backend = NvmlBackend(pynvml)
    except BackendUnavailable as exc:
        pytest.skip(f"no NVIDIA driver: {exc}")

    holder = subprocess.Popen(
        [sys.executable, "-c", CUDA_HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready", "could not hold a CUDA context"
        with backend:
            uuids = {gpu.uuid for gpu in backend.discover()}
            found = backend.processes()
    finally:
        holder.communicate(timeout=30)

    for process in found:
        print(process)
    assert backend.process_problems == ()
    assert {p.gpu_uuid for p in found} <= uuids
    mine = [p for p in found if p.pid == holder.pid]
    # Missing here means NVML reports pids from another pid namespace (a container): then
    # processes cannot be matched to tasks on this machine.
    assert len(mine) == 1, f"pid {holder.pid} not among {[p.pid for p in found]}"
    assert mine[0].used_mb is None or mine[0].used_mb >= 256
