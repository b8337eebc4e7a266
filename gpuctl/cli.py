"""gpuctl's commands: argparse in front, one function per command behind.

Like kubectl: ``gpuctl get tasks``, ``gpuctl describe task 12``, ``gpuctl logs -f 12``; like
Slurm's srun/sbatch: ``gpuctl run --gpus 2 -- python train.py`` and ``gpuctl submit -f
spec.yaml``. Tables for people by default, ``-o json`` / ``-o yaml`` (the API's data) for scripts.

Exit codes scripts can rely on (also in ``gpuctl --help``):

    0    ok
    1    the API refused the request (a 4xx not listed below, e.g. a bad spec; 429 after retries),
         the server failed (5xx), or a task did not succeed while waiting for it (--wait, wait)
    2    usage error (bad arguments, unreadable spec file, -o yaml without PyYAML)
    3    cannot connect to the server
    4    authentication: not logged in, token rejected (401) or role not allowed (403)
    5    not found (404): no such task (another tenant's included), node, token or log
    6    conflict (409): the task's state does not allow the action (cancel twice, ...)
    130  interrupted (Ctrl-C)

Errors are one-liners on stderr (``error: resources.gpus: must be ...``), never a traceback;
``--debug`` shows the HTTP requests and, on failure, the traceback.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import shlex
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from gpuctl import (
    EXIT_AUTH,
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    __version__,
    telemetry,
)
from gpuctl import output as out
from gpuctl.client import (
    ApiError,
    Client,
    CliError,
    config_path,
    load_config,
    resolve,
    save_config,
)

STATES = (
    "pending",
    "scheduled",
    "running",
    "paused",
    "preempted",
    "lost",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
)
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
PRIORITY_NAMES = {10: "low", 50: "normal", 90: "high"}
CONTROL_RESULT = {"cancel": "cancelled", "pause": "paused", "resume": "running", "retry": "pending"}
LOG_POLL_S = 1.0
WAIT_POLL_S = 2.0
EVENTS_SHOWN = 10
STDIN = "-"  # as a file name or token: read it from standard input

ENVIRONMENT_HELP = """\
environment:
  GPUCTL_URL     server URL (overrides the config file; --url overrides it)
  GPUCTL_TOKEN   API token (overrides the config file; --token overrides it)
  GPUCTL_CONFIG  config file (default ~/.config/gpuctl/config.json, written by gpuctl login)"""

EXAMPLES_HELP = """\
examples:
  gpuctl login --url http://gpu-server:8000 --token gpup_...
  gpuctl run --gpus 2 --gpu-memory 20Gi --timeout 6h -- python train.py --lr 0.01
  gpuctl submit -f sweep.yaml --wait
  gpuctl get tasks --state pending,running
  gpuctl describe task 12
  gpuctl logs -f 12"""


# --- Context -------------------------------------------------------------------------------------


class Context:
    """What a command needs: its arguments, the output format and (lazily) the API client."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.output: str = getattr(args, "output", None) or "table"
        self.debug: bool = getattr(args, "debug", False)
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            settings = resolve(getattr(self.args, "url", None), getattr(self.args, "token", None))
            if not settings.token:
                raise CliError("not logged in: run gpuctl login (or set GPUCTL_TOKEN)", EXIT_AUTH)
            if not settings.url:
                raise CliError(
                    "not logged in: no server URL; run gpuctl login --url URL (or set GPUCTL_URL)",
                    EXIT_AUTH,
                )
            self._client = Client(settings.url, settings.token, debug=self.debug)
        return self._client

    @property
    def structured(self) -> bool:
        return self.output in ("json", "yaml")

    @property
    def wide(self) -> bool:
        return self.output == "wide"

    def show(self, data: Any, human: Callable[[], str]) -> None:
        """The API's data for -o json/yaml, else the human rendering."""
        out.emit(out.dump(data, self.output) if self.structured else human())


# --- Commands: session -------------------------------------------------------------------------


def cmd_login(ctx: Context) -> int:
    args = ctx.args
    url = getattr(args, "url", None) or os.environ.get("GPUCTL_URL") or load_config().get("url")
    if not url:
        raise CliError("login needs the server: gpuctl login --url URL --token TOKEN", EXIT_USAGE)
    token = getattr(args, "token", None) or os.environ.get("GPUCTL_TOKEN")
    if not token or token == STDIN:
        token = read_secret("API token: ")
    client = Client(url, token.strip(), debug=ctx.debug)
    try:
        me = client.get("me/")
    except ApiError as exc:
        if exc.status == 404:
            raise CliError(
                f"no gpuplatform API at {client.base} (404 on {client.url_for('me/')})",
                EXIT_NOT_FOUND,
            ) from exc
        raise
    if not isinstance(me, dict) or "username" not in me:
        raise CliError(f"{client.base} answered, but not like a gpuplatform server")
    config = load_config()
    config.update(url=client.base, token=client.token)
    path = save_config(config)
    if ctx.structured:
        out.emit(out.dump(me, ctx.output))
    else:
        tenant = f" in tenant {me['tenant']}" if me.get("tenant") else ""
        out.emit(f"logged in to {client.base} as {me['username']}{tenant}")
        out.note(f"saved to {path} (readable by you only)")
    return EXIT_OK


def read_secret(prompt: str) -> str:
    if sys.stdin.isatty():
        secret = getpass.getpass(prompt)
    else:
        secret = sys.stdin.readline()
    secret = secret.strip()
    if not secret:
        raise CliError("no token given: gpuctl login --url URL --token TOKEN", EXIT_USAGE)
    return secret


def cmd_logout(ctx: Context) -> int:
    path = config_path()
    config = load_config()
    if "token" not in config:
        out.note(f"not logged in ({path} holds no token)")
        return EXIT_OK
    del config["token"]
    save_config(config)
    out.emit(f"logged out: token removed from {path}")
    return EXIT_OK


def cmd_whoami(ctx: Context) -> int:
    me = ctx.client.get("me/")

    def human() -> str:
        memberships = ", ".join(f"{m['tenant']} ({m['role']})" for m in me.get("memberships", []))
        return out.fields(
            [
                ("Server", ctx.client.base),
                ("User", me.get("username")),
                ("Tenant", me.get("tenant")),
                ("Token", me.get("token")),
                ("Operator", bool(me.get("is_operator"))),
                ("Memberships", memberships),
            ]
        )

    ctx.show(me, human)
    return EXIT_OK


# --- Commands: submitting ----------------------------------------------------------------------


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


def env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def task_id(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a task id is a positive whole number, got {text!r}")
    return int(text)


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


# --- Commands: reading -------------------------------------------------------------------------


def cmd_get(ctx: Context) -> int:
    resource = ctx.args.resource.rstrip("s") if ctx.args.resource != "gpus" else "gpu"
    if resource != "task" and (ctx.args.state or ctx.args.queue or ctx.args.name):
        raise CliError("--state, --queue and --name apply to tasks only", EXIT_USAGE)
    handler = {"task": get_tasks, "gpu": get_gpus, "node": get_nodes, "pool": get_pools}
    return handler[resource](ctx)


def get_tasks(ctx: Context) -> int:
    args = ctx.args
    if args.names:
        ids = [task_id_or_usage(n) for n in args.names]
        tasks = [ctx.client.get(f"tasks/{i}/", what=f"task {i}") for i in ids]
        data: Any = tasks[0] if len(tasks) == 1 else tasks
        ctx.show(data, lambda: tasks_table(tasks, wide=ctx.wide))
        return EXIT_OK
    states = []
    for group in args.state or []:
        for state in filter(None, (s.strip() for s in group.split(","))):
            if state not in STATES:
                raise CliError(
                    f"unknown state {state!r}: expected one of {', '.join(STATES)}", EXIT_USAGE
                )
            states.append(state)
    params = {"state": ",".join(states), "queue": args.queue, "name": args.name}
    tasks, count, exact = ctx.client.list("tasks/", params, limit=None if args.all else args.limit)
    if ctx.structured:
        out.emit(out.dump(tasks, ctx.output))
    elif not tasks:
        out.note("no tasks found")
    else:
        out.emit(tasks_table(tasks, wide=ctx.wide))
        if len(tasks) < count:
            total = f"{count}" if exact else f"at least {count}"
            out.note(f"showing {len(tasks)} of {total} tasks: -l N for more, -A for all")
    return EXIT_OK


def task_id_or_usage(text: str) -> int:
    try:
        return task_id(text)
    except argparse.ArgumentTypeError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc


def tasks_table(tasks: list[dict], *, wide: bool = False) -> str:
    headers = ["ID", "NAME", "STATE", "GPUS", "NODE", "AGE"]
    if wide:
        headers += ["QUEUE", "PRIORITY", "CLASS", "OWNER", "ATTEMPT", "EXIT"]
    headers.append("REASON")
    rows = []
    for t in tasks:
        gpus = t.get("gpus")
        if t.get("gpu_memory_mb"):
            gpus = f"{gpus}x{out.memory(t['gpu_memory_mb'])}"
        row = [t["id"], t["name"], t["state"], gpus, t.get("node"), out.age(t.get("submitted_at"))]
        if wide:
            row += [
                t.get("queue"),
                priority_text(t.get("priority")),
                t.get("task_class"),
                t.get("owner"),
                t.get("attempt"),
                t.get("exit_code"),
            ]
        row.append(t.get("reason"))
        rows.append(row)
    return out.table(headers, rows, fit=not wide)


def priority_text(priority: Any) -> str:
    name = PRIORITY_NAMES.get(priority)
    return f"{priority} ({name})" if name else out.cell_text(priority)


def get_gpus(ctx: Context) -> int:
    gpus = ctx.client.list("gpus/").items
    if ctx.args.names:
        wanted = set(ctx.args.names)
        gpus = [
            g
            for g in gpus
            if {
                str(g["id"]),
                g["uuid"],
                f"{g['node']}/{g['index']}",
                f"{g['node']}/gpu{g['index']}",
            }
            & wanted
        ]
        if not gpus:
            raise CliError(f"no GPU {', '.join(ctx.args.names)}", EXIT_NOT_FOUND)

    def human() -> str:
        # STATE is what an operator allows (available, draining, ...); FREE is what a new task
        # could still get: an available GPU that a task holds whole has none.
        headers = ["ID", "NODE", "IDX", "TYPE", "MEMORY", "RESERVED", "FREE", "STATE", "MY-TASKS"]
        if ctx.wide:
            headers += ["MODEL", "UUID", "PCI", "FOREIGN", "SEEN"]
        rows = []
        for g in gpus:
            mine = ",".join(f"{t['id']}:{t['name']}" for t in g.get("my_tasks") or [])
            state = g["state"] + (f" ({g['state_reason']})" if g.get("state_reason") else "")
            row = [
                g["id"],
                g["node"],
                g["index"],
                g.get("gpu_type"),
                out.memory(g.get("memory_mb")),
                memory_or_zero(g.get("reserved_mb")),
                memory_or_zero(g.get("free_mb")),
                state,
                mine,
            ]
            if ctx.wide:
                row += [
                    g.get("model"),
                    g.get("uuid"),
                    g.get("pci_bus_id"),
                    out.memory(g.get("foreign_memory_mb") or None),
                    out.age(g.get("last_seen_at")),
                ]
            rows.append(row)
        return out.table(headers, rows, fit=not ctx.wide)

    return show_listing(ctx, gpus, human, "no GPUs registered")


def memory_or_zero(mb: Any) -> str:
    """``0`` for none at all (where ``0Mi`` reads oddly); ``-`` when the server did not say."""
    return "0" if mb == 0 else out.memory(mb)


def named(ctx: Context, items: list[dict], noun: str) -> list[dict]:
    """The listed items the command line named (all when it named none); none found is 404."""
    if not ctx.args.names:
        return items
    wanted = set(ctx.args.names)
    found = [item for item in items if item["name"] in wanted]
    if not found:
        raise CliError(f"no {noun} {', '.join(ctx.args.names)}", EXIT_NOT_FOUND)
    return found


def show_listing(ctx: Context, items: list[dict], human, empty: str) -> int:
    if not items and not ctx.structured:
        out.note(empty)
        return EXIT_OK
    ctx.show(items, human)
    return EXIT_OK


def get_nodes(ctx: Context) -> int:
    nodes = named(ctx, ctx.client.list("nodes/").items, "node")

    def human() -> str:
        headers = ["NAME", "POOL", "STATE", "BACKEND", "GPUS", "HEARTBEAT", "REASON"]
        rows = [
            [
                n["name"],
                n.get("pool"),
                n["state"],
                n.get("backend"),
                n.get("gpu_count"),
                f"{out.age(n['last_heartbeat'])} ago" if n.get("last_heartbeat") else None,
                n.get("state_reason"),
            ]
            for n in nodes
        ]
        return out.table(headers, rows, fit=not ctx.wide)

    return show_listing(ctx, nodes, human, "no nodes registered")


def get_pools(ctx: Context) -> int:
    pools = named(ctx, ctx.client.list("pools/").items, "pool")
    headers = ["NAME", "NODES", "GPUS", "DESCRIPTION"]
    rows = [
        [p["name"], p.get("node_count"), p.get("gpu_count"), p.get("description")] for p in pools
    ]
    ctx.show(pools, lambda: out.table(headers, rows, fit=not ctx.wide))
    return EXIT_OK


def cmd_describe(ctx: Context) -> int:
    client = ctx.client
    described = []
    for number in ctx.args.ids:
        task = client.get(f"tasks/{number}/", what=f"task {number}")
        events = client.list(f"tasks/{number}/events/").items
        described.append({**task, "events": events})
    if ctx.structured:
        out.emit(out.dump(described[0] if len(described) == 1 else described, ctx.output))
        return EXIT_OK
    out.emit("\n".join(describe_task(t, t["events"]) for t in described))
    return EXIT_OK


def describe_task(t: dict, events: list[dict]) -> str:
    state = t["state"]
    pairs: list[tuple[str, Any]] = [("Task", f"{t['id']} {t['name']}"), ("State", state)]
    if state == "pending":
        pairs.append(("Waiting", t.get("reason") or "for the next scheduling pass"))
        if t.get("position"):
            pairs.append(("Position", f"{out.ordinal(t['position'])} in line"))
    elif t.get("reason"):
        pairs.append(("Reason", t["reason"]))
    if t.get("hold_reason"):
        pairs.append(("Held", t["hold_reason"]))
    if t.get("not_before"):
        pairs.append(("Not before", out.local_time(t["not_before"])))
    preemptible = "preemptible" if t.get("preemptible") else "not preemptible"
    pairs += [
        ("Owner", t.get("owner")),
        ("Queue", t.get("queue")),
        ("Priority", priority_text(t.get("priority"))),
        ("Class", f"{t.get('task_class')}, {preemptible}"),
        ("Command", t.get("command")),
        ("Workdir", t.get("workdir") or "(the tenant's root)"),
    ]
    if t.get("env"):
        pairs.append(("Env", "\n".join(f"{k}={v}" for k, v in t["env"].items())))
    share = (
        f"{out.memory(t['gpu_memory_mb'])} each, shared"
        if t.get("gpu_memory_mb")
        else "whole cards, exclusive"
    )
    wanted = f"{t.get('gpus')} x {t.get('gpu_type') or 'any type'} ({share})"
    where = [f"pool {t['pool']}" if t.get("pool") else "", f"node {t['required_node']}"]
    if t.get("required_node"):
        wanted += " on " + " ".join(w for w in where if w)
    elif t.get("pool"):
        wanted += f" in pool {t['pool']}"
    pairs += [
        ("GPUs wanted", wanted),
        ("Node", t.get("node")),
        ("GPUs held", "\n".join(t.get("gpu_uuids") or []) or None),
        ("Attempt", f"{t.get('attempt') or 'none yet'} (retries allowed: {t.get('retries', 0)})"),
        ("Exit code", t.get("exit_code")),
        ("Timeout", out.duration(t["timeout_s"]) if t.get("timeout_s") else "none"),
    ]
    if t.get("depends_on"):
        pairs.append(("After", ", ".join(str(d) for d in t["depends_on"])))
    if t.get("infra_requeues"):
        pairs.append(("Requeued", f"{t['infra_requeues']} time(s) after infrastructure failures"))
    pairs += [
        ("Submitted", out.local_time(t.get("submitted_at"))),
        ("Scheduled", out.local_time(t.get("scheduled_at"))),
        ("Started", out.local_time(t.get("started_at"))),
        ("Finished", out.local_time(t.get("finished_at"))),
    ]
    if t.get("started_at"):
        pairs.append(("Waited", out.between(t.get("submitted_at"), t["started_at"])))
        pairs.append(("Ran", out.between(t["started_at"], t.get("finished_at"))))
    elif state not in TERMINAL:
        pairs.append(("Waited", f"{out.between(t.get('submitted_at'), None)} so far"))
    text = out.fields(pairs)
    attempts = t.get("attempts") or []
    if attempts:
        rows = [
            [
                a["number"],
                a.get("node"),
                len(a.get("gpu_uuids") or []),
                out.local_time(a.get("started_at")),
                out.between(a.get("started_at"), a.get("ended_at"))
                if a.get("started_at")
                else None,
                a.get("exit_code"),
                a.get("outcome") or ("running" if not a.get("ended_at") else None),
            ]
            for a in attempts
        ]
        headers = ["#", "NODE", "GPUS", "STARTED", "RAN", "EXIT", "OUTCOME"]
        text += "\nAttempts:\n" + indent(out.table(headers, rows, fit=False))
    if events:
        shown = events[-EVENTS_SHOWN:]
        title = "Events" if len(shown) == len(events) else f"Events (last {len(shown)})"
        rows = [
            [
                f"{out.age(e.get('at'))} ago",
                f"{e.get('from_state') or '-'} -> {e.get('to_state')}",
                e.get("actor"),
                e.get("reason"),
            ]
            for e in shown
        ]
        text += f"\n{title}:\n" + indent(out.table(["WHEN", "CHANGE", "BY", "REASON"], rows))
    return text


def indent(text: str, prefix: str = "  ") -> str:
    return "".join(prefix + line if line.strip() else line for line in text.splitlines(True))


# --- Commands: logs and waiting ----------------------------------------------------------------


def read_log(client: Client, number: int, params: dict[str, Any]) -> dict | None:
    """One chunk of the log, or None when the attempt has no log (yet)."""
    try:
        return client.get(f"tasks/{number}/log/", params, what=f"task {number}")
    except ApiError as exc:
        if exc.status == 404 and "attempt" in exc.errors:
            return None
        raise


def cmd_logs(ctx: Context) -> int:
    """Print the log (all of it, or --tail N lines); with -f keep reading from next_offset until
    the attempt finishes. Without --attempt, -f goes on to the next attempt of a retried task."""
    client = ctx.client
    args = ctx.args
    number = args.id
    pinned = args.attempt
    if ctx.structured:
        if args.follow:
            raise CliError("-f prints text: -o json/yaml reads one chunk, without -f", EXIT_USAGE)
        params = {"attempt": pinned}
        params.update({"tail": args.tail} if args.tail is not None else {"offset": 0})
        chunk = read_log(client, number, params)
        if chunk is None:
            task = client.get(f"tasks/{number}/", what=f"task {number}")
            raise CliError(no_log_message(number, pinned, task), EXIT_NOT_FOUND)
        out.emit(out.dump(chunk, ctx.output))
        return EXIT_OK
    streaming: int | None = None  # the attempt being printed
    done_attempt = 0  # the last attempt printed to its end (-f goes on to the next one)
    offset = 0
    waiting_said = False
    while True:
        if streaming is None:
            chunk = None
            if done_attempt:  # ask the task first: re-reading the old attempt would be wasted
                task = client.get(f"tasks/{number}/", what=f"task {number}")
                if task["state"] in TERMINAL and task["attempt"] <= done_attempt:
                    return EXIT_OK
                if task["attempt"] > done_attempt:
                    chunk = read_log(client, number, {"attempt": task["attempt"], "offset": 0})
            else:
                params = {"attempt": pinned}
                params.update({"tail": args.tail} if args.tail is not None else {"offset": 0})
                chunk = read_log(client, number, params)
                if chunk is None:
                    task = client.get(f"tasks/{number}/", what=f"task {number}")
                    if not args.follow or task["state"] in TERMINAL:
                        raise CliError(no_log_message(number, pinned, task), EXIT_NOT_FOUND)
                    if not waiting_said:
                        out.note(f"waiting for task {number} to start ({task['state']})...")
                        waiting_said = True
            if chunk is None:
                time.sleep(LOG_POLL_S)
                continue
            if done_attempt:
                out.note(f"--- task {number}, attempt {chunk['attempt']} ---")
            streaming = chunk["attempt"]
        else:
            chunk = read_log(client, number, {"attempt": streaming, "offset": offset})
            if chunk is None:  # the log went away (cleaned up): nothing more to read
                return EXIT_OK
        sys.stdout.write(chunk["text"])
        sys.stdout.flush()
        offset = chunk["next_offset"]
        at_end = offset >= chunk["size"]
        if chunk["finished"] and at_end:
            if not args.follow or pinned is not None:
                return EXIT_OK
            done_attempt, streaming, offset = streaming, None, 0
        elif at_end and not args.follow:
            return EXIT_OK
        if at_end:
            time.sleep(LOG_POLL_S)


def no_log_message(number: int, attempt: int | None, task: dict) -> str:
    if attempt:
        return f"task {number}: no log for attempt {attempt}"
    if task["state"] in TERMINAL:
        return f"task {number}: no log: it is {task['state']} and never ran"
    return f"task {number}: no log yet: it is {task['state']} (use -f to wait for it)"


def cmd_wait(ctx: Context) -> int:
    return wait_for(ctx, ctx.args.ids)


def wait_for(ctx: Context, ids: list[int]) -> int:
    """Poll until every task has ended, telling each change on stderr; 0 if all succeeded."""
    client = ctx.client
    last: dict[int, str] = dict.fromkeys(ids, "")
    final: dict[int, dict] = {}
    while len(final) < len(ids):
        for number in ids:
            if number in final:
                continue
            task = client.get(f"tasks/{number}/", what=f"task {number}")
            if task["state"] != last[number]:
                last[number] = task["state"]
                where = f" on {task['node']}" if task.get("node") else ""
                why = (
                    f": {task['reason']}"
                    if task.get("reason") and task["state"] != "running"
                    else ""
                )
                out.note(f"task {number} {task['name']}: {task['state']}{where}{why}")
            if task["state"] in TERMINAL:
                final[number] = task
        if len(final) < len(ids):
            time.sleep(WAIT_POLL_S)
    ended = [final[n] for n in ids]
    if ctx.structured:
        out.emit(out.dump(ended if len(ended) != 1 else ended[0], ctx.output))
    failed = [t for t in ended if t["state"] != "succeeded"]
    for t in failed:
        code = f" (exit code {t['exit_code']})" if t.get("exit_code") is not None else ""
        out.note(f"error: task {t['id']} {t['name']} {t['state']}{code}")
    if not failed:
        out.note(f"{len(ended)} task(s) succeeded")
    return EXIT_FAILED if failed else EXIT_OK


# --- Commands: control -------------------------------------------------------------------------


def cmd_control(ctx: Context) -> int:
    action = ctx.args.action
    results, code = [], EXIT_OK
    for number in ctx.args.ids:
        try:
            task = ctx.client.post(f"tasks/{number}/{action}/", what=f"task {number}")
        except ApiError as exc:
            if exc.code == EXIT_AUTH and exc.status == 401:
                raise
            for line in exc.message.splitlines():
                out.note(f"error: {line}")
            code = code or exc.code
            continue
        results.append(task)
        if not ctx.structured:
            expected = CONTROL_RESULT[action]
            if task["state"] == expected:
                out.emit(f"task {number} {task['name']}: {expected}")
            else:
                out.emit(f"task {number} {task['name']}: {action} requested (now {task['state']})")
    if ctx.structured:
        out.emit(out.dump(results, ctx.output))
    return code


# --- Commands: tenant ----------------------------------------------------------------------------


def cmd_quota(ctx: Context) -> int:
    quota = ctx.client.get("quota/")

    def human() -> str:
        use = quota.get("in_use", {})
        fair = quota.get("fair_share", {})
        text = out.fields(
            [
                ("Tenant", quota.get("tenant")),
                ("GPUs in use", out.number(use.get("gpus"))),
                ("GPU memory", out.memory(use.get("gpu_memory_mb") or 0)),
                ("Running", use.get("running_tasks")),
                ("Queued", use.get("queued_tasks")),
                (
                    "Fair share",
                    f"recent use {out.number(fair.get('recent_gpus'))} GPUs, "
                    f"weight {out.number(fair.get('weight'))}, "
                    f"half-life {out.duration(fair.get('half_life_s'))}",
                ),
            ]
        )
        limits = quota.get("limits") or []
        if not limits:
            return text + "\nLimits: none set for this tenant\n"
        headers = ["POOL", "GPUS", "GPU-MEMORY", "RUNNING", "QUEUED", "MAX-PRIORITY", "WEIGHT"]
        rows = [
            [
                q.get("pool") or "(all pools)",
                q.get("max_gpus"),
                out.memory(q.get("max_gpu_memory_mb")),
                q.get("max_running_tasks"),
                q.get("max_queued_tasks"),
                q.get("max_priority"),
                out.number(q.get("fair_share_weight")),
            ]
            for q in limits
        ]
        return text + "\nLimits (- = no limit):\n" + indent(out.table(headers, rows))

    ctx.show(quota, human)
    return EXIT_OK


def cmd_usage(ctx: Context) -> int:
    if ctx.args.sampled:
        sampled = ctx.client.get("usage/sampled/", {"days": ctx.args.days})
        ctx.show(sampled, lambda: telemetry.sampled_usage_table(sampled))
        return EXIT_OK
    usage = ctx.client.get("usage/", {"days": ctx.args.days})

    def human() -> str:
        rows = [[d["day"], f"{d['gpu_hours']:.2f}"] for d in usage.get("days", [])]
        rows.append(["total", f"{usage.get('total_gpu_hours', 0):.2f}"])
        title = f"GPU-hours of tenant {usage.get('tenant')}, last {len(rows) - 1} day(s) (UTC):\n"
        return title + out.table(["DAY", "GPU-HOURS"], rows)

    ctx.show(usage, human)
    return EXIT_OK


def cmd_token_create(ctx: Context) -> int:
    body: dict[str, Any] = {"name": ctx.args.name}
    if ctx.args.days:
        body["expires_in_days"] = ctx.args.days
    token = ctx.client.post("tokens/", body, what="token")
    if ctx.structured:
        out.emit(out.dump(token, ctx.output))
    else:
        out.emit(token["token"])
        expires = (
            f"expires {out.local_time(token['expires_at'])}"
            if token.get("expires_at")
            else "never expires"
        )
        out.note(f"token {token['name']!r} created (id {token['id']}, {expires}).")
        out.note(
            "This is the only time the secret is shown: store it now; the server keeps a hash."
        )
    return EXIT_OK


def cmd_token_list(ctx: Context) -> int:
    tokens = ctx.client.list("tokens/").items

    def human() -> str:
        rows = []
        for t in tokens:
            expires = out.parse_time(t.get("expires_at"))
            if t.get("revoked_at"):
                status = "revoked"
            elif expires and expires <= out.now():
                status = "expired"
            else:
                status = "active"
            rows.append(
                [
                    t["id"],
                    t["name"],
                    t["prefix"],
                    status,
                    out.age(t.get("created_at")),
                    out.local_time(t.get("expires_at")) if expires else "never",
                    f"{out.age(t['last_used_at'])} ago" if t.get("last_used_at") else "never",
                ]
            )
        headers = ["ID", "NAME", "PREFIX", "STATUS", "AGE", "EXPIRES", "LAST-USED"]
        return out.table(headers, rows)

    if not tokens and not ctx.structured:
        out.note("no tokens")
        return EXIT_OK
    ctx.show(tokens, human)
    return EXIT_OK


def cmd_token_revoke(ctx: Context) -> int:
    code = EXIT_OK
    for number in ctx.args.ids:
        try:
            ctx.client.delete(f"tokens/{number}/", what=f"token {number}")
        except ApiError as exc:
            if exc.status == 401:
                raise
            for line in exc.message.splitlines():
                out.note(f"error: {line}")
            code = code or exc.code
            continue
        out.emit(f"token {number} revoked")
    return code


# --- Parser --------------------------------------------------------------------------------------


class _ParseFailed(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse that can be asked to raise instead of exiting (to try a split at ``--``)."""

    trial = False

    def error(self, message: str):
        if Parser.trial:
            raise _ParseFailed(message)
        super().error(message)


def build_parser() -> Parser:
    common = Parser(add_help=False)
    group = common.add_argument_group("global options")
    group.add_argument("--url", default=argparse.SUPPRESS, help="server URL (else GPUCTL_URL)")
    group.add_argument(
        "--token", default=argparse.SUPPRESS, help="API token (else GPUCTL_TOKEN; prefer those)"
    )
    group.add_argument(
        "-o",
        "--output",
        choices=out.FORMATS,
        default=argparse.SUPPRESS,
        help="table (default), wide, json or yaml (json/yaml: the API's data)",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show HTTP requests, and tracebacks on errors",
    )
    parser = Parser(
        prog="gpuctl",
        description="Command-line client for gpuplatform: submit and follow GPU tasks.",
        epilog=f"{EXAMPLES_HELP}\n\n{ENVIRONMENT_HELP}\n\n{EXIT_CODES_HELP}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, func: Callable[[Context], int], help_text: str, **kwargs: Any):
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[common],
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,
        )
        sub.set_defaults(func=func)
        return sub

    command("login", cmd_login, "check a token against the server and save both (mode 0600)")
    command("logout", cmd_logout, "remove the saved token")
    command("whoami", cmd_whoami, "show the user and tenant the token acts for")

    sub = command("submit", cmd_submit, "submit tasks from a YAML or JSON file")
    sub.add_argument(
        "-f", "--filename", required=True, metavar="FILE", help="spec file, or - for stdin"
    )
    sub.add_argument(
        "--wait", action="store_true", help="wait until the tasks end (exit 1 if any failed)"
    )

    sub = command(
        "run",
        cmd_run,
        "submit one task built from flags: gpuctl run [options] -- CMD [ARGS...]",
        usage="gpuctl run [options] -- CMD [ARGS...]",
    )
    sub.add_argument("--name", help="task name (default: the command's first word)")
    sub.add_argument("--gpus", help="GPUs: 2, or a range like 1-4 (elastic), 0 for CPU only")
    sub.add_argument("--gpu-memory", metavar="SIZE", help="memory per GPU, shares cards: 20Gi")
    sub.add_argument("--gpu-type", metavar="TYPE", help="e.g. rtx4090-24g")
    sub.add_argument("--pool")
    sub.add_argument("--node")
    sub.add_argument("--priority", help="low, normal, high or 0-100")
    sub.add_argument("--class", dest="task_class", choices=("batch", "online"))
    sub.add_argument("--queue", help="serial queue: one task at a time per queue")
    sub.add_argument("--timeout", metavar="DURATION", help="e.g. 6h, 1h30m")
    sub.add_argument("--retries", type=non_negative)
    sub.add_argument(
        "--after", action="append", metavar="TASK", help="start after this task succeeded"
    )
    sub.add_argument(
        "--env", "-e", action="append", type=env_pair, metavar="NAME=VALUE", help="repeatable"
    )
    sub.add_argument("--workdir", metavar="DIR", help="relative to the tenant's root directory")
    sub.add_argument("--wait", action="store_true", help="wait until it ends (exit 1 if it failed)")
    sub.add_argument("--dry-run", action="store_true", help="print the spec, submit nothing")
    sub.add_argument("cmd", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    sub = command("get", cmd_get, "list tasks, gpus, nodes or pools (or show some by id/name)")
    sub.add_argument(
        "resource", choices=("tasks", "task", "gpus", "gpu", "nodes", "node", "pools", "pool")
    )
    sub.add_argument("names", nargs="*", metavar="ID", help="task ids, GPU ids, node names")
    sub.add_argument("--state", action="append", help="tasks in these states: pending,running")
    sub.add_argument("--queue", help="tasks of this queue")
    sub.add_argument("--name", help="tasks whose name contains this")
    sub.add_argument("-l", "--limit", type=positive, default=50, help="at most N tasks (50)")
    sub.add_argument("-A", "--all", action="store_true", help="every task (all pages)")

    sub = command("describe", cmd_describe, "a task in detail: why it waits, attempts, events")
    sub.add_argument("resource", choices=("task", "tasks"))
    sub.add_argument("ids", nargs="+", type=task_id, metavar="ID")

    sub = command("logs", cmd_logs, "print a task's output")
    sub.add_argument("id", type=task_id, metavar="ID")
    sub.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    sub.add_argument("--tail", type=non_negative, metavar="N", help="only the last N lines")
    sub.add_argument("--attempt", type=positive, metavar="N", help="this attempt (default: latest)")

    for action, text in (
        ("cancel", "cancel tasks (stops them if running)"),
        ("pause", "pause running tasks (SIGSTOP; they keep their GPUs)"),
        ("resume", "resume paused tasks"),
        ("retry", "run ended tasks again"),
    ):
        sub = command(action, cmd_control, text)
        sub.add_argument("ids", nargs="+", type=task_id, metavar="ID")
        sub.set_defaults(action=action)

    sub = command("wait", cmd_wait, "wait until tasks end (exit 1 if any did not succeed)")
    sub.add_argument("ids", nargs="+", type=task_id, metavar="ID")

    command("quota", cmd_quota, "your tenant's limits, what it uses now, its fair share")
    sub = command("usage", cmd_usage, "GPU-hours per day")
    sub.add_argument("--days", type=positive, default=30, help="how many days back (30)")
    sub.add_argument(
        "--sampled",
        action="store_true",
        help="per member: GPU-hours held, used (utilisation-weighted) and idle, from samples",
    )
    telemetry.add_commands(command)

    token = commands.add_parser(
        "token",
        help="create, list and revoke API tokens",
        description="create, list and revoke API tokens",
        parents=[common],
    )
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    for name, func, help_text in (
        ("create", cmd_token_create, "create a token (its secret is printed once)"),
        ("list", cmd_token_list, "your tokens in this tenant"),
        ("revoke", cmd_token_revoke, "revoke tokens by id"),
    ):
        sub = token_commands.add_parser(
            name, help=help_text, description=help_text, parents=[common]
        )
        sub.set_defaults(func=func)
        if name == "create":
            sub.add_argument("name")
            sub.add_argument("--days", type=positive, help="expires after N days (default never)")
        elif name == "revoke":
            sub.add_argument("ids", nargs="+", type=positive, metavar="ID")
    return parser


def parse_args(parser: Parser, argv: list[str]) -> argparse.Namespace:
    """argparse, except that for ``run`` everything after the first ``--`` is the command, taken
    as it is (options to the command are never read as gpuctl's)."""
    if "--" in argv:
        cut = argv.index("--")
        Parser.trial = True
        try:
            args = parser.parse_args(argv[:cut])
        except _ParseFailed:
            args = None
        finally:
            Parser.trial = False
        if args is not None and args.command == "run":
            tail = argv[cut + 1 :]
            args.cmd = [*args.cmd, "--", *tail] if args.cmd else tail
            return args
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head = argv[: argv.index("--")] if "--" in argv else argv
    debug = "--debug" in head
    try:
        args = parse_args(build_parser(), argv)
        return int(args.func(Context(args)) or EXIT_OK)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else 2)
    except CliError as exc:
        if debug:
            traceback.print_exc()
        for line in exc.message.splitlines() or [""]:
            print(f"error: {line}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (gpuctl logs 12 | head): stop quietly, and keep Python from
        # complaining again while it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(
            f"error: unexpected failure: {type(exc).__name__}: {exc} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED
