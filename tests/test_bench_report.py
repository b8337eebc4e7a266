"""docs/benchmarks.md as bench/run.py writes it: the run's machine, one row per judged figure,
and where the file goes. Nothing here runs a benchmark."""

from __future__ import annotations

import os

from bench import common, report, run


def _machine() -> report.Machine:
    return report.Machine(
        cores=2,
        cpu_model="AMD EPYC",
        memory="23.5 GiB",
        python="3.11.7",
        postgres="PostgreSQL 15.8",
        started="2026-11-27 18:42 UTC",
        commit="5b4ec16",
        load="1.20, 0.80, 0.50",
    )


def _results() -> list[report.BenchResult]:
    return [
        report.BenchResult(
            "api",
            "The task API over HTTP",
            [
                common.Target("daphne: POST, 8 client(s)", "393/s, 0 errors", ">= 300/s", True),
                common.Target("daphne: GET, 8 client(s)", "p99 56.4 ms", "p99 < 50 ms", False),
            ],
            seconds=61.0,
        ),
        report.BenchResult("replay", "Trace replay", outcome="skipped: no trace at /x.csv"),
        report.BenchResult("live", "GPU sample -> dashboard", outcome="failed (see the output)"),
        report.BenchResult(
            "telemetry",
            "GPU telemetry",
            [common.Target("PostgreSQL CPU", "not measured", "< 10 % of a core", None)],
        ),
    ]


def test_a_judged_figure_is_recorded_for_the_report_and_its_verdict_returned(monkeypatch):
    monkeypatch.setattr(common, "TARGETS", [])
    assert common.target("pass, median", "80.0 ms", "<= 100 ms", True) == "met"
    assert common.target("pass, p99", "120.0 ms", "<= 100 ms", False) == "NOT met"
    assert common.target("NVML read", "n/a", "< 1 ms", None) == "not measured"
    assert common.TARGETS == [
        common.Target("pass, median", "80.0 ms", "<= 100 ms", True),
        common.Target("pass, p99", "120.0 ms", "<= 100 ms", False),
        common.Target("NVML read", "n/a", "< 1 ms", None),
    ]


def test_the_report_names_the_machine_the_commit_and_each_benchmark():
    text = report.render(_results(), _machine())
    assert text.startswith(report.INTRO)
    for row in (
        "| cores | 2 |",
        "| CPU | AMD EPYC |",
        "| memory | 23.5 GiB |",
        "| started | 2026-11-27 18:42 UTC |",
        "| commit | 5b4ec16 |",
        "| Python | 3.11.7 |",
        "| PostgreSQL | PostgreSQL 15.8 |",
        "| load average at the start (1, 5, 15 min) | 1.20, 0.80, 0.50 |",
    ):
        assert row in text
    assert "- `api`: The task API over HTTP (61 s)" in text
    assert "- `replay`: Trace replay **skipped: no trace at /x.csv**" in text


def test_the_report_is_one_table_with_a_row_per_figure_and_its_verdict():
    text = report.render(_results(), _machine())
    assert text.count("| benchmark | figure | measured | target | verdict |") == 1
    assert "| `api` | daphne: POST, 8 client(s) | 393/s, 0 errors | >= 300/s | met |" in text
    assert "| `api` | daphne: GET, 8 client(s) | p99 56.4 ms | p99 < 50 ms | NOT met |" in text
    unmeasured = "| `telemetry` | PostgreSQL CPU | not measured | < 10 % of a core | not measured |"
    assert unmeasured in text
    # A benchmark that judged nothing still has its row, saying why.
    assert "| `replay` | skipped: no trace at /x.csv | | | |" in text
    assert "| `live` | failed (see the output) | | | |" in text
    assert "1 of 3 targets met; 1 not met, 1 not measured." in text


def test_a_cell_never_breaks_the_table():
    results = [
        report.BenchResult(
            "api", "x", [common.Target("kind | size\nsecond line", "a|b", "< 1", True)]
        )
    ]
    row = next(line for line in report.render(results, _machine()).splitlines() if "kind" in line)
    assert row == "| `api` | kind \\| size second line | a\\|b | < 1 | met |"


def test_a_note_goes_between_the_intro_and_the_run():
    text = report.render(_results(), _machine(), note="Seeded by hand.")
    assert text.index("Seeded by hand.") < text.index("## The run")


def test_write_puts_the_report_in_its_file(tmp_path):
    path = tmp_path / "docs" / "benchmarks.md"
    report.write(path, _results(), _machine())
    assert path.read_text() == report.render(_results(), _machine())


def test_a_benchmark_is_summed_up_by_its_docstrings_first_paragraph():
    class Module:
        """Neighbours under a flood: one tenant floods the API, another's p95 is compared with
        its own baseline.

        How it measures."""

    assert report.summary(Module) == (
        "Neighbours under a flood: one tenant floods the API, another's p95 is compared with "
        "its own baseline."
    )

    class Bare:
        pass

    assert report.summary(Bare) == ""


def test_a_benchmark_that_could_not_run_here_says_why():
    assert report.outcome({"skipped": "no chromium"}) == "skipped: no chromium"
    assert report.outcome({"p99_ms": 12.0}) == "ran"
    assert report.outcome([("target", True)]) == "ran"


def test_the_machine_is_this_one():
    machine = report.machine(postgres="PostgreSQL 15.8")
    assert machine.cores == os.cpu_count()
    assert machine.cpu_model and machine.memory
    assert machine.started.endswith(" UTC")
    assert machine.commit  # a short hash here, "unknown ..." outside a git checkout
    assert machine.postgres == "PostgreSQL 15.8"


def test_only_a_run_of_every_benchmark_rewrites_the_docs_file(tmp_path):
    assert run.markdown_path(run.available(), None) == report.DEFAULT_PATH
    assert run.markdown_path(list(reversed(run.available())), None) == report.DEFAULT_PATH
    assert run.markdown_path(["policy"], None) is None  # a part would replace the whole table
    assert run.markdown_path(["policy"], tmp_path / "x.md") == tmp_path / "x.md"


def test_the_checked_in_file_is_the_writers():
    text = report.DEFAULT_PATH.read_text()
    assert text.startswith(report.INTRO)
    assert "| benchmark | figure | measured | target | verdict |" in text


class _Bench:
    def __init__(self, *after: str) -> None:
        self.RUNS_AFTER = after


def test_a_benchmark_judged_beside_another_runs_after_it():
    modules = {"api": _Bench(), "estate32": _Bench("throughput"), "policy": _Bench(),
               "throughput": _Bench()}  # fmt: skip
    assert list(run.in_order(modules)) == ["api", "throughput", "estate32", "policy"]
    # One it names that this run leaves out is not waited for.
    assert list(run.in_order({"estate32": _Bench("throughput")})) == ["estate32"]


def test_32_hosts_are_judged_beside_the_4_node_default_line_of_the_same_run(monkeypatch):
    from bench import bench_estate32

    monkeypatch.setattr(bench_estate32, "FIGURES", {})
    assert bench_estate32.four_node_rate() is None  # not in this run: not measured
    line = {"completion": {"per_s": 117.5}}
    ran = {"gpuplatform": {"throughput": {"quotas": line, "unlimited": {}}}}
    monkeypatch.setattr(bench_estate32, "FIGURES", {"throughput": ran})
    assert bench_estate32.four_node_rate() == 117.5
