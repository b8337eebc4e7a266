"""GPU samples and their rollups.

Layout, chosen for the queries it serves:

* ``GpuSample`` (raw, ~1 Hz, kept ``telemetry.raw_retention``, 48 h by default). Its primary key
  is ``(gpu_id, at)``: the one B-tree serves every read (a GPU's, a node's or a task's GPUs' time
  range is a range scan per GPU) and also refuses a duplicate sample, so no surrogate id column
  and no second B-tree are paid for on each of ~22 million inserts a day (256 GPUs at 1 Hz).
  Rows arrive in time order, so a BRIN index on ``at`` (a few pages for the whole table)
  serves the estate-wide scans: retention's ``DELETE ... WHERE at < cutoff``, the rollup of
  the last minutes and ``/metrics``' latest sample. Daily partitions would make retention a
  DROP instead of a DELETE; at this estate's scale (one day of 256 GPUs is ~2.5 GB) a
  batched DELETE every minute removes ~15,000 rows and autovacuum keeps up.
* ``GpuRollupMinute`` / ``GpuRollupHour``: min, mean and max of each metric per GPU, bucket and
  holding task (kept 30 days and a year). Per task, so that attribution survives the raw
  samples' deletion and a bucket spanning two tasks is split between them.

Attribution: each sample carries the task and tenant holding the GPU when it was read (the
largest reservation where tasks share a GPU; every holder is in ``scheduling.Allocation``).
Neither is a foreign key: a sample outlives nothing it refers to, and checking two foreign
keys on every insert would cost more than the insert.
"""

from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.utils import timezone

# The metrics that rollups summarise, in the order the API lists them.
METRICS = (
    "util_gpu",
    "util_memory",
    "memory_used_mb",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
    "fan_pct",
)


def _holder(model: str) -> models.ForeignKey:
    """The task or tenant that held the GPU: history outlives them, so no constraint (a deleted
    task leaves its samples) and no index (reads go by GPU and time, then filter)."""
    return models.ForeignKey(
        model,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        null=True,
        related_name="+",
    )


class GpuSample(models.Model):
    pk = models.CompositePrimaryKey("gpu_id", "at")
    # Not indexed alone: the leading column of the (gpu, time) index serves it.
    gpu = models.ForeignKey(
        "scheduling.GPU", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    at = models.DateTimeField()
    task = _holder("scheduling.Task")
    tenant = _holder("tenants.Tenant")
    simulated = models.BooleanField(default=False)
    lost = models.BooleanField(default=False)
    util_gpu = models.SmallIntegerField(null=True)
    util_memory = models.SmallIntegerField(null=True)
    memory_used_mb = models.IntegerField(null=True)
    memory_total_mb = models.IntegerField(null=True)
    temperature_c = models.SmallIntegerField(null=True)
    power_w = models.FloatField(null=True)
    power_limit_w = models.FloatField(null=True)
    sm_clock_mhz = models.IntegerField(null=True)
    fan_pct = models.SmallIntegerField(null=True)
    ecc_corrected = models.BigIntegerField(null=True)
    ecc_uncorrected = models.BigIntegerField(null=True)
    throttle_reasons = models.BigIntegerField(null=True)
    # [[pid, used MiB or null], ...] where the backend listed them; null otherwise.
    processes = models.JSONField(null=True)

    class Meta:
        indexes = [BrinIndex(fields=["at"], name="gpusample_at_brin")]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.at:%Y-%m-%d %H:%M:%S}"


class GpuRollup(models.Model):
    # Not indexed alone: the leading column of the (gpu, time) index serves it.
    gpu = models.ForeignKey(
        "scheduling.GPU", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    start = models.DateTimeField(help_text="Start of the bucket.")
    task = _holder("scheduling.Task")
    tenant = _holder("tenants.Tenant")
    samples = models.PositiveIntegerField(help_text="Raw samples summarised.")
    simulated = models.BooleanField(default=False)
    util_gpu_min = models.FloatField(null=True)
    util_gpu_mean = models.FloatField(null=True)
    util_gpu_max = models.FloatField(null=True)
    util_memory_min = models.FloatField(null=True)
    util_memory_mean = models.FloatField(null=True)
    util_memory_max = models.FloatField(null=True)
    memory_used_mb_min = models.FloatField(null=True)
    memory_used_mb_mean = models.FloatField(null=True)
    memory_used_mb_max = models.FloatField(null=True)
    temperature_c_min = models.FloatField(null=True)
    temperature_c_mean = models.FloatField(null=True)
    temperature_c_max = models.FloatField(null=True)
    power_w_min = models.FloatField(null=True)
    power_w_mean = models.FloatField(null=True)
    power_w_max = models.FloatField(null=True)
    sm_clock_mhz_min = models.FloatField(null=True)
    sm_clock_mhz_mean = models.FloatField(null=True)
    sm_clock_mhz_max = models.FloatField(null=True)
    fan_pct_min = models.FloatField(null=True)
    fan_pct_mean = models.FloatField(null=True)
    fan_pct_max = models.FloatField(null=True)
    ecc_uncorrected_max = models.BigIntegerField(null=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} from {self.start:%Y-%m-%d %H:%M}"


class GpuRollupMinute(GpuRollup):
    class Meta:
        indexes = [
            models.Index(fields=["gpu", "start"], name="rollupmin_gpu_start"),
            BrinIndex(fields=["start"], name="rollupmin_start_brin"),
        ]


class GpuRollupHour(GpuRollup):
    class Meta:
        indexes = [
            models.Index(fields=["gpu", "start"], name="rolluphour_gpu_start"),
            BrinIndex(fields=["start"], name="rolluphour_start_brin"),
        ]


class FaultKind(models.TextChoices):
    TEMPERATURE = "temperature", "temperature"
    XID = "xid", "XID"
    LOST = "lost", "lost GPU"
    CLEAR = "clear", "clear injected faults"


class SimulatedFault(models.Model):
    """A fault a test or an operator injects into a simulated GPU (``manage.py gpu_fault``).

    The node agent's sampler applies pending faults at its next tick and marks them applied;
    real (NVML) GPUs ignore them.
    """

    # Not indexed alone: the leading column of the (gpu, time) index serves it.
    gpu = models.ForeignKey(
        "scheduling.GPU", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    kind = models.CharField(max_length=16, choices=FaultKind.choices)
    value = models.IntegerField(null=True, blank=True, help_text="Degrees C, or the XID.")
    created_at = models.DateTimeField(default=timezone.now)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["gpu"],
                condition=models.Q(applied_at__isnull=True),
                name="simfault_pending",
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.value or ''} on GPU {self.gpu_id}"


class XidRecord(models.Model):
    """Every XID a node agent heard, and what the platform did about it."""

    gpu = models.ForeignKey(
        "scheduling.GPU", on_delete=models.CASCADE, related_name="xids", verbose_name="GPU"
    )
    xid = models.PositiveIntegerField(verbose_name="XID")
    at = models.DateTimeField(db_index=True)
    task = models.ForeignKey(
        "scheduling.Task", on_delete=models.SET_NULL, null=True, blank=True, related_name="xids"
    )
    action = models.CharField(max_length=16, help_text="drain, fail_task, ignore or none.")
    simulated = models.BooleanField(default=False)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"XID {self.xid} on GPU {self.gpu_id}"
