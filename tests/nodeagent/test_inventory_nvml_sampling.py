"""NvmlBackend.sample() and xid_events() against a fake pynvml, plus a real-GPU run where a
driver answers (skipped elsewhere, saying why)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from nodeagent.inventory import BackendUnavailable, NvmlBackend
from tests.nodeagent.test_inventory_nvml import FakeNvml, NVMLError, rtx_4090

MIB = 1024 * 1024


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    text = "Not Supported"


class NVMLError_Timeout(NVMLError):  # noqa: N801 - pynvml's name
    text = "Timeout"


@dataclass
class SamplingNvml(FakeNvml):
    """FakeNvml plus the readings and the XID event API; consumer cards have no ECC."""

    pending: list[tuple[int, int]] = field(default_factory=list)
    registered: list[int] = field(default_factory=list)

    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._alive(handle)
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetMemoryInfo(self, handle):
        gpu = self._alive(handle)
        return SimpleNamespace(total=gpu.total_bytes, free=0, used=20000 * MIB)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._alive(handle)
        return 71

    def nvmlDeviceGetPowerUsage(self, handle):
        return 312_500  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 450_000

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 2520

    def nvmlDeviceGetFanSpeed(self, handle):
        return 64

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        raise NVMLError_NotSupported()

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 4

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle, types, event_set):
        self.registered.append(self.gpus.index(handle))

    def nvmlEventSetWait(self, event_set, timeout_ms):
        assert timeout_ms == 0  # never blocks the sampler
        if not self.pending:
            raise NVMLError_Timeout()
        index, xid = self.pending.pop(0)
        return SimpleNamespace(device=self.gpus[index], eventData=xid)

    def nvmlEventSetFree(self, event_set):
        self.calls.append("event-set-free")


def test_it_reads_every_metric_in_one_batch_and_leaves_unsupported_ones_none():
    nvml = SamplingNvml(gpus=[rtx_4090(0), rtx_4090(1)])
    backend = NvmlBackend(nvml)
    backend.discover()

    first, second = backend.sample()

    assert first.at == second.at
    assert (first.util_gpu, first.util_memory, first.memory_used_mb) == (87, 41, 20000)
    assert (first.memory_total_mb, first.temperature_c, first.power_w) == (24564, 71, 312.5)
    assert (first.power_limit_w, first.sm_clock_mhz, first.fan_pct) == (450.0, 2520, 64)
    assert (first.ecc_corrected, first.ecc_uncorrected) == (None, None)  # no ECC on a 4090
    assert first.throttle_reasons == 4 and not first.simulated and not first.lost
    assert second.gpu_uuid == "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"


class MemoryV2Nvml(SamplingNvml):
    """Bindings and a driver with version 2 of the memory call: its ``used`` leaves out the
    driver's reserve, as nvidia-smi does."""

    nvmlMemory_v2 = 0x02000028  # noqa: N815 - pynvml's name

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._alive(handle)
        reserve = 0 if version == self.nvmlMemory_v2 else 480 * MIB
        return SimpleNamespace(total=gpu.total_bytes, free=0, used=1139 * MIB + reserve)


def test_memory_used_leaves_the_drivers_reserve_out_where_the_driver_can():
    backend = NvmlBackend(MemoryV2Nvml(gpus=[rtx_4090(0)]))
    backend.discover()
    assert backend.sample()[0].memory_used_mb == 1139

    backend = NvmlBackend(SamplingNvml(gpus=[rtx_4090(0)]))  # version 1 only
    backend.discover()
    assert backend.sample()[0].memory_used_mb == 20000


def test_a_gpu_fallen_off_the_bus_is_sampled_as_lost():
    nvml = SamplingNvml(gpus=[rtx_4090(0), rtx_4090(1)])
    backend = NvmlBackend(nvml)
    backend.discover()
    nvml.gpus[1].lost = True

    healthy, lost = backend.sample()

    assert not healthy.lost and healthy.util_gpu == 87
    assert lost.lost and lost.util_gpu is None
    assert lost.gpu_uuid == "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"


def test_xid_events_are_drained_without_waiting():
    nvml = SamplingNvml(gpus=[rtx_4090(0), rtx_4090(1)])
    backend = NvmlBackend(nvml)
    backend.discover()
    assert backend.xid_events() == []
    assert nvml.registered == [0, 1]

    nvml.pending = [(1, 79), (0, 13)]
    events = backend.xid_events()

    assert [(e.gpu_uuid[:12], e.xid) for e in events] == [("GPU-00000001", 79),
                                                          ("GPU-00000000", 13)]  # fmt: skip
    backend.close()
    assert "event-set-free" in nvml.calls


@pytest.mark.gpu
def test_it_samples_the_real_gpus(capsys):
    import pynvml

    try:
        backend = NvmlBackend(pynvml)
    except BackendUnavailable as exc:
        pytest.skip(f"no NVIDIA driver: {exc}")
    with backend:
        backend.discover()
        for _ in range(5):
            for sample in backend.sample():
                print(sample)
            for event in backend.xid_events():
                print(event)
            time.sleep(1)
    assert backend.problems == []
