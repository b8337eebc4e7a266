"""gpuctl's GPU telemetry commands: ``top`` (a live view of every GPU, like nvitop) and
``metrics TASK`` (a task's GPU history); ``usage --sampled`` renders through here too."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from typing import Any

from gpuctl import EXIT_OK
from gpuctl import output as out
from gpuctl.context import Context

BAR = 10
CLEAR = "\x1b[H\x1b[2J"


def bar(percent: Any) -> str:
    if percent is None:
        return "-"
    filled = round(BAR * max(0, min(100, percent)) / 100)
    return "█" * filled + "·" * (BAR - filled) + f" {percent:>3}%"


def top_table(gpus: list[dict]) -> str:
    headers = ["NODE", "GPU", "UTIL", "MEMORY", "TEMP", "POWER", "TENANT", "TASK", "SAMPLED"]
    rows = []
    simulated = False
    for g in gpus:
        simulated = simulated or bool(g.get("simulated"))
        used, total = g.get("memory_used_mb"), g.get("memory_total_mb")
        memory = f"{out.memory(used)}/{out.memory(total)}" if total else "-"
        power = g.get("power_w")
        limit = g.get("power_limit_w")
        watts = f"{power:.0f}/{limit:.0f} W" if power is not None and limit else "-"
        task = g.get("task")
        state = "" if g.get("state") == "available" else f" ({g.get('state')})"
        if g.get("lost"):
            state = " (lost)"
        rows.append(
            [
                g["node"],
                f"{g['index']}{state}",
                bar(g.get("util_gpu")) if g.get("sampled_at") else "no sample",
                memory,
                f"{g['temperature_c']} °C" if g.get("temperature_c") is not None else "-",
                watts,
                g.get("tenant") or "",
                f"{task}:{g.get('task_name') or ''}" if task else "",
                out.age(g.get("sampled_at")) if g.get("sampled_at") else "",
            ]
        )
    text = out.table(headers, rows)
    if simulated:
        text += "\n(simulated GPUs: these readings are made up from what runs on them)"
    return text


def cmd_top(ctx: Context) -> int:
    path = "operator/gpus/live/" if ctx.args.all else "gpus/live/"
    if ctx.structured or ctx.args.once:
        gpus = ctx.client.get(path)
        ctx.show(gpus, lambda: top_table(gpus))
        return EXIT_OK
    try:
        while True:
            gpus = ctx.client.get(path)
            stamp = time.strftime("%H:%M:%S")
            sys.stdout.write(f"{CLEAR}gpuctl top  {stamp}  (Ctrl-C to quit)\n\n")
            sys.stdout.write(top_table(gpus) + "\n")
            sys.stdout.flush()
            time.sleep(ctx.args.interval)
    except KeyboardInterrupt:
        return EXIT_OK  # quitting top with Ctrl-C is the normal way out


def metrics_table(data: dict) -> str:
    lines = [
        f"source: {data['source']}  step: {out.duration(data['step'])}  "
        f"from {out.local_time(data['start'])} to {out.local_time(data['end'])}"
    ]
    if not data["series"]:
        lines.append("no samples in this range")
        return "\n".join(lines)
    for series in data["series"]:
        lines.append(f"\n{series['node']} GPU {series['index']} ({series['gpu']})")
        rows = [
            [
                out.local_time(datetime.fromtimestamp(p[0], UTC).isoformat()),
                _num(p[1], "%"),
                _num(p[6], "%"),
                out.memory(p[3]) if p[3] is not None else "-",
                _num(p[4], " °C"),
                _num(p[5], " W"),
            ]
            for p in zip(*series["values"], strict=True)
        ]
        lines.append(out.table(["TIME", "UTIL", "PEAK", "MEMORY", "TEMP", "POWER"], rows))
    return "\n".join(lines)


def _num(value: Any, unit: str) -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def cmd_metrics(ctx: Context) -> int:
    params = {key: getattr(ctx.args, key) for key in ("since", "step", "start", "end")}
    params = {key: value for key, value in params.items() if value}
    data = ctx.client.get(f"tasks/{ctx.args.id}/metrics/", params, what=f"task {ctx.args.id}")
    ctx.show(data, lambda: metrics_table(data))
    return EXIT_OK


def sampled_usage_table(data: dict) -> str:
    rows = [
        [
            r["day"],
            r["member"],
            f"{r['allocated_gpu_hours']:.2f}",
            f"{r['used_gpu_hours']:.2f}",
            f"{(r['idle_gpu_hours'] or 0):.2f}",
        ]
        for r in data["rows"]
    ]
    title = f"GPU-hours measured from samples, last {data['days']} day(s) (UTC):\n"
    return title + out.table(["DAY", "MEMBER", "HELD", "USED", "IDLE"], rows)


def add_commands(command) -> None:
    sub = command("top", cmd_top, "live view of every GPU: load, memory, temperature, holder")
    sub.add_argument("-n", "--interval", type=float, default=2.0, help="seconds between updates")
    sub.add_argument("--once", action="store_true", help="print one view and exit")
    sub.add_argument("--all", action="store_true", help="operators: show every tenant's tasks")
    sub = command("metrics", cmd_metrics, "a task's GPU history: utilisation, memory, power")
    sub.add_argument("id", type=int, metavar="TASK")
    sub.add_argument("--since", help="range length, e.g. 15m, 6h (default: the task's run)")
    sub.add_argument("--step", help="bucket width, e.g. 10s, 1m, 1h (default: ~300 points)")
    sub.add_argument("--start", help="ISO 8601 start (instead of --since)")
    sub.add_argument("--end", help="ISO 8601 end (default: now, or the task's end)")
