"""gpuctl's submitting commands: ``submit -f FILE`` and ``run [options] -- CMD``."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import uuid
from typing import Any

from gpuctl import EXIT_OK, EXIT_USAGE
from gpuctl import output as out
from gpuctl.client import CliError
from gpuctl.commands.logs import wait_for
from gpuctl.commands.tasks import tasks_table
from gpuctl.context import Context


def cmd_submit(ctx: Context) -> int:
    body, content_type, label = read_spec_file(ctx.args.filename)
    tasks = submit(ctx, body, content_type, label)
    return after_submit(ctx, tasks)


def read_spec_file(path: str) -> tuple[bytes, str, str]:
    """The file's bytes as they will be sent, their Content-Type, and a label for messages.

    JSON (a .json file, or text that parses as JSON) is sent as JSON; anything else as YAML text,
    which the server parses with its own rules. With PyYAML importable, YAML syntax is checked
    here first, so a typo is reported with the file's name before any request.
    """
    label = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise CliError(f"cannot read {label}: {exc.strerror or exc}", EXIT_USAGE) from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot read {label}: not UTF-8 text ({exc.reason})", EXIT_USAGE) from exc
    stripped = text.strip()
    if not stripped:
        raise CliError(f"{label} is empty: expected a task, a sweep or a list of them", EXIT_USAGE)
    looks_json = path.lower().endswith(".json") or stripped[0] in "{["
    if looks_json:
        try:
            json.loads(text)
        except ValueError as exc:
            if path.lower().endswith(".json"):
                raise CliError(
                    f"{label}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
                ) from exc
        else:
            return text.encode(), "application/json", label
    yaml = out.yaml_module()
    if yaml is not None:
        try:
            list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise CliError(f"{label}: not valid YAML: {yaml_problem(exc)}") from exc
    return text.encode(), "application/yaml", label


def yaml_problem(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(exc).split())


def submit(ctx: Context, body: bytes, content_type: str, label: str) -> list[dict]:
    # The key makes the submission safe to repeat: the server answers a repeat with the tasks
    # it created the first time.
    return ctx.client.request(
        "POST",
        "tasks/",
        data=body,
        content_type=content_type,
        headers={"Idempotency-Key": f"gpuctl-{uuid.uuid4()}"},
        what=label,
    ).json()


def after_submit(ctx: Context, tasks: list[dict]) -> int:
    # Submitted all the same, but perhaps not as meant (a misspelt queue name).
    for task in tasks:
        for warning in task.get("warnings") or []:
            out.note(f"warning: task {task['id']} ({task['name']}): {warning}")
    wait = getattr(ctx.args, "wait", False)
    if not (ctx.structured and wait):
        ctx.show(tasks, lambda: tasks_table(tasks, wide=ctx.wide))
    if not wait:
        return EXIT_OK
    return wait_for(ctx, [t["id"] for t in tasks])


def cmd_run(ctx: Context) -> int:
    args = ctx.args
    words: list[str] = args.cmd
    if not words:
        raise CliError("run needs a command: gpuctl run [options] -- CMD [ARGS...]", EXIT_USAGE)
    spec = build_run_spec(args, words)
    if args.dry_run:
        fmt = ctx.output if ctx.structured else ("yaml" if out.yaml_module() else "json")
        out.emit(out.dump(spec, fmt))
        return EXIT_OK
    tasks = submit(ctx, json.dumps(spec).encode(), "application/json", "")
    return after_submit(ctx, tasks)


def build_run_spec(args: argparse.Namespace, words: list[str]) -> dict[str, Any]:
    """A task spec from run's flags. One word is taken as a shell command line as it is
    (``gpuctl run -- 'make && ./train'``); several are quoted for /bin/sh."""
    command = words[0] if len(words) == 1 else shlex.join(words)
    spec: dict[str, Any] = {"kind": "task", "name": args.name or default_name(words)}
    if args.queue:
        spec["queue"] = args.queue
    if args.priority is not None:
        spec["priority"] = int(args.priority) if args.priority.isdigit() else args.priority
    if args.task_class:
        spec["class"] = args.task_class
    spec["command"] = command
    if args.workdir:
        spec["workdir"] = args.workdir
    if args.env:
        spec["env"] = dict(args.env)
    resources: dict[str, Any] = {}
    if args.gpus is not None:
        resources["gpus"] = int(args.gpus) if args.gpus.strip().isdigit() else args.gpus
    for key, value in (
        ("gpu_memory", args.gpu_memory),
        ("gpu_type", args.gpu_type),
        ("pool", args.pool),
        ("node", args.node),
    ):
        if value:
            resources[key] = value
    if resources:
        spec["resources"] = resources
    policy: dict[str, Any] = {}
    if args.timeout:
        policy["timeout"] = args.timeout
    if args.retries is not None:
        policy["retries"] = args.retries
    if args.after:
        policy["after"] = [int(a) if a.isdigit() else a for a in args.after]
    if policy:
        spec["policy"] = policy
    # Any of the service flags makes it a service; the server checks the values (a 400 naming
    # service.port, service.replicas, ...).
    service: dict[str, Any] = {}
    if args.port:
        service["port"] = int(args.port) if args.port.strip().isdigit() else args.port
    if args.health:
        service["health"] = args.health
    if args.replicas is not None:
        service["replicas"] = args.replicas
    if service:
        spec["service"] = service
    return spec


def default_name(words: list[str]) -> str:
    """The command's first word (its base name), as a valid task name: ``python``, ``train.sh``."""
    tokens = words
    if len(words) == 1:
        try:
            tokens = shlex.split(words[0])
        except ValueError:
            tokens = words[0].split()
    first = next((t for t in tokens if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", t)), "")
    base = os.path.basename(first.rstrip("/"))
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base).lstrip("._-")[:200]
    return name or "task"
