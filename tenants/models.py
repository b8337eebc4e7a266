"""Tenants, who belongs to them, what they may use, and how their scripts authenticate."""

from __future__ import annotations

import math
import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

SLUG_VALIDATOR = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    "Use lowercase letters, digits and inner dashes (at most 63 characters).",
)
# What useradd accepts by default (NAME_REGEX), at most 32 characters (the field's length).
UNIX_USER = re.compile(r"[a-z_][a-z0-9_-]*\$?")


class Tenant(models.Model):
    """A team, lab or customer: the unit of isolation, quota and accounting."""

    name = models.CharField(max_length=63, unique=True, validators=[SLUG_VALIDATOR])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    is_active = models.BooleanField(
        default=True, help_text="Inactive tenants cannot submit tasks or authenticate."
    )
    unix_user = models.CharField(
        max_length=32,
        blank=True,
        help_text="Run this tenant's tasks as this Unix user when the platform runs as root.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Rules beyond the fields' own, checked by full_clean(): the admin's forms, the API's
        serializers and the portal's forms all call it, so each refuses with the same words."""
        if self.unix_user and not UNIX_USER.fullmatch(self.unix_user):
            raise ValidationError({"unix_user": [
                "a Unix user name: lowercase letters, digits, '_' and '-', not starting with a "
                "digit or '-'"
            ]})  # fmt: skip
        if self.unix_user == "root":
            raise ValidationError({"unix_user": ["tasks never run as root"]})


class Role(models.TextChoices):
    ADMIN = "admin", "Admin"  # manages members, tokens and every task of the tenant
    MEMBER = "member", "Member"  # submits and controls tasks
    VIEWER = "viewer", "Viewer"  # reads only


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["tenant__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user"),
            models.CheckConstraint(
                condition=Q(role__in=[r.value for r in Role]), name="membership_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class Quota(models.Model):
    """Limits of one tenant, either cluster-wide (pool empty) or inside one pool.

    An empty limit means "no limit". Both a cluster-wide and a per-pool quota may apply to the
    same task; the scheduler enforces every one that applies.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(
        "scheduling.Pool",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="quotas",
        help_text="Empty: applies across the whole cluster.",
    )
    max_gpus = models.PositiveIntegerField(null=True, blank=True)
    max_gpu_memory_mb = models.PositiveIntegerField(
        null=True, blank=True, help_text="Reserved GPU memory in MiB, summed over running tasks."
    )
    max_running_tasks = models.PositiveIntegerField(null=True, blank=True)
    max_queued_tasks = models.PositiveIntegerField(null=True, blank=True)
    max_priority = models.PositiveSmallIntegerField(
        default=100, help_text="Highest task priority (0-100) this tenant may ask for."
    )
    fair_share_weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0)],
        help_text="Relative share of the GPUs when tenants compete (2.0 = twice the share).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__name", "pool__name"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(pool__isnull=True), name="quota_one_cluster_wide"
            ),
            models.UniqueConstraint(
                fields=["tenant", "pool"],
                condition=Q(pool__isnull=False),
                name="quota_one_per_pool",
            ),
            models.CheckConstraint(condition=Q(max_priority__lte=100), name="quota_priority_range"),
            models.CheckConstraint(
                condition=Q(fair_share_weight__gt=0), name="quota_weight_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} quota ({self.pool or 'cluster'})"

    def validate_constraints(self, exclude=None) -> None:
        """The constraints above, checked before a save (by full_clean(): the admin, the API and
        the portal) with words that name the field; Django's own would name the constraint."""
        exclude = set(exclude or ())
        errors: dict[str, list[str]] = {}
        weight = self.fair_share_weight
        if "fair_share_weight" not in exclude and weight is not None:
            if not (math.isfinite(weight) and weight > 0):
                errors["fair_share_weight"] = ["must be above 0"]
        if "max_priority" not in exclude and self.max_priority is not None:
            if self.max_priority > 100:
                errors["max_priority"] = ["must be 0-100"]
        if "pool" not in exclude and self.tenant_id is not None:
            clash = Quota.objects.filter(tenant_id=self.tenant_id, pool_id=self.pool_id)
            if self.pk is not None:
                clash = clash.exclude(pk=self.pk)
            if clash.exists():
                errors["pool"] = ["this tenant already has a quota here"]
        # Anything added later is still checked, without repeating what is said above.
        try:
            super().validate_constraints(exclude=exclude | set(errors))
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                errors.setdefault(field, []).extend(messages)
        if errors:
            raise ValidationError(errors)


class ApiToken(models.Model):
    """A bearer token for the API and CLI. Only a hash of the secret is stored.

    The visible ``prefix`` identifies the token in lists, logs and leak scans; the secret is
    shown once at creation and cannot be recovered.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    parent = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        editable=False,
        related_name="children",
        help_text="The token whose request created this one: this one expires no later and "
        "is refused once it (or any token above it) is revoked or expired.",
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...)"

    def is_usable(self, now=None) -> bool:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now


class RateLimit(models.Model):
    """One throttling key's pace (gpuplatform.throttle): a GCRA's theoretical arrival time,
    updated by one UPSERT a request and shared by every web process."""

    key = models.CharField(max_length=100, primary_key=True)
    tat = models.FloatField(help_text="Epoch seconds: when the key's allowance is next full.")
    refused = models.PositiveIntegerField(
        default=0, help_text="Requests refused in a row since the last accepted one."
    )

    def __str__(self) -> str:
        return f"{self.key}: {self.tat}"
