"""The exit record: written at every end, made crash-proof only when it is the only record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeagent.launcher import supervisor
from scheduling import paths
from scheduling.agentapi.messages import Assignment


@pytest.fixture
def ending(tmp_path, monkeypatch):
    """A supervisor at its end, its exit file in ``tmp_path``, and the fsyncs made."""
    synced: list[Path] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(paths.os, "fsync", fsync)
    it = Assignment(
        attempt_id=1, task_id=7, attempt_no=1, node="n", tenant="lab", unix_user="",
        task_name="t", command="true", workdir="", log_path=str(tmp_path / "attempt-1.log"),
    )  # fmt: skip
    sup = supervisor.Supervisor(it)
    sup.exit_file = tmp_path / "attempt-1.exit.json"
    assert paths.reserve_exit_record(sup.exit_file)
    return sup, synced


def test_a_report_the_agent_took_leaves_the_record_unsynced(ending, monkeypatch):
    sup, synced = ending
    monkeypatch.setattr(supervisor.wire, "send", lambda node, report: {"outcome": "failed"})
    assert sup.finish(3) == 0
    assert json.loads(sup.exit_file.read_text())["exit_code"] == 3  # readable on this host
    assert synced == []  # the database has the outcome: no fsync for every task


def test_a_report_nobody_took_syncs_the_record_first(ending, monkeypatch):
    sup, synced = ending
    order: list[str] = []
    monkeypatch.setattr(supervisor.wire, "send", lambda node, report: None)  # no agent
    real_sync = paths.sync_exit_record

    def sync(path: Path) -> bool:
        order.append("synced")
        return real_sync(path)

    def db(func, *, default=None, tries=1, forever=False):
        order.append(f"database (forever: {forever})")
        return "failed"

    monkeypatch.setattr(paths, "sync_exit_record", sync)
    monkeypatch.setattr(sup, "db", db)
    assert sup.finish(3) == 0
    assert synced == [sup.exit_file]
    # synced before the database is tried, and with the record safe, tries are bounded
    assert order == ["synced", "database (forever: False)"]
