"""Process trees: identity that survives pid reuse, and signals to every descendant.

Killing the process group is not enough (a task can ``setsid`` away from it). The supervisor
makes itself a child subreaper, so every orphaned descendant is re-parented to it and stays
reachable as one of its descendants until it is reaped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import signal
import time

import psutil

from gpuplatform.procid import ProcessId, read_proc

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
# The name a supervisor shows in ps/top (a forked one would otherwise look like its parent).
SUPERVISOR_NAME = "gpup-supervisor"
SPAWNER_NAME = "gpup-spawner"


@functools.cache
def libc() -> ctypes.CDLL:
    # find_library runs ``ldconfig -p`` (a fork and exec) each time: once per process, and
    # before a fork (``warm``), not in every supervisor.
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def warm() -> None:
    """Load what the helpers below need in this process, so its forked children do not."""
    libc()


def prctl(option: int, value: int | bytes) -> bool:
    try:
        return libc().prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init (Linux only)."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def hide_from_same_user() -> bool:
    """Not dumpable: ``/proc/<pid>/environ``, ``mem`` and ptrace are closed even to processes
    of the same user (a task in single-user mode), as ssh-agent does. Reset by exec."""
    return prctl(PR_SET_DUMPABLE, 0)


def detach_standard_streams() -> None:
    """Point standard input, output and error at /dev/null. A supervisor must hold nothing of
    the process that forked it: output inherited from the node agent is a pipe of whoever runs
    the agent (``make run``), which would get no end of file while a supervisor lives (its
    reader waiting on tasks) and fails every write once that reader is killed. What a
    supervisor has to say goes to its own file (``supervisor.SinkHandler``)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)


def supervisor_title(task_id: int, attempt_no: int) -> str:
    """What ps shows of the supervisor of an attempt (``set_title``)."""
    return f"{SUPERVISOR_NAME} task={task_id} attempt={attempt_no}"


def supervising(supervisor: ProcessId, task_id: int, attempt_no: int) -> bool:
    """Whether ``supervisor`` lives and still supervises that attempt: a supervisor reused for
    another attempt (``spawner``), or waiting for one, does not."""
    return supervisor.alive() and title_of(supervisor.pid) == supervisor_title(task_id, attempt_no)


def title_of(pid: int) -> str | None:
    """The command line of ``pid`` as ps shows it (arguments joined by spaces), or None."""
    try:
        cmdline = read_proc(f"/proc/{pid}/cmdline")
    except OSError:
        return None
    return cmdline.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def set_title(title: str) -> None:
    """The whole command line ps and top show (``ps -o args``, ``/proc/<pid>/cmdline``), e.g.
    ``gpup-supervisor task=12 attempt=1`` instead of the ``python manage.py qcluster`` a forked
    supervisor inherits, and the first word as the process name (``ps -o comm``, psutil's
    ``name()``). setproctitle rewrites the argv memory the kernel reads, as PostgreSQL does."""
    import setproctitle

    setproctitle.setproctitle(title)
    set_name(title.split(" ", 1)[0])


def keep_titles_settable() -> None:
    """Call before unsetting an environment variable. setproctitle (1.3.8) finds the memory it
    may overwrite on first use: argv's strings and the environment's that follow them. Once the
    first variable is unset, they no longer follow each other and it sets no title at all, for
    this process and the children it forks (seen where DATABASE_URL came first). Used once, it
    has taken its copy of the environment and the space stays its own."""
    import setproctitle

    setproctitle.getproctitle()


def set_name(name: str) -> None:
    """The process name ps, top and psutil show (Linux: 15 bytes at most)."""
    prctl(PR_SET_NAME, name.encode()[:15])


def exit_fd(pid: int) -> int | None:
    """A descriptor that becomes readable when our child ``pid`` exits (a pidfd), or None
    where the kernel has none (before Linux 5.3): then the caller polls."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def descendants(pid: int | None = None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.Error:
        return []


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def reap(*, keep: int | None = None) -> None:
    """Collect exited children (adopted orphans included) so they do not linger as zombies.

    ``keep`` is the child whose status the caller collects itself: a ``waitpid(-1)`` here would
    take it first, and Popen would then see exit status 0 for a task that failed. So each
    exited child is looked at first (``WNOWAIT``) and only then collected; called often, this
    must stay cheap (no scan of /proc).
    """
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        try:
            os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            pass


def has_children() -> bool:
    """Whether this process has any child, running or exited and not yet collected, asked of
    the kernel (one ``waitid``) rather than found by reading every process of the host as
    ``descendants`` does. For a child subreaper, no child means no descendant at all: a
    descendant whose parent exits becomes its child."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def kill_tree(grace_s: float, *, keep: int | None = None) -> None:
    """SIGTERM every descendant, wait up to ``grace_s``, then SIGKILL whatever is left.

    ``keep`` is a child pid the caller reaps itself (so its exit status is not lost here).
    """
    live = [p for p in descendants() if p.pid != keep] + (
        [psutil.Process(keep)] if keep and psutil.pid_exists(keep) else []
    )
    signal_all(live, signal.SIGCONT)  # a stopped (paused) process cannot act on SIGTERM
    signal_all(live, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not [p for p in descendants() if running(p)]:
            break
        time.sleep(0.05)
        _reap_except(keep)
    for _ in range(100):  # SIGKILL until nothing is left; new forks get caught next round
        left = [p for p in descendants() if running(p)]
        if not left:
            break
        signal_all(left, signal.SIGKILL)
        time.sleep(0.02)
        _reap_except(keep)


def running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_stopped(found: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each process is gone or a zombie; returns those still running at the
    timeout. Not ``psutil.wait_procs``: it waits for a killed process that is not our child to
    be reaped as well, which an init that reaps orphans once a second (seen on CI's machine)
    turns into a second per process, for one that holds nothing any more."""
    deadline = time.monotonic() + timeout
    while True:
        left = [proc for proc in found if running(proc)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def _reap_except(keep: int | None) -> None:
    for proc in descendants():
        if proc.pid == keep:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE and proc.ppid() == os.getpid():
                os.waitpid(proc.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass
