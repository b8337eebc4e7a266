"""django-q2 task functions for telemetry: they only dispatch and return quickly."""

from __future__ import annotations

from telemetry import alerts, jobs


def rollup() -> dict:
    """Every minute: minute and hour rollups, then the idle-GPU check that reads them."""
    result = jobs.rollup()
    result.update(alerts.check_idle())
    return result


def retention() -> dict:
    """Every 10 minutes: delete what is past its retention window."""
    return jobs.retention()
