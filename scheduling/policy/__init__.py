"""The pure scheduling policy: ``schedule(snapshot, settings) -> Decision``. No Django here."""

from scheduling.policy.core import schedule, schedule_fifo
from scheduling.policy.model import (
    BATCH,
    ONLINE,
    Decision,
    GpuView,
    Limits,
    PendingView,
    Placement,
    PolicySettings,
    Preemption,
    RunningView,
    Snapshot,
    TenantView,
    occupied,
)

__all__ = [
    "BATCH",
    "ONLINE",
    "Decision",
    "GpuView",
    "Limits",
    "PendingView",
    "Placement",
    "PolicySettings",
    "Preemption",
    "RunningView",
    "Snapshot",
    "TenantView",
    "occupied",
    "schedule",
    "schedule_fifo",
]
