#!/usr/bin/env python3
"""Submit N tasks built from one template spec to gpuplatform, and optionally wait for them.

    export GPUPLATFORM_TOKEN=gpup_...          # printed once by the first `make run`
    python3 examples/submit_many.py --n 8 --gpus 1 --gpu-memory 4Gi --wait
    python3 examples/submit_many.py --n 4 --queue demo --command 'python3 gpu_burn.py --seconds 5'
    python3 examples/submit_many.py --n 2 --dry-run        # print the specs, submit nothing

Written against the task API contract of gpuplatform (``/api/v1/``):

- ``POST /api/v1/tasks/`` with a JSON body holding one spec or a list of specs (the fields of
  the YAML task spec: name, command, priority, queue, resources.gpus, resources.gpu_memory,
  policy.retries, ...), ``Authorization: Bearer gpup_...``; answers 201 with a JSON list of
  the created tasks, each with at least ``id``, ``name`` and ``state``. All tasks of one request
  are accepted or none: a bad spec gives 400 with a JSON body naming every problem by its field
  path (``[3].resources.gpus: ...``).
- ``GET /api/v1/tasks/<id>/``: one task with its ``state`` (pending, scheduled, running,
  paused, preempted, lost, then succeeded, failed, cancelled or timed_out) and, when the server
  sends them, ``started_at``, ``finished_at``, ``exit_code`` and ``reason``.
- No token or a bad one: 401.

The default command runs examples/gpu_burn.py by its absolute path on this machine, which works
when the platform's node agent runs on the same host (``make run``); otherwise copy gpu_burn.py
into the tenant's work directory and pass ``--command 'python3 gpu_burn.py --seconds 5'``.

Exit status: 0 when every task was submitted (and, with --wait, succeeded); 1 when some task
did not succeed (or --wait-timeout passed first); 2 for a usage, connection, authentication or
refused-spec error. Python standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")
GPU_BURN = Path(__file__).resolve().with_name("gpu_burn.py")
DEFAULT_COMMAND = f"python3 {shlex.quote(str(GPU_BURN))} --seconds 5"
MAX_POLL_FAILURES = 5  # consecutive failed polls before --wait gives up


class Failure(Exception):
    """Stops the client with a message for the user and an exit status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class HttpError(Exception):
    def __init__(self, status: int, reason: str, body: object) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason, self.body = status, reason, body


class Client:
    """A minimal JSON client for the gpuplatform API."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(self, method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 (the URL is the user's own platform)
            self.url + path, data=data, method=method
        )
        request.add_header("Accept", "application/json")
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return _json(response.read())
        except urllib.error.HTTPError as exc:
            raise HttpError(exc.code, exc.reason, _json(exc.read())) from None


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw.decode("utf-8")) if raw else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return raw.decode("utf-8", "replace").strip()


# --- error messages ---------------------------------------------------------------------------


def field_errors(body: object, path: str = "") -> list[tuple[str, str]]:
    """(field path, message) pairs from an error body: DRF-style {"field": ["msg"]}, nested
    mappings and lists, {"errors": {...}}, or {"detail": "..."}."""
    if isinstance(body, dict):
        if not path and isinstance(body.get("errors"), dict | list):
            return field_errors(body["errors"])
        pairs = []
        for key, value in body.items():
            key = str(key)
            if not path and key in ("detail", "message", "error"):
                sub = ""
            elif key.startswith("[") or not path:
                sub = path + key
            else:
                sub = f"{path}.{key}"
            pairs.extend(field_errors(value, sub))
        return pairs
    if isinstance(body, list):
        if all(isinstance(item, str) for item in body):
            return [(path, item) for item in body]
        pairs = []
        for index, item in enumerate(body):
            if item:  # DRF answers a list of specs with {} for the ones that were fine
                pairs.extend(field_errors(item, f"{path}[{index}]"))
        return pairs
    if body is None or body == "":
        return []
    return [(path, str(body))]


def describe_http_error(exc: HttpError, url: str, what: str) -> Failure:
    problems = field_errors(exc.body)
    detail = "; ".join(message for _, message in problems) if problems else ""
    if exc.status == 401:
        return Failure(
            f"error: {url} refused the token (401 Unauthorized){': ' + detail if detail else ''}.\n"
            "Use the token `make run` printed on its first run (gpup_...), or mint one with\n"
            "  .venv/bin/python manage.py issue_token USER TENANT"
        )
    if exc.status == 403:
        return Failure(f"error: not allowed to {what} (403 Forbidden): {detail or exc.reason}")
    if exc.status == 400:
        lines = [f"error: the platform refused the spec (400 Bad Request) when trying to {what}:"]
        lines += [f"  {path}: {message}" if path else f"  {message}" for path, message in problems]
        return Failure("\n".join(lines))
    if exc.status == 404:
        return Failure(
            f"error: {url} answered 404 Not Found to {what}: {detail or 'no such endpoint'}"
        )
    return Failure(f"error: {url} answered {exc.status} {exc.reason} to {what}: {detail}".strip())


def describe_connection_error(exc: Exception, url: str) -> Failure:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return Failure(
            f"error: cannot connect to {url}: connection refused.\n"
            "Is the platform running? Start it with `make run`, or point --url at it."
        )
    if isinstance(reason, TimeoutError):
        return Failure(f"error: {url} did not answer in time")
    return Failure(f"error: cannot reach {url}: {reason}")


def call(client: Client, method: str, path: str, what: str, body: object = None) -> object:
    try:
        return client.request(method, path, body)
    except HttpError as exc:
        raise describe_http_error(exc, client.url, what) from None
    except (urllib.error.URLError, OSError) as exc:
        raise describe_connection_error(exc, client.url) from None


# --- specs, submission, waiting ---------------------------------------------------------------


def build_specs(args: argparse.Namespace) -> list[dict]:
    specs = []
    for index in range(args.n):
        resources: dict[str, object] = {"gpus": args.gpus}
        if args.gpu_memory:
            resources["gpu_memory"] = args.gpu_memory
        spec: dict[str, object] = {
            "kind": "task",
            "name": f"{args.name}-{index}",
            "priority": args.priority,
            "command": args.command,
            "resources": resources,
        }
        if args.queue:
            spec["queue"] = args.queue
        policy: dict[str, object] = {}
        if args.retries:
            policy["retries"] = args.retries
        if args.timeout:
            policy["timeout"] = args.timeout
        if policy:
            spec["policy"] = policy
        specs.append(spec)
    return specs


def created_tasks(body: object) -> list[dict]:
    if isinstance(body, dict):  # tolerate a wrapped list or a single task
        body = body.get("tasks", body.get("results", [body]))
    if not isinstance(body, list) or not all(
        isinstance(task, dict) and "id" in task for task in body
    ):
        raise Failure(f"error: unexpected answer to the submission: {str(body)[:300]}")
    return body


def wait(client: Client, tasks: list[dict], poll: float, timeout: float | None) -> None:
    """Poll every task until it reaches a terminal state (or the timeout); updates in place."""
    started = time.monotonic()
    failures = 0
    while True:
        waiting = [task for task in tasks if task.get("state") not in TERMINAL]
        if not waiting:
            return
        if timeout is not None and time.monotonic() - started > timeout:
            print(f"gave up waiting after {timeout:g} s; {len(waiting)} task(s) not finished")
            return
        time.sleep(poll)
        for task in waiting:
            try:
                fresh = client.request("GET", f"/api/v1/tasks/{task['id']}/")
            except HttpError as exc:
                if exc.status in (401, 403, 404):
                    raise describe_http_error(exc, client.url, f"read task {task['id']}") from None
                fresh = None
            except (urllib.error.URLError, OSError) as exc:
                failures += 1
                if failures >= MAX_POLL_FAILURES:
                    raise describe_connection_error(exc, client.url) from None
                print(f"  (poll failed: {getattr(exc, 'reason', exc)}; trying again)")
                break
            if not isinstance(fresh, dict):
                failures += 1
                if failures >= MAX_POLL_FAILURES:
                    raise Failure(f"error: could not read task {task['id']} from {client.url}")
                continue
            failures = 0
            old = task.get("state")
            task.update(fresh)
            task.setdefault("_seen_done", None)
            if task.get("state") != old:
                reason = f" ({task['reason']})" if task.get("reason") else ""
                print(
                    f"  task {task['id']} {task.get('name', '')}: {old} -> {task['state']}{reason}"
                )
            if task.get("state") in TERMINAL and task["_seen_done"] is None:
                task["_seen_done"] = time.monotonic() - started


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def wall_time(task: dict) -> str:
    start, end = _time(task.get("started_at")), _time(task.get("finished_at"))
    if start and end:
        return f"{(end - start).total_seconds():.1f}s"
    if start and task.get("state") not in TERMINAL:
        return "running"
    if task.get("_seen_done") is not None:  # the server sent no times: what the client saw
        return f"~{task['_seen_done']:.0f}s"
    return "-"


def print_table(tasks: list[dict]) -> None:
    rows = [("id", "name", "state", "wall", "exit", "reason")]
    for task in tasks:
        exit_code = task.get("exit_code")
        reason = " ".join(str(task.get("reason") or "").split())
        rows.append(
            (
                str(task.get("id")),
                str(task.get("name", "")),
                str(task.get("state", "?")),
                wall_time(task),
                "" if exit_code is None else str(exit_code),
                reason[:60] + ("..." if len(reason) > 60 else ""),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


# --- command line -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Submit N tasks built from one template spec to gpuplatform.",
        epilog="Exit status: 0 all submitted (with --wait: all succeeded), 1 some did not "
        "succeed, 2 usage, connection, authentication or spec error.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("GPUPLATFORM_URL", "http://127.0.0.1:8000"),
        help="the platform (default $GPUPLATFORM_URL or http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("GPUPLATFORM_TOKEN", ""),
        help="API token gpup_... (default $GPUPLATFORM_TOKEN)",
    )
    parser.add_argument("--n", type=int, default=8, help="how many tasks (default 8)")
    parser.add_argument("--name", default="burn", help="name prefix: NAME-0, NAME-1, ...")
    parser.add_argument(
        "--gpus", default="1", help='GPUs per task: 1, 2, or a range like "1-4" (default 1)'
    )
    parser.add_argument(
        "--gpu-memory",
        default="",
        help="GPU memory per GPU, e.g. 4Gi, to share cards (default: whole GPUs)",
    )
    parser.add_argument("--queue", default="", help="serial queue: run one at a time, in order")
    parser.add_argument(
        "--priority", default="normal", help="low, normal, high or 0-100 (default normal)"
    )
    parser.add_argument("--retries", type=int, default=0, help="retries after a failure")
    parser.add_argument("--timeout", default="", help="per-task time limit, e.g. 10m")
    parser.add_argument(
        "--command", default=DEFAULT_COMMAND, help="run by /bin/sh -c (default: gpu_burn.py, 5 s)"
    )
    parser.add_argument(
        "--wait", action="store_true", help="wait until every task has finished; print a table"
    )
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between polls")
    parser.add_argument(
        "--wait-timeout", type=float, default=None, help="stop waiting after this many seconds"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the specs as JSON and submit nothing"
    )
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    if args.poll <= 0:
        parser.error("--poll must be positive")
    if args.priority.isdigit():
        args.priority = int(args.priority)
    if args.gpus.isdigit():
        args.gpus = int(args.gpus)
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"--url must start with http:// or https://, got {args.url!r}")
    if not args.token and not args.dry_run:
        parser.error(
            "no token: pass --token gpup_... or set GPUPLATFORM_TOKEN "
            "(`make run` prints one on its first run)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    specs = build_specs(args)
    if args.dry_run:
        print(json.dumps(specs, indent=2))
        return 0
    client = Client(args.url, args.token)
    try:
        body = call(client, "POST", "/api/v1/tasks/", f"submit {len(specs)} task(s)", specs)
        tasks = created_tasks(body)
        print(f"submitted {len(tasks)} task(s) to {client.url}")
        if args.wait:
            wait(client, tasks, args.poll, args.wait_timeout)
    except Failure as exc:
        print(exc, file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print("interrupted; the tasks keep running on the platform", file=sys.stderr)
        return 1
    print_table(tasks)
    if args.wait and any(task.get("state") != "succeeded" for task in tasks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
