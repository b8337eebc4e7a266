"""What a replay measured: each job's record and the run's summary figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduling.policy.model import (
    BATCH,
    ONLINE,
)

# --- results --------------------------------------------------------------------------------


@dataclass(slots=True)
class JobRecord:
    job_id: str
    tenant: str
    qos: str
    submit_s: float
    duration_s: float
    gpus: int
    gpu_milli: int
    first_start_s: float | None = None
    end_s: float | None = None
    preemptions: int = 0
    # The start a pass told it to expect when it arrived and waited (replay/forecasting.py),
    # and on what basis; "later" or "unknown" when it got none; None when it started at once.
    expected_start_s: float | None = None
    forecast_basis: str | None = None

    @property
    def forecast_error_s(self) -> float | None:
        """How far its real first start fell from the start it was told to expect."""
        if self.expected_start_s is None or self.first_start_s is None:
            return None
        return abs(self.first_start_s - self.expected_start_s)

    @property
    def jct_s(self) -> float:
        if self.end_s is None:
            raise ValueError(f"job {self.job_id} has not finished")
        return self.end_s - self.submit_s

    @property
    def wait_s(self) -> float:
        """All time not making progress: queueing plus work lost to preemption."""
        return self.jct_s - self.duration_s


@dataclass(slots=True)
class ReplayResult:
    policy: str
    total_gpus: int
    records: list[JobRecord]
    timeline: list[tuple[float, float]]  # (time, GPUs busy from then on), fractional jobs weighted
    busy_gpu_s: float = 0.0  # including work later lost to preemption
    lost_gpu_s: float = 0.0
    tenant_gpu_s: dict[str, float] = field(default_factory=dict)
    class_gpu_s: dict[str, float] = field(default_factory=lambda: {ONLINE: 0.0, BATCH: 0.0})
    # Per class, the longest a job of it waited while it would have fitted within its class's
    # unused guaranteed share (``_track_share_waits``): what the class guarantee bounds.
    class_share_wait_max_s: dict[str, float] = field(
        default_factory=lambda: {ONLINE: 0.0, BATCH: 0.0}
    )
    preemptions: int = 0
    # (time, victim job id, job id it made room for, the policy's reason)
    preemption_log: list[tuple[float, str, str, str]] = field(default_factory=list)
    passes: int = 0
    policy_time_total_s: float = 0.0
    policy_time_max_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        done = self.records
        jcts = [r.jct_s for r in done]
        waits = [r.wait_s for r in done]
        multi = [r for r in done if r.gpus > 1]
        start = min((r.submit_s for r in done), default=0.0)
        end = max((r.end_s or 0.0 for r in done), default=0.0)
        makespan = end - start
        capacity = self.total_gpus * makespan
        tenant_total = sum(self.tenant_gpu_s.values())
        return {
            "jobs": len(done),
            **_stats("jct", jcts),
            **_stats("wait", waits),
            "multi_gpu_jobs": len(multi),
            **_stats("multi_gpu_jct", [r.jct_s for r in multi]),
            **_stats("multi_gpu_wait", [r.wait_s for r in multi]),
            "max_wait_s": max(waits, default=None),
            "makespan_s": makespan,
            "gpu_utilisation": self.busy_gpu_s / capacity if capacity else None,
            "preemptions": self.preemptions,
            "lost_gpu_hours": self.lost_gpu_s / 3600,
            "tenant_gpu_share": {
                tenant: (seconds / tenant_total if tenant_total else 0.0)
                for tenant, seconds in sorted(self.tenant_gpu_s.items())
            },
            "class_gpu_share": {
                name: (seconds / tenant_total if tenant_total else 0.0)
                for name, seconds in sorted(self.class_gpu_s.items())
            },
            "class_share_wait_max_s": dict(sorted(self.class_share_wait_max_s.items())),
            **_forecast_figures(done),
            "policy_passes": self.passes,
            "policy_time_total_s": self.policy_time_total_s,
            "policy_time_max_s": self.policy_time_max_s,
        }


def _forecast_figures(records: Sequence[JobRecord]) -> dict[str, Any]:
    """The expected start against the real one, over the jobs that waited on arrival."""
    waited = [r for r in records if r.forecast_basis is not None]
    errors = sorted(e for r in waited if (e := r.forecast_error_s) is not None)
    return {
        "forecast_jobs": len(waited),
        "forecast_unknown": len(waited) - len(errors),
        "p50_forecast_error_s": percentile(errors, 50),
        "p90_forecast_error_s": percentile(errors, 90),
    }


def _stats(name: str, values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {
        f"avg_{name}_s": sum(ordered) / len(ordered) if ordered else None,
        f"p50_{name}_s": percentile(ordered, 50),
        f"p99_{name}_s": percentile(ordered, 99),
    }


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The value at rank ``floor(n * q / 100)`` of sorted values (no interpolation).

    The same definition as the reference replay in the traces README, so that the strict FIFO
    figures can be checked against it (its p99 wait is the 1,981st of 2,000 waits).
    """
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]
