"""docs/benchmarks.md: one run's figures against their targets, written at the end of
``bench/run.py`` (``make bench``). The file holds the latest run only; earlier runs are in git.

Each benchmark records its figures with ``bench.common.target`` as it judges them; this module
only lays them out, with what the run ran on.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import ROOT, Target, verdict

DEFAULT_PATH = ROOT / "docs" / "benchmarks.md"

INTRO = """\
# Benchmarks

This file is written by `make bench` (`bench/run.py`) at the end of a run, and the next run
replaces it: it holds the figures of one run against their targets, not a history (earlier runs
are in git). A benchmark never fails on a timing. The targets are set for this project's 2-core
machine, where the platform shares the CPUs with its own tasks and PostgreSQL, so timings move
with the machine and with whatever else it runs (the load average below says how busy it was);
how to read them is in [development.md](development.md#benchmarks), and how each benchmark
measures is in its module's docstring under `bench/`.
"""


@dataclass(frozen=True)
class Machine:
    """What a run ran on, and when."""

    cores: int | None
    cpu_model: str
    memory: str
    python: str
    postgres: str
    started: str  # UTC, to the minute
    commit: str
    load: str  # load average when the run started


@dataclass
class BenchResult:
    """One benchmark of a run: what it measures, how it ended, the targets it judged."""

    name: str
    summary: str  # what it measures: the first line of its docstring
    targets: list[Target] = field(default_factory=list)
    outcome: str = "ran"  # "ran", "failed", or "skipped: <why>"
    seconds: float | None = None


def summary(module: object) -> str:
    """The first paragraph of a benchmark module's docstring, as one line."""
    doc = (getattr(module, "__doc__", None) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def outcome(figures: object) -> str:
    """How a benchmark that returned ``figures`` ended: a whole benchmark that could not run
    here returns ``{"skipped": why}``."""
    if isinstance(figures, dict) and isinstance(figures.get("skipped"), str):
        return f"skipped: {figures['skipped']}"
    return "ran"


def machine(*, postgres: str = "not used") -> Machine:
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return Machine(
        cores=os.cpu_count(),
        cpu_model=_cpu_model(),
        memory=_memory(),
        python=platform.python_version(),
        postgres=postgres,
        started=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        commit=_commit(),
        load=load,
    )


def render(results: Sequence[BenchResult], run_on: Machine, *, note: str = "") -> str:
    lines = [INTRO]
    if note:
        lines += [note.strip(), ""]
    lines += [
        "## The run",
        "",
        "| | |",
        "|---|---|",
        f"| cores | {'unknown' if run_on.cores is None else run_on.cores} |",
        f"| CPU | {_cell(run_on.cpu_model)} |",
        f"| memory | {_cell(run_on.memory)} |",
        f"| started | {_cell(run_on.started)} |",
        f"| commit | {_cell(run_on.commit)} |",
        f"| Python | {_cell(run_on.python)} |",
        f"| PostgreSQL | {_cell(run_on.postgres)} |",
        f"| load average at the start (1, 5, 15 min) | {_cell(run_on.load)} |",
        "",
        "## What each benchmark measures",
        "",
    ]
    for result in results:
        took = "" if result.seconds is None else f" ({result.seconds:,.0f} s)"
        ended = "" if result.outcome == "ran" else f" **{_cell(result.outcome)}**"
        lines.append(f"- `{result.name}`: {_cell(result.summary)}{took}{ended}")
    lines += [
        "",
        "## Figures",
        "",
        "| benchmark | figure | measured | target | verdict |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        if not result.targets:
            why = "no figure judged" if result.outcome == "ran" else result.outcome
            lines.append(f"| `{result.name}` | {_cell(why)} | | | |")
        for row in result.targets:
            lines.append(
                f"| `{result.name}` | {_cell(row.figure)} | {_cell(row.value)} | "
                f"{_cell(row.goal)} | {verdict(row.met)} |"
            )
    judged = [row.met for result in results for row in result.targets]
    lines += [
        "",
        f"{sum(met is True for met in judged)} of {len(judged)} targets met; "
        f"{sum(met is False for met in judged)} not met, "
        f"{sum(met is None for met in judged)} not measured.",
        "",
    ]
    return "\n".join(lines)


def write(path: Path, results: Sequence[BenchResult], run_on: Machine, *, note: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(results, run_on, note=note))


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory() -> str:
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 1024**2:,.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


def _commit() -> str:
    """The checkout's commit, and whether tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(  # noqa: S603 - fixed argv
            ["git", *args],  # noqa: S607 - git from PATH
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{commit} (with uncommitted changes)" if changed else commit
