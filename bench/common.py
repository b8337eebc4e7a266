"""What every benchmark shares: timing statistics, plain-text tables and target lines."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(len(ordered) * q / 100))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, left: int = 1) -> str:
    """Columns padded to their widest cell: the first ``left`` left-aligned, the rest right."""
    cells = [[str(c) for c in header], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[col]) for row in cells) for col in range(len(header))]
    lines = []
    for index, row in enumerate(cells):
        parts = [
            cell.ljust(width) if col < left else cell.rjust(width)
            for col, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def verdict(met: bool | None) -> str:
    if met is None:
        return "not measured"
    return "met" if met else "NOT met"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def clear_tasks(*extra_tables: str) -> None:
    """Empty every task table (and ``extra_tables``) between benchmark rounds."""
    from django.db import connection

    from scheduling.models import Allocation, SchedulerState, Task, TaskAttempt, TaskEvent

    tables = [
        Allocation._meta.db_table,
        TaskEvent._meta.db_table,
        TaskAttempt._meta.db_table,
        Task.depends_on.through._meta.db_table,
        Task._meta.db_table,
        SchedulerState._meta.db_table,
        *extra_tables,
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")  # noqa: S608 - model names
