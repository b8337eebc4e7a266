"""Several policies over one trace, compared and shown as a table or a plot."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from replay.common import POLICIES, PolicyFn
from replay.results import ReplayResult
from replay.simulator import simulate
from replay.trace import TraceJob

# --- comparing and reporting ----------------------------------------------------------------


def run_policies(
    jobs: Sequence[TraceJob], policies: Iterable[str | PolicyFn], **options: Any
) -> dict[str, Any]:
    """Replay ``jobs`` under each policy. Returns a comparison dict (see ``compare``)."""
    results: dict[str, ReplayResult] = {}
    for policy in policies:
        result = simulate(jobs, policy=policy, **options)
        results[result.policy] = result
    summaries = {name: result.summary() for name, result in results.items()}
    ratios: dict[str, float | None] = {}
    if "ours" in summaries and "fifo" in summaries:
        for key in ("avg_jct_s", "p99_wait_s", "max_wait_s"):
            ratios[key] = _ratio(summaries["ours"][key], summaries["fifo"][key])
    return {"summaries": summaries, "ratios": ratios, "results": results}


def compare(jobs: Sequence[TraceJob], **options: Any) -> dict[str, Any]:
    """Replay ``jobs`` under "ours" and "fifo" (same options as ``simulate``).

    Returns ``{"summaries": {policy: summary}, "ratios": {metric: ours / fifo}, "results":
    {policy: ReplayResult}}``; everything but "results" is plain JSON-able data.
    """
    return run_policies(jobs, POLICIES, **options)


def _ratio(ours: float | None, fifo: float | None) -> float | None:
    if ours is None or not fifo:
        return None
    return ours / fifo


# (label, summary key, how to show it); "count" rows get no ratio.
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "count"),
    ("avg JCT", "avg_jct_s", "s"),
    ("p50 JCT", "p50_jct_s", "s"),
    ("p99 JCT", "p99_jct_s", "s"),
    ("avg wait", "avg_wait_s", "s"),
    ("p50 wait", "p50_wait_s", "s"),
    ("p99 wait", "p99_wait_s", "s"),
    ("max wait", "max_wait_s", "s"),
    ("multi-GPU jobs", "multi_gpu_jobs", "count"),
    ("multi-GPU avg JCT", "avg_multi_gpu_jct_s", "s"),
    ("multi-GPU p99 JCT", "p99_multi_gpu_jct_s", "s"),
    ("multi-GPU avg wait", "avg_multi_gpu_wait_s", "s"),
    ("multi-GPU p99 wait", "p99_multi_gpu_wait_s", "s"),
    ("makespan", "makespan_s", "s"),
    ("GPU utilisation", "gpu_utilisation", "pct"),
    ("preemptions", "preemptions", "int"),
    ("lost GPU-hours", "lost_gpu_hours", "float"),
    ("jobs that waited on arrival", "forecast_jobs", "count"),
    ("  of them no estimate (unknown, later)", "forecast_unknown", "count"),
    ("  expected start error p50", "p50_forecast_error_s", "s"),
    ("  expected start error p90", "p90_forecast_error_s", "s"),
    ("policy passes", "policy_passes", "int"),
    ("policy time total", "policy_time_total_s", "ms"),
    ("policy time max/pass", "policy_time_max_s", "ms"),
)


def format_table(comparison: dict[str, Any]) -> str:
    """A text table: one row per metric, one column per policy, and ours/fifo when both ran."""
    summaries: dict[str, dict[str, Any]] = comparison["summaries"]
    names = list(summaries)
    with_ratio = "ours" in summaries and "fifo" in summaries
    rows: list[list[str]] = [["metric", *names, *(["ours/fifo"] if with_ratio else [])]]

    def add(label: str, values: list[Any], kind: str) -> None:
        row = [label, *(_show(value, kind) for value in values)]
        if with_ratio:
            ours, fifo = values[names.index("ours")], values[names.index("fifo")]
            ratio = None if kind == "count" else _ratio(ours, fifo)
            row.append("-" if ratio is None else f"{ratio:.2f}x")
        rows.append(row)

    for label, key, kind in _ROWS:
        add(label, [summaries[name].get(key) for name in names], kind)
    tenants = sorted({t for s in summaries.values() for t in s.get("tenant_gpu_share", {})})
    for tenant in tenants:
        values = [summaries[name]["tenant_gpu_share"].get(tenant) for name in names]
        add(f"GPU-hours share {tenant}", values, "pct")
    classes = sorted({c for s in summaries.values() for c in s.get("class_gpu_share", {})})
    for name_ in classes:
        values = [summaries[name]["class_gpu_share"].get(name_) for name in names]
        add(f"GPU-hours share {name_}", values, "pct")
    for name_ in classes:
        values = [summaries[name]["class_share_wait_max_s"].get(name_) for name in names]
        add(f"longest wait within share, {name_}", values, "s")

    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _show(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "s":
        return f"{round(value):,}s"
    if kind in ("int", "count"):
        return f"{value:,}"
    if kind == "pct":
        return f"{value * 100:.1f}%"
    if kind == "ms":
        return f"{value * 1000:,.1f} ms"
    return f"{value:,.2f}"


def plot(comparison: dict[str, Any], path: str | Path) -> None:
    """Write a PNG: CDF of wait per policy (log x) and GPUs busy over time per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results: dict[str, ReplayResult] = comparison["results"]
    figure, (cdf, busy) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, result in results.items():
        # A log axis has no zero: waits under a second are drawn at one second.
        waits = sorted(max(1.0, r.wait_s) for r in result.records)
        fractions = [(i + 1) / len(waits) for i in range(len(waits))]
        cdf.step(waits, fractions, where="post", label=name)
        times = [t / 3600 for t, _ in result.timeline]
        busy.step(times, [b for _, b in result.timeline], where="post", label=name, linewidth=0.8)
    cdf.set_xscale("log")
    cdf.set_xlabel("wait (s, log; under 1 s drawn at 1 s)")
    cdf.set_ylabel("fraction of jobs")
    cdf.set_title("Wait CDF")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend()
    if results:
        total = max(result.total_gpus for result in results.values())
        busy.axhline(total, color="grey", linestyle="--", linewidth=0.8, label="capacity")
    busy.set_xlabel("time (h)")
    busy.set_ylabel("GPUs busy")
    busy.set_title("GPUs busy over time")
    busy.grid(True, alpha=0.3)
    busy.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
