"""Printing: aligned tables and key/value blocks for people, JSON or YAML for scripts."""

from __future__ import annotations

import json
import shutil
import sys
from datetime import UTC, datetime
from typing import Any

from gpuctl import EXIT_USAGE
from gpuctl.client import CliError

FORMATS = ("table", "wide", "json", "yaml")
NONE = "-"


def dump(data: Any, fmt: str) -> str:
    """The API's data as JSON or YAML text (ends with a newline)."""
    if fmt == "yaml":
        yaml = yaml_module()
        if yaml is None:
            raise CliError(
                "-o yaml needs PyYAML, which is not installed: pip install pyyaml, or use -o json",
                EXIT_USAGE,
            )
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def yaml_module():
    try:
        import yaml
    except ImportError:
        return None
    return yaml


def emit(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stdout.flush()


def note(text: str) -> None:
    """A remark for the person at the terminal, kept off stdout so pipes stay clean."""
    print(text, file=sys.stderr)


def table(headers: list[str], rows: list[list[Any]], *, fit: bool = True) -> str:
    """Columns aligned with two spaces; the last column is cut to the terminal's width when
    stdout is a terminal (``fit``), with an ellipsis."""
    cells = [[cell_text(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    limit = shutil.get_terminal_size((200, 24)).columns if fit and sys.stdout.isatty() else None
    lines = []
    for row in [headers, *cells]:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        line = "  ".join([*padded, row[-1]]).rstrip()
        if limit and len(line) > limit:
            line = line[: max(limit - 1, 0)] + "…"
        lines.append(line)
    return "\n".join(lines) + "\n"


def fields(pairs: list[tuple[str, Any]]) -> str:
    """``Key:  value`` lines, values aligned; multi-line values indented under their key."""
    width = max((len(k) for k, _ in pairs), default=0) + 2
    lines = []
    for key, value in pairs:
        text = cell_text(value).splitlines() or [""]
        lines.append(f"{key + ':':<{width}}{text[0]}".rstrip())
        lines.extend(f"{'':<{width}}{rest}".rstrip() for rest in text[1:])
    return "\n".join(lines) + "\n"


def cell_text(value: Any) -> str:
    if value is None or value == "":
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(cell_text(v) for v in value) or NONE
    return str(value)


# --- Values --------------------------------------------------------------------------------------


def parse_time(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


def duration(seconds: float | None) -> str:
    """Compact like kubectl's AGE: 45s, 12m, 3h20m, 2d4h."""
    if seconds is None:
        return NONE
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours and days < 10 else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs and minutes < 10 else f"{minutes}m"
    return f"{secs}s"


def age(value: Any) -> str:
    moment = parse_time(value)
    return duration((now() - moment).total_seconds()) if moment else NONE


def between(start: Any, end: Any) -> str:
    """Time from start to end (or to now if end is empty)."""
    began = parse_time(start)
    if began is None:
        return NONE
    ended = parse_time(end) or now()
    return duration((ended - began).total_seconds())


def local_time(value: Any) -> str:
    """``2025-03-01 14:02:11 (5m ago)`` in the local time zone."""
    moment = parse_time(value)
    if moment is None:
        return NONE
    shown = moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    delta = (now() - moment).total_seconds()
    relative = f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"
    return f"{shown} ({relative})"


def memory(mb: Any) -> str:
    if mb is None or mb == "":
        return NONE
    mb = float(mb)
    if mb >= 1024:
        gib = mb / 1024
        return f"{gib:.0f}Gi" if gib == int(gib) else f"{gib:.1f}Gi"
    return f"{mb:.0f}Mi"


def number(value: Any) -> str:
    if value is None:
        return NONE
    if isinstance(value, float):
        return f"{value:g}" if value == int(value) else f"{value:.3f}".rstrip("0")
    return str(value)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def indent(text: str, prefix: str = "  ") -> str:
    return "".join(prefix + line if line.strip() else line for line in text.splitlines(True))
