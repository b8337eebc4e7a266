"""The process helpers the supervisor relies on."""

from __future__ import annotations

import os
import select
import subprocess
import sys

from scheduling.launcher import procs


def test_exit_fd_becomes_readable_when_the_child_exits_and_not_before():
    read_end, write_end = os.pipe()
    child = subprocess.Popen(  # exits once the pipe closes: no timing involved
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=read_end
    )
    os.close(read_end)
    exited = procs.exit_fd(child.pid)
    assert exited is not None, "Linux >= 5.3 has pidfds"
    try:
        assert select.select([exited], [], [], 0)[0] == [], "still running"
        os.close(write_end)
        assert select.select([exited], [], [], 30)[0] == [exited]
        assert child.poll() == 0, "its status can be collected at once"
    finally:
        os.close(exited)
