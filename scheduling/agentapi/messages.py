"""What a supervisor is given and what it reports: plain data that crosses processes.

A supervisor forked by the node's spawner (``spawner``) never loads Django's models: it gets
its attempt as an :class:`Assignment` over the spawner's socket, and sends :class:`StartReport`
and :class:`ExitReport` over the node agent's (``relay``). Nothing here imports Django.

Each message's ``as_dict`` is ``dataclasses.asdict`` written out, for the two reports every
supervisor sends and the assignment it is given: asdict's recursive deep copy costs far more,
above all in freshly forked supervisors, whose first touch of that code costs page faults. A
test holds the two equal.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, field

from gpuplatform.procid import ProcessId

# What a node whose agent cannot run tasks as their tenants' users reports as its isolation.
SINGLE_USER_NOTE = "single-user mode: tenants are not isolated on this host"


@dataclass(frozen=True)
class Assignment:
    """One attempt of one task, as its supervisor needs it: no database read to start it."""

    attempt_id: int
    task_id: int
    attempt_no: int
    node: str
    tenant: str
    unix_user: str
    task_name: str
    command: str
    workdir: str
    log_path: str
    timeout_s: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    resources: dict = field(default_factory=dict)  # the spec's resources (cgroup limits)
    gpu_uuids: list[str] = field(default_factory=list)
    service: dict | None = None  # the spec's service block (port, health, replicas)
    # The estate's ``heartbeat.fence_after`` when the attempt was assigned: the supervisor's
    # lease (``Lease``), without the configuration's parser loaded in every supervisor. None:
    # the supervisor reads the configuration itself.
    fence_after_s: int | None = None

    @classmethod
    def of(cls, attempt, *, fence_after_s: int | None = None) -> Assignment:
        """From a ``TaskAttempt`` with its task, the task's tenant and its node."""
        task = attempt.task
        return cls(
            attempt_id=attempt.pk,
            task_id=task.pk,
            attempt_no=attempt.number,
            node=attempt.node.name,
            tenant=task.tenant.name,
            unix_user=task.tenant.unix_user,
            task_name=task.name,
            command=task.command,
            workdir=task.workdir,
            log_path=attempt.log_path,
            timeout_s=task.timeout_s,
            env=dict(task.env or {}),
            resources=dict((task.spec or {}).get("resources") or {}),
            gpu_uuids=list(attempt.gpu_uuids),
            service=(task.spec or {}).get("service"),
            fence_after_s=fence_after_s,
        )

    @classmethod
    def from_dict(cls, fields: dict) -> Assignment:
        return cls(**fields)

    def as_dict(self) -> dict:
        # Written out as the reports' are (see above): one per task, in the node agent's thread
        # that answers supervisors.
        return {
            "attempt_id": self.attempt_id,
            "task_id": self.task_id,
            "attempt_no": self.attempt_no,
            "node": self.node,
            "tenant": self.tenant,
            "unix_user": self.unix_user,
            "task_name": self.task_name,
            "command": self.command,
            "workdir": self.workdir,
            "log_path": self.log_path,
            "timeout_s": self.timeout_s,
            "env": dict(self.env),
            "resources": deepcopy(self.resources),
            "gpu_uuids": list(self.gpu_uuids),
            "service": deepcopy(self.service),
            "fence_after_s": self.fence_after_s,
        }

    def __str__(self) -> str:
        return f"task {self.task_id} attempt {self.attempt_no}"


@dataclass(frozen=True)
class StartReport:
    attempt_id: int
    supervisor: ProcessId
    pid: ProcessId

    @classmethod
    def of(cls, fields: dict) -> StartReport:
        """From ``dataclasses.asdict`` of one (as ``relay`` carries it)."""
        return cls(
            fields["attempt_id"], ProcessId(**fields["supervisor"]), ProcessId(**fields["pid"])
        )

    def as_dict(self) -> dict:
        return {
            "attempt_id": self.attempt_id,
            "supervisor": _process_id(self.supervisor),
            "pid": _process_id(self.pid),
        }


def _process_id(pid: ProcessId | None) -> dict | None:
    return None if pid is None else {"pid": pid.pid, "started": pid.started}


@dataclass(frozen=True)
class ExitReport:
    task_id: int
    attempt_no: int
    exit_code: int | None
    timed_out: bool = False
    problem: str = ""
    note: str = ""
    # The supervisor can take the next attempt on the GPUs this one frees, in the agent's
    # answer (``handoff``): it is one of the spawner's and may serve another.
    ready: bool = False
    # The command ended before its start was reported (``supervisor.START_GRACE_S``): the start,
    # written with the end (``relay.write_reports``), not in a round trip of its own.
    started: StartReport | None = None
    # A service stopped by its supervisor after failing its health check too often: what the
    # last check said. A user failure (retried), whatever the command's exit status.
    unhealthy: str = ""
    # The supervisor stopped the command because its node's lease lapsed: the seconds since it
    # last saw its node's heartbeat in the database (``launcher.lease.Lease``).
    fenced_s: int | None = None

    @classmethod
    def of(cls, fields: dict) -> ExitReport:
        """From ``dataclasses.asdict`` of one (as ``relay`` carries it)."""
        started = fields.get("started")
        return cls(**{**fields, "started": None if started is None else StartReport.of(started)})

    def as_dict(self) -> dict:
        return {
            "task_id": self.task_id,
            "attempt_no": self.attempt_no,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "problem": self.problem,
            "note": self.note,
            "ready": self.ready,
            "started": None if self.started is None else self.started.as_dict(),
            "unhealthy": self.unhealthy,
            "fenced_s": self.fenced_s,
        }


@dataclass(frozen=True)
class LogTrouble:
    """A supervisor cannot write its attempt's log (a full, read-only or vanished log disk):
    the node agent raises its node's alert, once per node rather than once per task."""

    task_id: int
    path: str
    error: str  # the system's words for it ("No space left on device")

    def as_dict(self) -> dict:
        return {"task_id": self.task_id, "path": self.path, "error": self.error}


@dataclass(frozen=True)
class FenceQuery:
    """Is this attempt still wanted? (asked every few seconds while it runs)"""

    attempt_id: int

    def as_dict(self) -> dict:
        return {"attempt_id": self.attempt_id}


# --- What a node's GPU backend reports -----------------------------------------------------------


@dataclass(frozen=True)
class GpuInfo:
    index: int
    # Stable identity: indices can change across reboots and driver upgrades, UUIDs do not, and
    # CUDA_VISIBLE_DEVICES accepts them.
    uuid: str
    model: str
    memory_mb: int
    pci_bus_id: str
    gpu_type: str
    # The device node's minor number (/dev/nvidia<minor>, char major 195), which the node agent
    # fences tasks by; None where the driver does not say.
    minor: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, as the driver sees it."""

    gpu_uuid: str
    # In the host's pid namespace: a node agent inside a container sees other pids.
    pid: int
    # None where the driver cannot tell (some drivers, WSL, insufficient permissions).
    used_mb: int | None


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. A metric the GPU or driver cannot report is None."""

    gpu_uuid: str
    # Wall-clock seconds (time.time()) of the read, taken once per batch.
    at: float
    util_gpu: int | None = None  # percent of time a kernel ran
    util_memory: int | None = None  # percent of time memory was read or written
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    fan_pct: int | None = None
    ecc_corrected: int | None = None  # volatile (since driver load) totals
    ecc_uncorrected: int | None = None
    throttle_reasons: int | None = None  # NVML's clocksEventReasons bit mask
    # (pid, used MiB or None) of the processes on this GPU, where the backend lists them.
    processes: tuple[tuple[int, int | None], ...] = ()
    # The GPU answered "lost" (fallen off the bus); its other fields are None.
    lost: bool = False
    simulated: bool = False


@dataclass(frozen=True)
class XidEvent:
    """A GPU error reported by the driver (NVIDIA's XID catalogue)."""

    gpu_uuid: str
    xid: int
    at: float
