"""What a service's supervisor records: the port its attempt holds on its node, and what its
health check says.

A port is held in the database (``TaskAttempt.service_port``, unique per node among attempts
not ended: the ``attempt_service_port_held`` constraint), so two launches on one node can never
record the same port, whichever process picks it. Health is written when it changes (and
refreshed now and then): the attempt's columns, the task's reason while it runs, and a
``TaskEvent`` (running to running) published like any change of the task's, so the portal and
the websockets hear of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction

from gpuplatform import events
from scheduling import reasons
from scheduling.models import Health, Task, TaskAttempt, TaskEvent
from scheduling.states import TaskState


class PortTaken(Exception):
    """The attempt cannot have the port it asked for (or any, with ``auto``): the message says
    why, for the task's reason. Retrying would not help, so the attempt fails."""


def claim_port(
    *, attempt_id: int, node: str, wanted: str | int, free: Callable[[int], bool]
) -> int:
    """Record a port for the attempt and return it: ``wanted`` ("auto", or a number) that no
    other attempt not ended on ``node`` holds and that ``free`` (a bind on the node) finds
    unused. ``auto`` takes from ``SERVICE_PORTS``, starting at a random place so that
    concurrent launches rarely try the same port first. PortTaken when there is none."""
    held = set(
        TaskAttempt.objects.filter(node__name=node, outcome="", service_port__isnull=False)
        .exclude(pk=attempt_id)
        .values_list("service_port", flat=True)
    )
    if wanted == "auto":
        low, high = settings.SERVICE_PORT_RANGE
        start = random.randint(low, high)  # noqa: S311 - spreading, not secrecy
        candidates = [*range(start, high + 1), *range(low, start)]
    else:
        candidates = [int(wanted)]
    for port in candidates:
        if port in held or not free(port):
            if wanted != "auto":
                whose = "another task" if port in held else "another program"
                raise PortTaken(f"port {port} is in use on node {node} by {whose}")
            continue
        try:
            with transaction.atomic():
                TaskAttempt.objects.filter(pk=attempt_id).update(service_port=port)
        except IntegrityError:  # another launch recorded it first
            if wanted != "auto":
                raise PortTaken(f"port {port} is in use on node {node} by another task") from None
            continue
        return port
    low, high = settings.SERVICE_PORT_RANGE
    raise PortTaken(f"no free port in SERVICE_PORTS {low}-{high} on node {node}")


def record_health(
    *,
    attempt_id: int,
    health: str,
    detail: str,
    checked_at: datetime,
    reason: reasons.Reason | None,
) -> bool:
    """Write what the attempt's health check says; with ``reason`` (a change of health), the
    task's reason too while this attempt runs it, with a TaskEvent, published on commit.
    False when the attempt has ended (its supervisor stops checking)."""
    with transaction.atomic():
        attempt = (
            TaskAttempt.objects.select_for_update()
            .filter(pk=attempt_id, outcome="")
            .only("pk", "task_id", "number", "stop_requested")
            .first()
        )
        if attempt is None:
            return False
        TaskAttempt.objects.filter(pk=attempt_id).update(
            health=Health(health), health_detail=detail[:500], health_checked_at=checked_at
        )
        # Stopping (cancelled, preempted, a broken limit): the task's reason says so, and stays.
        if reason is None or attempt.stop_requested:
            return True
        text, code, params = reasons.stored(reason)
        running = Task.objects.filter(
            pk=attempt.task_id, attempt=attempt.number, state=TaskState.RUNNING
        )
        if not running.update(reason=text, reason_code=code, reason_params=params):
            return True
        task = Task.objects.get(pk=attempt.task_id)
        TaskEvent.objects.create(
            task=task,
            at=checked_at,
            from_state=TaskState.RUNNING,
            to_state=TaskState.RUNNING,
            reason=text,
            reason_code=code,
            reason_params=params,
            attempt=attempt.number,
        )
        events.publish(events.TASKS, [task])
    return True


def holds_port(*, node: str, task_id: int, port: int) -> bool:
    """Whether ``task_id``'s attempt that runs on ``node`` now (not ended) holds ``port``: what
    the node agent asks before it relays a connection to that port (``nodeagent.peer``)."""
    return TaskAttempt.objects.filter(
        node__name=node, task_id=task_id, service_port=port, ended_at__isnull=True
    ).exists()
