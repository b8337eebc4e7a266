"""The platform's django-q2 broker: the ORM broker's queue, woken by LISTEN/NOTIFY."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from gpuplatform import broker as broker_module
from gpuplatform.broker import NotifyingOrm, QueueBatch, channel_for
from scheduling import passes
from scheduling.passes import DelayedOrm
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tests.live import PYTHON, ROOT, process_env

pytestmark = pytest.mark.django_db(transaction=True)

# Far longer than any of these tests may take: a dequeue that returns at all was woken.
NEVER_S = 60.0
BOUND_S = 20.0


@pytest.fixture(autouse=True)
def idle_for_long(monkeypatch):
    monkeypatch.setattr(broker_module, "IDLE_S", NEVER_S)


def dequeue_in_thread(broker: NotifyingOrm) -> tuple[threading.Thread, list]:
    """Call dequeue until it hands something out or is interrupted, in a thread with its own
    connection."""
    got: list = []

    def run() -> None:
        try:
            deadline = time.monotonic() + BOUND_S
            # Until a stop, as a broker's owner does: an interrupted broker waits no more.
            while not got and not broker._interrupted.is_set() and time.monotonic() < deadline:
                got.extend(broker.dequeue() or [])
        finally:
            broker.close_listener()
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def wait_until_listening(broker: NotifyingOrm) -> None:
    deadline = time.monotonic() + BOUND_S
    while broker._listener is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert broker._listener is not None, "the broker never waited on its queue"


def test_a_waiting_dequeue_is_woken_by_the_commit_of_an_enqueue():
    waiting = NotifyingOrm(list_key="node-a")
    thread, got = dequeue_in_thread(waiting)
    wait_until_listening(waiting)
    with transaction.atomic():
        NotifyingOrm(list_key="node-a").enqueue("payload")
        time.sleep(0.3)
        assert got == [], "woken before the enqueue committed"
    began = time.monotonic()
    thread.join(BOUND_S)
    assert [payload for _, payload in got] == ["payload"]
    # Woken by the notification: without it the idle wait would have lasted NEVER_S.
    assert time.monotonic() - began < BOUND_S


def test_each_queue_hands_out_only_its_own_rows():
    waiting = NotifyingOrm(list_key="node-a")
    thread, got = dequeue_in_thread(waiting)
    wait_until_listening(waiting)
    NotifyingOrm(list_key="node-b").enqueue("for b")
    NotifyingOrm(list_key="node-a").enqueue("for a")
    thread.join(BOUND_S)
    assert [payload for _, payload in got] == ["for a"]
    assert list(OrmQ.objects.filter(key="node-b").values_list("payload", flat=True)) == ["for b"]


def test_a_batch_queues_jobs_on_several_queues_in_one_statement_and_wakes_each_at_commit():
    waiting = {key: NotifyingOrm(list_key=key) for key in ("node-a", "node-b")}
    threads = {key: dequeue_in_thread(broker) for key, broker in waiting.items()}
    for broker in waiting.values():
        wait_until_listening(broker)
    batch = QueueBatch()
    with transaction.atomic(), CaptureQueriesContext(connections["default"]) as queued:
        for key, args in (("node-a", [[1, 1]]), ("node-b", [[2, 1], [3, 1]])):
            # As a pass queues its launches; sync=False: tests run django-q2's jobs inline.
            async_task("nodeagent.launcher.tasks.launch_many", *args, cluster=key,
                       broker=batch.broker(key), sync=False)  # fmt: skip
        batch.send()
        time.sleep(0.3)
        assert all(got == [] for _, got in threads.values()), "woken before the commit"
    assert len(queued) == 1
    for key, (thread, got) in threads.items():
        thread.join(BOUND_S)
        (job,) = [SignedPackage.loads(payload) for _, payload in got]
        assert (job["func"], job["cluster"]) == ("nodeagent.launcher.tasks.launch_many", key)
    assert sorted(OrmQ.objects.values_list("key", flat=True)) == ["node-a", "node-b"]


def test_a_delayed_row_is_handed_out_once_due_without_another_notification():
    waiting = NotifyingOrm(list_key="gpuplatform")
    thread, got = dequeue_in_thread(waiting)
    wait_until_listening(waiting)
    due = timezone.now() + timedelta(seconds=0.5)
    DelayedOrm(list_key="gpuplatform", due=due).enqueue("wake-up")
    thread.join(BOUND_S)
    assert [payload for _, payload in got] == ["wake-up"]
    assert timezone.now() >= due


def test_channel_names_are_identifiers_whatever_the_queue_is_called():
    for key in ("gpuplatform", "node with spaces", "ü" * 80, 'a"; DROP TABLE x; --'):
        name = channel_for(key)
        assert name.startswith("djq_") and len(name) == 12 and name.isascii()


def test_ready_rows_are_claimed_oldest_first_in_one_statement_and_acknowledged_in_one():
    broker = NotifyingOrm(list_key="node-a")
    for n in range(5):
        broker.enqueue(f"job-{n}")
    got = []
    for _ in range(5):  # Q_CLUSTER's bulk is 1: a job per claim
        with CaptureQueriesContext(connections["default"]) as claim:
            got += broker.dequeue()
        assert len(claim.captured_queries) == 1
    assert [payload for _, payload in got] == [f"job-{n}" for n in range(5)]
    # Claimed rows are locked until retry: none of them is ready any more.
    assert OrmQ.objects.filter(key="node-a", lock__lt=timezone.now()).count() == 0
    with CaptureQueriesContext(connections["default"]) as ack:
        broker.acknowledge(got[0][0])
    assert len(ack.captured_queries) == 1
    assert OrmQ.objects.filter(key="node-a").count() == 4


def test_a_dequeue_that_finds_nothing_ready_learns_when_to_look_again_in_the_same_statement():
    broker = NotifyingOrm(list_key="gpuplatform")
    due = timezone.now() + timedelta(seconds=0.3)
    DelayedOrm(list_key="gpuplatform", due=due).enqueue("wake-up")
    try:
        with CaptureQueriesContext(connections["default"]) as queries:
            assert broker.dequeue() is None  # nothing ready: it waited instead
        # Until the row fell due (IDLE_S is a minute here), told so by the claim itself.
        assert timezone.now() >= due
        assert len(queries.captured_queries) == 1
        assert [payload for _, payload in broker.dequeue()] == ["wake-up"]
    finally:
        broker.close_listener()


def test_after_a_claim_the_next_look_waits_for_a_notification_before_claiming(monkeypatch):
    broker = NotifyingOrm(list_key="node-a")
    broker.enqueue("first")
    claims: list[str] = []
    execute = broker._execute
    monkeypatch.setattr(
        broker, "_execute", lambda sql, params: claims.append(sql) or execute(sql, params)
    )
    assert [payload for _, payload in broker.dequeue()] == ["first"]
    thread, got = dequeue_in_thread(broker)
    wait_until_listening(broker)
    time.sleep(0.3)
    assert len(claims) == 1, "it claimed again before any notification"
    NotifyingOrm(list_key="node-a").enqueue("second")
    thread.join(BOUND_S)
    assert [payload for _, payload in got] == ["second"]
    assert len(claims) == 2  # one claim per job, none that finds the queue empty


def test_an_interrupt_ends_a_wait_at_once_and_every_later_one():
    broker = NotifyingOrm(list_key="node-a")
    thread, got = dequeue_in_thread(broker)
    wait_until_listening(broker)
    time.sleep(0.2)  # into its wait (IDLE_S is a minute here)
    broker.interrupt()
    thread.join(BOUND_S)
    assert not thread.is_alive() and got == []
    # A broker interrupted before it waits does not wait either: a stop is not missed.
    broker = NotifyingOrm(list_key="node-a")
    broker.interrupt()
    try:
        began = time.monotonic()
        assert broker.dequeue() is None
        assert time.monotonic() - began < BOUND_S
    finally:
        broker.close_listener()


def test_a_listener_whose_session_ends_wakes_the_wait_and_a_new_one_takes_the_next_job():
    broker = NotifyingOrm(list_key="node-a")
    thread, got = dequeue_in_thread(broker)
    wait_until_listening(broker)
    time.sleep(0.2)  # into its wait (IDLE_S is a minute here)
    lost = broker._listener.info.backend_pid
    with connections["default"].cursor() as cursor:  # what a restarted server does to it
        cursor.execute("SELECT pg_terminate_backend(%s)", [lost])
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        listener = broker._listener
        if listener is not None and listener.info.backend_pid not in (0, lost):
            break
        time.sleep(0.01)
    else:
        pytest.fail("no new listener after the first one's session ended")
    NotifyingOrm(list_key="node-a").enqueue("after the loss")
    thread.join(BOUND_S)
    assert [payload for _, payload in got] == ["after the loss"]


def test_a_job_queued_between_the_claim_and_the_wait_wakes_the_wait():
    """The listener listens before the claim: a notification sent after the claim found the
    queue empty is waiting for it when it waits."""
    broker = NotifyingOrm(list_key="node-a")
    execute = broker._execute

    def claim_then_queue(sql, params):
        rows = execute(sql, params)
        if not any(pk for pk, _, _ in rows):
            queued = threading.Thread(target=enqueue_elsewhere, args=("in between",))
            queued.start()
            queued.join()
        return rows

    broker._execute = claim_then_queue
    thread, got = dequeue_in_thread(broker)
    thread.join(BOUND_S)
    assert [payload for _, payload in got] == ["in between"]
    assert not thread.is_alive()


def enqueue_elsewhere(payload: str) -> None:
    try:
        NotifyingOrm(list_key="node-a").enqueue(payload)
    finally:
        connections.close_all()


def test_a_dequeue_outside_a_transaction_survives_a_dropped_session():
    broker = NotifyingOrm(list_key="node-a")
    broker.enqueue("after the drop")
    # What a restarted server leaves a persistent connection with: a closed socket.
    connections["default"].connection.close()
    got = broker.dequeue()
    assert [payload for _, payload in got] == ["after the drop"]


def test_cluster_statistics_reach_the_cache_every_few_seconds_not_every_guard_cycle(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(broker_module.time, "monotonic", lambda: clock[0])
    broker = NotifyingOrm("stats")
    broker.cache.clear()  # other tests' clusters leave their statistics there
    broker.set_stat("q:stat:a", "first", 3)
    broker.set_stat("q:stat:a", "half a second later", 3)  # skipped
    broker.set_stat("q:stat:b", "another cluster", 3)
    assert broker.get_stat("q:stat:a") == "first"
    assert broker.get_stat("q:stat:b") == "another cluster"

    clock[0] += broker_module.STAT_EVERY_S
    broker.set_stat("q:stat:a", "later", 3)
    assert broker.get_stat("q:stat:a") == "later"
    assert [stat for stat in broker.get_stats("q:stat:*")] == ["later", "another cluster"]


def test_saved_statistics_outlive_the_pause_between_saves(monkeypatch):
    saved = []
    monkeypatch.setattr(broker_module.ORM, "set_stat", lambda self, *args: saved.append(args))
    NotifyingOrm("stats").set_stat("q:stat:a", "value", 3)
    assert saved == [("q:stat:a", "value", 3 * broker_module.STAT_EVERY_S)]


def test_claims_and_acknowledgements_do_not_wait_for_the_disk_but_a_callers_transaction_does():
    broker = NotifyingOrm(list_key="node-a")
    broker.enqueue("job")
    with CaptureQueriesContext(connections["default"]) as queries:
        ((pk, _),) = broker.dequeue()
        broker.acknowledge(pk)
    assert all("synchronous_commit" in q["sql"] for q in queries.captured_queries)
    assert current_synchronous_commit() == "on"  # for that statement's transaction alone

    # A broker of its own: the first, having emptied its queue, would first wait for a
    # notification, which this transaction sends only at its commit (IDLE_S is a minute here).
    broker = NotifyingOrm(list_key="node-a")
    with transaction.atomic():
        broker.enqueue("job")
        ((pk, _),) = broker.dequeue()
        broker.acknowledge(pk)
        assert current_synchronous_commit() == "on"


def current_synchronous_commit() -> str:
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


# --- django-q2's own broker (GPUPLATFORM_STOCK=broker) -----------------------------------------


@pytest.fixture
def stock_broker(monkeypatch):
    """What GPUPLATFORM_STOCK=broker gives: no broker_class, so django-q2's ORM broker, polling
    every 10 ms here."""
    monkeypatch.setattr(Conf, "BROKER_CLASS", None)
    monkeypatch.setattr(Conf, "POLL", 0.01)


def test_with_the_stock_broker_a_batch_queues_each_job_at_once_in_the_callers_transaction(
    stock_broker,
):
    batch = QueueBatch()
    with transaction.atomic():
        for key in ("node-a", "node-b"):
            async_task("scheduling.launcher.tasks.launch_many", [[1, 1]], cluster=key,
                       broker=batch.broker(key), sync=False)  # fmt: skip
        assert sorted(OrmQ.objects.values_list("key", flat=True)) == ["node-a", "node-b"]
        batch.send()  # nothing left to send
    assert OrmQ.objects.count() == 2
    ((_, payload),) = ORM(list_key="node-b").dequeue()
    assert SignedPackage.loads(payload)["cluster"] == "node-b"


def test_the_stock_broker_hands_a_delayed_row_out_only_once_due(stock_broker):
    due = timezone.now() + timedelta(seconds=0.5)
    DelayedOrm(list_key="gpuplatform", due=due).enqueue("wake-up")
    broker = ORM(list_key="gpuplatform")
    assert broker.dequeue() is None
    deadline = time.monotonic() + BOUND_S
    while not (got := broker.dequeue()) and time.monotonic() < deadline:
        pass
    assert [payload for _, payload in got] == ["wake-up"]
    assert timezone.now() >= due


@pytest.mark.slow
def test_the_scheduler_on_the_stock_broker_places_a_submitted_task(
    lab, workstation, stock_broker, monkeypatch
):
    # The pass request goes to the broker, as the web's do, not inline as in tests.
    monkeypatch.setattr(passes, "async_task", functools.partial(async_task, sync=False))
    environ = process_env(Q_SYNC="0", GPUPLATFORM_STOCK="broker")
    environ.pop("Q_CLUSTER_NAME", None)
    cluster = subprocess.Popen(  # noqa: S603 - fixed argv
        [PYTHON, "manage.py", "scheduler"], cwd=ROOT, env=environ, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with transaction.atomic():
            task = task_submit(tenant=lab, spec=TaskSpec(name="stock", command="true"))
        deadline = time.monotonic() + 60
        while task.state == TaskState.PENDING and time.monotonic() < deadline:
            time.sleep(0.1)
            task.refresh_from_db()
        assert task.state == TaskState.SCHEDULED, task.reason
    finally:
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()


def test_with_the_stock_broker_the_scheduler_and_node_agents_poll_with_it(stock_broker):
    # Nothing notifies a queue then: a wait on a LISTEN connection would end only at its
    # backstop (the node's 30 s, as the stock bench found), so they take django-q2's broker.
    from gpuplatform.broker import queue_broker
    from gpuplatform.jobrunner import JobRunner
    from nodeagent.launcher.jobs import NodeJobs

    assert type(queue_broker("node-a", idle_s=30.0)) is ORM
    assert type(NodeJobs("node-a").broker) is ORM
    assert type(JobRunner("gpuplatform", workers=1, resolve=lambda name: None).broker) is ORM


def test_with_the_platforms_broker_they_wait_on_their_queues_listener():
    from gpuplatform.broker import queue_broker
    from nodeagent.launcher.jobs import BACKSTOP_S, NodeJobs

    assert isinstance(queue_broker("node-a"), NotifyingOrm)
    assert NodeJobs("node-a").broker.idle_s == BACKSTOP_S


def test_a_listener_that_cannot_be_opened_is_warned_of_once_until_it_opens(monkeypatch, caplog):
    broker = NotifyingOrm(list_key="node-a")
    tries = [psycopg.OperationalError("refused"), psycopg.OperationalError("refused"), "open"]

    def listener():
        outcome = tries.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(broker, "listener", listener)
    with caplog.at_level(logging.DEBUG, logger="gpuplatform.broker"):
        assert [broker._listen() for _ in range(3)] == [None, None, "open"]
    said = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]
    assert said == [
        ("WARNING", "cannot listen to queue node-a"),
        ("DEBUG", "cannot listen to queue node-a"),
        ("INFO", "listening to queue node-a again"),
    ]
