"""The supervisor of one task attempt: ``python -m nodeagent.launcher.supervisor TASK ATTEMPT``.

Started detached for the node's launch task: forked by the node's spawner (``spawner``), which
hands it a ``messages.Assignment`` and never loads Django's models, or by the launch worker
itself, or as a fresh interpreter (``SUPERVISOR_START=exec``). It runs
the command with ``/bin/sh -c`` in the tenant's work directory, as the tenant's Unix user when
it is root, inside the attempt's own cgroup (see ``tracking``); it copies the task's output
into the attempt's log, and reports that the command started and how it ended through the node
agent (``relay``, which writes many supervisors' reports at once), or to the database itself
when the agent cannot take them. Signals from the node's control task:
SIGTERM stops the task (SIGTERM, grace, then the whole cgroup or process tree is killed),
SIGUSR1 pauses it (freeze), SIGUSR2 resumes it (thaw). It enforces the timeout itself, and
writes the exit status to a file reserved in advance before telling the database, so the status
survives a full disk, a database outage and restarts of every other platform process.
A service's supervisor also holds its port and checks its health (``serving``).

Faults in the platform's own plumbing never become reruns: output that cannot be written (a
full log disk) is dropped and marked, the task goes on; if neither the exit file nor the
database can take the status, the supervisor stays alive and keeps trying, so the node agent
never mistakes the attempt for a lost one. It holds no database connection between reports.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import django
from django.apps import apps
from django.conf import settings  # lazy: read after django.setup()

from gpuplatform.units import parse_memory_mb
from nodeagent.launcher import (
    environ,
    identity,
    limithits,
    logfaults,
    namespaces,
    procs,
    serving,
    tracking,
    unitcgroup,
    wire,
)
from nodeagent.launcher.cgroups import Limits
from nodeagent.launcher.lease import Lease
from nodeagent.launcher.logrelay import LogRelay, fds
from scheduling import paths
from scheduling.agentapi.messages import (
    Assignment,
    ExitReport,
    FenceQuery,
    LogTrouble,
    StartReport,
)

# The launcher's modules are imported here, not in the functions that use them: a supervisor is
# a fresh fork of the spawner, and each import statement run in it touched the import machinery
# again. Only what needs Django's apps (``reports``, the models) is imported where it is used.

logger = logging.getLogger("scheduling.supervisor")

POLL_S = 0.1
# A command that ends this soon after it started has its start reported with its end, in one
# message and one batch of the agent's, instead of a round trip of its own that the end then
# waits for. No longer than the agent's own gathering of a batch (``relay.GATHER_S``), so a
# longer task is shown running as soon as before, give or take that. 0 turns it off, at the
# cost of more transactions and CPU per task.
START_GRACE_S = 0.005
REPORT_TRIES = 120  # with an exit file: a report a second for two minutes, then reconciliation
DRAIN_S = 5.0
# Ends after which the process may supervise another attempt: anything else (stopped, lost,
# superseded, reported to the database itself) and it exits, as every supervisor used to.
REUSABLE_AFTER = ("succeeded", "failed")


class Supervisor:
    def __init__(self, assignment: Assignment) -> None:
        self.assignment = assignment
        self.stop_asked = False
        self.pause_asked: bool | None = None
        self.paused_since: float | None = None
        self.paused_total = 0.0
        self.tracker = None
        self.relay: LogRelay | None = None
        self.trouble_told = False  # the node agent heard of trouble with the log
        # Set by ``finish``: the attempt ended plainly and the agent recorded it, so this process
        # may supervise another (``become``).
        self.reusable = False
        # Set by ``become``: it may serve another attempt after this one, and so offers to take
        # one in the agent's answer to its end (``handoff``), which ``finish`` keeps here as
        # (assignment, sink): believed only signed with the platform's key.
        self.takes_next = False
        self.next_work: tuple[Assignment, str] | None = None
        # The start of a command that ended within START_GRACE_S: sent with its end.
        self.started: StartReport | None = None
        # A service's health check (``serving``), and what it said when it gave up on it.
        self.health: serving.HealthWatch | None = None
        self.unhealthy = ""
        # Set when the node's lease lapsed and the command was stopped for it: how long the
        # node had been cut off from the database, in seconds (``Lease``).
        self.fenced_s: int | None = None
        self.lease: Lease | None = None
        it = assignment
        self.exit_file = paths.exit_path(it.tenant, it.task_id, it.attempt_no)

    @classmethod
    def of(cls, task_id: int, attempt_no: int) -> Supervisor:
        from scheduling.models import TaskAttempt

        return cls(
            Assignment.of(
                TaskAttempt.objects.select_related("task__tenant", "node").get(
                    task_id=task_id, number=attempt_no
                )
            )
        )

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
        procs.become_subreaper()
        procs.hide_from_same_user()
        it = self.assignment
        procs.set_title(procs.supervisor_title(it.task_id, it.attempt_no))
        environ.drop_secrets_from_environ()
        self.install_signals()
        paths.reserve_exit_record(self.exit_file)  # False: the database is the only record left
        try:
            who = identity.tenant_identity(it.tenant, it.unix_user)
            if who is None:
                paths.tenant_root(it.tenant).mkdir(mode=0o700, parents=True, exist_ok=True)
            cwd = paths.workdir(it.tenant, it.workdir)
        except (identity.IdentityError, paths.PathEscape, OSError) as exc:
            return self.finish(None, problem=f"cannot run as the tenant: {exc}")
        try:
            self.tracker = tracking.for_attempt(
                it.node, it.task_id, it.attempt_no, task_limits(it.resources), it.gpu_uuids
            )
        except Exception as exc:  # noqa: BLE001 - any cgroup failure fails the attempt clearly
            return self.finish(None, problem=f"cannot set up the attempt's cgroup: {exc}")
        port = None
        if it.service is not None:
            port, problem = self.claim_port()
            if problem:
                return self.finish(None, problem=problem)
        self.relay = LogRelay(Path(it.log_path))
        try:
            helper = exec_helper()
            walls = [] if helper is None else namespaces.helper_options(
                it.resources, paths.tenant_root(it.tenant).resolve()
            )  # fmt: skip
            child = subprocess.Popen(  # noqa: S603 - the tenant's command is the point
                task_argv(helper, self.tracker, who, str(cwd), it.command, walls),
                env=environ.task_environment(it, who, private_tmp=bool(walls), port=port),
                stdin=subprocess.DEVNULL,
                stdout=self.relay.write_fd,
                stderr=self.relay.write_fd,
                start_new_session=True,
                # Without a preexec_fn, subprocess spawns with vfork: nothing is copied.
                preexec_fn=None if helper else enter_attempt(self.tracker, who, str(cwd)),  # noqa: PLW1509
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return self.finish(None, problem=f"cannot start the command: {exc}")
        finally:
            os.close(self.relay.write_fd)  # the task holds the only writing end now
        # Readable once the command has exited, so its end is seen at once, not at the next
        # poll: the output pipe closes a moment before the exit status can be collected, and a
        # POLL_S sleep there held the GPUs of most short tasks for up to POLL_S more.
        exited = procs.exit_fd(child.pid)
        try:
            start = StartReport(
                it.attempt_id, procs.ProcessId.of(os.getpid()), procs.ProcessId.of(child.pid)
            )
            if ended_within(exited, START_GRACE_S):
                self.started = start  # reported with its end: one round trip to the agent
            elif not self.report_started(start):
                self.tracker.stop(settings.TASK_STOP_GRACE, keep=child.pid)
                return self.finish(child.wait())
            if port is not None and (it.service or {}).get("health"):
                host = serving.check_host(settings.SERVICE_HOST)
                self.health = serving.HealthWatch(port, it.service["health"], host=host)
            return self.watch(child, exited)
        finally:
            if exited is not None:
                os.close(exited)

    def claim_port(self) -> tuple[int | None, str]:
        """The service's port, held for this attempt in the database; or why it has none."""
        it = self.assignment

        def claim():
            from scheduling.agentapi.serving import PortTaken, claim_port

            try:
                port = claim_port(
                    attempt_id=it.attempt_id,
                    node=it.node,
                    wanted=it.service.get("port", "auto"),
                    free=lambda port: serving.port_free(settings.SERVICE_HOST, port),
                )
            except PortTaken as exc:
                return None, str(exc)
            return port, ""

        found = self.db(claim, default=None, tries=30)
        return found or (None, "cannot record the service's port: the database is unavailable")

    def check_health(self, now: float) -> None:
        """One health check; its result written when it changed (or now and then)."""
        health = self.health
        changed = health.tick(now)
        first = health.written_at == 0.0
        if health.give_up:
            self.unhealthy = (
                f"{health.failures} failed health checks in a row; last: {health.detail()}"
            )
            self.stop_asked = True
        if not health.needs_writing(changed, now):
            return
        it = self.assignment

        def write():
            from scheduling import reasons
            from scheduling.agentapi.serving import record_health

            reason = None
            if changed or first:
                reason = reasons.Reason(f"service_{health.health}", health.reason_params(it.node))
            return record_health(
                attempt_id=it.attempt_id,
                health=health.health,
                detail=health.detail(),
                checked_at=health.last.at,
                reason=reason,
            )

        self.db(write, default=None)

    def report_started(self, report: StartReport) -> bool:
        """Through the node agent (with other supervisors' reports); if it cannot take it, to
        the database ourselves. Until this is written, reconciliation treats the attempt as
        still launching (LAUNCH_PATIENCE), then kills what it left, by its cgroup."""
        reply = wire.send(self.assignment.node, report)  # through the node agent
        if reply is not None:
            return bool(reply["started"])

        def write():
            from scheduling.agentapi import reports

            return reports.attempts_started([report])[report.attempt_id]

        return self.db(write, forever=True)

    def fence(self) -> dict | None:
        """Fencing, asked of the node agent, or of the database when the agent does not answer:
        ``wanted`` and ``age`` (``reports.fences``); None when neither answers."""
        query = FenceQuery(self.assignment.attempt_id)
        reply = wire.send(self.assignment.node, query)  # through the node agent
        if reply is not None:
            return {"wanted": bool(reply["wanted"]), "age": reply.get("age")}

        def ask():
            from scheduling.agentapi import reports

            return reports.fences([query.attempt_id])[query.attempt_id]

        return self.db(ask, default=None)

    def watch(self, child: subprocess.Popen, exited: int | None) -> int:
        """Until the command ends; ``exited``: its pidfd (``procs.exit_fd``), or None."""
        started = time.monotonic()
        self.lease = lease = Lease(self.fence, started, self.assignment.fence_after_s)
        timeout = self.assignment.timeout_s
        timed_out = False
        open_pipe = True
        while True:
            if open_pipe:
                open_pipe = self.relay.pump(POLL_S, wake=exited)
            else:
                select.select(fds(exited), [], [], POLL_S)
            if self.relay.error is not None and not self.trouble_told:
                self.log_trouble()  # while the task runs on: a long task's must not wait
            code = child.poll()
            if code is not None:
                break
            procs.reap(keep=child.pid)
            self.apply_pause()
            now = time.monotonic()
            if lease.superseded:
                self.stop_asked = True  # superseded (lost and requeued): never run twice
            elif lease.lapsed(now) and self.fenced_s is None:
                self.fenced_s = round(now - lease.renewed)
                logger.error(
                    "%s: node %s has not reached the database for %s s: stopping the task "
                    "before the scheduler requeues it elsewhere",
                    self.assignment,
                    self.assignment.node,
                    self.fenced_s,
                )
                self.stop_asked = True
            health = self.health
            if health and not (self.stop_asked or self.paused_since) and health.due(now):
                self.check_health(now)
            running_for = now - started - self.paused_total
            if timeout and running_for > timeout and self.paused_since is None:
                timed_out = True
                self.stop_asked = True
            if self.stop_asked:
                self.tracker.stop(settings.TASK_STOP_GRACE, keep=child.pid)
                code = child.wait()
                break
        lease.close()
        # The main process is done; nothing it started may outlive it.
        self.tracker.stop(min(5, settings.TASK_STOP_GRACE), keep=child.pid)
        procs.reap()
        self.relay.drain(DRAIN_S)
        return self.finish(code, timed_out=timed_out)

    def apply_pause(self) -> None:
        if self.pause_asked is None:
            return
        if self.pause_asked and self.paused_since is None:
            self.tracker.pause()
            self.paused_since = time.monotonic()
        elif not self.pause_asked and self.paused_since is not None:
            self.tracker.resume()
            self.paused_total += time.monotonic() - self.paused_since
            self.paused_since = None
        self.pause_asked = None

    # -- trouble with the log --

    def log_trouble(self) -> None:
        """Once per attempt whose log failed: the node agent raises its node's alert (one per
        node, not per task); when it does not answer, the database hears it from us."""
        self.trouble_told = True
        it, relay = self.assignment, self.relay
        logger.error("cannot write %s: %s; the task's output is dropped", relay.path,
                     relay.trouble)  # fmt: skip
        trouble = LogTrouble(it.task_id, str(relay.path), relay.trouble)
        if wire.send(it.node, trouble) is None:
            message = logfaults.alert_message(it.node, trouble.path, trouble.error)
            self.db(lambda: logfaults.raise_alert(it.node, message), default=None)

    # -- the end --

    def finish(self, returncode: int | None, *, timed_out: bool = False, problem: str = "") -> int:
        it = self.assignment
        exit_code = (
            None if returncode is None else (returncode if returncode >= 0 else 128 - returncode)
        )
        notes = []
        if self.tracker is not None:
            plain = not (problem or timed_out or self.stop_asked)
            hit, limits = limithits.limits_hit(self.tracker, it.resources, exit_code, plain=plain)
            problem = problem or hit
            notes.append(limits)
            self.tracker.close()
        if self.relay is not None:
            self.relay.close()
            notes.append(self.relay.note())
            if self.relay.trouble and not self.trouble_told:
                self.log_trouble()
        note = "; ".join(n for n in notes if n)
        record = {
            "exit_code": exit_code,
            "timed_out": timed_out,
            "problem": problem,
            "note": note,
            "ended_at": time.time(),
            "unhealthy": self.unhealthy,
            "fenced_s": self.fenced_s,
        }
        exit_file = self.exit_file
        kept = paths.write_exit_record(exit_file, record)
        if not kept:
            logger.error(
                "cannot write the exit file %s; the database is the only record", exit_file
            )
        ready = self.takes_next and exit_code == 0 and not (problem or timed_out or self.stop_asked)
        report = ExitReport(
            it.task_id,
            it.attempt_no,
            exit_code,
            timed_out,
            problem,
            note,
            ready,
            self.started,
            self.unhealthy,
            fenced_s=self.fenced_s,
        )
        reply = wire.send(it.node, report)  # through the node agent
        work = (reply or {}).get("next")
        if isinstance(work, dict) and wire.genuine(work):
            self.next_work = Assignment.from_dict(work["assignment"]), str(work["sink"])

        def write():
            from scheduling.agentapi import reports

            return reports.attempts_finished([report])[(report.task_id, report.attempt_no)]

        outcome = reply["outcome"] if reply is not None else None
        # Not with its lease's thread still asking: a pooled supervisor forks the next command.
        asking = self.lease is not None and self.lease.asking()
        self.reusable = outcome in REUSABLE_AFTER and not (self.stop_asked or timed_out or asking)
        if outcome is None and kept:
            # The database has not got it: until it has, the file is the only record, and it
            # must outlive a crash of this host too.
            kept = paths.sync_exit_record(exit_file)
        outcome = outcome or self.db(
            write,
            default=None,
            tries=REPORT_TRIES,
            forever=not kept,  # nothing else keeps the status: never give up on it
        )
        if outcome is None:
            logger.error("could not report %s; the exit file %s keeps it", it, exit_file)
            return 1
        # Quiet about a success (the task's record says all): its supervisor file is then never
        # made (``SinkHandler``), one file fewer per task.
        level = logging.DEBUG if outcome == "succeeded" else logging.INFO
        logger.log(level, "%s ended: %s (exit %s)", it, outcome, exit_code)
        return 0

    def db(self, func, *, default=None, tries: int = 1, forever: bool = False):
        """Call a database service, surviving a database that is down for a while, and hold no
        connection afterwards (a running task's supervisor costs the server nothing). A
        supervisor forked by the spawner loads Django's apps here, the first time it needs the
        database (the node agent answers for it otherwise)."""
        if not apps.ready:
            django.setup(set_prefix=False)
        from django.db import DatabaseError, connections

        attempt = 0
        while True:
            attempt += 1
            try:
                result = func()
            except DatabaseError as exc:
                connections.close_all()
                logger.warning("database unavailable (%s); will retry", exc)
                if not forever and attempt >= tries:
                    return default
                time.sleep(1)
                continue
            connections.close_all()
            return result


def ended_within(exited: int | None, seconds: float) -> bool:
    """Whether the child whose pidfd is ``exited`` exits within ``seconds`` (False without a
    pidfd: the kernel cannot tell without reaping it; and for 0 seconds)."""
    return exited is not None and seconds > 0 and bool(select.select([exited], [], [], seconds)[0])


def task_limits(resources: dict) -> Limits:
    """The cgroup limits in the task's spec (``resources.memory``, ``cpus``, ``pids``)."""
    memory = resources.get("memory")
    return Limits(
        memory_bytes=None if memory is None else parse_memory_mb(memory) * 1024 * 1024,
        cpus=resources.get("cpus"),
        pids=resources.get("pids"),
    )


@functools.cache
def exec_helper() -> str | None:
    """``TASK_EXEC_HELPER`` when it can be run (the spawner looks once, before it forks)."""
    helper = settings.TASK_EXEC_HELPER
    if helper and os.access(helper, os.X_OK):
        return helper
    if helper:
        logger.warning("TASK_EXEC_HELPER %s cannot be run: tasks start through Python (slower)",
                       helper)  # fmt: skip
    return None


def task_argv(
    helper: str | None, tracker, who, cwd: str, command: str, options: list[str] = ()
) -> list[str]:
    """The task's argv: its command through ``/bin/sh -c``, behind the exec helper when there
    is one (which does what ``enter_attempt`` does, in the same order, see gpup_exec.c), with
    its ``options`` (``namespaces.helper_options``)."""
    shell = ["/bin/sh", "-c", command]
    if helper is None:
        return shell
    user = ("-", "-") if who is None else (str(who.uid), str(who.gid))
    files = [os.fsdecode(path) for path in tracker.procs_files]
    return [helper, *options, *user, cwd, str(len(files)), *files, *shell]


def enter_attempt(tracker, who, cwd: str):
    """What the task's process does between fork and exec: join the attempt's cgroup while
    still root, become the tenant's user, then make and enter its work directory as that user
    (so a tenant can never have root create something for it). A failure is written to the
    log and the process exits 126, as a shell does for a command it cannot run."""

    def prepare() -> None:
        try:
            tracker.join()
            if who is not None:
                identity.drop_privileges(who)
            os.umask(0o077)
            os.makedirs(cwd, exist_ok=True)
            os.chdir(cwd)
        except Exception as exc:  # noqa: BLE001 - reported in the task's own log
            os.write(2, f"gpuplatform: cannot prepare the task: {exc}\n".encode())
            os._exit(126)

    return prepare


LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def log_to_stderr() -> None:
    """A supervisor's logging: INFO and up, to whatever file descriptor 2 is."""
    logging.basicConfig(level=logging.INFO, force=True, format=LOG_FORMAT)


class SinkHandler(logging.FileHandler):
    """Logging to the attempt's supervisor file (``supervisor-<n>.log`` beside its log), made
    on its first line: an attempt with nothing to say (a success) leaves no file. Files cost
    (ext4 looks for a free inode on each), and a supervisor file was made for every task to
    hold one line saying it succeeded. ``to`` moves it to the next attempt's."""

    def __init__(self, sink) -> None:
        super().__init__(sink, mode="a", encoding="utf-8", delay=True)
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def _open(self):
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        return open(fd, "a", encoding=self.encoding)

    # The file is on the log disk, which may be full, read-only or gone: a line that cannot be
    # written is dropped, with what was buffered, and never ends the supervisor (a flush that
    # failed again when the file was closed, between two attempts, did, and the next attempt
    # waited for reconciliation).

    def emit(self, record) -> None:
        try:
            super().emit(record)  # opening the file (its first line) is outside logging's guard
        except OSError:
            self.handleError(record)

    def handleError(self, record) -> None:  # noqa: N802 - logging's name
        stream, self.stream = self.stream, None  # opened again by the next line
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> None:
        try:
            super().close()
        except OSError:
            self.stream = None

    def to(self, sink) -> None:
        self.acquire()
        try:
            self.close()  # opened again, at the new path, by the next line logged
            self.baseFilename = os.fspath(sink)
        finally:
            self.release()


def become(assignment: Assignment, sink, *, pooled: bool = False) -> NoReturn:
    """In a freshly forked child (of the spawner or of a launch worker): be the supervisor of
    ``assignment``, its logging to ``sink`` (``SinkHandler``: made on its first line), and
    exit with its status. Never returns. Standard input is /dev/null (and so are standard
    output and error, which its forker detached: ``procs.detach_standard_streams``).

    Logging is set up once per process, not per attempt, and only moved to the next attempt's
    file after that.

    ``pooled`` (forked by the spawner): once an attempt has ended plainly, wait for the next
    one from the spawner (``wire.wait_for_work``), up to ``SUPERVISOR_REUSE`` attempts."""
    code = 1
    handler = None
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)  # whatever our parent process had set
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        handler = SinkHandler(sink)
        # The parent's handlers are left alone, not closed as basicConfig(force=True) would:
        # closing flushes them, which here writes the parent's buffered output a second time,
        # or raises (a handler on a full disk) and so ended the supervisor unreported.
        root = logging.getLogger()
        root.handlers = [handler]
        root.setLevel(logging.INFO)
        unitcgroup.leave_unit(settings.CGROUP_NAME, assignment.node)
        for served in range(1, settings.SUPERVISOR_REUSE + 1):
            supervisor = Supervisor(assignment)
            supervisor.takes_next = pooled and served < settings.SUPERVISOR_REUSE
            code = supervisor.run()
            # The agent's answer named the next attempt: it is ours to run, and nobody else's.
            work = supervisor.next_work
            if work is None and (
                not (pooled and supervisor.reusable) or served == settings.SUPERVISOR_REUSE
            ):
                break
            work = work or _idle(assignment.node)
            if work is None:
                break
            assignment, sink = work
            handler.to(sink)
    except BaseException:
        logger.exception("the supervisor of %s failed", assignment)
    finally:
        if handler is not None:
            handler.close()  # flushed: os._exit does not (never the parent's: see above)
        os._exit(code)


def _idle(node_name: str) -> tuple[Assignment, str] | None:
    """Between attempts: signals that meant the last attempt are ignored, SIGTERM ends us.
    The title says idle once the spawner has the offer (tests wait for it)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)
    title = f"{procs.SUPERVISOR_NAME} idle node={node_name}"
    return wire.wait_for_work(node_name, offered=lambda: procs.set_title(title))


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    django.setup()
    log_to_stderr()
    task_id, attempt_no = int(argv[1]), int(argv[2])
    supervisor = Supervisor.of(task_id, attempt_no)
    from django.db import connections

    connections.close_all()  # none held while the task runs
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
