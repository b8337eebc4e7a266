"""A process named by its pid and its start time, so a reused pid never passes for it.

Plain data that crosses processes (a supervisor's reports carry two), with the two checks the
node needs: the start time of a pid, and whether the process so named is still alive.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class ProcessId:
    """A pid plus its start time: a reused pid never passes for the original process."""

    pid: int
    started: float

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        try:
            return cls(pid, start_time(pid))
        except (OSError, ValueError, IndexError):
            return None

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return same_start(proc.create_time(), self.started) and (
                proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False


def same_start(a: float, b: float) -> bool:
    """Whether two start times (``start_time``, psutil's ``create_time``) are one process's:
    computed from clock ticks, they may differ in the last digits."""
    return abs(a - b) < 0.01


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def start_time(pid: int) -> float:
    """What ``psutil.Process(pid).create_time()`` says (``alive`` compares the two), computed
    as psutil does: ``/proc/<pid>/stat`` field 22 in clock ticks after boot, plus the boot
    time in ``/proc/stat`` (read each time, as psutil does, so a clock step moves both alike).
    Two raw reads instead of psutil's objects: a supervisor calls it twice per task, and in a
    freshly forked supervisor psutil's path costs several times more. Raises OSError when
    ``pid`` is gone."""
    ticks = int(stat_fields(read_proc(f"/proc/{pid}/stat"))[19])
    return ticks / CLOCK_TICKS + _boot_time()


def stat_fields(stat: bytes) -> list[bytes]:
    """The fields of a ``/proc/<pid>/stat`` after the command name (``[0]`` is the state,
    ``[1]`` the parent's pid, ``[19]`` the start time in clock ticks after boot)."""
    # The command name, in parentheses, may itself hold spaces and parentheses.
    return stat[stat.rindex(b")") + 2 :].split()


def _boot_time() -> float:
    for line in read_proc("/proc/stat").splitlines():
        if line.startswith(b"btime "):
            return float(line.split()[1])
    raise ValueError("no btime in /proc/stat")


def read_proc(path: str) -> bytes:
    """The whole file (``/proc/stat`` outgrows one read on hosts with many CPUs)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
