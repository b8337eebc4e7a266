"""A task opens only the device nodes of the GPUs it holds.

``CUDA_VISIBLE_DEVICES`` is advice: a task that unsets it would see every GPU of the host. So
each attempt's cgroup also says which NVIDIA GPU nodes its processes may open, as Slurm's
``ConstrainDevices=yes`` and Kubernetes' device plugins do: char major 195, minors 0-253
(``/dev/nvidia<minor>``), all denied but the minors of the attempt's GPUs. Everything else stays
open: 195:254 (``nvidia-modeset``) and 195:255 (``nvidiactl``), which every CUDA process needs,
``nvidia-uvm`` and ``nvidia-uvm-tools`` (a major of their own), ``/dev/dri``, ``/dev/null``, ttys.
A task with no GPU opens none of them. An attempt that cannot be fenced fails to start (or, with
no way to fence on this host at all, runs unfenced and the node says so).

How, by host:

* an eBPF device program attached to the attempt's cgroup v2 (``bpfdev``), as runc and systemd
  do, wherever a cgroup v2 tracks attempts (pure v2, and hybrid hosts' ``unified``);
* the v1 ``devices`` controller otherwise (pure v1, or no eBPF): the attempt gets a cgroup there,
  with one ``devices.deny`` line per GPU minor it does not hold (dearer: see ``mode``).

``GPU_FENCE`` picks one (``auto``, ``devices``, ``bpf``, ``off``). Minors come from the node's GPU
backend (NVML's minor number; the simulated backend's index), which the node agent publishes in
its runtime directory for the supervisors (``publish``), since a supervisor knows its GPUs only
by UUID and must not open NVML for every task.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from nodeagent.launcher import bpfdev, cgroups
from nodeagent.launcher.identity import runtime_dir

logger = logging.getLogger(__name__)

NVIDIA_MAJOR = 195
# The driver's NV_MINOR_DEVICE_NUMBER_REGULAR_MAX; 254 is nvidia-modeset, 255 nvidiactl.
GPU_MINORS = range(0, 254)
MODES = ("devices", "bpf")


@dataclass(frozen=True)
class Fence:
    """The GPU nodes one attempt may open (``allowed`` minors), and how that is enforced."""

    how: str  # "devices" or "bpf"
    allowed: tuple[int, ...] = ()

    def denied(self) -> list[int]:
        return [minor for minor in GPU_MINORS if minor not in self.allowed]

    def device_rules(self) -> list[str]:
        """Lines for a v1 ``devices.deny``: read, write and mknod of every GPU not held."""
        return [f"c {NVIDIA_MAJOR}:{minor} rwm" for minor in self.denied()]

    def program(self) -> bytes:
        return bpfdev.program(NVIDIA_MAJOR, GPU_MINORS[0], GPU_MINORS[-1], self.allowed)


def mode(hierarchy: cgroups.Hierarchy | None) -> str | None:
    """How attempts on this host are fenced: "devices", "bpf", or None (not at all)."""
    wanted = settings.GPU_FENCE
    if hierarchy is None or wanted == "off":
        return None
    if wanted in MODES:
        return wanted  # insisted on: an attempt that cannot have it fails, saying why
    # eBPF first where a cgroup v2 tracks the attempt (hybrid hosts have both): measured on
    # this machine class, an attempt's 254 devices.deny lines cost ~15 ms of kernel time (each
    # write revalidates the cgroup's whole list), the program's load and attach ~1 ms.
    if hierarchy.unified is not None and bpfdev.available() is None:
        return "bpf"
    if hierarchy.location("devices") is not None:
        return "devices"
    return None


def describe(hierarchy: cgroups.Hierarchy | None) -> str:
    """For the node's status: whether tasks are fenced to their GPUs' device nodes, and how."""
    how = mode(hierarchy)
    if how == "devices":
        where = hierarchy.location("devices") if hierarchy else None
        if where is None:
            return "GPUs not fenced: GPU_FENCE=devices but no v1 devices controller"
        return f"GPUs fenced by the v1 devices controller ({where})"
    if how == "bpf":
        if hierarchy is None or hierarchy.unified is None:
            return "GPUs not fenced: GPU_FENCE=bpf but no cgroup v2"
        if (problem := bpfdev.available()) is not None:
            return f"GPUs not fenced: GPU_FENCE=bpf but no eBPF device programs ({problem})"
        return f"GPUs fenced by an eBPF device program on cgroup v2 ({hierarchy.unified})"
    if hierarchy is None:
        return "GPUs not fenced: no cgroups"
    if settings.GPU_FENCE == "off":
        return "GPUs not fenced: GPU_FENCE=off"
    return "GPUs not fenced: no devices controller and no eBPF device programs"


def plan(hierarchy: cgroups.Hierarchy | None, node_name: str, gpu_uuids: Sequence[str]):
    """The fence of an attempt holding ``gpu_uuids``, or None when this host fences nothing.

    A GPU whose minor is not known (no map from the node agent yet) stays fenced off: a task
    that cannot use its GPU says so in CUDA's words, one that could use others' never would."""
    how = mode(hierarchy)
    if how is None:
        return None
    allowed, unknown = minors(node_name, gpu_uuids)
    if unknown:
        logger.warning(
            "the device nodes of GPU(s) %s are not known on node %s: fenced off",
            ", ".join(unknown),
            node_name,
        )
    return Fence(how=how, allowed=tuple(allowed))


def attach(group: cgroups.AttemptCgroup, fence: Fence) -> None:
    """After the attempt's cgroup is made, before the task joins it: the eBPF program (the v1
    rules are written by ``AttemptCgroup.create``)."""
    if fence.how != "bpf":
        return
    unified = group.hierarchy.unified
    if unified is None:
        raise cgroups.CgroupError("cannot fence the GPUs with eBPF: this host has no cgroup v2")
    try:
        bpfdev.attach(group.path, fence.program())
    except bpfdev.BpfError as exc:
        raise cgroups.CgroupError(f"cannot fence the GPUs of {group.path}: {exc.strerror}") from exc


# --- The node's GPUs, by UUID, for its supervisors --------------------------------------------


def map_path(node_name: str) -> Path:
    return runtime_dir() / f"gpu-devices-{node_name}.json"


def device_path(minor: int) -> Path:
    """The device node of the GPU with this minor number (under ``GPU_DEVICE_DIR``)."""
    return Path(settings.GPU_DEVICE_DIR) / f"nvidia{minor}"


def publish(node_name: str, gpus: Iterable) -> Path:
    """Write the node's GPUs (``GpuInfo``) as {uuid: {minor, path}} where supervisors read it
    (root only: 0600 in the 0700 runtime directory). Replaced whole, so never read half-made."""
    found = {
        gpu.uuid: {"minor": gpu.minor, "path": str(device_path(gpu.minor))}
        for gpu in gpus
        if gpu.minor is not None
    }
    path = map_path(node_name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(found, sort_keys=True).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def minors(node_name: str, gpu_uuids: Sequence[str]) -> tuple[list[int], list[str]]:
    """The minors of ``gpu_uuids`` on this node, and the UUIDs whose minor is unknown."""
    if not gpu_uuids:
        return [], []
    try:
        known = json.loads(map_path(node_name).read_bytes())
    except (OSError, ValueError):
        known = {}
    found = [known[uuid]["minor"] for uuid in gpu_uuids if uuid in known]
    return found, [uuid for uuid in gpu_uuids if uuid not in known]
