"""A service's part of a task's API detail (the spec's service block): its port and health on
its node, and its replicas with theirs ("healthy 1/2"). Kept beside ``api`` so the task
serializers stay readable."""

from __future__ import annotations

from rest_framework import serializers

from scheduling.models import Health
from scheduling.selectors import Replica


class ReplicaOut(serializers.Serializer):
    id = serializers.IntegerField(source="task.pk")
    state = serializers.CharField(source="task.state")
    node = serializers.CharField(source="task.node.name", default=None, allow_null=True)
    service_port = serializers.IntegerField(
        source="attempt.service_port", default=None, allow_null=True
    )
    health = serializers.CharField(
        source="attempt.health",
        default="",
        help_text="starting, healthy, unhealthy; empty without a health check or attempt.",
    )


class ServiceOut(serializers.Serializer):
    port = serializers.JSONField(help_text='As asked: "auto" or a port number.')
    health_check = serializers.JSONField(
        allow_null=True, help_text="path, interval, timeout, start_period (s), failures."
    )
    replicas_wanted = serializers.IntegerField(help_text="replicas in the spec.")
    service_port = serializers.IntegerField(
        allow_null=True, help_text="The port its running attempt was given on its node."
    )
    health = serializers.CharField(help_text="Its running attempt's: starting, healthy, ...")
    health_detail = serializers.CharField(help_text="What the last check said, and when.")
    health_checked_at = serializers.DateTimeField(allow_null=True)
    replica_of = serializers.IntegerField(
        allow_null=True, help_text="The service (first replica) this one belongs to."
    )
    replicas = ReplicaOut(many=True, help_text="Every replica, the service first.")
    healthy = serializers.CharField(help_text='Healthy replicas of all: "healthy 1/2".')


def service_data(task, group: list[Replica]) -> dict | None:
    """``ServiceOut``'s data for ``task`` (``group``: ``selectors.service_group``'s), or None
    when the task is no service."""
    block = (task.spec or {}).get("service")
    if block is None:
        return None
    own = next((r.attempt for r in group if r.task.pk == task.pk), None)
    healthy = sum(1 for r in group if r.attempt is not None and r.attempt.health == Health.HEALTHY)
    return {
        "port": block.get("port", "auto"),
        "health_check": block.get("health"),
        "replicas_wanted": block.get("replicas", 1),
        "service_port": own.service_port if own else None,
        "health": own.health if own else "",
        "health_detail": own.health_detail if own else "",
        "health_checked_at": own.health_checked_at if own else None,
        "replica_of": task.replica_of_id,
        "replicas": group,
        "healthy": f"healthy {healthy}/{len(group)}",
    }
