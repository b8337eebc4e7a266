"""gpuplatform.jobrunner and ``manage.py scheduler``: a queue's jobs run on threads of one
process, through the real broker (rows in PostgreSQL, LISTEN wake-ups), with django-q2's
failure records, schedules, and a stop that strands nothing."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import Failure, OrmQ, Schedule
from django_q.tasks import async_task

from gpuplatform.jobrunner import JobRunner
from scheduling import tasks as scheduling_tasks
from scheduling.management.commands.scheduler import resolve

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "test-jobrunner"
BOUND_S = 10.0
ran: list[tuple[str, object]] = []


def job_ok(value):
    ran.append(("ok", value))
    return value


def job_fails():
    ran.append(("fails", None))
    raise RuntimeError("the job's own error")


def job_sleeps(seconds):
    time.sleep(seconds)
    ran.append(("slept", seconds))


JOBS = {f"{__name__}.{f.__name__}": f for f in (job_ok, job_fails, job_sleeps)}


@pytest.fixture
def runner():
    ran.clear()
    made = []

    def start(**kwargs) -> JobRunner:
        runner = JobRunner(QUEUE, resolve=JOBS.get, **{"workers": 2, **kwargs})
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        made.append((runner, thread))
        return runner

    yield start
    for runner, thread in made:
        runner.stop()
        thread.join(timeout=BOUND_S)
        assert not thread.is_alive()


def queue(func, *args) -> None:
    async_task(func, *args, cluster=QUEUE, sync=False)


def until(condition, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {BOUND_S} s: {what}"
        time.sleep(0.02)


def left() -> int:
    return OrmQ.objects.filter(key=QUEUE).count()


def test_jobs_run_and_are_acknowledged(runner):
    runner()
    for n in range(5):
        queue(f"{__name__}.job_ok", n)
    until(lambda: len(ran) == 5 and left() == 0, "five jobs run and acknowledged")
    assert sorted(value for _, value in ran) == [0, 1, 2, 3, 4]
    assert not Failure.objects.exists()  # successes are not stored (Q_SAVE_LIMIT -1)


def test_a_function_the_process_does_not_run_is_refused_not_run(runner):
    runner()
    queue("os.system", "touch /tmp/never")
    queue(f"{__name__}.job_ok", "after")
    until(lambda: ran == [("ok", "after")] and left() == 0, "the refused job dropped")
    assert not Failure.objects.exists()


def test_a_failing_job_is_recorded_as_django_q2_records_it_and_the_others_go_on(runner):
    runner()
    queue(f"{__name__}.job_fails")
    queue(f"{__name__}.job_ok", 1)
    until(lambda: len(ran) == 2 and left() == 0, "both jobs run")
    failure = Failure.objects.get()
    assert failure.func == f"{__name__}.job_fails"
    assert "the job's own error" in failure.result
    assert failure.cluster == QUEUE


def test_a_stop_lets_running_jobs_finish_and_strands_nothing_claimed(runner):
    started = runner(workers=1)
    queue(f"{__name__}.job_sleeps", 0.5)
    queue(f"{__name__}.job_ok", "second")
    until(lambda: started.running, "the first job running")
    started.stop()
    until(lambda: ("slept", 0.5) in ran, "the running job finished")
    time.sleep(1.5)  # the runner's main thread would have claimed by now, had it gone on
    # The second was never claimed: it is ready for whoever takes the queue next.
    assert ("ok", "second") not in ran
    assert OrmQ.objects.filter(key=QUEUE, lock__lte=timezone.now()).count() == 1


def test_a_job_past_its_timeout_is_reported_once_and_the_queue_moves_on(runner, caplog):
    runner(timeout_s=0.2)
    with caplog.at_level(logging.ERROR, logger="gpuplatform.jobrunner"):
        queue(f"{__name__}.job_sleeps", 2.5)
        until(lambda: left() == 1 and "past Q_TIMEOUT" in caplog.text, "the report")
        queue(f"{__name__}.job_ok", "meanwhile")
        until(lambda: ("ok", "meanwhile") in ran, "the other worker's job")
        until(lambda: ("slept", 2.5) in ran, "the slow job")
    assert caplog.text.count("past Q_TIMEOUT") == 1


def test_due_schedules_are_queued_and_run(runner, monkeypatch):
    # As in production: a due schedule is queued (on the runner's queue), not run inline.
    monkeypatch.setattr(Conf, "SYNC", False)
    Schedule.objects.create(
        name="test-jobrunner",
        func=f"{__name__}.job_ok",
        args="'scheduled'",
        schedule_type=Schedule.MINUTES,
        minutes=1,
        repeats=-1,
        next_run=timezone.now() - timedelta(seconds=1),
        cluster=Conf.CLUSTER_NAME,  # the scheduler's own: the runner queues it on its queue
    )
    runner()
    until(lambda: ("ok", "scheduled") in ran, "the scheduled job")
    assert Schedule.objects.get(name="test-jobrunner").next_run > timezone.now()


def test_the_scheduler_runs_the_control_planes_jobs_and_nothing_else():
    assert resolve("scheduling.tasks.run_pass") is scheduling_tasks.run_pass
    assert resolve("telemetry.tasks.rollup") is not None
    assert resolve("monitoring.tasks.webhook_send") is not None
    assert resolve("nodeagent.launcher.tasks.launch") is None  # a node's, never here
    assert resolve("os.system") is None
    assert resolve("scheduling.tasks._private") is None
    assert resolve("scheduling.tasks.nothing_of_that_name") is None


def test_an_idle_runner_sleeps_on_its_queue_instead_of_claiming_every_second(runner):
    started = runner()
    claims = []
    dequeue = started.broker.dequeue
    started.broker.dequeue = lambda: claims.append(1) or dequeue()
    time.sleep(2.5)
    # Before the wait on its LISTEN connection was bounded by the schedules' time (30 s), it
    # claimed once a second.
    assert len(claims) <= 1
    queue(f"{__name__}.job_ok", "woken")  # a notification still wakes it at once
    until(lambda: ("ok", "woken") in ran, "the job queued to the sleeping runner")


def test_an_outage_is_logged_once_and_its_end_once(monkeypatch, caplog):
    """A retry a second through a database outage would write a warning a second."""
    from django.db import OperationalError

    from gpuplatform import jobrunner

    monkeypatch.setattr(jobrunner, "RETRY_AFTER_ERROR_S", 0)
    runner = JobRunner(QUEUE, workers=1, resolve=lambda name: None, schedules=False)

    def down():
        raise OperationalError("connection refused")

    with caplog.at_level(logging.DEBUG, logger="gpuplatform.jobrunner"):
        assert [runner._guarded(down) for _ in range(3)] == [None, None, None]
        assert [runner._guarded(lambda: "ok") for _ in range(2)] == ["ok", "ok"]
        runner._guarded(down)
    said = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]
    assert said == [
        ("WARNING", f"queue {QUEUE}: database unreachable"),
        ("DEBUG", f"queue {QUEUE}: database unreachable"),
        ("DEBUG", f"queue {QUEUE}: database unreachable"),
        ("INFO", f"queue {QUEUE}: database reachable again after 0 s"),
        ("WARNING", f"queue {QUEUE}: database unreachable"),  # the next outage is said again
    ]


interrupted: list[int] = []


def job_interrupted_once(value):
    """Fails as a job does when the database goes away under it, the first time only."""
    from django.db import OperationalError

    if not interrupted:
        interrupted.append(value)
        raise OperationalError("server closed the connection unexpectedly")
    ran.append(("ok", value))


JOBS[f"{__name__}.job_interrupted_once"] = job_interrupted_once


@pytest.mark.parametrize("sole_consumer", [True, False])
def test_on_a_node_queue_a_job_an_outage_interrupted_runs_again(runner, monkeypatch, sole_consumer):
    """A node's queue (its agent its sole consumer): a launch the database's fail-over broke
    runs again once it answers, not three minutes later (the broker's retry) or never. Any
    other queue records the failure, as django-q2 does."""
    from gpuplatform import jobrunner

    monkeypatch.setattr(jobrunner, "RETRY_AFTER_ERROR_S", 0.1)
    interrupted.clear()
    runner(workers=1, inline=True, schedules=False, sole_consumer=sole_consumer)
    queue(f"{__name__}.job_interrupted_once", "launch")
    queue(f"{__name__}.job_ok", "next")
    until(lambda: ("ok", "next") in ran and left() == 0, "both jobs done")
    if sole_consumer:
        assert sorted(ran) == [("ok", "launch"), ("ok", "next")]
        assert not Failure.objects.exists()
    else:
        assert ran == [("ok", "next")]
        assert "server closed the connection" in Failure.objects.get().result


def job_always_interrupted():
    from django.db import OperationalError

    ran.append(("interrupted", None))
    raise OperationalError("canceling statement due to statement timeout")


JOBS[f"{__name__}.job_always_interrupted"] = job_always_interrupted


def test_a_job_the_database_breaks_every_time_is_recorded_as_failed_in_the_end(runner, monkeypatch):
    """psycopg counts a statement timeout with the lost connections: a job that always meets
    one is tried a bounded number of times, then recorded as any failure, not run for ever."""
    from gpuplatform import jobrunner

    monkeypatch.setattr(jobrunner, "RETRY_AFTER_ERROR_S", 0.05)
    runner(workers=1, inline=True, schedules=False, sole_consumer=True)
    queue(f"{__name__}.job_always_interrupted")
    until(lambda: left() == 0, "the job given up")
    assert len(ran) == jobrunner.INTERRUPTED_TRIES + 1
    assert "statement timeout" in Failure.objects.get().result


def test_claims_an_outage_stranded_on_a_node_queue_are_released_when_it_ends(monkeypatch):
    """A claim committed as the connection broke (or a job whose acknowledgement failed) holds
    its row for the broker's retry; the node's runner releases it when the outage ends."""
    from django.db import OperationalError

    from gpuplatform import jobrunner

    monkeypatch.setattr(jobrunner, "RETRY_AFTER_ERROR_S", 0)
    ran.clear()
    queue(f"{__name__}.job_ok", "stranded")
    claimed_until = timezone.now() + timedelta(seconds=Conf.RETRY)
    OrmQ.objects.filter(key=QUEUE).update(lock=claimed_until)  # claimed, never acknowledged
    node = JobRunner(QUEUE, workers=1, resolve=JOBS.get, schedules=False, inline=True,
                     sole_consumer=True)  # fmt: skip

    def down():
        raise OperationalError("connection refused")

    node._guarded(down)  # the outage
    thread = threading.Thread(target=node.run, daemon=True)
    thread.start()
    try:
        until(lambda: ran == [("ok", "stranded")] and left() == 0, "the stranded job run")
    finally:
        node.stop()
        thread.join(timeout=BOUND_S)
    # Any other queue's runner leaves another's claim alone.
    queue(f"{__name__}.job_ok", "claimed elsewhere")
    OrmQ.objects.filter(key=QUEUE).update(lock=claimed_until)
    shared = JobRunner(QUEUE, workers=1, resolve=JOBS.get, schedules=False)
    shared._guarded(down)
    assert shared._guarded(lambda: "reached") == "reached"
    assert OrmQ.objects.get(key=QUEUE).lock == claimed_until
