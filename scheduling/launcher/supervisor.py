"""The supervisor of one task attempt: ``python -m scheduling.launcher.supervisor TASK ATTEMPT``.

Started detached by the node's launch task. It runs the command with ``/bin/sh -c`` in the
tenant's work directory, appends its output to the attempt's log file (a file, not a pipe: the
task keeps writing whatever happens to us), and reports to the database. Signals from the
node's control task: SIGTERM stops the task (SIGTERM, grace, SIGKILL to every descendant),
SIGUSR1 pauses it (SIGSTOP), SIGUSR2 resumes it. It enforces the timeout itself, kills what the
command left behind, and writes the exit status to a file before telling the database, so the
status survives a database outage and restarts of every other platform process.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import signal
import subprocess
import sys
import time

import django
from django.conf import settings  # lazy: read after django.setup()

logger = logging.getLogger("scheduling.supervisor")

POLL_S = 0.1
FENCE_EVERY_S = 5.0
REPORT_TRIES = 120  # one report a second for two minutes, then leave it to reconciliation


def task_environment(task, attempt) -> dict[str, str]:
    """A clean environment: the platform's own (DATABASE_URL, SECRET_KEY, ...) never leaks."""
    gpus = ",".join(attempt.gpu_uuids)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME", "/"),
    }
    env.update(task.env)  # names that could subvert the platform were refused at submission
    env.update(
        CUDA_VISIBLE_DEVICES=gpus,
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        NVIDIA_VISIBLE_DEVICES=gpus or "void",
        GPUPLATFORM_TASK_ID=str(task.pk),
        GPUPLATFORM_TASK_NAME=task.name,
        GPUPLATFORM_ATTEMPT=str(attempt.number),
        GPUPLATFORM_GPUS=gpus,
        GPUPLATFORM_TENANT=task.tenant.name,
    )
    return env


class Supervisor:
    def __init__(self, task_id: int, attempt_no: int) -> None:
        from scheduling.models import TaskAttempt

        self.attempt = TaskAttempt.objects.select_related("task__tenant", "node").get(
            task_id=task_id, number=attempt_no
        )
        self.task = self.attempt.task
        self.stop_asked = False
        self.pause_asked: bool | None = None
        self.paused_since: float | None = None
        self.paused_total = 0.0

    # -- signals from the control task --

    def install_signals(self) -> None:
        def stop(signum, frame):
            self.stop_asked = True

        def pause(signum, frame):
            self.pause_asked = True

        def resume(signum, frame):
            self.pause_asked = False

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGUSR1, pause)
        signal.signal(signal.SIGUSR2, resume)

    # -- the run --

    def run(self) -> int:
        from scheduling.launcher import lifecycle, paths, procs
        from scheduling.models import TaskAttempt

        procs.become_subreaper()
        procs.set_name(procs.SUPERVISOR_NAME)
        self.install_signals()
        me = procs.ProcessId.of(os.getpid())
        TaskAttempt.objects.filter(pk=self.attempt.pk).update(
            supervisor_pid=me.pid, supervisor_started=me.started
        )
        try:
            cwd = paths.workdir(self.task.tenant.name, self.task.workdir, create=True)
        except (paths.PathEscape, OSError) as exc:
            return self.finish(None, problem=f"cannot use the work directory: {exc}")
        log = os.open(self.attempt.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            child = subprocess.Popen(  # noqa: S603 - the tenant's command is the point
                ["/bin/sh", "-c", self.task.command],
                cwd=cwd,
                env=task_environment(self.task, self.attempt),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                **self.run_as(),
            )
        except OSError as exc:
            return self.finish(None, problem=f"cannot start the command: {exc}")
        finally:
            os.close(log)
        if not lifecycle.attempt_started(self.attempt, procs.ProcessId.of(child.pid)):
            procs.kill_tree(settings.TASK_STOP_GRACE, keep=child.pid)
            return self.finish(child.wait())
        return self.watch(child)

    def run_as(self) -> dict:
        """Run as the tenant's Unix user when configured and we are root."""
        name = self.task.tenant.unix_user
        if not (settings.RUN_AS_TENANT_USER and name and os.geteuid() == 0):
            return {}
        entry = pwd.getpwnam(name)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def watch(self, child: subprocess.Popen) -> int:
        from scheduling.launcher import lifecycle, procs

        started = time.monotonic()
        next_fence = started + FENCE_EVERY_S
        timeout = self.task.timeout_s
        timed_out = False
        while True:
            try:
                code = child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            procs.reap()
            self.apply_pause()
            now = time.monotonic()
            if now >= next_fence:
                next_fence = now + FENCE_EVERY_S
                if not self.safe(lifecycle.still_wanted, self.attempt.pk, default=True):
                    self.stop_asked = True  # superseded (lost and requeued): never run twice
            running_for = now - started - self.paused_total
            if timeout and running_for > timeout and self.paused_since is None:
                timed_out = True
                self.stop_asked = True
            if self.stop_asked:
                procs.kill_tree(settings.TASK_STOP_GRACE, keep=child.pid)
                code = child.wait()
                break
        # The main process is done; nothing it started may outlive it.
        procs.kill_tree(min(5, settings.TASK_STOP_GRACE), keep=None)
        procs.reap()
        return self.finish(code, timed_out=timed_out)

    def apply_pause(self) -> None:
        from scheduling.launcher import procs

        if self.pause_asked is None:
            return
        tree = procs.descendants()
        if self.pause_asked and self.paused_since is None:
            procs.signal_all(tree, signal.SIGSTOP)
            self.paused_since = time.monotonic()
        elif not self.pause_asked and self.paused_since is not None:
            procs.signal_all(tree, signal.SIGCONT)
            self.paused_total += time.monotonic() - self.paused_since
            self.paused_since = None
        self.pause_asked = None

    # -- the end --

    def finish(self, returncode: int | None, *, timed_out: bool = False, problem: str = "") -> int:
        from scheduling.launcher import lifecycle, paths

        exit_code = (
            None if returncode is None else (returncode if returncode >= 0 else 128 - returncode)
        )
        record = {
            "exit_code": exit_code,
            "timed_out": timed_out,
            "problem": problem,
            "ended_at": time.time(),
        }
        exit_file = paths.exit_path(self.task.tenant.name, self.task.pk, self.attempt.number)
        paths.write_atomically(exit_file, json.dumps(record))
        for _ in range(REPORT_TRIES):
            outcome = self.safe(
                lifecycle.attempt_finished,
                self.task.pk,
                self.attempt.number,
                exit_code,
                timed_out=timed_out,
                problem=problem,
                default=None,
            )
            if outcome is not None:
                logger.info("attempt %s ended: %s (exit %s)", self.attempt, outcome, exit_code)
                return 0
            time.sleep(1)
        logger.error("could not report %s; the exit file %s keeps it", self.attempt, exit_file)
        return 1

    def safe(self, func, *args, default, **kwargs):
        """Call a database service, surviving a database that is down for a while."""
        from django.db import DatabaseError, close_old_connections

        try:
            return func(*args, **kwargs)
        except DatabaseError as exc:
            logger.warning("database unavailable (%s); will retry", exc)
            close_old_connections()
            return default


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    django.setup()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    task_id, attempt_no = int(argv[1]), int(argv[2])
    return Supervisor(task_id, attempt_no).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
