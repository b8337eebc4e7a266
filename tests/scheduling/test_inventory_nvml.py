"""NvmlBackend against a fake pynvml that behaves like nvidia-ml-py, plus one real-GPU check."""

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from scheduling.inventory import BackendUnavailable, GpuInfo, NvmlBackend

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
    )
    assert [gpu.index for gpu in gpus] == [0, 1]


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
