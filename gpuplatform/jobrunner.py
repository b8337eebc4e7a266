"""One process that takes a django-q2 queue's jobs and runs them on threads of its own.

django-q2's cluster (``manage.py qcluster``) is a process tree: a main process, a sentinel, a
pusher, a monitor and one process per worker, each a copy of Django, talking through
multiprocessing queues. For the platform's control plane (a pass at a time under an advisory
lock, a schedule now and then, a webhook) that is most of what an idle workstation weighs.
``JobRunner`` does the same work in one process, on the same queue table and the same broker
(``gpuplatform.broker``: claimed rows, LISTEN wake-ups, acknowledgements), so the two are
interchangeable and may even run side by side (with ``GPUPLATFORM_STOCK=broker``, django-q2's
own polling ORM broker):

- the main thread claims a job only when a worker is free (nothing claimed waits in memory,
  where a stop would strand it until the broker's retry), hands it to a worker thread, and runs
  django-q2's ``scheduler`` (its ``Schedule`` rows) every ``SCHEDULE_EVERY_S``, as django-q2's
  sentinel does; in between it sleeps on the queue's LISTEN connection (a job queued, a
  delayed one falling due, the schedules' time or a stop wakes it), not a poll a second;
- each worker closes old connections and sends ``pre_execute`` before a job (as django-q2's
  workers do), runs it, and saves a failure as django-q2's monitor does (``save_task``: the
  admin's failed tasks; successes are saved only as ``save_limit`` says), then acknowledges it;
- a job that runs past ``Q_CLUSTER["timeout"]`` is reported in the log, once: a thread cannot
  be killed as django-q2 kills a worker process, so the others keep taking the queue's jobs;
- on a queue it alone takes (``sole_consumer``: a node's, whose agent is its only reader), no
  job is lost to a database outage: a job that failed because the database went away is not
  recorded nor acknowledged (up to ``INTERRUPTED_TRIES`` times), and the first look at the
  queue after the outage releases the claims it left (that job's, one whose acknowledgement
  failed, one whose claim committed as the connection broke), so they run again at once, not
  after the broker's ``retry`` (``Q_CLUSTER``) or the node's reconciliation. Node jobs are
  idempotent (a launch starts a task once however often it comes), and a node's queue holds
  no delayed jobs, which this would release early.

What a process like this runs is the queue's to say: its jobs are signed with SECRET_KEY
(django-q2's ``SignedPackage``), and ``resolve`` names the only functions it will run.
"""

from __future__ import annotations

import logging
import math
import queue
import signal
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone
from django_q.conf import Conf
from django_q.monitor import save_task
from django_q.scheduler import scheduler as run_schedules
from django_q.signals import pre_execute
from django_q.signing import BadSignature, SignedPackage

from gpuplatform import broker
from gpuplatform.outage import OutageLog, database_unavailable

logger = logging.getLogger(__name__)

SCHEDULE_EVERY_S = 30.0  # as django-q2's sentinel: its Schedule rows are per minute at best
RETRY_AFTER_ERROR_S = 1.0
# A sole consumer's job broken by the database this often is recorded as failed: its error
# (a statement timeout, say, which psycopg counts with the lost connections) may be its own.
INTERRUPTED_TRIES = 3
STOP = object()


class JobRunner:
    """Run the jobs of the queue ``list_key`` on ``workers`` threads (``inline``: one at a time
    on the thread that calls ``run``) until ``stop()``.

    ``resolve(name)`` returns the function a job names, or None for a name this process does not
    run (the job is then failed, as a job that does not unpack is)."""

    def __init__(
        self,
        list_key: str,
        *,
        workers: int,
        resolve: Callable[[str], Callable | None],
        schedules: bool = True,
        timeout_s: float | None = None,
        backstop_s: float = SCHEDULE_EVERY_S,
        inline: bool = False,
        sole_consumer: bool = False,
    ) -> None:
        self.list_key = list_key
        self.sole_consumer = sole_consumer
        # After an outage, a sole consumer's claims to release before its next statement.
        self._stranded = False
        self._interrupted: dict[object, int] = {}  # ack id: how often the database broke it
        # The platform's broker (Q_CLUSTER["broker_class"]), django-q2's own with
        # GPUPLATFORM_STOCK=broker.
        self.broker = broker.queue_broker(list_key, idle_s=backstop_s)
        # The longest the main thread sleeps when nothing wakes it: every wake-up it needs
        # comes from the listener's socket or from ``stop``; this bounds what nothing tells it.
        self.backstop_s = backstop_s
        self.resolve = resolve
        self.schedules = schedules and Conf.SCHEDULER
        self.timeout_s = Conf.TIMEOUT if timeout_s is None else timeout_s
        self.stopping = threading.Event()
        # ``inline``: one job at a time on the main thread, on its own connection (a node
        # agent's, whose connections are counted: gpuplatform.connections), no worker threads.
        self.free = threading.Semaphore(1 if inline else workers)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        # ack id: (the job's function, when it was handed to a worker); set by the main thread,
        # so that its next sleep already ends at that job's timeout.
        self.running: dict[object, tuple[str, float]] = {}
        self.reported: set[object] = set()
        self.done = 0
        self._outage = OutageLog(logger)
        self.threads = [] if inline else [
            threading.Thread(target=self._work, name=f"job-worker-{n}", daemon=True)
            for n in range(1, workers + 1)
        ]  # fmt: skip

    def run(self) -> None:
        """Take jobs until stopped, then let the running ones finish."""
        logger.info(
            "job runner on queue %s running: %s",
            self.list_key,
            f"{len(self.threads)} worker thread(s)" if self.threads else "jobs run inline",
        )
        for thread in self.threads:
            thread.start()
        next_schedules = time.monotonic() if self.schedules else math.inf
        try:
            while not self.stopping.is_set():
                if self.schedules and time.monotonic() >= next_schedules:
                    next_schedules = time.monotonic() + SCHEDULE_EVERY_S
                    self._guarded(run_schedules, broker=self.broker)
                self._report_overdue()
                if not self.free.acquire(timeout=1.0):
                    continue  # every worker busy: look at the schedules and the clock again
                if self.stopping.is_set():
                    break
                if isinstance(self.broker, broker.NotifyingOrm):
                    # Asleep until a job, or the schedules' time, or a running job's timeout.
                    self.broker.idle_s = max(0.05, self._next_look(next_schedules))
                claimed = self._guarded(self.broker.dequeue)  # waits for a wake-up
                claimed = list(claimed or ())
                if not claimed:
                    self.free.release()
                    continue
                for n, (ack_id, payload) in enumerate(claimed):
                    if n:  # a claim of more than one (Q_CLUSTER's bulk): a worker each
                        self.free.acquire()
                    self.running[ack_id] = ("a job", time.monotonic())
                    if self.threads:
                        self.jobs.put((ack_id, payload))
                    else:
                        self._run(ack_id, payload)
        finally:
            for _ in self.threads:
                self.jobs.put(STOP)
            for thread in self.threads:
                thread.join()
            broker.close_listener(self.broker)
            connections.close_all()  # this thread's
            logger.info("job runner on queue %s stopped (%d jobs run)", self.list_key, self.done)

    def stop(self) -> None:
        logger.info("job runner on queue %s: stopping", self.list_key)
        self.stopping.set()
        broker.interrupt(self.broker)  # ends the main thread's wait at once

    def stop_on_signals(self) -> None:
        """SIGTERM and SIGINT stop the runner (from the main thread only, as signals are)."""

        def stop(signum: int, frame: object) -> None:
            # On a thread of its own: the handler runs on the main thread, which may hold the
            # broker's wake lock at this moment (``interrupt`` takes it).
            threading.Thread(target=self.stop, name="job-runner-stop", daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def _guarded(self, func: Callable, *args, **kwargs):
        """``func``, where the database being unreachable costs a pause, not the process. An
        outage is logged once as a warning (each retry after it at debug) and its end once."""
        try:
            if self._stranded:
                released = self.broker.release_claims(list(self.running))
                self._stranded = False
                if released:
                    logger.info(
                        "queue %s: %d job(s) an outage interrupted or stranded, run again",
                        self.list_key,
                        released,
                    )
            result = func(*args, **kwargs)
        except DatabaseError as exc:
            self._unreachable(exc)
            return None
        self._outage.reached("queue %s: database reachable again after %.0f s", self.list_key)
        return result

    def _unreachable(self, exc: BaseException) -> None:
        self._outage.failed(
            "queue %s: database unreachable (%s); trying again every %.0f s",
            self.list_key,
            exc,
            RETRY_AFTER_ERROR_S,
        )
        self._stranded = self.sole_consumer and isinstance(self.broker, broker.NotifyingOrm)
        close_old_connections()
        self.stopping.wait(RETRY_AFTER_ERROR_S)

    def _work(self) -> None:
        for ack_id, payload in iter(self.jobs.get, STOP):
            self._run(ack_id, payload)
        connections.close_all()  # this thread's

    def _run(self, ack_id, payload: str) -> None:
        try:
            self.run_one(ack_id, payload)
        finally:
            self.running.pop(ack_id, None)
            self.reported.discard(ack_id)
            self.free.release()

    def run_one(self, ack_id, payload: str) -> None:
        try:
            task = SignedPackage.loads(payload)
            func = self.resolve(task["func"])
        except (BadSignature, KeyError, TypeError, ValueError) as exc:
            func, task = None, {"func": f"? ({exc!r})"}
        if func is None:
            logger.error(
                "queue %s: job %s refused: %s is not run here", self.list_key, ack_id, task["func"]
            )
            self._guarded(self.broker.fail, ack_id)
            return
        self.running[ack_id] = (task["func"], self.running.get(ack_id, ("", time.monotonic()))[1])
        close_old_connections()
        pre_execute.send(sender="django_q", func=func, task=task)
        try:
            result, success = func(*task.get("args", ()), **task.get("kwargs", {})), True
        except Exception as exc:  # one job's failure must not stop the others
            tries = self._interrupted.get(ack_id, 0)
            if self.sole_consumer and database_unavailable(exc) and tries < INTERRUPTED_TRIES:
                # Neither recorded nor acknowledged: run again once the database answers.
                self._interrupted[ack_id] = tries + 1
                logger.warning(
                    "queue %s: job %s interrupted by the database (%s); it runs again",
                    self.list_key,
                    task["func"],
                    exc,
                )
                self._unreachable(exc)
                return
            logger.exception("queue %s: job %s failed", self.list_key, task["func"])
            result, success = f"{exc!r}", False
            close_old_connections()
        self._interrupted.pop(ack_id, None)
        task.update(result=result, success=success, stopped=timezone.now())
        task["cluster"], task["ack_id"] = self.list_key, ack_id
        self._guarded(save_task, task, self.broker)  # failures, and successes save_limit keeps
        if success or task.get("ack_failure", Conf.ACK_FAILURES):
            self._guarded(self.broker.acknowledge, ack_id)
        self.done += 1

    def _next_look(self, next_schedules: float) -> float:
        """Seconds until the main thread must look again: the schedules, or the first running
        job to run past its timeout (not reported yet)."""
        overdue = [since + self.timeout_s for ack_id, (_, since) in list(self.running.items())
                   if ack_id not in self.reported]  # fmt: skip
        return min(min([next_schedules, *overdue]) - time.monotonic(), self.backstop_s)

    def _report_overdue(self) -> None:
        now = time.monotonic()
        for ack_id, (job, since) in list(self.running.items()):
            if now - since > self.timeout_s and ack_id not in self.reported:
                self.reported.add(ack_id)
                logger.error(
                    "queue %s: job %s (%s) has run %.0f s, past Q_TIMEOUT (%s s); the other "
                    "workers go on taking jobs",
                    self.list_key,
                    ack_id,
                    job,
                    now - since,
                    self.timeout_s,
                )
