"""The end-to-end benchmark's pure parts: figures from recorded timestamps, the peers' set-up and
the clean-up that must run whatever happens. No timing is asserted; nothing here starts a server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from bench import common
from bench.throughput import accounting, figures, peers, scenarios
from bench.throughput import report as tput_report
from gpuplatform import procid
from scheduling.config import load_config


def test_mean_busy_counts_each_allocation_only_while_tasks_wait():
    intervals = [(0.0, 10.0), (5.0, None), (12.0, 15.0)]
    # Over 2..12: the first covers 8 s, the open one 7 s, the last starts at the window's end.
    assert figures.mean_busy(intervals, 2.0, 12.0) == pytest.approx(1.5)


def test_mean_busy_of_an_empty_window_is_zero():
    assert figures.mean_busy([(0.0, 1.0)], 5.0, 5.0) == 0.0


def test_a_gpu_reused_counts_the_time_it_stood_free_between_its_allocations():
    allocations = [
        (1, 0.0, 1.0), (1, 1.25, 2.0), (1, 2.0, None),  # GPU 1: free 0.25 s, then 0 s
        (2, 3.0, 4.0), (2, 4.5, 5.0),  # GPU 2: reused after the window ended
        (3, 0.5, None),  # never freed
    ]  # fmt: skip
    assert figures.reuse_gaps(allocations, 0.0, 4.0) == pytest.approx([0.25, 0.0])


def test_pass_times_come_from_the_schedulers_log():
    log = (
        "2026-11-26 09:00:00,001 INFO scheduling.scheduler: pass: 12 placed, 0 preempted, "
        "0 failed (dependencies), 1,988 waiting, 31.5 ms\n"
        "2026-11-26 09:00:00,002 INFO django_q: something else\n"
        "... pass: 0 placed, 1 preempted, 0 failed (dependencies), 7 waiting, 4.0 ms\n"
    )
    assert figures.pass_times(log) == [(12, 31.5), (0, 4.0)]


def test_completion_runs_from_the_first_submit_to_the_last_finish():
    done = figures.completion(100.0, [101.0, 104.0, 102.0], 3, stopped=110.0)
    assert (done.finished, done.elapsed_s, done.limited) == (3, 4.0, False)
    assert done.per_s == pytest.approx(0.75)
    assert done.describe() == "0.8/s (3 in 4.0 s)"


def test_a_run_stopped_at_its_limit_says_how_many_finished():
    late = [221.0] * 10  # finished while the figures were read, after the limit
    done = figures.completion(100.0, [101.0] * 1_234 + late, 2_000, stopped=220.0)
    assert done.limited
    assert done.per_s == pytest.approx(1_234 / 120)
    assert done.describe() == "10.3/s (1,234 of 2,000 finished in 120 s)"


def test_it_reads_the_stamp_date_wrote():
    assert figures.parse_stamp("1795499575.259238699\n") == pytest.approx(1795499575.259238699)
    assert figures.parse_stamp("warning: something\n1795499575.5\n") == pytest.approx(1795499575.5)
    assert figures.parse_stamp("") is None
    assert figures.parse_stamp("no stamp here\n") is None


def test_latency_percentiles_and_the_probes_that_never_ran():
    latency = figures.Latency(samples=[0.010, 0.020, 0.030, 0.400], lost=1)
    assert latency.p(50) == pytest.approx(0.020)
    assert latency.p(99) == pytest.approx(0.400)
    assert latency.describe() == "20.0 / 400.0 ms (4 runs)"
    assert figures.Latency().describe() == "n/a"
    assert figures.Latency().p(50) is None


def test_ratios_are_ours_over_the_peers():
    assert figures.ratio(8.0, 800.0) == "0.010x"
    assert figures.ratio(600.0, 3.0) == "200x"
    assert figures.ratio(None, 3.0) == "-"
    assert figures.ratio(5.0, None) == "-"


def test_slurm_runs_one_node_of_32_slots_without_munge_inside_its_scratch_directory(tmp_path):
    conf = peers.slurm_conf(tmp_path, host="box", ctld_port=40001, node_port=40002, cpus=32)
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
    path.write_text(figures.estate_yaml())
    estate = load_config(path)
    assert len(estate.nodes) == figures.NODES
    assert {node.pool for node in estate.nodes} == {figures.POOL}
    assert sum(node.simulate.count for node in estate.nodes) == figures.SLOTS == 32


def test_cleanup_runs_once_on_leaving_even_after_an_error():
    calls = []
    with pytest.raises(RuntimeError), peers.cleanup(lambda: calls.append(1)):
        raise RuntimeError("boom")
    assert calls == [1]


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers can only be set in the main thread",
)
def test_sigterm_unwinds_so_that_the_daemons_are_stopped():
    before = signal.getsignal(signal.SIGTERM)
    stopped = []
    with pytest.raises(SystemExit) as exc, peers.sigterm_as_exit():
        with peers.cleanup(lambda: stopped.append(True)):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # the handler runs before this returns
    assert exc.value.code == 128 + signal.SIGTERM
    assert stopped == [True]
    assert signal.getsignal(signal.SIGTERM) == before


def _cpu(each: float, rest: float, total: float) -> dict:
    return {**dict.fromkeys((*accounting.CPU_ROLES, accounting.BENCH_CPU), each),
            accounting.CPU_REST: rest, "all": total}  # fmt: skip


def _run(total: int, finished: int, **changes) -> dict:
    return {
        "completion": figures.completion(0.0, [1.0] * finished, total, stopped=50.0),
        "left": total - finished,
        "states": {"succeeded": finished, "pending": total - finished},
        "batches_per_s": [400.0, 90.0],
        "batch_runnable": [(3.0, 7), (11.5, 24)],
        "busy": 16.0,
        "reuse_gaps": [0.15, 0.2, 0.9],
        "busy_window_s": 48.0,
        "passes": 160,
        "pass_ms": [20.0, 30.0, 40.0],
        "pass_placed": 300,
        "supervisors": 60,
        "cpu_ms_per_task": _cpu(5.0, 20.0, 50.0),
        "db_per_task": {"transactions": 6.0, "writes": 3.456, "wal_kb": 7.04},
        **changes,
    }


def _figures() -> dict:
    return {
        "startup_s": 12.0,
        "latency": figures.Latency(samples=[0.25, 0.3, 0.6]),
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
            "cpu_ms_per_accepted": _cpu(4.0, 6.0, 30.0),
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
            "cpu_ms_per_accepted": _cpu(0.5, 1.0, 5.0),
            "passes": 60,
            "passes_per_accepted": 60 / 1_800,
        },  # fmt: skip
        "throughput": {
            "quotas": _run(2_000, 400),
            "unlimited": _run(
                2_000,
                2_000,
                batches_per_s=[5_000.0, 3_000.0],
                passes=25,
                pass_placed=2_001,  # a latency probe among them
                supervisors=2_000,
                cpu_ms_per_task={**_cpu(1.0, 1.0, 8.0), "PostgreSQL": 3.0},
            ),
        },  # fmt: skip
        "idle": {
            "seconds": 10.0,
            "cpu_pct": dict.fromkeys(accounting.CPU_ROLES, 0.5),
            "transactions_per_s": 14.04,
            "writes_per_s": 4.5,
            "wal_kb_per_s": 3.25,
        },
        "connections": {"warm-up": 24, "2,000 tasks": 54},
        # Over the documented cap (50 for make run's processes with 4 nodes): missed.
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


def test_the_report_gives_both_lines_what_is_left_and_the_peers_last(capsys, monkeypatch):
    monkeypatch.setattr(common, "TARGETS", [])
    monkeypatch.setattr(tput_report, "CPUS", 2)
    tsp = {
        "version": "Task Spooler v1.0.1",
        "latency": figures.Latency(samples=[0.0035, 0.0048]),
        "throughput": figures.completion(0.0, [2.5] * 2_000, 2_000, stopped=2.5),
    }
    slurm = {"skipped": "not installed (slurm-wlm), and not root to install it"}
    targets = dict(tput_report.report(_figures(), tsp, slurm))
    out = capsys.readouterr().out
    # Both lines side by side, the default first.
    header = next(line for line in out.splitlines() if line.startswith("measure "))
    assert header.index("1. 4 tenants, 8-GPU quota each, mixed") < header.index(
        "2. 1 tenant, no quota, one-GPU only"
    )
    assert "4 x 500 tasks (POSTs of 500" in out
    assert "80% 1 GPU, 10% 2 GPUs, 10% gpu_memory 4Gi (sharing); the default" in out
    tput = next(line for line in out.splitlines() if line.startswith("tasks completed per second"))
    assert "8.0/s (400 of 2,000 finished in 50 s)" in tput
    assert "2,000.0/s (2,000 in 1.0 s)" in tput
    assert "1,600 pending, 400 succeeded" in out
    assert "160 (12.5 tasks per pass)" in out and "25 (80.0 tasks per pass)" in out
    by_pass = next(line for line in out.splitlines() if line.startswith("tasks placed by a pass"))
    assert by_pass.split("ended")[1].split() == ["300", "/", "1,700", "2,000", "/", "0"]
    forks = next(line for line in out.splitlines() if line.startswith("supervisor processes"))
    assert forks.split(")")[1].split() == ["0.03", "1.00"]
    assert "400 / 90 tasks/s" in out and "5,000 / 3,000 tasks/s" in out
    # CPU per task by role, in both lines.
    postgres = next(line for line in out.splitlines() if line.strip().startswith("PostgreSQL "))
    assert postgres.split()[1:] == ["5.0", "3.0"]
    # What is left: tsp's 800/s on 2 CPUs leave 2.5 ms a task; roles largest first.
    assert "completing 800 tasks a second, task-spooler's rate (measured in this run)" in out
    assert "leaves 2.5 ms of CPU per task" in out
    assert "1. 4 tenants, 8-GPU quota each, mixed: 50.0 ms in all, 20.0x the budget" in out
    assert (
        "47.5 ms over it; by role, largest first (x the whole budget): the rest 20.0 (8.0x)" in out
    )
    assert "2. 1 tenant, no quota, one-GPU only: 8.0 ms in all, 3.2x the budget" in out
    assert "largest first (x the whole budget): PostgreSQL 3.0 (1.2x), web (daphne) 1.0" in out
    assert (
        "API, 8 clients, one task each, into a busy estate (they queue): 299/s, p99 70.0 ms" in out
    )
    assert "20/s, p99 650.0 ms, 24 errors (24 HTTP 5xx) of 160" in out
    assert "while the clients submitted: 30.0 ms of CPU per accepted submission" in out
    assert "40 scheduling passes (0.29 per accepted submission)" in out  # 136 accepted
    assert "allow at most 67 submissions a second while their tasks run" in out  # 2 CPUs, 30 ms
    assert "allow at most 400 submissions a second while their tasks queue" in out
    # The peers come last, with each line of ours as a ratio to each.
    assert out.index("peers, measured after the platform") > out.rindex("target: ")
    assert re.search(
        r"2,000 `true`, 32 slots, in 2 submissions of 1,000\)\s+800\.0/s \(2,000 in", out
    )
    assert "ours, 1. 4 tenants, 8-GPU quota each, mixed: 8.0/s  " in out
    assert "0.010x" in out and "2.500x" in out  # 8 / 800 and 2,000 / 800
    assert "Slurm: not installed (slurm-wlm), and not root to install it" in out
    assert "Task Spooler v1.0.1" in out.split("peers, measured after the platform")[1]
    # The targets judge the default line; 299 a second into the busy estate misses by one.
    assert (
        "target: API single-task submissions/s, 8 clients (into a busy estate) >= 300/s, "
        "0 errors: NOT met" in out
    )
    assert len(targets) == 9
    assert not any(targets.values())  # the figures above meet none of issues 9 and 41's targets
    recorded = {row.figure: row for row in common.TARGETS}
    assert len(recorded) == 9
    api = recorded["API single-task submissions/s, 8 clients (into a busy estate)"]
    assert (api.value, api.goal, api.met) == ("299/s, 0 errors", ">= 300/s, 0 errors", False)
    default = " (4 tenants, 8-GPU quota each, mixed)"
    assert recorded["mean busy GPUs while tasks wait" + default].value == "16.0 of 32"
    assert recorded["tasks completed per second" + default].value == "8.0"
    cpu = recorded["CPU per finished task, every role" + default]
    assert (cpu.goal, cpu.met) == ("<= 4 ms", False)
    assert recorded["task batches, every POST of every line"].value == (
        "400 / 90 / 5,000 / 3,000 tasks/s"
    )
    assert (
        "target: PostgreSQL connections of the platform, most at once <= the documented cap 50"
        in out
    )
    assert "the platform's own, most at once: 72 of the documented cap 50" in out
    assert "web 30 of 26, scheduler 6 of 4, nodes 36 of 20; others: unnamed 1" in out
    assert "nothing submitted, 10 s): 14.0 PostgreSQL transactions a second (4.5 writing)" in out
    assert f"3.2 kB/s of WAL; percent of one core: {accounting.CPU_ROLES[0]} 0.5" in out


def test_what_is_left_counts_against_the_reference_rate_when_tsp_was_not_measured():
    budget, rate, source = tput_report.budget_ms({"skipped": "no apt-get"})
    assert rate == tput_report.TSP_REFERENCE_PER_S == 775.0
    assert budget == pytest.approx(1000 * common.CPUS / 775.0)
    assert "2-core machine" in source
    measured = {"throughput": figures.completion(0.0, [4.0] * 2_000, 2_000, stopped=4.0)}
    assert tput_report.budget_ms(measured)[:2] == pytest.approx((1000 * common.CPUS / 500, 500))


def test_the_default_scenario_is_four_tenants_under_quotas_each_posting_a_mix_at_once():
    quotas = scenarios.SCENARIOS[0]
    assert (quotas.tenants, quotas.quota_gpus, quotas.per_tenant) == (4, 8, 500)
    posts = quotas.batches("some-pool")
    assert [len(tenant) for tenant in posts] == [1, 1, 1, 1]  # each tenant's 500 in one POST
    (first,) = posts[0]
    kinds = Counter(
        (spec["resources"]["gpus"], spec["resources"].get("gpu_memory")) for spec in first
    )
    assert kinds == {(1, None): 400, (2, None): 50, (1, "4Gi"): 50}
    # Spread through the POST, not in blocks: every kind among the first twenty.
    assert (
        len({(s["resources"]["gpus"], s["resources"].get("gpu_memory")) for s in first[:20]}) == 3
    )
    assert {spec["resources"]["pool"] for spec in first} == {"some-pool"}
    assert len({spec["name"] for tenant in posts for post in tenant for spec in post}) == 2_000
    unlimited = scenarios.SCENARIOS[1]
    assert unlimited.quota_gpus is None
    assert [len(post) for post in unlimited.batches("p")[0]] == [1_000, 1_000]
    roomy = scenarios.SCENARIOS[2]
    assert roomy.quota_gpus * roomy.tenants > figures.SLOTS  # never reached, even all at once
    assert roomy.mix == quotas.mix


def test_every_task_the_scenarios_submit_is_a_spec_the_platform_accepts():
    from scheduling.spec.parse import parse_specs

    for scenario in scenarios.SCENARIOS:
        for tenant in scenario.batches(figures.POOL):
            for post in tenant:
                assert len(parse_specs(post)) == len(post)


def test_a_gpu_shared_by_memory_counts_once_and_is_free_only_when_its_last_holder_left():
    allocations = [
        (1, 0.0, 4.0), (1, 1.0, 6.0), (1, 2.0, 3.0),  # three sharing GPU 1: busy 0-6
        (1, 6.0, 7.0),  # handed straight over: its own span, a gap of 0
        (2, 0.0, 1.0), (2, 0.5, None),  # still held at the end
    ]  # fmt: skip
    spans = sorted(figures.gpu_spans(allocations), key=lambda s: (s[0], s[1]))
    assert spans == [(1, 0.0, 6.0), (1, 6.0, 7.0), (2, 0.0, None)]
    assert figures.mean_busy([(b, e) for _, b, e in spans], 0.0, 8.0) == pytest.approx(15 / 8)
    assert figures.reuse_gaps(spans, 0.0, 8.0) == [0.0]


def test_the_run_queue_is_sampled_while_a_batch_is_answered():
    assert accounting.runnable() >= 1  # this test itself runs
    with accounting.run_queue() as samples:
        time.sleep(0.05)
    count = len(samples)
    time.sleep(0.02)
    assert count >= 2 and all(n >= 1 for n in samples)
    assert len(samples) == count  # it stops with the block


def test_sessions_are_counted_by_the_role_their_application_name_names():
    role = accounting.connection_role
    assert role("gpuplatform web") == role("gpuplatform web channels") == "web"
    assert role("gpuplatform scheduler") == role("gpuplatform qcluster") == "scheduler"
    assert {role("gpuplatform qcluster node-1"), role("gpuplatform node_agent"),
            role("gpuplatform supervisor")} == {"nodes"}  # fmt: skip
    assert role("gpuplatform run") == accounting.BENCH_ROLE
    assert role("psql") == "psql"
    assert role("") == "unnamed"
    sampler = accounting.ConnectionSampler()
    sampler.samples = [
        ("warm-up", Counter({"web": 2, "nodes": 9, accounting.BENCH_ROLE: 2})),
        ("2,000 tasks", Counter({"web": 8, "nodes": 7, accounting.BENCH_ROLE: 2})),
    ]
    assert sampler.peaks() == {"warm-up": 13, "2,000 tasks": 17}
    assert sampler.role_peaks() == {"web": 8, "nodes": 9, accounting.BENCH_ROLE: 2, "platform": 15}


def test_cpu_per_task_splits_the_machine_among_the_roles_and_the_rest():
    before = {
        **dict.fromkeys((*accounting.CPU_ROLES, accounting.BENCH_CPU, "machine"), 100.0),
        accounting.SUPERVISORS: {},
    }
    after = {**before, "PostgreSQL": 101.0, accounting.SPAWNERS: 100.5, "machine": 104.0}
    per = accounting.cpu_per_task(before, after, 100)
    assert per["PostgreSQL"] == pytest.approx(10.0)
    assert per[accounting.SPAWNERS] == pytest.approx(5.0)
    assert per["web (daphne)"] == 0.0
    assert per[accounting.CPU_REST] == pytest.approx(25.0)
    assert per["all"] == pytest.approx(40.0)


def test_a_supervisor_counts_what_it_spent_in_the_window_and_one_that_ended_nothing():
    # The kernel reaps a spawner's supervisors: what one spent leaves no trace once it ends.
    before = {**dict.fromkeys((*accounting.CPU_ROLES, accounting.BENCH_CPU, "machine"), 100.0),
              accounting.SUPERVISORS: {(11, 1.0): 3.0, (12, 1.0): 7.0}}  # fmt: skip
    after = {**before, accounting.SPAWNERS: 100.1, accounting.BENCH_CPU: 100.3, "machine": 102.0,
             accounting.SUPERVISORS: {(11, 1.0): 3.2, (13, 2.0): 0.4}}  # fmt: skip
    spent = accounting.role_spent(before, after)
    # The spawner's own 0.1, supervisor 11's 0.2, new 13's 0.4; 12 ended: nothing, not -7.
    assert spent[accounting.SPAWNERS] == pytest.approx(0.7)
    per = accounting.cpu_per_task(before, after, 100)
    assert per[accounting.SPAWNERS] == pytest.approx(7.0)
    assert per[accounting.BENCH_CPU] == pytest.approx(3.0)  # this bench's own: not the rest
    assert per[accounting.CPU_REST] == pytest.approx(10.0)


CHILD = """
import ctypes, time
ctypes.CDLL(None).prctl(15, b"gpup-supervisor", 0, 0, 0)  # PR_SET_NAME, as setproctitle does
began = time.process_time()
while time.process_time() - began < 0.3:
    pass
time.sleep(60)
"""


def test_the_census_keeps_what_a_supervisor_spent_once_it_has_left():
    """A supervisor that leaves during a phase is reaped by init, and what it spent with it;
    the census's last sight of it is what the phase counts."""
    child = subprocess.Popen([sys.executable, "-c", CHILD])  # noqa: S603 - this interpreter
    try:
        started = procid.start_time(child.pid)
        with accounting.supervisor_census() as census:
            deadline = time.monotonic() + 20
            while (census.last_seen(child.pid, started) or 0.0) < 0.3:
                assert time.monotonic() < deadline, census.seen
                time.sleep(0.05)
            child.kill()
            child.wait()
            time.sleep(3 * accounting.CENSUS_S)
    finally:
        child.kill()
        child.wait()
    assert census.last_seen(child.pid, started) >= 0.3
    assert census.last_seen(child.pid, started + 5) is None  # another process of that pid


@pytest.mark.django_db(transaction=True)
def test_database_work_counts_transactions_those_that_wrote_and_their_log():
    from tenants.models import Tenant

    # This backend's own statistics: published once it has been idle a second.
    before = accounting.database_work(settle_s=1.5)  # once the test's set-up is published
    Tenant.objects.create(name="writes-1")  # one transaction each (autocommit)
    Tenant.objects.create(name="writes-2")
    for _ in range(4):
        Tenant.objects.count()  # a read takes no transaction id
    work = accounting.work_per_task(before, accounting.database_work(settle_s=1.5), finished=2)
    assert work["writes"] >= 1.0, work  # 2 writes over 2 tasks (more if another database wrote)
    assert 3.0 <= work["transactions"] < 5.0, work  # and the 4 reads (this test's alone)
    assert work["wal_kb"] > 0, work


def test_a_process_tree_counts_the_cpu_of_the_children_it_reaped_and_of_those_alive():
    me = os.getpid()
    before = accounting.ProcessTable().tree_cpu(me)
    subprocess.run([sys.executable, "-c", "sum(range(10_000_000))"], check=True)
    reaped = accounting.ProcessTable().tree_cpu(me)
    assert reaped - before >= 0.05  # the child's work, counted once it was reaped
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
    grandchild = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {busy!r}]); "
        "time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", grandchild])  # noqa: S603 - this interpreter
    try:
        time.sleep(1.0)
        alive = accounting.ProcessTable().tree_cpu(me)
    finally:
        child.kill()
        child.wait()
    assert alive - reaped >= 0.2  # a grandchild still running, under a child still running


@pytest.mark.django_db(transaction=True)
def test_a_paused_connection_sampler_makes_no_statement_of_its_own(monkeypatch):
    monkeypatch.setattr(accounting, "SAMPLE_S", 0.01)
    sampler = accounting.ConnectionSampler()
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
