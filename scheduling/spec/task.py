"""A task as the platform runs it: one task of a spec, checked and normalised."""

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpuplatform.units import format_duration_s
from scheduling.spec.errors import Problems
from scheduling.spec.schema import PRIORITIES, TaskInput


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """One task, checked and normalised; the fields map onto scheduling.models.Task."""

    name: str
    command: str
    queue: str = ""
    priority: int = PRIORITIES["normal"]
    task_class: str = "batch"
    preemptible: bool = True
    workdir: str = ""  # normalised relative POSIX path; "" is the tenant's root
    env: dict[str, str] = field(default_factory=dict)
    gpus_min: int = 1
    gpus_max: int = 1
    gpu_memory_mb: int | None = None
    gpu_type: str = ""
    pool: str = ""
    node: str = ""
    # Host limits, enforced by the attempt's cgroup where the node has cgroups.
    memory_mb: int | None = None
    cpus: float | None = None
    pids: int | None = None
    timeout_s: int | None = None
    retries: int = 0
    after: tuple[str | int, ...] = ()
    # The service block, normalised (``port``, ``health`` or None, ``replicas``); None: no
    # service. Read by the node that runs it from the stored spec.
    service: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The normalised spec as JSON-able data; parse_spec() reads it back to an equal spec."""
        gpus = (
            self.gpus_min if self.gpus_min == self.gpus_max else f"{self.gpus_min}-{self.gpus_max}"
        )
        memory = self.gpu_memory_mb
        data = {
            "kind": "task",
            "name": self.name,
            "queue": self.queue,
            "priority": self.priority,
            "class": self.task_class,
            "command": self.command,
            "workdir": self.workdir,
            "env": dict(self.env),
            "resources": {
                "gpus": gpus,
                # Gi or Mi, never a rounded "24.0 GiB": the stored spec must read back exactly.
                "gpu_memory": None
                if memory is None
                else (f"{memory // 1024}Gi" if memory % 1024 == 0 else f"{memory}Mi"),
                "gpu_type": self.gpu_type,
                "pool": self.pool,
                "node": self.node,
                "memory": None if self.memory_mb is None else f"{self.memory_mb}Mi",
                "cpus": self.cpus,
                "pids": self.pids,
            },
            "policy": {
                "timeout": None if self.timeout_s is None else format_duration_s(self.timeout_s),
                "retries": self.retries,
                "preemptible": self.preemptible,
                "after": list(self.after),
            },
        }
        if self.service is not None:  # only then: other tasks' stored specs stay as they were
            health = self.service["health"]
            data["service"] = {**self.service, "health": None if health is None else {**health}}
        return data


def task_spec(data: object, problems: Problems, path: str) -> TaskSpec | None:
    """One task mapping checked against the schema, or None with its problems added."""
    try:
        task = TaskInput.model_validate(data)
    except ValidationError as exc:
        problems.add_invalid(path, exc, TaskInput)
        return None
    resources, policy, service = task.resources, task.policy, task.service
    preemptible = policy.preemptible
    # A service is long-running: online (never preempted) unless its class is written.
    task_class = (
        "online" if service is not None and "task_class" not in task.model_fields_set
        else task.task_class
    )  # fmt: skip
    return TaskSpec(
        name=task.name,
        command=task.command,
        queue=task.queue,
        priority=task.priority,
        task_class=task_class,
        preemptible=task_class != "online" if preemptible is None else preemptible,
        workdir=task.workdir,
        env=task.env,
        gpus_min=resources.gpus[0],
        gpus_max=resources.gpus[1],
        gpu_memory_mb=resources.gpu_memory,
        gpu_type=resources.gpu_type,
        pool=resources.pool,
        node=resources.node,
        memory_mb=resources.memory,
        cpus=None if resources.cpus is None else float(resources.cpus),
        pids=resources.pids,
        timeout_s=policy.timeout,
        retries=policy.retries,
        after=policy.after,
        service=None if service is None else service.model_dump(),
    )
