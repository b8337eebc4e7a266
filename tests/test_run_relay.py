"""scripts/run.py copies each process's output to `make run`'s as soon as a line is whole."""

from __future__ import annotations

import importlib.util
import io
import os
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "run_script", Path(__file__).resolve().parent.parent / "scripts" / "run.py"
)
run_script = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(run_script)


@pytest.fixture
def pipe():
    read, write = os.pipe()
    yield read, write
    for fd in (read, write):
        try:
            os.close(fd)
        except OSError:
            pass


def test_every_whole_line_the_pipe_holds_is_copied_at_once(pipe):
    read, write = pipe
    out = io.StringIO()
    relay = run_script.Relay(read, "agent | ", out)
    # The node agent writes its start-up lines in one burst, then nothing for a long time: all
    # of them must show now, not when it next writes (the readline-based copy held them back).
    os.write(write, b"spawner started\nGPU set changed\nspawner ready (pid 7)\nhalf a ")
    assert relay.relay() is True
    assert out.getvalue() == (
        "agent | spawner started\nagent | GPU set changed\nagent | spawner ready (pid 7)\n"
    )
    os.write(write, b"line\n")
    relay.relay()
    assert out.getvalue().endswith("agent | half a line\n")


def test_a_last_line_without_newline_is_copied_when_the_process_ends(pipe):
    read, write = pipe
    out = io.StringIO()
    relay = run_script.Relay(read, "web | ", out)
    os.write(write, "stopped, 停止\nno newline".encode())
    relay.relay()
    os.close(write)
    assert relay.relay() is False
    assert out.getvalue() == "web | stopped, 停止\nweb | no newline\n"
    assert relay.relay() is False
    assert out.getvalue().count("\n") == 2
