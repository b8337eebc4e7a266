"""A service's address on the platform and its health, as the API, the portal and gpuctl
show them. The web server's gateway (``gateway/``) serves ``/services/<id>/``: the id is the
service's, the first replica's (a replica's own id leads there too)."""

from __future__ import annotations

from scheduling.models import Task
from scheduling.states import TaskState

PREFIX = "/services/"


def is_service(task: Task) -> bool:
    """A task with a ``service:`` block, a replica, or one whose attempt was given a port."""
    spec = task.spec if isinstance(task.spec, dict) else {}
    if spec.get("service") or task.replica_of_id is not None:
        return True
    return any(attempt.service_port for attempt in task.attempts.all())


def service_path(task: Task) -> str | None:
    """``/services/<id>/`` for a service (its first replica's id), else None."""
    if not is_service(task):
        return None
    return f"{PREFIX}{task.replica_of_id or task.pk}/"


def service_health(task: Task) -> str:
    """What the running attempt's health check says (starting, healthy, unhealthy), "" when
    it has none or the task is not running."""
    if task.state != TaskState.RUNNING:
        return ""
    running = [a for a in task.attempts.all() if a.ended_at is None]
    return max(running, key=lambda a: a.number).health if running else ""
