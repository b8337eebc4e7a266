"""What the platform watches: alerts (GPU samples and rollups arrive later; see DESIGN.md)."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class AlertKind(models.TextChoices):
    GPU_MEMORY_OVERUSE = "gpu_memory_overuse", "GPU memory overuse"
    GPU_FAILED = "gpu_failed", "GPU failed"
    NODE_OFFLINE = "node_offline", "node offline"
    TASK_LOST = "task_lost", "task lost"
    TASK_LOG_IO = "task_log_io", "task log cannot be written"
    GPU_IDLE = "gpu_idle", "GPU allocated but idle"
    GPU_OVER_TEMPERATURE = "gpu_over_temperature", "GPU over temperature"
    GPU_ECC = "gpu_ecc", "GPU ECC errors"
    GPU_XID = "gpu_xid", "GPU XID error"


class Severity(models.TextChoices):
    INFO = "info", "info"
    WARNING = "warning", "warning"
    CRITICAL = "critical", "critical"


def resolve_and_set_null(collector, field, sub_objs, using) -> None:
    """SET_NULL that first resolves the open alerts about the deleted GPU, task or node.

    Nobody can act on an alert about something that no longer exists, and left open, two alerts
    that differed only by the deleted object would become the same subject and collide with the
    one-open-alert constraint, failing the deletion.
    """
    resolved_at = field.model._meta.get_field("resolved_at")
    # Added first, so it runs first: field updates run in the order they were added.
    collector.add_field_update(resolved_at, timezone.now(), sub_objs.filter(resolved_at=None))
    collector.add_field_update(field, None, sub_objs)


# Like SET_NULL: the collector passes a QuerySet instead of fetching the rows.
resolve_and_set_null.lazy_sub_objs = True  # type: ignore[attr-defined]


class Alert(models.Model):
    """Something an operator should know about, open until the condition goes away.

    Raising the same alert again while it is open refreshes it instead of opening another: the
    subject (kind, GPU, task, node) has at most one open alert, which the database enforces.
    """

    # Not a database check on the choices: a new kind needs no migration of old rows.
    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    gpu = models.ForeignKey(
        "scheduling.GPU",
        on_delete=resolve_and_set_null,
        null=True,
        blank=True,
        related_name="alerts",
        verbose_name="GPU",
    )
    task = models.ForeignKey(
        "scheduling.Task",
        on_delete=resolve_and_set_null,
        null=True,
        blank=True,
        related_name="alerts",
    )
    node = models.ForeignKey(
        "scheduling.Node",
        on_delete=resolve_and_set_null,
        null=True,
        blank=True,
        related_name="alerts",
    )
    message = models.TextField()
    opened_at = models.DateTimeField(default=timezone.now, db_index=True)
    last_seen_at = models.DateTimeField(
        default=timezone.now, help_text="When the condition was last observed."
    )
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-opened_at", "-id"]
        indexes = [
            models.Index(
                fields=["kind"], condition=Q(resolved_at__isnull=True), name="alert_open_kind"
            ),
        ]
        constraints = [
            # NULLs compare equal here, so "no task" is one subject, not a new one every time.
            models.UniqueConstraint(
                fields=["kind", "gpu", "task", "node"],
                condition=Q(resolved_at__isnull=True),
                nulls_distinct=False,
                name="alert_one_open_per_subject",
            ),
            models.CheckConstraint(
                condition=Q(severity__in=[s.value for s in Severity]), name="alert_severity_valid"
            ),
            models.CheckConstraint(
                condition=Q(resolved_at__isnull=True) | Q(resolved_at__gte=F("opened_at")),
                name="alert_resolved_after_open",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.message}"

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None
