"""What the throughput benchmark prints, and its figures as JSON.

In order: each scenario's throughput side by side, with the CPU per finished task by role;
what is left (the CPU a task may cost to beat task-spooler on these CPUs, against what each
role costs now); latency, the API, the idle estate and the database's sessions; the targets;
and last the peers, with the ratio of each line of ours to each of them.
"""

from __future__ import annotations

import statistics

from bench.common import CPUS, percentile, table, target
from bench.throughput.accounting import (
    BENCH_ROLE,
    CONNECTION_ROLES,
    CPU_ROLES,
    CPU_ROWS,
    PLATFORM,
    connection_budget,
    describe_work,
)
from bench.throughput.figures import (
    BATCH,
    CLIENTS,
    DRAIN_LIMIT_S,
    GPUS_PER_NODE,
    NODES,
    SLOTS,
    TARGET_API_PER_S,
    TARGET_BATCH_PER_S,
    TARGET_BUSY,
    TARGET_CPU_MS,
    TARGET_P50_S,
    TARGET_P99_S,
    TARGET_PER_S,
    TARGET_REUSE_S,
    TASKS,
    Completion,
    Latency,
    ratio,
)
from bench.throughput.scenarios import SCENARIOS, Scenario

# task-spooler's rate on this project's 2-core machine (/work/shared/NOTES.md, 2026-11-23): the
# budget "what is left" is counted against when this run could not measure it.
TSP_REFERENCE_PER_S = 775.0


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:,.1f} ms"


def peer_cell(peer: dict, what: str) -> str:
    if "skipped" in peer:
        return "not measured"
    if what == "throughput":
        return peer["throughput"].describe()
    return peer["latency"].describe()


def api_cell(phase: dict) -> str:
    return (f"{phase['per_s']:,.0f}/s, p99 {_ms(phase['p99_s'])}, {phase['errors']:,} errors "
            f"({phase['http_500']:,} HTTP 5xx) of {phase['requests']:,}")  # fmt: skip


def states_cell(states: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {state}" for state, n in sorted(states.items(), key=lambda s: -s[1]))


def peer_rate(peer: dict) -> float | None:
    return peer["throughput"].per_s if "throughput" in peer else None


def budget_ms(tsp: dict) -> tuple[float, float, str]:
    """CPU milliseconds a task may cost, all roles together, for the platform to complete
    tasks as fast as task-spooler on this machine's CPUs; that rate; and where it comes from."""
    rate = peer_rate(tsp)
    source = "measured in this run"
    if not rate:
        rate, source = TSP_REFERENCE_PER_S, "its rate on the project's 2-core machine"
    return 1000 * CPUS / rate, rate, source


def what_is_left(cpu: dict[str, float], budget: float) -> str:
    """Each role's CPU per task, largest first, against the whole budget of a task."""
    roles = sorted(CPU_ROWS, key=lambda role: -cpu[role])
    parts = ", ".join(f"{role} {cpu[role]:.1f} ({cpu[role] / budget:.1f}x)" for role in roles)
    over = cpu["all"] - budget
    verdict = f"{over:.1f} ms over it" if over > 0 else f"{-over:.1f} ms under it"
    return (f"{cpu['all']:.1f} ms in all, {cpu['all'] / budget:.1f}x the budget, {verdict}; "
            f"by role, largest first (x the whole budget): {parts}")  # fmt: skip


def scenario_rows(runs: dict[str, dict], shown: list[Scenario]) -> list[list[str]]:
    """The throughput table: one column per scenario."""

    def row(label: str, cell) -> list[str]:
        return [label, *(cell(runs[scenario.key]) for scenario in shown)]

    def reuse(t: dict) -> str:
        gaps = t["reuse_gaps"]
        if not gaps:
            return "never"
        return (f"{_ms(percentile(gaps, 50))} / {_ms(percentile(gaps, 99))} "
                f"({len(gaps):,} times)")  # fmt: skip

    def pass_ms(t: dict) -> str:
        if not t["pass_ms"]:
            return "-"
        return (f"{_ms(percentile(t['pass_ms'], 50) / 1000)} / "
                f"{_ms(percentile(t['pass_ms'], 90) / 1000)} ({len(t['pass_ms']):,})")  # fmt: skip

    def passes(t: dict) -> str:
        total = t["completion"].total
        return f"{t['passes']:,} ({total / max(t['passes'], 1):.1f} tasks per pass)"

    def placed_by(t: dict) -> str:
        total = t["completion"].total
        by_pass = min(t["pass_placed"], total)  # a latency probe may be among the pass's
        return f"{by_pass:,} / {total - by_pass:,}"

    rows = [
        row("tasks completed per second", lambda t: t["completion"].describe()),
        row("final states", lambda t: states_cell(t["states"])),
        row("mean busy GPUs while tasks wait", lambda t: f"{t['busy']:,.1f} of {SLOTS}"),
        row("a freed GPU placed again, p50 / p99", reuse),
        row("scheduling passes", passes),
        row("passes that placed: p50 / p90 inside (how many)", pass_ms),
        row("tasks placed by a pass / handed GPUs by a node agent as others ended", placed_by),
        row(
            "supervisor processes per task (each runs task after task)",
            lambda t: f"{t['supervisors'] / max(t['completion'].total, 1):.2f}",
        ),
        row(
            "each POST answered at",
            lambda t: " / ".join(f"{b:,.0f}" for b in t["batches_per_s"]) + " tasks/s",
        ),
        row(
            "runnable processes meanwhile, median (most)",
            lambda t: " / ".join(f"{m:.0f} ({most})" for m, most in t["batch_runnable"]),
        ),
        row(
            "CPU per finished task, ms of the machine",
            lambda t: f"{t['cpu_ms_per_task']['all']:.1f}",
        ),
    ]
    for role in CPU_ROWS:
        rows.append(row(f"  {role}", lambda t, role=role: f"{t['cpu_ms_per_task'][role]:.1f}"))
    rows.append(
        row("PostgreSQL transactions per finished task", lambda t: describe_work(t["db_per_task"]))
    )
    return rows


def report(ours: dict, tsp: dict, slurm: dict) -> list[tuple[str, bool | None]]:
    runs: dict[str, dict] = ours["throughput"]
    shown = [scenario for scenario in SCENARIOS if scenario.key in runs]
    default = shown[0]
    head = runs[default.key]
    tput: Completion = head["completion"]
    lat: Latency = ours["latency"]
    api, queued = ours["api"], ours["api_queued"]
    busy, gaps = head["busy"], head["reuse_gaps"]
    peak = max(ours["connections"].values())
    roles, cap = ours["connection_roles"], connection_budget()
    batches = [b for scenario in shown for b in runs[scenario.key]["batches_per_s"]]

    print(f"gpuplatform: {NODES} node agents x {GPUS_PER_NODE} simulated GPUs, scheduler, daphne; "
          f"up and warm in {ours['startup_s']:.1f} s. Throughput, `true` tasks, each line from "
          "its first POST to its last task's end:")  # fmt: skip
    for n, scenario in enumerate(shown, start=1):
        print(f"  {n}. {scenario.label}: {scenario.tenants} x {scenario.per_tenant:,} tasks "
              f"(POSTs of {scenario.batch:,}, one tenant after another), "
              f"{scenario.describe_mix()}"
              f"{'; the default' if scenario is default else ''}")  # fmt: skip
    header = ["measure", *(f"{n}. {s.label}" for n, s in enumerate(shown, start=1))]
    print(table(header, scenario_rows(runs, shown), left=1))
    print("busy GPUs: a GPU shared by memory counts once; measured from the first POST's "
          "answer to the last task's placement (or the time limit). Passes that placed: "
          "milliseconds from a pass's first read to its last write, before its commit (the "
          "scheduler's log)")  # fmt: skip
    print()

    budget, rate, source = budget_ms(tsp)
    print(f"what is left: completing {rate:,.0f} tasks a second, task-spooler's rate ({source}), "
          f"on this machine's {CPUS} CPUs leaves {budget:.1f} ms of CPU per task for every role "
          "together, the tasks' own processes and PostgreSQL included:")  # fmt: skip
    for n, scenario in enumerate(shown, start=1):
        left = what_is_left(runs[scenario.key]["cpu_ms_per_task"], budget)
        print(f"  {n}. {scenario.label}: {left}")
    print()

    print(f"submit -> process exists on an idle estate, p50 / p99: {lat.describe()}")
    if lat.lost:
        print(f"latency: {lat.lost} probe(s) left out (supervisor killed from outside)")
    for title, phase, what in (
        (f"API, {CLIENTS} clients, one task each, into a busy estate (they queue)", queued,
         "while their tasks queue"),
        (f"API, the same, each task also run at once (`true`, {SLOTS} GPUs free)", api,
         "while their tasks run"),
    ):  # fmt: skip
        print(f"{title}: {api_cell(phase)}; statuses {phase['statuses']}; "
              f"{phase['cancelled_after']} of its tasks, still pending {DRAIN_LIMIT_S:.0f} s "
              "after the clients (and the estate's holders) stopped, were cancelled; "
              f"{phase['left_running']} still unfinished when the next phase began")  # fmt: skip
        if phase["error_sample"]:
            print(f"  e.g. {phase['error_sample']}")
        cpu = phase["cpu_ms_per_accepted"]
        parts = ", ".join(f"{role} {cpu[role]:.1f}" for role in CPU_ROWS)
        print(f"  while the clients submitted: {cpu['all']:.1f} ms of CPU per accepted "
              f"submission ({parts}; the API's clients are other processes, in the rest), "
              f"{phase['passes']:,} scheduling passes "
              f"({phase['passes_per_accepted']:.2f} per accepted submission); at that cost "
              f"the machine's {CPUS} CPUs allow at most "
              f"{CPUS * 1000 / max(cpu['all'], 1e-9):,.0f} submissions a second "
              f"{what}")  # fmt: skip
    lifecycle = head["cpu_ms_per_task"]["all"]
    print(f"  {TARGET_API_PER_S:,.0f} submissions a second leave "
          f"{CPUS * 1000 / TARGET_API_PER_S:.1f} ms of the {CPUS} CPUs for each: a task's "
          f"whole life (pass, launch, process, end) took {lifecycle:.1f} ms of them in line 1, "
          "before its POST's; so the target is judged on the busy estate, the API's own "
          "capacity")  # fmt: skip
    idle = ours["idle"]
    parts = ", ".join(f"{role} {idle['cpu_pct'][role]:.1f}" for role in CPU_ROLES)
    print(f"an idle estate ({NODES} nodes x {GPUS_PER_NODE} GPUs, nothing submitted, "
          f"{idle['seconds']:.0f} s): {idle['transactions_per_s']:.1f} PostgreSQL transactions a "
          f"second ({idle['writes_per_s']:.1f} writing), {idle['wal_kb_per_s']:.1f} kB/s of WAL; "
          f"percent of one core: {parts}")  # fmt: skip
    conns = ", ".join(f"{phase} {n}" for phase, n in ours["connections"].items())
    print(f"PostgreSQL sessions on the bench database, peak per phase (this bench's own two "
          f"included): {conns}; the server allows {ours['max_connections']} (max_connections "
          "less the superuser reserve)")  # fmt: skip
    held = ", ".join(f"{role} {roles.get(role, 0)} of {getattr(cap, role)}"
                     for role in CONNECTION_ROLES)  # fmt: skip
    others = ", ".join(f"{role} {n}" for role, n in roles.items()
                       if role not in (*CONNECTION_ROLES, PLATFORM, BENCH_ROLE))  # fmt: skip
    print(f"  the platform's own, most at once: {roles.get(PLATFORM, 0)} of the documented cap "
          f"{cap.total} (gpuplatform/connections.py); by role, most at once of its cap: {held}"
          f"{'; others: ' + others if others else ''}")  # fmt: skip
    print()

    reuse_p50 = percentile(gaps, 50) if gaps else None
    platform_held = roles.get(PLATFORM, 0)
    line = f" ({default.label})"
    targets = [  # what was measured, as measured, the target, met
        ("tasks completed per second" + line, f"{tput.per_s:,.1f}", f">= {TARGET_PER_S:,.0f}",
         tput.per_s >= TARGET_PER_S),
        ("CPU per finished task, every role" + line, f"{lifecycle:.1f} ms",
         f"<= {TARGET_CPU_MS:.0f} ms", lifecycle <= TARGET_CPU_MS),
        ("mean busy GPUs while tasks wait" + line, f"{busy:,.1f} of {SLOTS}",
         f">= {TARGET_BUSY:.0%} of {SLOTS}", busy >= TARGET_BUSY * SLOTS),
        ("a freed GPU placed again within tens of milliseconds, p50" + line,
         _ms(reuse_p50) if gaps else "never", f"< {_ms(TARGET_REUSE_S)}",
         reuse_p50 is not None and reuse_p50 < TARGET_REUSE_S),
        ("submit -> process exists p50", _ms(lat.p(50)), f"<= {_ms(TARGET_P50_S)}",
         None if lat.p(50) is None else lat.p(50) <= TARGET_P50_S),
        ("submit -> process exists p99", _ms(lat.p(99)), f"<= {_ms(TARGET_P99_S)}",
         None if lat.p(99) is None else lat.p(99) <= TARGET_P99_S),
        (f"API single-task submissions/s, {CLIENTS} clients (into a busy estate)",
         f"{queued['per_s']:,.0f}/s, {queued['errors']:,} errors",
         f">= {TARGET_API_PER_S:,.0f}/s, 0 errors",
         queued["per_s"] >= TARGET_API_PER_S and queued["errors"] == 0),
        ("task batches, every POST of every line",
         " / ".join(f"{b:,.0f}" for b in batches) + " tasks/s",
         f">= {TARGET_BATCH_PER_S:,.0f} tasks/s", min(batches) >= TARGET_BATCH_PER_S),
        ("PostgreSQL connections of the platform, most at once",
         f"{platform_held} (sessions {peak})",
         f"<= the documented cap {cap.total}, under the server's {ours['max_connections']}",
         platform_held <= cap.total and peak < ours["max_connections"]),
    ]  # fmt: skip
    for figure, value, goal, met in targets:
        print(f"target: {figure} {goal}: {target(figure, value, goal, met)}")
    print()

    peers_report(runs, shown, lat, tsp, slurm)
    return [(f"{figure} {goal}", met) for figure, value, goal, met in targets]


def peers_report(runs: dict[str, dict], shown: list[Scenario], lat: Latency, tsp: dict,
                 slurm: dict) -> None:  # fmt: skip
    """The peers' figures, and each line of ours as a ratio to each of them."""

    def peer_p(peer: dict, q: float) -> float | None:
        return peer["latency"].p(q) if "latency" in peer else None

    header = ["measure", "task-spooler (tsp -S 32)", "Slurm, one node, untuned",
              "ratio to tsp", "ratio to Slurm"]  # fmt: skip
    rows = [
        ["submit -> process exists, p50 / p99 (ours: " + lat.describe() + ")",
         peer_cell(tsp, "latency"), peer_cell(slurm, "latency"),
         f"{ratio(lat.p(50), peer_p(tsp, 50))} / {ratio(lat.p(99), peer_p(tsp, 99))}",
         f"{ratio(lat.p(50), peer_p(slurm, 50))} / {ratio(lat.p(99), peer_p(slurm, 99))}"],
        [f"tasks completed per second ({TASKS:,} `true`, {SLOTS} slots, in {TASKS // BATCH} "
         f"submissions of {BATCH:,})", peer_cell(tsp, "throughput"),
         peer_cell(slurm, "throughput"), "", ""],
    ]  # fmt: skip
    for n, scenario in enumerate(shown, start=1):
        per_s = runs[scenario.key]["completion"].per_s
        rows.append([f"  ours, {n}. {scenario.label}: {per_s:,.1f}/s", "", "",
                     ratio(per_s, peer_rate(tsp)), ratio(per_s, peer_rate(slurm))])  # fmt: skip
    print("peers, measured after the platform, on the same machine:")
    print(table(header, rows, left=1))
    print("ratios: gpuplatform / peer (throughput: higher is better; latency: lower is better); "
          "the peers run one-slot jobs with no quota, like line 2")  # fmt: skip
    for name, peer in (("task-spooler", tsp), ("Slurm", slurm)):
        if "skipped" in peer:
            print(f"{name}: {peer['skipped']}")
        else:
            lost = f"; {peer['latency'].lost} probe(s) never ran" if peer["latency"].lost else ""
            print(f"{name}: {peer['version']}{lost}")


def plain(value: object) -> object:
    """Figures as JSON-friendly values (bench/run.py --json)."""
    if isinstance(value, Completion):
        return {"total": value.total, "finished": value.finished, "elapsed_s": value.elapsed_s,
                "limited": value.limited, "per_s": value.per_s}  # fmt: skip
    if isinstance(value, Latency):
        return {"p50_s": value.p(50), "p99_s": value.p(99), "n": len(value.samples),
                "lost": value.lost,
                "mean_s": statistics.fmean(value.samples) if value.samples else None}  # fmt: skip
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
