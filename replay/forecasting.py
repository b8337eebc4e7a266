"""How good is the expected start a pass gives a waiting task? Measured on the replay.

When a job arrives and the pass at its instant leaves it waiting, it gets the estimate a
scheduling pass gives it in production: ``policy.forecast.forecast`` on that pass's snapshot,
line and placements, with runtimes from the history the simulated platform has seen so far
(the runtimes of the jobs that have ended, the tenant's else everyone's, as
``scheduling.forecasts`` reads them from succeeded tasks; a trace has no command to match on,
and no timeouts). The job's real first start, once the replay is over, gives the error.

Pure, like the simulator: no Django.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from replay.results import JobRecord
from scheduling.policy.forecast import (
    BASIS_PLATFORM,
    BASIS_TENANT,
    FORECAST_LIMIT,
    Runtime,
    forecast,
)
from scheduling.policy.model import Decision, Snapshot

QUANTILES = (0.1, 0.5, 0.9)  # as scheduling.forecasts: a short, a typical and a long runtime
# What a job that waited on arrival got: an estimate (its basis, BASES), or none of these.
LATER = "later"  # beyond the first FORECAST_LIMIT in line
UNKNOWN = "unknown"  # nothing to go by, or not in line for GPUs


def _quantiles(ordered: list[float], basis: str) -> Runtime | None:
    if not ordered:
        return None
    last = len(ordered) - 1
    low, mid, high = (ordered[round(q * last)] for q in QUANTILES)
    return Runtime(low, mid, high, basis)


class History:
    """Runtimes of the jobs that ended, per tenant and for the platform, kept sorted."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, list[float]] = {}
        self.everyone: list[float] = []
        self._cache: dict[str | None, Runtime | None] = {}

    def ended(self, tenant: str, seconds: float) -> None:
        bisect.insort(self.by_tenant.setdefault(tenant, []), seconds)
        bisect.insort(self.everyone, seconds)
        self._cache.pop(tenant, None)
        self._cache.pop(None, None)

    def runtime(self, tenant: str) -> Runtime | None:
        if tenant not in self._cache:
            self._cache[tenant] = _quantiles(self.by_tenant.get(tenant, []), BASIS_TENANT)
        if self._cache[tenant] is not None:
            return self._cache[tenant]
        if None not in self._cache:
            self._cache[None] = _quantiles(self.everyone, BASIS_PLATFORM)
        return self._cache[None]


def estimate_arrivals(
    snapshot: Snapshot,
    decision: Decision,
    arrived: Sequence[int],
    history: History,
    records: Sequence[JobRecord],
) -> None:
    """Record on each job of ``arrived`` (task ids, 1-based positions in ``records``) that the
    pass ``decision`` on ``snapshot`` left waiting the start it was told to expect."""
    waiting = [task_id for task_id in arrived if records[task_id - 1].first_start_s is None]
    if not waiting:
        return
    place = {task_id: n for n, task_id in enumerate(decision.line)}
    tenant_of = {task.id: task.tenant for task in (*snapshot.running, *snapshot.pending)}
    # What the forecast reads: the running tasks, the placed ones and the first in line.
    wanted = {
        *(task.id for task in snapshot.running),
        *(placement.task_id for placement in decision.placements),
        *decision.line[:FORECAST_LIMIT],
    }
    runtimes = {
        task_id: runtime
        for task_id in wanted
        if task_id in tenant_of and (runtime := history.runtime(tenant_of[task_id])) is not None
    }
    estimates = forecast(snapshot, decision.line, runtimes, placements=decision.placements)
    for task_id in waiting:
        record = records[task_id - 1]
        estimate = estimates.get(task_id)
        if estimate is not None and estimate.at is not None:
            record.expected_start_s, record.forecast_basis = estimate.at, estimate.basis
        elif task_id in place and place[task_id] >= FORECAST_LIMIT:
            record.forecast_basis = LATER
        else:
            record.forecast_basis = UNKNOWN
