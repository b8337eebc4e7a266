"""Run the benchmarks and print their figures: ``python bench/run.py [NAME ...] [--json PATH]
[--markdown PATH]``.

``make bench`` runs them all. Each ``bench/bench_<name>.py`` has a ``main()`` that prints its
tables and returns its figures, and records each figure it judges against a target with
``bench.common.target``; modules that set ``NEEDS_DATABASE`` get a throwaway test database
(Django's test-database machinery), dropped at the end. Benchmarks print figures and targets;
they never fail on a timing. At the end, a run of every benchmark rewrites docs/benchmarks.md
with one table of its figures (``bench.report``); a run of some writes only where
``--markdown`` says.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if str(ROOT) not in sys.path:  # run as a script: the repository's packages
    sys.path.insert(0, str(ROOT))

from bench import common, report  # noqa: E402 - needs the path above


def available() -> list[str]:
    return sorted(path.stem.removeprefix("bench_") for path in BENCH_DIR.glob("bench_*.py"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = available()
    parser = argparse.ArgumentParser(description="Print the gpuplatform benchmark figures.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run (default: all of {', '.join(names)})")  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="also write every figure to PATH")
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        type=Path,
        help="write the run's table of figures and targets to PATH (default: "
        "docs/benchmarks.md when every benchmark runs, else nowhere)",
    )
    args = parser.parse_args(argv)
    unknown = [name.removeprefix("bench_") for name in args.names]
    unknown = [name for name in unknown if name not in names]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(names)}")
    args.names = [n.removeprefix("bench_") for n in args.names] or names
    return args


def in_order(modules: dict[str, object]) -> dict[str, object]:
    """The benchmarks in the order asked, each after those of this run it names in its
    ``RUNS_AFTER`` (it is judged beside their figures: ``common.FIGURES``)."""
    ordered: dict[str, object] = {}

    def add(name: str) -> None:
        if name in ordered:
            return
        for first in getattr(modules[name], "RUNS_AFTER", ()):
            if first in modules:
                add(first)
        ordered[name] = modules[name]

    for name in modules:
        add(name)
    return ordered


def header(name: str, module: object) -> str:
    summary = report.summary(module)
    title = f"{name}: {summary}" if summary else name
    return f"\n{'=' * 100}\n{title}\n{'=' * 100}"


def markdown_path(names: list[str], markdown: Path | None) -> Path | None:
    """Where the run's table goes: where asked, else docs/benchmarks.md for a run of every
    benchmark (a run of some would replace the whole table with a part of it)."""
    if markdown is not None:
        return markdown
    return report.DEFAULT_PATH if sorted(names) == available() else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    # The Unix users the benchmarks' platforms make for tenants (as root) are named under this
    # run's own prefix, read by every process they start, and removed when it ends.
    os.environ["TENANT_USER_PREFIX"] = user_prefix = f"gpub{os.getpid()}-"
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    modules = in_order(
        {name: importlib.import_module(f"bench.bench_{name}") for name in args.names}
    )
    needs_database = any(getattr(module, "NEEDS_DATABASE", False) for module in modules.values())
    cpus = os.cpu_count()
    print(f"gpuplatform benchmarks: Python {platform.python_version()}, {cpus} CPUs, "
          f"{', '.join(modules)}")  # fmt: skip

    figures = common.FIGURES
    failed: list[str] = []
    results: list[report.BenchResult] = []
    postgres = "not used"
    original_name = connection.settings_dict["NAME"]
    created = False
    try:
        if needs_database:
            # Never test_<name>, which the test suite may be using on the same server.
            bench_name = original_name.removesuffix("_bench") + "_bench"
            connection.settings_dict["TEST"]["NAME"] = f"test_{bench_name}"
            setup_test_environment()
            began = time.perf_counter()
            name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
            created = True
            where = connection.settings_dict.get("HOST") or "local socket"
            print(f"test database {name} on {where} created and migrated "
                  f"in {time.perf_counter() - began:.1f} s")  # fmt: skip
            with connection.cursor() as cursor:
                cursor.execute("SHOW server_version")
                postgres = f"PostgreSQL {cursor.fetchone()[0]}"
        run_on = report.machine(postgres=postgres)
        for name, module in modules.items():
            print(header(name, module), flush=True)
            result = report.BenchResult(name, report.summary(module))
            judged = len(common.TARGETS)
            began = time.perf_counter()
            try:
                if created:  # each starts from an empty estate, whatever the last one left
                    common.clear_estate()
                figures[name] = module.main()
                result.outcome = report.outcome(figures[name])
            except Exception:  # noqa: BLE001 - report it and go on with the others
                traceback.print_exc()
                failed.append(name)
                result.outcome = "failed (see the run's output)"
            result.seconds = time.perf_counter() - began
            result.targets = common.TARGETS[judged:]
            results.append(result)
            print(f"({name} took {result.seconds:.1f} s)", flush=True)
    finally:
        if created:
            connection.creation.destroy_test_db(original_name, verbosity=0)
            teardown_test_environment()
        remove_tenant_users(user_prefix)

    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
        print(f"\nfigures written to {args.json}")
    markdown = markdown_path(args.names, args.markdown)
    if markdown is not None:
        report.write(markdown, results, run_on)
        print(f"\nfigures and targets written to {markdown}")
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def remove_tenant_users(prefix: str) -> None:
    """Root cleans up after itself: the users (and their groups) made under ``prefix``."""
    if os.geteuid() != 0:
        return
    from nodeagent.launcher import tenant_users

    for problem in tenant_users.remove_all(prefix):
        print(f"tenant user left behind: {problem}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
