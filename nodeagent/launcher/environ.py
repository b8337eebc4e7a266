"""Environments: the task's (clean, built from nothing) and the node's own child processes'
(the platform's, with every secret replaced by a file that tasks cannot read).

A task could once read ``DATABASE_URL`` from ``/proc/$PPID/environ``: its supervisor had been
forked with the platform's whole environment. Now the node agent starts its spawner, and so every
supervisor, with ``DATABASE_URL_FILE`` and ``SECRET_KEY_FILE`` pointing into the
node's runtime directory (0700, files 0600), and supervisors drop even those names from their
own copy of the environment before a task starts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
from django.conf import settings

from gpuplatform.dburl import current_database_url
from nodeagent.launcher import procs
from nodeagent.launcher.identity import Identity, examples_dir, runtime_dir

SECRET_NAMES = ("DATABASE_URL", "SECRET_KEY")
TASK_PATH = "/usr/local/bin:/usr/bin:/bin"


def task_environment(
    assignment, identity: Identity | None, *, private_tmp: bool = False, port: int | None = None
) -> dict[str, str]:
    """Nothing of the platform's own environment reaches a task (``assignment``: a
    ``messages.Assignment``). ``private_tmp``: it has a /tmp of its own (``namespaces``),
    named in ``TMPDIR`` too (the task's own env may name another). ``port``: a service's, as
    ``PORT`` (what most servers read) and ``GPUPLATFORM_SERVICE_PORT``, with the address to
    listen on."""
    gpus = ",".join(assignment.gpu_uuids)
    env = {"PATH": TASK_PATH, "LANG": "C.UTF-8"}
    if private_tmp:
        env["TMPDIR"] = "/tmp"  # noqa: S108 - the task's own tmpfs
    if identity is None:  # single-user mode: the platform's user, with its own home
        env["HOME"] = os.environ.get("HOME", "/")
    else:
        env.update(HOME=str(identity.home), USER=identity.user, LOGNAME=identity.user)
    env.update(assignment.env)  # names that could subvert the platform were refused at submission
    env.update(
        CUDA_VISIBLE_DEVICES=gpus,
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        NVIDIA_VISIBLE_DEVICES=gpus or "void",
        GPUPLATFORM_TASK_ID=str(assignment.task_id),
        GPUPLATFORM_TASK_NAME=assignment.task_name,
        GPUPLATFORM_ATTEMPT=str(assignment.attempt_no),
        GPUPLATFORM_GPUS=gpus,
        GPUPLATFORM_TENANT=assignment.tenant,
        # The examples shipped with the platform, so examples/train-sweep.yaml runs as written.
        GPUPLATFORM_EXAMPLES=examples_dir(),
    )
    if port is not None:
        env.update(
            PORT=str(port),
            GPUPLATFORM_SERVICE_PORT=str(port),
            GPUPLATFORM_SERVICE_HOST=settings.SERVICE_HOST,
        )
    return env


def platform_environment(**extra: str) -> dict[str, str]:
    """For the node's own children: this process's environment without secrets in it."""
    env = {name: value for name, value in os.environ.items() if name not in SECRET_NAMES}
    env["DATABASE_URL_FILE"] = str(_secret_file("database_url", current_database_url()))
    if not os.environ.get("SECRET_KEY_FILE"):
        env["SECRET_KEY_FILE"] = str(_secret_file("secret_key", settings.SECRET_KEY))
    env.update(extra)
    return env


def drop_secrets_from_environ() -> None:
    """In a supervisor: what it passes on (it builds the task's environment from nothing, but
    a helper it runs inherits) must not name or hold a secret."""
    procs.keep_titles_settable()
    for name in SECRET_NAMES:
        os.environ.pop(name, None)
        os.environ.pop(f"{name}_FILE", None)


def _secret_file(name: str, value: str) -> Path:
    """``var/run/<pid>/<name>``: this process's own copy, so that two agents on one host (two
    test runs, two databases) never hand their children each other's database."""
    runtime = runtime_dir()
    runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(runtime, 0o700)
    directory = runtime / str(os.getpid())
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / name
    tmp = directory / f".{name}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def forget_secret_files_of_dead_processes() -> None:
    """At agent start: the copies of processes that are gone (killed, so they never cleaned)."""
    runtime = runtime_dir()
    if not runtime.is_dir():
        return
    for entry in runtime.iterdir():
        if entry.name.isdigit() and not psutil.pid_exists(int(entry.name)):
            shutil.rmtree(entry, ignore_errors=True)
