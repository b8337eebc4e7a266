"""Where a task runs and where its output goes, with the tenant's root as a hard wall."""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.conf import settings


class PathEscape(ValueError):
    """A workdir a task may not use: it leads outside the tenant's root."""


class PathLoop(PathEscape):
    """A workdir that cannot be resolved: its symbolic links form a loop."""


def tenant_root(tenant_name: str) -> Path:
    return Path(settings.TASKS_ROOT) / tenant_name


def workdir(tenant_name: str, relative: str, *, create: bool = False) -> Path:
    """The task's working directory; refuses one that leaves the tenant's root.

    Resolving symlinks is the point: ``projects`` may be a link, but not one that leads out.
    """
    root = tenant_root(tenant_name)
    if create:
        root.mkdir(parents=True, exist_ok=True)
    resolved_root = root.resolve()
    try:
        resolved = (root / relative).resolve() if relative else resolved_root
    except (RuntimeError, OSError) as exc:  # a loop: RuntimeError before Python 3.13
        raise PathLoop(f"workdir: {relative!r} is a loop of symbolic links") from exc
    if resolved != resolved_root and not resolved.is_relative_to(resolved_root):
        raise PathEscape(f"workdir: {relative!r} leads outside the tenant's directory")
    if create:
        resolved.mkdir(parents=True, exist_ok=True)
    return resolved


# Each path is made in one Path() call, not joined part by part: a supervisor's pathlib objects
# showed in its profile.


def attempt_dir(tenant_name: str, task_id: int) -> Path:
    return Path(settings.TASK_LOG_DIR, tenant_name, str(task_id))


def log_path(tenant_name: str, task_id: int, attempt: int) -> Path:
    return Path(settings.TASK_LOG_DIR, tenant_name, str(task_id), f"attempt-{attempt}.log")


def exit_path(tenant_name: str, task_id: int, attempt: int) -> Path:
    """Written by the supervisor before it reports to the database: the record of last resort."""
    return Path(settings.TASK_LOG_DIR, tenant_name, str(task_id), f"attempt-{attempt}.exit.json")


EXIT_RECORD_SIZE = 4096


def reserve_exit_record(path: Path) -> bool:
    """Claim the exit file's blocks before the task starts: a record written later overwrites
    them in place and needs no new space, so a full disk cannot stop it. False when even this
    fails (the status then reaches the database only, which the supervisor waits for).

    ``posix_fallocate`` allocates the blocks at once (a write alone leaves them to delayed
    allocation); no fsync: the reservation matters only while this host runs, and the record
    written over it is synced when it is the only one (``write_exit_record``)."""
    return _write_from_start(path, b" " * EXIT_RECORD_SIZE, os.O_TRUNC, _allocate)


def write_exit_record(path: Path, record: dict) -> bool:
    """Write the exit record over its reserved blocks (or as a new file if none were
    reserved). False when it could not be written; never raises.

    Not synced: readers on this host (reconciliation after the supervisor died) see it at once,
    and only a crash of the host itself could lose it, which matters only if the database never
    got the outcome either. So the supervisor syncs it (``sync_exit_record``) only when its
    report did not go through; an fsync on every exit was most of what the record cost
    (perf: ``ext4_sync_file``)."""
    data = json.dumps(record).encode()
    return _write_from_start(path, data.ljust(EXIT_RECORD_SIZE), 0, None)


def sync_exit_record(path: Path) -> bool:
    """Make the record written by ``write_exit_record`` survive a crash of the host; False
    when it could not be (never raises)."""
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def _allocate(fd: int) -> None:
    os.posix_fallocate(fd, 0, EXIT_RECORD_SIZE)


def _write_from_start(path: Path, data: bytes, flags: int, finish) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
        try:
            os.pwrite(fd, data, 0)
            if finish is not None:
                finish(fd)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def read_exit_record(path: Path) -> dict | None:
    """The record, or None when there is none yet (no file, or blocks reserved but unwritten)."""
    try:
        text = path.read_bytes().strip()
    except FileNotFoundError:
        return None
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None  # torn by a crash while writing: as if never written
