"""A recorded GPU workload: its jobs as the replay reads them from the trace's CSV."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.common import QOS_CLASSES, TRACE_COLUMNS

# --- the trace ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    tenant: str
    qos: str
    submit_s: float
    duration_s: float
    num_gpus: int
    gpu_milli: int

    @property
    def task_class(self) -> str:
        return QOS_CLASSES[self.qos][0]

    @property
    def priority(self) -> int:
        return QOS_CLASSES[self.qos][1]

    @property
    def preemptible(self) -> bool:
        return QOS_CLASSES[self.qos][2]

    @property
    def fractional(self) -> bool:
        return self.num_gpus == 1 and self.gpu_milli < 1000

    @property
    def gpu_weight(self) -> float:
        """GPUs this job keeps busy: a fractional job counts its share of one card."""
        return self.gpu_milli / 1000 if self.fractional else float(self.num_gpus)

    def gpu_memory_mb(self, node_gpu_memory_mb: int) -> int | None:
        """Per-GPU memory request; None asks for whole GPUs (exclusive)."""
        if not self.fractional:
            return None
        return max(1, self.gpu_milli * node_gpu_memory_mb // 1000)


def load_trace(path: str | Path, *, limit: int | None = None) -> list[TraceJob]:
    """Read a trace CSV (columns ``TRACE_COLUMNS``; extra columns such as ``status`` ignored).

    Raises ValueError naming the file, the line and the column of the first bad value.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    path = Path(path)
    jobs: list[TraceJob] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
        for row in reader:
            if limit is not None and len(jobs) >= limit:
                break
            jobs.append(_parse_row(row, where=f"{path}: line {reader.line_num}"))
    return jobs


def _parse_row(row: dict[str, Any], *, where: str) -> TraceJob:
    def text(column: str) -> str:
        value = (row.get(column) or "").strip()
        if not value:
            raise ValueError(f"{where}, column {column}: empty")
        return value

    def number(column: str, *, minimum: float, integer: bool = False) -> float:
        raw = text(column)
        try:
            value = int(raw) if integer else float(raw)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise ValueError(f"{where}, column {column}: expected {kind}, got {raw!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise ValueError(f"{where}, column {column}: must be at least {minimum}, got {raw!r}")
        return value

    qos = text("qos")
    if qos not in QOS_CLASSES:
        known = ", ".join(QOS_CLASSES)
        raise ValueError(f"{where}, column qos: unknown QoS {qos!r} (expected one of {known})")
    gpu_milli = int(number("gpu_milli", minimum=1, integer=True))
    if gpu_milli > 1000:
        raise ValueError(f"{where}, column gpu_milli: must be at most 1000, got {gpu_milli}")
    duration = number("duration_s", minimum=0)
    if duration <= 0:
        raise ValueError(f"{where}, column duration_s: must be more than zero, got {duration}")
    return TraceJob(
        job_id=text("job_id"),
        tenant=text("tenant"),
        qos=qos,
        submit_s=number("submit_time_s", minimum=0),
        duration_s=duration,
        num_gpus=int(number("num_gpus", minimum=1, integer=True)),
        gpu_milli=gpu_milli,
    )
