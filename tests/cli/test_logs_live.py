"""The live tail: ``GET .../log/?offset=N&wait=S`` answers as soon as a line is written or the
attempt ends (a long-poll), and ``gpuctl logs -f`` uses it, so a line a running task writes
reaches gpuctl without waiting for a poll. Latencies are printed, never asserted."""

from __future__ import annotations

import queue
import statistics
import threading
import time

import httpx
import pytest

from scheduling.models import Task, TaskAttempt
from tests.cli.test_gpuctl import Gpuctl, live_db, server, write  # noqa: F401 - fixtures
from tests.factories import TaskFactory

pytestmark = [pytest.mark.slow, live_db]


@pytest.fixture
def gpuctl(tmp_path) -> Gpuctl:
    return Gpuctl(tmp_path)


def running(owner, node, log) -> Task:
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, name="live", state="running",
                       node=node, attempt=1)  # fmt: skip
    TaskAttempt.objects.create(task=task, number=1, node=node, log_path=str(log))
    return task


def test_a_waiting_read_answers_when_a_line_comes_or_the_attempt_ends(
    server,  # noqa: F811
    owner,
    outsider,
    workstation,
    tmp_path,
):
    log = write(tmp_path / "live.log", "start\n")
    task = running(owner, workstation, log)
    url = f"/api/v1/tasks/{task.pk}/log/"
    auth = {"Authorization": f"Bearer {owner.token}"}
    with httpx.Client(base_url=server, headers=auth, timeout=60) as client:
        quiet = client.get(url, params={"offset": 6, "wait": 1})
        assert quiet.status_code == 200
        assert (quiet.json()["text"], quiet.json()["finished"]) == ("", False)
        timer = threading.Timer(0.5, lambda: log.open("a").write("tick\n"))
        timer.start()
        began = time.monotonic()
        answer = client.get(url, params={"offset": 6, "wait": 25})
        print(f"\nlong-poll answered {time.monotonic() - began - 0.5:.3f} s after the write")
        timer.join()
        assert answer.json()["text"] == "tick\n" and answer.json()["next_offset"] == 11
        ends = threading.Timer(0.5, lambda: TaskAttempt.objects.filter(task=task).update(
            outcome="succeeded", exit_code=0))  # fmt: skip
        ends.start()
        last = client.get(url, params={"offset": 11, "wait": 25})
        ends.join()
        assert (last.json()["text"], last.json()["finished"]) == ("", True)
        too_long = client.get(url, params={"offset": 0, "wait": 31})
        assert too_long.status_code == 400 and "wait" in too_long.json()["errors"]
    # Another tenant's task is not there, waiting or not.
    other = {"Authorization": f"Bearer {outsider.token}"}
    refused = httpx.get(f"{server}{url}", params={"offset": 0, "wait": 5}, headers=other)
    assert refused.status_code == 404


def test_gpuctl_follows_a_running_tasks_new_lines_as_they_are_written(
    server,  # noqa: F811
    gpuctl,
    owner,
    workstation,
    tmp_path,
):
    log = write(tmp_path / "live.log", "start\n")
    task = running(owner, workstation, log)
    gpuctl.ok("login", "--url", server, "--token", owner.token)
    follower = gpuctl.popen("logs", "-f", str(task.pk))
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout])
    reader.start()
    try:
        assert lines.get(timeout=30) == "start\n"
        latencies = []
        for i in range(8):
            time.sleep(0.4)  # quiet: the follower is waiting at the server
            with log.open("a") as handle:
                handle.write(f"tick {i}\n")
            written = time.monotonic()
            assert lines.get(timeout=30) == f"tick {i}\n"
            latencies.append(time.monotonic() - written)
        print(
            f"\ngpuctl logs -f: a written line printed after {statistics.median(latencies):.3f} s"
            f" (median of {len(latencies)}), {max(latencies):.3f} s at most"
        )
        TaskAttempt.objects.filter(task=task).update(outcome="succeeded", exit_code=0)
        Task.objects.filter(pk=task.pk).update(state="succeeded", exit_code=0)
        assert follower.wait(timeout=60) == 0, follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        reader.join(timeout=10)
