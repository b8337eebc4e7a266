"""The end-to-end benchmark's pure parts: figures from recorded timestamps, the peers' set-up and
the clean-up that must run whatever happens. No timing is asserted; nothing here starts a server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import psutil
import pytest

from bench import bench_throughput as bench
from bench import common
from scheduling.config import load_config


def test_mean_busy_counts_each_allocation_only_while_tasks_wait():
    intervals = [(0.0, 10.0), (5.0, None), (12.0, 15.0)]
    # Over 2..12: the first covers 8 s, the open one 7 s, the last starts at the window's end.
    assert bench.mean_busy(intervals, 2.0, 12.0) == pytest.approx(1.5)


def test_mean_busy_of_an_empty_window_is_zero():
    assert bench.mean_busy([(0.0, 1.0)], 5.0, 5.0) == 0.0


def test_a_gpu_reused_counts_the_time_it_stood_free_between_its_allocations():
    allocations = [
        (1, 0.0, 1.0), (1, 1.25, 2.0), (1, 2.0, None),  # GPU 1: free 0.25 s, then 0 s
        (2, 3.0, 4.0), (2, 4.5, 5.0),  # GPU 2: reused after the window ended
        (3, 0.5, None),  # never freed
    ]  # fmt: skip
    assert bench.reuse_gaps(allocations, 0.0, 4.0) == pytest.approx([0.25, 0.0])


def test_pass_times_come_from_the_schedulers_log():
    log = (
        "2026-11-26 09:00:00,001 INFO scheduling.scheduler: pass: 12 placed, 0 preempted, "
        "0 failed (dependencies), 1,988 waiting, 31.5 ms\n"
        "2026-11-26 09:00:00,002 INFO django_q: something else\n"
        "... pass: 0 placed, 1 preempted, 0 failed (dependencies), 7 waiting, 4.0 ms\n"
    )
    assert bench.pass_times(log) == [(12, 31.5), (0, 4.0)]


def test_completion_runs_from_the_first_submit_to_the_last_finish():
    done = bench.completion(100.0, [101.0, 104.0, 102.0], 3, stopped=110.0)
    assert (done.finished, done.elapsed_s, done.limited) == (3, 4.0, False)
    assert done.per_s == pytest.approx(0.75)
    assert done.describe() == "0.8/s (3 in 4.0 s)"


def test_a_run_stopped_at_its_limit_says_how_many_finished():
    late = [221.0] * 10  # finished while the figures were read, after the limit
    done = bench.completion(100.0, [101.0] * 1_234 + late, 2_000, stopped=220.0)
    assert done.limited
    assert done.per_s == pytest.approx(1_234 / 120)
    assert done.describe() == "10.3/s (1,234 of 2,000 finished in 120 s)"


def test_it_reads_the_stamp_date_wrote():
    assert bench.parse_stamp("1795499575.259238699\n") == pytest.approx(1795499575.259238699)
    assert bench.parse_stamp("warning: something\n1795499575.5\n") == pytest.approx(1795499575.5)
    assert bench.parse_stamp("") is None
    assert bench.parse_stamp("no stamp here\n") is None


def test_latency_percentiles_and_the_probes_that_never_ran():
    latency = bench.Latency(samples=[0.010, 0.020, 0.030, 0.400], lost=1)
    assert latency.p(50) == pytest.approx(0.020)
    assert latency.p(99) == pytest.approx(0.400)
    assert latency.describe() == "20.0 / 400.0 ms (4 runs)"
    assert bench.Latency().describe() == "n/a"
    assert bench.Latency().p(50) is None


def test_ratios_are_ours_over_the_peers():
    assert bench.ratio(8.0, 800.0) == "0.010x"
    assert bench.ratio(600.0, 3.0) == "200x"
    assert bench.ratio(None, 3.0) == "-"
    assert bench.ratio(5.0, None) == "-"


def test_slurm_runs_one_node_of_32_slots_without_munge_inside_its_scratch_directory(tmp_path):
    conf = bench.slurm_conf(tmp_path, host="box", ctld_port=40001, node_port=40002, cpus=32)
    settings = dict(
        line.split("=", 1) for line in conf.splitlines() if line and not line.startswith("#")
    )
    assert settings["AuthType"] == "auth/none"
    assert settings["CredType"] == "cred/none"
    assert settings["SlurmctldHost"] == "box(127.0.0.1)"
    assert (settings["SlurmctldPort"], settings["SlurmdPort"]) == ("40001", "40002")
    assert "CPUs=32" in settings["NodeName"]
    # Every file the daemons write lies in the scratch directory.
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile"):
        assert settings[key].startswith(str(tmp_path)), key


def test_the_estate_is_one_the_platform_accepts(tmp_path):
    path = tmp_path / "estate.yaml"
    path.write_text(bench.estate_yaml())
    estate = load_config(path)
    assert len(estate.nodes) == bench.NODES
    assert {node.pool for node in estate.nodes} == {bench.POOL}
    assert sum(node.simulate.count for node in estate.nodes) == bench.SLOTS == 32


def test_cleanup_runs_once_on_leaving_even_after_an_error():
    calls = []
    with pytest.raises(RuntimeError), bench.cleanup(lambda: calls.append(1)):
        raise RuntimeError("boom")
    assert calls == [1]


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers can only be set in the main thread",
)
def test_sigterm_unwinds_so_that_the_daemons_are_stopped():
    before = signal.getsignal(signal.SIGTERM)
    stopped = []
    with pytest.raises(SystemExit) as exc, bench.sigterm_as_exit():
        with bench.cleanup(lambda: stopped.append(True)):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # the handler runs before this returns
    assert exc.value.code == 128 + signal.SIGTERM
    assert stopped == [True]
    assert signal.getsignal(signal.SIGTERM) == before


def _figures() -> dict:
    return {
        "startup_s": 12.0,
        "latency": bench.Latency(samples=[0.25, 0.3, 0.6]),
        "api": {
            "requests": 160,
            "per_s": 20.0,
            "p50_s": 0.3,
            "p99_s": 0.65,
            "errors": 24,
            "http_500": 24,
            "statuses": {201: 136, 500: 24},
            "error_sample": "500: boom",
            "cancelled_after": 3,
            "left_running": 0,
            "cpu_ms_per_accepted": {
                **dict.fromkeys(bench.CPU_ROLES, 4.0),
                bench.CPU_REST: 6.0,
                "all": 30.0,
            },
            "passes": 40,
            "passes_per_accepted": 40 / 136,
        },  # fmt: skip
        "api_queued": {
            "requests": 1_800,
            "per_s": 299.0,
            "p50_s": 0.02,
            "p99_s": 0.07,
            "errors": 0,
            "http_500": 0,
            "statuses": {201: 1_800},
            "error_sample": "",
            "cancelled_after": 0,
            "left_running": 0,
            "cpu_ms_per_accepted": {
                **dict.fromkeys(bench.CPU_ROLES, 0.5),
                bench.CPU_REST: 1.0,
                "all": 5.0,
            },
            "passes": 60,
            "passes_per_accepted": 60 / 1_800,
        },  # fmt: skip
        "throughput": {
            "completion": bench.completion(0.0, [1.0] * 400, 2_000, stopped=50.0),
            "left": 1_600,
            "states": {"succeeded": 400, "pending": 1_600},
            "batches_per_s": [400.0, 90.0],
            "batch_runnable": [(3.0, 7), (11.5, 24)],
            "busy": 16.0,
            "reuse_gaps": [0.15, 0.2, 0.9],
            "busy_window_s": 48.0,
            "passes": 160,
            "pass_ms": [20.0, 30.0, 40.0],
            "cpu_ms_per_task": {
                **dict.fromkeys(bench.CPU_ROLES, 5.0),
                bench.CPU_REST: 20.0,
                "all": 50.0,
            },
            "db_per_task": {"transactions": 6.0, "writes": 3.456, "wal_kb": 7.04},
        },
        "idle": {
            "seconds": 10.0,
            "cpu_pct": dict.fromkeys(bench.CPU_ROLES, 0.5),
            "transactions_per_s": 14.04,
            "writes_per_s": 4.5,
            "wal_kb_per_s": 3.25,
        },
        "connections": {"warm-up": 24, "2,000 tasks": 54},
        # Over the documented cap (68 for make run's processes with 4 nodes): missed.
        "connection_roles": {
            "web": 30,
            "scheduler": 6,
            "nodes": 36,
            "platform": 72,
            "this bench": 2,
            "unnamed": 1,
        },  # fmt: skip
        "max_connections": 97,
    }


def test_the_report_names_a_peer_that_was_not_measured_and_every_target(capsys, monkeypatch):
    monkeypatch.setattr(common, "TARGETS", [])
    tsp = {
        "version": "Task Spooler v1.0.1",
        "latency": bench.Latency(samples=[0.0035, 0.0048]),
        "throughput": bench.completion(0.0, [2.6] * 2_000, 2_000, stopped=2.6),
    }
    slurm = {"skipped": "not installed (slurm-wlm), and not root to install it"}
    targets = dict(bench.report(_figures(), tsp, slurm))
    out = capsys.readouterr().out
    assert "8.0/s (400 of 2,000 finished in 50 s)" in out
    assert "769.2/s (2,000 in 2.6 s)" in out
    assert "Slurm: not installed (slurm-wlm), and not root to install it" in out
    assert "20/s, p99 650.0 ms, 24 errors (24 HTTP 5xx) of 160" in out
    assert (
        "into a busy estate (they queue)  299/s, p99 70.0 ms, 0 errors (0 HTTP 5xx) of 1,800" in out
    )
    assert "400 tasks/s / 90 tasks/s" in out
    assert f"runnable on the machine's {bench.CPUS} CPUs, median (most): 3 (7) / 12 (24)" in out
    assert "16.0 of 32" in out
    assert "200.0 ms / 900.0 ms (3 times)" in out
    assert "scheduling passes in the 2,000-task phase: 160 (12.5 tasks per pass)" in out
    assert "of them 3 placed tasks, each in p50 / p90 30.0 ms / 40.0 ms" in out
    assert "CPU per finished task in the 2,000-task phase: 50.0 ms" in out
    assert f"PostgreSQL 5.0, {bench.CPU_REST} 20.0" in out
    assert "task phase: 6.00 transactions (3.46 of them writing), 7.0 kB of WAL" in out
    assert "while the clients submitted: 30.0 ms of CPU per accepted submission" in out
    assert "40 scheduling passes (0.29 per accepted submission)" in out  # 136 accepted
    # 30 ms of CPU each: the CPUs' ceiling, whatever the platform's speed otherwise.
    assert (
        f"allow at most {bench.CPUS * 1000 / 30:,.0f} submissions a second while their tasks run"
        in out
    )
    assert (
        f"allow at most {bench.CPUS * 1000 / 5:,.0f} submissions a second while their tasks queue"
        in out
    )
    assert "60 scheduling passes (0.03 per accepted submission)" in out
    # 299 a second into the busy estate: missed by one, 0 errors or not.
    assert (
        "target: API single-task submissions/s, 8 clients (into a busy estate) >= 300/s, "
        "0 errors: NOT met" in out
    )
    assert len(targets) == 8
    assert not any(targets.values())  # the figures above meet none of issue 9's targets
    # The same eight, with what was measured, for docs/benchmarks.md.
    recorded = {row.figure: row for row in common.TARGETS}
    assert len(recorded) == 8
    api = recorded["API single-task submissions/s, 8 clients (into a busy estate)"]
    assert (api.value, api.goal, api.met) == ("299/s, 0 errors", ">= 300/s, 0 errors", False)
    assert recorded["mean busy GPUs while tasks wait"].value == "16.0 of 32"
    assert (
        "target: PostgreSQL connections of the platform, most at once <= the documented cap 68"
        in out
    )
    assert "the platform's own, most at once: 72 of the documented cap 68" in out
    assert "web 30 of 26, scheduler 6 of 6, nodes 36 of 36; others: unnamed 1" in out
    assert "72 (cap 68)" in out
    assert "nothing submitted, 10 s): 14.0 PostgreSQL transactions a second (4.5 writing)" in out
    assert f"3.2 kB/s of WAL; percent of one core: {bench.CPU_ROLES[0]} 0.5" in out


def test_the_run_queue_is_sampled_while_a_batch_is_answered():
    assert bench.runnable() >= 1  # this test itself runs
    with bench.run_queue() as samples:
        time.sleep(0.05)
    count = len(samples)
    time.sleep(0.02)
    assert count >= 2 and all(n >= 1 for n in samples)
    assert len(samples) == count  # it stops with the block


def test_sessions_are_counted_by_the_role_their_application_name_names():
    role = bench.connection_role
    assert role("gpuplatform web") == role("gpuplatform web channels") == "web"
    assert role("gpuplatform qcluster") == "scheduler"
    assert {role("gpuplatform qcluster node-1"), role("gpuplatform node_agent"),
            role("gpuplatform supervisor")} == {"nodes"}  # fmt: skip
    assert role("gpuplatform run") == bench.BENCH_ROLE
    assert role("psql") == "psql"
    assert role("") == "unnamed"
    sampler = bench.ConnectionSampler()
    sampler.samples = [
        ("warm-up", Counter({"web": 2, "nodes": 9, bench.BENCH_ROLE: 2})),
        ("2,000 tasks", Counter({"web": 8, "nodes": 7, bench.BENCH_ROLE: 2})),
    ]
    assert sampler.peaks() == {"warm-up": 13, "2,000 tasks": 17}
    assert sampler.role_peaks() == {"web": 8, "nodes": 9, bench.BENCH_ROLE: 2, "platform": 15}


def test_cpu_per_task_splits_the_machine_among_the_roles_and_the_rest():
    before = {**dict.fromkeys((*bench.CPU_ROLES, "machine"), 100.0), bench.SUPERVISORS: {}}
    after = {**before, "PostgreSQL": 101.0, bench.SPAWNERS: 100.5, "machine": 104.0}
    per = bench.cpu_per_task(before, after, 100)
    assert per["PostgreSQL"] == pytest.approx(10.0)
    assert per[bench.SPAWNERS] == pytest.approx(5.0)
    assert per["web (daphne)"] == 0.0
    assert per[bench.CPU_REST] == pytest.approx(25.0)
    assert per["all"] == pytest.approx(40.0)


def test_a_supervisor_counts_what_it_spent_in_the_window_and_one_that_ended_nothing():
    # The kernel reaps a spawner's supervisors: what one spent leaves no trace once it ends.
    before = {**dict.fromkeys((*bench.CPU_ROLES, "machine"), 100.0),
              bench.SUPERVISORS: {(11, 1.0): 3.0, (12, 1.0): 7.0}}  # fmt: skip
    after = {**before, bench.SPAWNERS: 100.1, "machine": 102.0,
             bench.SUPERVISORS: {(11, 1.0): 3.2, (13, 2.0): 0.4}}  # fmt: skip
    spent = bench.role_spent(before, after)
    # The spawner's own 0.1, supervisor 11's 0.2, new 13's 0.4; 12 ended: nothing, not -7.
    assert spent[bench.SPAWNERS] == pytest.approx(0.7)
    per = bench.cpu_per_task(before, after, 100)
    assert per[bench.SPAWNERS] == pytest.approx(7.0)
    assert per[bench.CPU_REST] == pytest.approx(13.0)


@pytest.mark.django_db(transaction=True)
def test_database_work_counts_transactions_those_that_wrote_and_their_log():
    from tenants.models import Tenant

    before = bench.database_work()  # once what the test's set-up did is published
    Tenant.objects.create(name="writes-1")  # one transaction each (autocommit)
    Tenant.objects.create(name="writes-2")
    for _ in range(4):
        Tenant.objects.count()  # a read takes no transaction id
    work = bench.work_per_task(before, bench.database_work(), finished=2)
    assert work["writes"] >= 1.0, work  # 2 writes over 2 tasks (more if another database wrote)
    assert 3.0 <= work["transactions"] < 5.0, work  # and the 4 reads (this test's alone)
    assert work["wal_kb"] > 0, work


def test_a_process_tree_counts_the_cpu_of_the_children_it_reaped():
    me = psutil.Process()
    before = bench._tree_cpu(me)
    subprocess.run([sys.executable, "-c", "sum(range(10_000_000))"], check=True)
    assert bench._tree_cpu(me) - before >= 0.05  # the child's work, counted once it was reaped


@pytest.mark.django_db(transaction=True)
def test_a_paused_connection_sampler_makes_no_statement_of_its_own(monkeypatch):
    monkeypatch.setattr(bench, "SAMPLE_S", 0.01)
    sampler = bench.ConnectionSampler()
    sampler.start()

    def wait_for_samples(count: int) -> None:
        deadline = time.monotonic() + 10
        while len(sampler.samples) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sampler.samples) >= count

    try:
        wait_for_samples(2)
        sampler.paused.set()
        time.sleep(0.1)  # a count under way when it was paused ends
        taken = len(sampler.samples)
        time.sleep(0.3)  # 30 intervals
        assert len(sampler.samples) == taken
        sampler.paused.clear()
        wait_for_samples(taken + 1)
    finally:
        sampler.stop()
