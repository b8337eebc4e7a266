from types import SimpleNamespace

import pytest

from nodeagent.inventory import (
    BackendUnavailable,
    NvmlBackend,
    SimulatedBackend,
    gpu_type_for,
    open_backend,
)
from scheduling.config import SimulatedGpus


def spec(**overrides: object) -> SimulatedGpus:
    values: dict[str, object] = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 4}
    return SimulatedGpus.model_validate({**values, **overrides})


class _LibraryNotFound(Exception):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


def nvml_without_driver() -> SimpleNamespace:
    """A pynvml stand-in on a machine with no NVIDIA driver."""

    def init() -> None:
        raise _LibraryNotFound()

    return SimpleNamespace(
        NVMLError=Exception, NVMLError_LibraryNotFound=_LibraryNotFound, nvmlInit=init
    )


def nvml_with_no_gpus() -> SimpleNamespace:
    return SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 0,
    )


def test_it_simulates_the_configured_gpus() -> None:
    gpus = SimulatedBackend("workstation-1", spec()).discover()

    assert [gpu.index for gpu in gpus] == [0, 1, 2, 3]
    assert {gpu.model for gpu in gpus} == {"NVIDIA GeForce RTX 4090"}
    assert {gpu.memory_mb for gpu in gpus} == {24576}
    assert [gpu.pci_bus_id for gpu in gpus] == [
        "00000000:01:00.0",
        "00000000:02:00.0",
        "00000000:03:00.0",
        "00000000:04:00.0",
    ]
    assert all(gpu.uuid.startswith("GPU-") for gpu in gpus)
    assert len({gpu.uuid for gpu in gpus}) == 4


def test_it_gives_the_same_uuids_after_a_restart() -> None:
    before = SimulatedBackend("workstation-1", spec()).discover()
    after = SimulatedBackend("workstation-1", spec()).discover()

    assert [gpu.uuid for gpu in before] == [gpu.uuid for gpu in after]
    # Pinned: the database keys GPUs by UUID, so these must never change between releases.
    assert before[0].uuid == "GPU-bf6ad0dc-f981-5062-9451-c3411c596e3a"


def test_it_gives_other_nodes_other_uuids() -> None:
    one = SimulatedBackend("workstation-1", spec()).discover()
    two = SimulatedBackend("workstation-2", spec()).discover()

    assert not {gpu.uuid for gpu in one} & {gpu.uuid for gpu in two}


def test_it_leaves_hidden_gpus_out_keeping_the_others_identity() -> None:
    everything = SimulatedBackend("workstation-1", spec()).discover()

    backend = SimulatedBackend("workstation-1", spec(), hidden={2})
    remaining = backend.discover()

    assert [gpu.index for gpu in remaining] == [0, 1, 3]
    assert remaining == [everything[0], everything[1], everything[3]]


def test_it_lets_a_gpu_vanish_between_discoveries() -> None:
    backend = SimulatedBackend("workstation-1", spec(count=2))
    backend.hidden.add(0)

    assert [gpu.index for gpu in backend.discover()] == [1]


def test_it_derives_the_gpu_type_from_model_and_memory() -> None:
    (gpu,) = SimulatedBackend(
        "w", spec(model="NVIDIA RTX A6000", memory="48Gi", count=1)
    ).discover()

    assert gpu.gpu_type == "rtxa6000-48g"


def test_it_prefers_the_configured_gpu_type() -> None:
    (gpu,) = SimulatedBackend("w", spec(count=1, gpu_type="consumer-24g")).discover()

    assert gpu.gpu_type == "consumer-24g"


@pytest.mark.parametrize(
    ("model", "memory_mb", "expected"),
    [
        ("NVIDIA GeForce RTX 4090", 24564, "rtx4090-24g"),
        ("NVIDIA H100 80GB HBM3", 81559, "h100-80g"),
        ("NVIDIA A100-SXM4-40GB", 40960, "a100-40g"),
        ("NVIDIA A100-PCIE-40GB", 40960, "a100-40g"),
        ("NVIDIA RTX A6000", 49140, "rtxa6000-48g"),
        ("Tesla V100-SXM2-16GB", 16160, "v100-16g"),
        ("NVIDIA H100 NVL", 95830, "h100-94g"),
        ("Quadro RTX 8000", 48601, "rtx8000-47g"),
        # Nearest GiB, halves up: 46068 MiB is 44.99 GiB.
        ("NVIDIA L40S", 46068, "l40s-45g"),
        ("NVIDIA L40S", 46080, "l40s-45g"),
        ("NVIDIA L40S", 45568, "l40s-45g"),
        ("NVIDIA L40S", 45567, "l40s-44g"),
        ("NVIDIA", 8192, "gpu-8g"),
        ("Tiny Test GPU", 256, "tinytestgpu-256m"),
    ],
)
def test_it_labels_gpu_types_without_vendor_or_form_factor(
    model: str, memory_mb: int, expected: str
) -> None:
    assert gpu_type_for(model, memory_mb) == expected


def test_it_falls_back_to_simulation_when_auto_finds_no_driver(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = open_backend(
        "auto", node_name="workstation-1", simulate=spec(), pynvml_module=nvml_without_driver()
    )

    assert isinstance(backend, SimulatedBackend)
    assert backend.name == "simulated"
    assert len(backend.discover()) == 4
    assert "no NVIDIA driver is installed" in caplog.text


def test_it_keeps_real_nvml_in_auto_mode_even_with_no_gpus() -> None:
    backend = open_backend(
        "auto", node_name="workstation-1", simulate=spec(), pynvml_module=nvml_with_no_gpus()
    )

    assert isinstance(backend, NvmlBackend)
    assert backend.discover() == []


def test_it_names_both_reasons_when_auto_has_nothing_to_fall_back_to() -> None:
    with pytest.raises(BackendUnavailable) as caught:
        open_backend(
            "auto", node_name="workstation-9", simulate=None, pynvml_module=nvml_without_driver()
        )

    message = str(caught.value)
    assert "no NVIDIA driver is installed" in message
    assert "node workstation-9 has no simulate: section in the configuration" in message


def test_it_refuses_simulation_for_a_node_without_a_simulate_section() -> None:
    with pytest.raises(
        BackendUnavailable,
        match="^node workstation-9 has no simulate: section in the configuration$",
    ):
        open_backend("simulated", node_name="workstation-9", simulate=None)


def test_it_passes_on_the_driver_problem_when_nvml_is_demanded() -> None:
    with pytest.raises(BackendUnavailable, match="no NVIDIA driver is installed"):
        open_backend(
            "nvml", node_name="workstation-1", simulate=spec(), pynvml_module=nvml_without_driver()
        )


def test_it_rejects_an_unknown_backend_kind() -> None:
    with pytest.raises(ValueError, match="unknown GPU backend 'cuda'; expected one of: auto, nvml"):
        open_backend("cuda", node_name="workstation-1", simulate=spec())


def test_it_runs_no_processes_unless_told() -> None:
    assert SimulatedBackend("workstation-1", spec()).processes() == []


def test_it_reports_the_fake_processes_it_is_given_as_they_change() -> None:
    from scheduling.agentapi.messages import GpuProcess

    backend = SimulatedBackend("workstation-1", spec(count=2))
    uuid = backend.discover()[1].uuid
    notebook = GpuProcess(gpu_uuid=uuid, pid=4242, used_mb=3000)
    shared = [notebook]
    backend = SimulatedBackend("workstation-1", spec(count=2), fake_processes=shared)

    assert backend.processes() == [notebook]

    shared.append(GpuProcess(gpu_uuid=uuid, pid=4243, used_mb=None))
    backend.fake_processes.remove(notebook)

    assert backend.processes() == [GpuProcess(gpu_uuid=uuid, pid=4243, used_mb=None)]
    # A copy: the caller cannot change the backend's list through the answer.
    backend.processes().clear()
    assert len(backend.fake_processes) == 1
