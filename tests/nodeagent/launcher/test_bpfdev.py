"""The eBPF device program's loading: once per process and program, the verifier's word on a
refusal. (What a fenced task may open is ``test_gpu_fence``'s.)"""

from __future__ import annotations

import os

import pytest

from nodeagent.launcher import bpfdev


@pytest.fixture
def kernel(monkeypatch):
    """``bpf()`` as a record of the commands asked: a load answers a descriptor of its own."""
    asked: list[int] = []

    def bpf(command: int, attr: bytes) -> int:
        asked.append(command)
        return os.open(os.devnull, os.O_RDONLY) if command == bpfdev.BPF_PROG_LOAD else 0

    monkeypatch.setattr(bpfdev, "_bpf", bpf)
    monkeypatch.setattr(bpfdev, "_LOADED", {})
    yield asked
    for fd in bpfdev._LOADED.values():
        os.close(fd)


def test_a_program_is_loaded_once_for_every_cgroup_it_fences_and_a_few_are_kept(
    kernel, tmp_path, monkeypatch
):
    monkeypatch.setattr(bpfdev, "KEEP", 2)
    first, second, third = (bpfdev.program(195, 0, 253, [minor]) for minor in range(3))

    for _ in range(3):
        bpfdev.attach(tmp_path, first)
    assert kernel == [bpfdev.BPF_PROG_LOAD] + [bpfdev.BPF_PROG_ATTACH] * 3

    kernel.clear()
    bpfdev.attach(tmp_path, second)
    kept = bpfdev._LOADED[first]
    bpfdev.attach(tmp_path, third)  # more than KEEP: the least recently used goes
    assert kernel == [bpfdev.BPF_PROG_LOAD, bpfdev.BPF_PROG_ATTACH] * 2
    assert list(bpfdev._LOADED) == [second, third]
    with pytest.raises(OSError):
        os.fstat(kept)  # closed: only cgroups it is attached to hold that program now


@pytest.mark.skipif(os.geteuid() != 0, reason="loading an eBPF program needs root")
def test_a_refused_program_says_what_the_verifier_said():
    with pytest.raises(bpfdev.BpfError) as refused:
        bpfdev.load(bpfdev._insn(bpfdev._EXIT))  # exits without setting its answer (r0)
    assert "R0 !read_ok" in str(refused.value)
