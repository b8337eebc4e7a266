"""scripts/run.py copies each process's output to `make run`'s as soon as a line is whole."""

from __future__ import annotations

import io
import os

import pytest

from scripts.run import Relay


class Pipe:
    def __init__(self) -> None:
        self.read, self.write = os.pipe()
        self.open = [self.read, self.write]

    def close_write(self) -> None:
        self.open.remove(self.write)
        os.close(self.write)


@pytest.fixture
def pipe():
    pipe = Pipe()
    yield pipe
    for fd in pipe.open:  # only ours: a number closed once may be someone else's by now
        os.close(fd)


def test_every_whole_line_the_pipe_holds_is_copied_at_once(pipe):
    out = io.StringIO()
    relay = Relay(pipe.read, "agent | ", out)
    # The node agent writes its start-up lines in one burst, then nothing for a long time: all
    # of them must show now, not when it next writes (the readline-based copy held them back).
    os.write(pipe.write, b"spawner started\nGPU set changed\nspawner ready (pid 7)\nhalf a ")
    assert relay.relay() is True
    assert out.getvalue() == (
        "agent | spawner started\nagent | GPU set changed\nagent | spawner ready (pid 7)\n"
    )
    os.write(pipe.write, b"line\n")
    relay.relay()
    assert out.getvalue().endswith("agent | half a line\n")


def test_a_last_line_without_newline_is_copied_when_the_process_ends(pipe):
    out = io.StringIO()
    relay = Relay(pipe.read, "web | ", out)
    os.write(pipe.write, "stopped, 停止\nno newline".encode())
    relay.relay()
    pipe.close_write()
    assert relay.relay() is False
    assert out.getvalue() == "web | stopped, 停止\nweb | no newline\n"
    assert relay.relay() is False
    assert out.getvalue().count("\n") == 2
