"""Where a task runs and where its output goes, with the tenant's root as a hard wall."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings


class PathEscape(ValueError):
    pass


def tenant_root(tenant_name: str) -> Path:
    return Path(settings.TASKS_ROOT) / tenant_name


def workdir(tenant_name: str, relative: str, *, create: bool = False) -> Path:
    """The task's working directory; refuses one that leaves the tenant's root.

    Resolving symlinks is the point: ``projects`` may be a link, but not one that leads out.
    """
    root = tenant_root(tenant_name)
    if create:
        root.mkdir(parents=True, exist_ok=True)
    target = root / relative if relative else root
    resolved_root = root.resolve()
    resolved = target.resolve()
    if resolved != resolved_root and resolved_root not in resolved.parents:
        raise PathEscape(f"workdir: {relative!r} leads outside the tenant's directory")
    if create:
        resolved.mkdir(parents=True, exist_ok=True)
    return resolved


def attempt_dir(tenant_name: str, task_id: int) -> Path:
    return Path(settings.TASK_LOG_DIR) / tenant_name / str(task_id)


def log_path(tenant_name: str, task_id: int, attempt: int) -> Path:
    return attempt_dir(tenant_name, task_id) / f"attempt-{attempt}.log"


def exit_path(tenant_name: str, task_id: int, attempt: int) -> Path:
    """Written by the supervisor before it reports to the database: the record of last resort."""
    return attempt_dir(tenant_name, task_id) / f"attempt-{attempt}.exit.json"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
