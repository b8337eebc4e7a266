"""GPU samples from the past: what a reconnecting page fills its gap with, the time-range
picker's series, the tiles' first values. Telemetry keeps them; without it there are none."""

from __future__ import annotations

from collections.abc import Collection


def samples_since(*, since: float, gpu_ids: Collection[int] | None) -> list[list]:
    """Rows in live.events.SAMPLE_FIELDS order taken after ``since`` (``gpu_ids`` None: all)."""
    return []


def latest_samples() -> dict[int, dict]:
    """Each GPU's newest sample, by GPU id."""
    return {}


def series(*, node, start: float, end: float) -> dict:
    """The node's GPUs over [start, end]: ``gpus`` (ids), ``t`` (epoch seconds), and per GPU
    ``util`` and ``mem`` (percent) aligned with ``t``, plus the node's ``power`` total (W)."""
    return {"gpus": [], "t": [], "util": {}, "mem": {}, "power": []}
