"""gpuctl's commands on tasks and the inventory: ``get``, ``describe`` and the controls
(``cancel``, ``pause``, ``resume``, ``retry``)."""

from __future__ import annotations

import argparse
from typing import Any

from gpuctl import EXIT_AUTH, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from gpuctl import output as out
from gpuctl.client import ApiError, CliError
from gpuctl.context import TERMINAL, Context, task_id

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
PRIORITY_NAMES = {10: "low", 50: "normal", 90: "high"}
CONTROL_RESULT = {"cancel": "cancelled", "pause": "paused", "resume": "running", "retry": "pending"}
EVENTS_SHOWN = 10


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


def service_pairs(t: dict) -> list[tuple[str, Any]]:
    """A service's lines (the API's ``service``): its URL, port, health and replicas."""
    service = t.get("service")
    if not service:
        return []
    port = service.get("service_port")
    asked = service.get("port")
    pairs: list[tuple[str, Any]] = [
        ("Service URL", t.get("service_url")),
        ("Port", f"{port or 'none yet'} (asked: {asked})"),
    ]
    check = service.get("health_check")
    if check:
        health = service.get("health") or "not checked yet"
        detail = service.get("health_detail")
        pairs.append(("Health", f"{health}: {detail}" if detail else health))
        pairs.append(
            ("Health check", f"GET {check['path']} every {out.duration(check['interval'])}")
        )
    else:
        pairs.append(("Health", "no health check"))
    if service.get("replica_of"):
        pairs.append(("Replica of", service["replica_of"]))
    replicas = service.get("replicas") or []
    if len(replicas) > 1 or service.get("replicas_wanted", 1) > 1:
        lines = [
            f"{r['id']} {r['state']} {r.get('node') or '-'} "
            f"port {r.get('service_port') or '-'} {r.get('health') or '-'}"
            for r in replicas
        ]
        pairs.append(("Replicas", "\n".join([service.get("healthy", ""), *lines])))
    return pairs


def describe_task(t: dict, events: list[dict]) -> str:
    state = t["state"]
    pairs: list[tuple[str, Any]] = [("Task", f"{t['id']} {t['name']}"), ("State", state)]
    if state == "pending":
        pairs.append(("Waiting", t.get("reason") or "for the next scheduling pass"))
        if t.get("position"):
            pairs.append(("Position", f"{out.ordinal(t['position'])} in line"))
        if t.get("expected_start"):
            pairs.append(("Expected start", t["expected_start"]["text"]))
    elif t.get("reason"):
        pairs.append(("Reason", t["reason"]))
    if t.get("service_url"):
        pairs.append(("Service", t["service_url"]))
        health = t.get("health") or ("no health check" if state == "running" else "not running")
        pairs.append(("Health", health))
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
    pairs += service_pairs(t)
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
        text += "\nAttempts:\n" + out.indent(out.table(headers, rows, fit=False))
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
        text += f"\n{title}:\n" + out.indent(out.table(["WHEN", "CHANGE", "BY", "REASON"], rows))
    return text


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
