"""The node agent's job thread: what the control plane queues for a node is run there, with the
node's name, and taken off the queue; nothing else is run."""

from __future__ import annotations

import time

import pytest
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from gpuplatform.broker import NotifyingOrm
from nodeagent.launcher import jobs
from tests.nodeagent.launcher.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "ws-jobs"


@pytest.fixture
def ran(monkeypatch):
    """The node's job functions, recording their calls; the last one fails."""
    calls = []

    def record(*args, node):
        calls.append((args, node))
        return "ok"

    def fail(*args, node):
        calls.append((args, node))
        raise RuntimeError("a launch that failed")

    monkeypatch.setattr(jobs, "JOBS", {"nodeagent.launcher.tasks.launch_many": record,
                                       "nodeagent.launcher.tasks.control": fail})  # fmt: skip
    return calls


@pytest.fixture
def thread():
    running = jobs.NodeJobs(NODE)
    running.start()
    yield running
    running.stop()
    running.join(timeout=10)
    assert not running.is_alive()


def queue(func: str, *args, key: str = NODE, payload: str | None = None) -> None:
    package = {"func": func, "args": args, "kwargs": {}}
    NotifyingOrm(list_key=key).enqueue(payload or SignedPackage.dumps(package))


def test_a_nodes_job_runs_there_with_its_name_and_leaves_the_queue(ran, thread):
    queue("nodeagent.launcher.tasks.launch_many", [[7, 1]])
    queue("nodeagent.launcher.tasks.launch_many", [[8, 1]], key="another-node")
    wait_for(lambda: thread.done == 1)
    assert ran == [(([[7, 1]],), NODE)]
    assert list(OrmQ.objects.values_list("key", flat=True)) == ["another-node"]  # not ours


def test_a_failed_job_is_taken_off_and_the_next_still_runs(ran, thread):
    queue("nodeagent.launcher.tasks.control", 7, 1, "stop")
    queue("nodeagent.launcher.tasks.launch_many", [[9, 1]])
    wait_for(lambda: thread.done == 2)
    assert [node for _, node in ran] == [NODE, NODE]
    assert not OrmQ.objects.exists()


def test_only_the_nodes_own_signed_jobs_run(ran, thread):
    queue("scheduling.tasks.run_pass")  # signed, but not a node's job
    queue("nodeagent.launcher.tasks.launch_many", payload="not signed by the platform")
    wait_for(lambda: not OrmQ.objects.exists())
    assert ran == [] and thread.done == 0


def test_an_idle_job_thread_does_not_claim_again_until_told(monkeypatch):
    """Idle, it waits on its listener: a claim per notification (or per BACKSTOP_S), not one
    every second."""
    claims = []
    execute = NotifyingOrm._execute
    monkeypatch.setattr(
        NotifyingOrm,
        "_execute",
        lambda self, sql, params: claims.append(sql) or execute(self, sql, params),
    )
    running = jobs.NodeJobs(NODE)
    running.start()
    try:
        wait_for(lambda: running.broker._listener is not None and claims)
        time.sleep(2.5)
        assert len(claims) == 1, "it claimed again with nothing queued"
    finally:
        running.stop()
        running.join(timeout=jobs.BACKSTOP_S / 2)  # the stop ended its wait, not the backstop
    assert not running.is_alive()
