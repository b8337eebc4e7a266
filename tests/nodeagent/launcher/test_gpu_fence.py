"""A task opens only the device nodes of the GPUs it holds (``nodeagent.launcher.gpufence``).

There is no GPU here, so the GPUs' nodes are stand-ins: character devices with NVIDIA's major
number (195) made with mknod in a temporary directory (``GPU_DEVICE_DIR``). No driver answers
for them, so opening one that the task may open fails with ENXIO, and one that it is fenced
off with EPERM (the cgroup refuses before any driver is asked): that tells the two apart. The
probe runs inside a real task, as the tenant's own user, on both ways of fencing: the v1
devices controller and the eBPF device program on cgroup v2 (this hybrid host has both).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from nodeagent.agent import NodeAgent
from nodeagent.launcher import cgroups
from scheduling.config import EstateConfig
from scheduling.models import Allocation, Node
from tests.nodeagent.launcher.conftest import state_of, wait_for
from tests.nodeagent.launcher.test_launch import attempt_of, log_of, start

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod, Unix users and cgroups need root")

GPUS = 4
CONTROL = {"nvidiactl": 255, "nvidia-modeset": 254}
PROBE = r"""exec python3 - <<'EOF'
import errno, json, os
found = {"uid": os.getuid()}
for path in os.environ["PROBE_PATHS"].split(":"):
    try:
        os.close(os.open(path, os.O_RDWR))
        found[path] = "opened"
    except OSError as exc:
        found[path] = errno.errorcode[exc.errno]
print(json.dumps(found))
EOF"""


@pytest.fixture
def stand_ins(launcher, monkeypatch, settings, request):
    """/dev/nvidia0..3, nvidiactl and nvidia-modeset as stand-ins, for every process here.

    Under /var/tmp, not pytest's /tmp: a task's /tmp is a private tmpfs of its own."""
    directory = Path(tempfile.mkdtemp(prefix="gpuplatform-fence-", dir="/var/tmp"))
    directory.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(directory, ignore_errors=True))
    nodes = {f"nvidia{minor}": minor for minor in range(GPUS)} | CONTROL
    for name, minor in nodes.items():
        os.mknod(directory / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        (directory / name).chmod(0o666)
    monkeypatch.setenv("GPU_DEVICE_DIR", str(directory))
    settings.GPU_DEVICE_DIR = directory
    return directory


def fence_with(how: str, monkeypatch, settings) -> None:
    monkeypatch.setenv("GPU_FENCE", how)
    settings.GPU_FENCE = how
    cgroups.detect.cache_clear()


def register(node: Node) -> Node:
    """As the node agent does: its GPUs (and their minors) from the simulated backend."""
    simulate = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": GPUS}
    config = EstateConfig.model_validate({"nodes": [{"name": node.name, "simulate": simulate}]})
    NodeAgent(config=config, node_name=node.name, backend_kind="simulated").register()
    return Node.objects.get(pk=node.pk)


def probe(lab, stand_ins, **fields) -> tuple[dict, list[int]]:
    """What a task holding ``fields``' GPUs got opening each node; and the GPUs it held."""
    paths = sorted(str(path) for path in stand_ins.iterdir()) + ["/dev/null"]
    task = start(lab, PROBE, env={"PROBE_PATHS": ":".join(paths)}, **fields)
    wait_for(state_of(task, "succeeded", "failed"))
    assert task.state == "succeeded", log_of(task)
    held = Allocation.objects.filter(task=task, attempt=attempt_of(task).number)
    return json.loads(log_of(task).strip().splitlines()[-1]), sorted(
        held.values_list("gpu__index", flat=True)
    )


@needs_root
@pytest.mark.parametrize("how", ["devices", "bpf"])
def test_a_task_opens_only_its_own_gpus_device_nodes(
    how, stand_ins, node, lab, monkeypatch, settings
):
    fence_with(how, monkeypatch, settings)
    node = register(node)

    found, held = probe(lab, stand_ins, gpus_min=2, gpus_max=2)

    assert len(held) == 2
    assert found["uid"] != 0  # the tenant's own user
    for minor in range(GPUS):
        expected = "ENXIO" if minor in held else "EPERM"  # no driver / fenced off
        assert found[str(stand_ins / f"nvidia{minor}")] == expected, (minor, held, found)
    # What CUDA needs besides its GPUs, and everything that is not a GPU, stays open.
    for name in CONTROL:
        assert found[str(stand_ins / name)] == "ENXIO", found
    assert found["/dev/null"] == "opened"
    # The node says how.
    assert "GPUs fenced by" in node.isolation
    assert ("devices controller" if how == "devices" else "eBPF") in node.isolation


@needs_root
@pytest.mark.parametrize("how", ["devices", "bpf"])
def test_a_task_without_gpus_opens_none(how, stand_ins, node, lab, monkeypatch, settings):
    fence_with(how, monkeypatch, settings)
    register(node)

    found, held = probe(lab, stand_ins, gpus_min=0, gpus_max=0)

    assert held == []
    assert [found[str(stand_ins / f"nvidia{minor}")] for minor in range(GPUS)] == ["EPERM"] * GPUS
    assert found[str(stand_ins / "nvidiactl")] == "ENXIO"
    assert found["/dev/null"] == "opened"


@needs_root
def test_a_host_that_cannot_fence_says_so_and_still_runs_tasks(
    stand_ins, node, lab, monkeypatch, settings
):
    fence_with("off", monkeypatch, settings)
    node = register(node)
    assert node.isolation.startswith("tenant users; GPUs not fenced: GPU_FENCE=off; ")

    found, held = probe(lab, stand_ins)

    assert len(held) == 1
    assert [found[str(stand_ins / f"nvidia{minor}")] for minor in range(GPUS)] == ["ENXIO"] * GPUS
