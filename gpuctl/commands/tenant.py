"""gpuctl's tenant commands: ``quota`` and ``usage``."""

from __future__ import annotations

from gpuctl import EXIT_OK
from gpuctl import output as out
from gpuctl.commands import telemetry
from gpuctl.context import Context


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
        return text + "\nLimits (- = no limit):\n" + out.indent(out.table(headers, rows))

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
