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
    "schedule",
    "schedule_fifo",
]
