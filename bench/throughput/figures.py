"""The throughput benchmark's settings, and its figures from recorded timestamps (pure)."""

from __future__ import annotations

import itertools
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.common import percentile

NODES, GPUS_PER_NODE = 4, 8
SLOTS = NODES * GPUS_PER_NODE
POOL = "bench-throughput"
TASKS, BATCH = 2_000, 1_000  # what the peers run, as ours without quotas: 2 submissions
CLIENTS = 8
API_REQUESTS = 250  # per client (API_LIMIT_S stops them sooner at today's speed)
STAMP = "date +%s.%N"  # the latency probe: its process writes the time it runs
HOLD = "sleep 600"  # keeps a GPU busy while a burst queues (cancelled after it)
LATENCY_TASKS, LATENCY_MIN = 30, 8  # as many as LATENCY_LIMIT_S allows, at least LATENCY_MIN
WARMUP = 3
# Time limits (seconds) that keep the whole benchmark near four minutes at today's speed.
STARTUP_LIMIT_S = 90.0
LATENCY_LIMIT_S = 20.0
API_LIMIT_S = 6.0
DRAIN_LIMIT_S = 10.0  # for the API phase's tasks, before the rest are cancelled
THROUGHPUT_LIMIT_S = 50.0
IDLE_S = 10.0  # what an idle estate costs is measured over this long
PEER_LATENCY_LIMIT_S = 12.0
PEER_LATENCY_MIN = 5
SLURM_THROUGHPUT_LIMIT_S = 30.0
TSP_THROUGHPUT_LIMIT_S = 60.0
# pg_stat_activity: sessions live for seconds at least; each count costs PostgreSQL ~1 ms,
# which this bench would charge to the platform.
SAMPLE_S = 0.25
POLL_S = 0.05
THROUGHPUT_POLL_S = 0.2  # near the end (only finds it: the figure comes from finished_at)
# Targets from issue 9, raised by issue 41 for the default line (several tenants under quotas):
# 300 tasks/s (issue 9 asked 200 of one tenant), submit to running p50 40 ms and p99 100 ms
# (issue 9: 60 and 250), and 4 ms of CPU per task.
TARGET_PER_S = 300.0
TARGET_CPU_MS = 4.0
TARGET_BUSY = 0.95  # "GPUs never idle while a task that fits is pending", as a mean
TARGET_REUSE_S = 0.100  # "a finished task's GPUs are offered again within tens of milliseconds"
TARGET_P50_S, TARGET_P99_S = 0.040, 0.100
TARGET_API_PER_S = 300.0
TARGET_BATCH_PER_S = 2_000.0

HOSTNAME = socket.gethostname().split(".")[0]


# --- Figures from recorded timestamps (pure) --------------------------------------------------


def mean_busy(intervals: Sequence[tuple[float, float | None]], start: float, end: float) -> float:
    """Mean number of intervals open over [start, end]; an interval still open (None) counts
    up to ``end``."""
    if end <= start:
        return 0.0
    covered = 0.0
    for began, ended in intervals:
        ended = end if ended is None else ended
        covered += max(0.0, min(ended, end) - max(began, start))
    return covered / (end - start)


def reuse_gaps(
    allocations: Sequence[tuple[int, float, float | None]], start: float, end: float
) -> list[float]:
    """Seconds each GPU stood free between one allocation's release and the next one's start
    (a freed GPU "offered again"), for the next allocations that started within [start, end]:
    ``allocations`` are (GPU id, started, released or None)."""
    by_gpu: dict[int, list[tuple[float, float | None]]] = {}
    for gpu, began, ended in allocations:
        by_gpu.setdefault(gpu, []).append((began, ended))
    gaps = []
    for spans in by_gpu.values():
        spans.sort(key=lambda span: span[0])
        for (_, released), (began, _) in itertools.pairwise(spans):
            if released is not None and start <= began <= end:
                gaps.append(max(0.0, began - released))
    return gaps


def gpu_spans(
    allocations: Sequence[tuple[int, float, float | None]],
) -> list[tuple[int, float, float | None]]:
    """Each GPU's busy spans: its allocations (GPU id, started, released or None) merged where
    they overlap, as tasks sharing a card by memory do, so that a shared GPU counts once and is
    free only once its last holder has left."""
    by_gpu: dict[int, list[tuple[float, float | None]]] = {}
    for gpu, began, ended in allocations:
        by_gpu.setdefault(gpu, []).append((began, ended))
    merged: list[tuple[int, float, float | None]] = []
    for gpu, spans in by_gpu.items():
        spans.sort(key=lambda span: span[0])
        began, ended = spans[0]
        for next_began, next_ended in spans[1:]:
            if ended is None or next_began < ended:  # overlaps: one busy span
                ended = None if ended is None or next_ended is None else max(ended, next_ended)
                continue
            merged.append((gpu, began, ended))
            began, ended = next_began, next_ended
        merged.append((gpu, began, ended))
    return merged


@dataclass
class Completion:
    """How many of ``total`` finished, and at what rate."""

    total: int
    finished: int
    elapsed_s: float  # first submit -> last finish, or -> the time limit when not all finished
    limited: bool

    @property
    def per_s(self) -> float:
        return self.finished / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def describe(self) -> str:
        rate = f"{self.per_s:,.1f}/s"
        if self.limited:
            done = f"{self.finished:,} of {self.total:,}"
            return f"{rate} ({done} finished in {self.elapsed_s:.0f} s)"
        return f"{rate} ({self.total:,} in {self.elapsed_s:.1f} s)"


def completion(first_submit: float, finishes: Sequence[float], total: int,
               stopped: float) -> Completion:  # fmt: skip
    """From the first submission to the last finish; a run stopped at its time limit before all
    finished is measured to ``stopped``."""
    if len(finishes) >= total:
        return Completion(total, len(finishes), max(finishes) - first_submit, limited=False)
    # What finished while the figures were being read came after the limit.
    in_time = sum(1 for moment in finishes if moment <= stopped)
    return Completion(total, in_time, stopped - first_submit, limited=True)


def parse_stamp(text: str) -> float | None:
    """The first line ``date +%s.%N`` wrote, as seconds since the epoch."""
    for line in text.splitlines():
        try:
            return float(line.strip())
        except ValueError:
            continue
    return None


@dataclass
class Latency:
    samples: list[float] = field(default_factory=list)
    lost: int = 0  # probes whose stamp never came

    def p(self, q: float) -> float | None:
        return percentile(self.samples, q) if self.samples else None

    def describe(self) -> str:
        if not self.samples:
            return "n/a"
        return f"{self.p(50) * 1000:,.1f} / {self.p(99) * 1000:,.1f} ms ({len(self.samples)} runs)"


def ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "-"
    value = ours / theirs
    return f"{value:,.3f}x" if value < 10 else f"{value:,.0f}x"


def estate_yaml() -> str:
    nodes = "".join(
        f"  - name: bench-tput-{n}\n    pool: {POOL}\n"
        f"    simulate: {{model: NVIDIA GeForce RTX 4090, memory: 24Gi, count: {GPUS_PER_NODE}}}\n"
        for n in range(1, NODES + 1)
    )
    # The heartbeat is the default (configs/scheduler.yaml, 5 s), as `make run` has it: every
    # heartbeat reconciles now and then and checks GPU memory, and four agents beating every
    # second, as this benchmark had them, cost about a tenth of this 2-core machine.
    return f"pools:\n  - name: default\n  - name: {POOL}\nnodes:\n{nodes}"


# What the scheduler logs of each pass that placed, preempted or failed a task (scheduler.py).
PASS_LINE = re.compile(r"pass: (\d+) placed, .* ([\d.]+) ms$")


def pass_times(log: str) -> list[tuple[int, float]]:
    """(tasks placed, milliseconds inside the pass) of each pass the scheduler logged."""
    return [
        (int(match[1]), float(match[2]))
        for line in log.splitlines()
        if (match := PASS_LINE.search(line))
    ]
