"""Replay a GPU job trace through the policy core on a simulated cluster.

``python manage.py replay TRACE.csv --nodes 4x8 --gpu-memory 24Gi --policy both``
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from gpuplatform.units import parse_duration_s, parse_memory_mb
from replay.common import POLICIES, PolicyViolation
from replay.report import format_table, plot, run_policies
from replay.trace import load_trace

_NODES = re.compile(r"(\d+)x(\d+)")


def parse_nodes(value: str) -> tuple[int, int]:
    """``"4x8"`` -> (4 nodes, 8 GPUs per node)."""
    match = _NODES.fullmatch(value.strip().lower())
    if match is None or int(match[1]) < 1 or int(match[2]) < 1:
        raise CommandError(f"--nodes: expected <nodes>x<gpus per node> such as 4x8, got {value!r}")
    return int(match[1]), int(match[2])


class Command(BaseCommand):
    help = (
        "Replay a trace CSV (job_id, tenant, qos, submit_time_s, duration_s, num_gpus, "
        "gpu_milli) through our policy and/or strict FIFO and print the metrics."
    )

    def add_arguments(self, parser):
        parser.add_argument("trace", help="trace CSV file")
        parser.add_argument("--nodes", default="4x8", help="<nodes>x<gpus per node> (default 4x8)")
        parser.add_argument(
            "--gpu-memory", default="24Gi", help="memory of each GPU, e.g. 24Gi (default)"
        )
        parser.add_argument(
            "--policy",
            default="both",
            help="both (default), ours or fifo",
        )
        parser.add_argument(
            "--half-life",
            default="24h",
            help="half-life of the decayed usage fair share sees, e.g. 24h (default)",
        )
        parser.add_argument("--limit", default=None, help="replay only the first N jobs")
        parser.add_argument(
            "--json", action="store_true", help="print the metrics as JSON instead of a table"
        )
        parser.add_argument("--plot", default=None, metavar="PNG", help="also write a chart")

    def handle(self, *args: Any, **options: Any) -> None:
        nodes, gpus_per_node = parse_nodes(options["nodes"])
        gpu_memory_mb = _option(parse_memory_mb, options["gpu_memory"], "--gpu-memory")
        half_life_s = _option(parse_duration_s, options["half_life"], "--half-life")
        limit = _limit(options["limit"])
        policy = options["policy"]
        if policy not in ("both", *POLICIES):
            raise CommandError(f"--policy: expected both, ours or fifo, got {policy!r}")
        policies = POLICIES if policy == "both" else (policy,)

        try:
            jobs = load_trace(options["trace"], limit=limit)
        except OSError as exc:
            raise CommandError(f"cannot read trace: {exc}") from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not jobs:
            raise CommandError(f"{options['trace']}: no jobs")

        try:
            comparison = run_policies(
                jobs,
                policies,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                gpu_memory_mb=gpu_memory_mb,
                half_life_s=half_life_s,
            )
        except ImportError as exc:
            raise CommandError(f"the policy core is not available: {exc}") from exc
        except PolicyViolation as exc:
            raise CommandError(f"the policy broke a rule: {exc}") from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

        if options["json"]:
            payload = {
                "trace": str(options["trace"]),
                "cluster": {
                    "nodes": nodes,
                    "gpus_per_node": gpus_per_node,
                    "gpu_memory_mb": gpu_memory_mb,
                    "half_life_s": half_life_s,
                },
                "summaries": comparison["summaries"],
                "ratios": comparison["ratios"],
            }
            self.stdout.write(json.dumps(payload, indent=2))
        else:
            self.stdout.write(
                f"{len(jobs)} jobs on {nodes}x{gpus_per_node} GPUs of {gpu_memory_mb} MiB, "
                f"fair-share half-life {half_life_s}s\n"
            )
            self.stdout.write(format_table(comparison))
        if options["plot"]:
            plot(comparison, options["plot"])
            # Keep stdout pure JSON when --json is given.
            out = self.stderr if options["json"] else self.stdout
            out.write(f"wrote {options['plot']}")


def _option(parse, value: str, name: str) -> int:
    try:
        return parse(value, field=name)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc


def _limit(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        limit = int(value)
    except ValueError:
        raise CommandError(f"--limit: expected a whole number of jobs, got {value!r}") from None
    if limit < 1:
        raise CommandError(f"--limit: must be at least 1, got {value!r}")
    return limit
