"""Neighbours under a flood: one tenant floods the API, another's p95 latency is compared with
its own baseline; and what one web process serves.

Real processes end to end: daphne as `make run` starts it (``gpuplatform.asgi``, one process,
its database pool) on a free loopback port against the bench database. First, with the
throttle raised out of the way, FLOOD_CLIENTS client processes send GET /api/v1/tasks/ as fast
as they can for CAPACITY_S: the requests a second one web process serves (what the default
API_THROTTLE_RATE is sized from). Then a fresh daphne with the default rates: the quiet tenant
alone sends one request every QUIET_GAP_S for BASELINE_S (its baseline p95); then, for
FLOOD_S (after a FLOOD_LEAD_S head start, past the flood's first burst), FLOOD_CLIENTS
processes of the flooding tenant send without pause and without honouring Retry-After while
the quiet tenant goes on as before. Printed: the quiet tenant's
baseline p95, its p95 under the flood, the ratio (target at most 2), and how the flood's
requests were answered. All traffic stays on 127.0.0.1; the run takes about 36 s.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from bench.common import clear_tasks, ms, percentile, table, target, web_server
from gpuplatform.dburl import current_database_url
from nodeagent.inventory import simulated_uuid
from scheduling.models import GPU, Node, Pool
from tenants import services as tenant_services
from tenants.models import Membership, RateLimit, Role, Tenant

NEEDS_DATABASE = True

PATH = "/api/v1/tasks/?limit=20"
TASKS_EACH = 20
FLOOD_CLIENTS = 8
CAPACITY_S = 4.0
BASELINE_S = 10.0
FLOOD_S = 12.0
FLOOD_LEAD_S = 1.0
QUIET_GAP_S = 0.2  # the quiet tenant's pause between requests (under its rate)
TARGET_RATIO = 2.0
STARTUP_TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parent.parent


def _client(job: tuple) -> dict:
    """Requests on one keep-alive connection until ``seconds`` pass; latencies and statuses."""
    port, token, seconds, gap_s, start_at = job
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    while (wait := start_at - time.perf_counter()) > 0:
        time.sleep(wait)
    deadline = start_at + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        try:
            conn.request("GET", PATH, headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            conn.close()
            status = 0
        latencies.append(time.perf_counter() - t0)
        statuses[status] += 1
        if gap_s:
            time.sleep(gap_s)
    conn.close()
    return {"latencies": latencies, "statuses": dict(statuses)}


def server_env(**extra: str) -> dict[str, str]:
    environ = dict(os.environ)
    for name in ("DEBUG", "API_THROTTLE_RATE", "API_ANON_THROTTLE_RATE", "DB_POOL_SIZE"):
        environ.pop(name, None)
    environ.update(DATABASE_URL=current_database_url(), GPUPLATFORM_TESTING="1", Q_SYNC="0",
                   LAUNCH_TASKS="0", **extra)  # fmt: skip
    return environ


@contextmanager
def daphne(tmp: Path, label: str, **extra_env: str) -> Iterator[int]:
    with web_server("daphne", 1, tmp, env=server_env(**extra_env), label=label) as (port, _):
        yield port


def build_estate() -> dict[str, str]:
    """A node of 8 simulated GPUs; tenants quiet and flood with a member and a token each."""
    pool, _ = Pool.objects.get_or_create(name="default")
    node = Node.objects.create(name="bench-neighbours-0", pool=pool, backend="simulated")
    GPU.objects.bulk_create(
        GPU(node=node, index=i, uuid=simulated_uuid(node.name, i),
            model="NVIDIA GeForce RTX 4090", gpu_type="rtx4090-24g", memory_mb=24 * 1024)
        for i in range(8)
    )  # fmt: skip
    secrets = {}
    for name in ("quiet", "flood"):
        tenant = Tenant.objects.create(name=f"bench-{name}")
        user = get_user_model().objects.create_user(username=f"bench-{name}", password=None)
        Membership.objects.create(user=user, tenant=tenant, role=Role.MEMBER)
        _, secrets[name] = tenant_services.apitoken_create(user=user, tenant=tenant, name="b")
    return secrets


def submit_tasks(port: int, secrets: dict[str, str]) -> None:
    """TASKS_EACH pending tasks per tenant, so each listing has rows to serialise."""
    specs = [{"name": f"t{i}", "command": "python train.py", "resources": {"gpus": 1}}
             for i in range(TASKS_EACH)]  # fmt: skip
    for token in secrets.values():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/api/v1/tasks/", body=json.dumps(specs), headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 201, response.read()[:300]
        conn.close()


def run(pool, jobs: list[tuple]) -> list[dict]:
    return pool.map(_client, jobs)


def summary(parts: list[dict]) -> tuple[list[float], Counter[int]]:
    latencies = sorted(lat for part in parts for lat in part["latencies"])
    statuses: Counter[int] = Counter()
    for part in parts:
        statuses.update(part["statuses"])
    return latencies, statuses


def main() -> dict:
    secrets = build_estate()
    connection.close()  # no connection of ours crosses a fork
    figures: dict = {}
    with tempfile.TemporaryDirectory() as tmp_dir, multiprocessing.Pool(FLOOD_CLIENTS + 1) as pool:
        tmp = Path(tmp_dir)
        # 1. What one web process serves, unthrottled.
        with daphne(tmp, "capacity", API_THROTTLE_RATE="1000000/s") as port:
            submit_tasks(port, secrets)
            start = time.perf_counter() + 0.3
            run(pool, [(port, secrets["flood"], 1.0, 0, start)] * FLOOD_CLIENTS)  # warm-up
            start = time.perf_counter() + 0.3
            parts = run(pool, [(port, secrets["flood"], CAPACITY_S, 0, start)] * FLOOD_CLIENTS)
            latencies, statuses = summary(parts)
            served = statuses.get(200, 0)
            figures["capacity_per_s"] = served / CAPACITY_S
            figures["capacity_p50_s"] = percentile(latencies, 50)
        RateLimit.objects.all().delete()
        connection.close()

        # 2. The quiet tenant's baseline, then under the other tenant's flood; default rates.
        with daphne(tmp, "neighbours") as port:
            start = time.perf_counter() + 0.3
            run(pool, [(port, secrets["quiet"], 1.0, QUIET_GAP_S, start)])  # warm-up
            start = time.perf_counter() + 0.3
            base = run(pool, [(port, secrets["quiet"], BASELINE_S, QUIET_GAP_S, start)])
            base_latencies, base_statuses = summary(base)
            # The quiet tenant starts FLOOD_LEAD_S into the flood: its steady state is measured,
            # not the flood's first burst (API_THROTTLE_BURST requests, by design).
            start = time.perf_counter() + 0.3
            jobs = [(port, secrets["quiet"], FLOOD_S, QUIET_GAP_S, start + FLOOD_LEAD_S)]
            jobs += [(port, secrets["flood"], FLOOD_S + FLOOD_LEAD_S, 0, start)] * FLOOD_CLIENTS
            parts = run(pool, jobs)
            flooded_latencies, flooded_statuses = summary(parts[:1])
            _, flood_statuses = summary(parts[1:])
    clear_tasks()
    connection.close()

    baseline_p95 = percentile(base_latencies, 95)
    flooded_p95 = percentile(flooded_latencies, 95)
    ratio = flooded_p95 / baseline_p95
    flood_total = sum(flood_statuses.values())
    figures.update(
        rate=settings.API_THROTTLE_RATE,
        quiet_baseline_p95_s=baseline_p95,
        quiet_flooded_p95_s=flooded_p95,
        ratio=ratio,
        quiet_statuses=dict(flooded_statuses),
        quiet_baseline_statuses=dict(base_statuses),
        flood_requests=flood_total,
        flood_429=flood_statuses.get(429, 0),
        flood_200=flood_statuses.get(200, 0),
        flood_statuses=dict(flood_statuses),
    )
    print(f"one daphne process, {FLOOD_CLIENTS} clients, GET {PATH} ({TASKS_EACH} tasks), "
          f"unthrottled: {figures['capacity_per_s']:,.1f} requests/s "
          f"(p50 {ms(figures['capacity_p50_s'])})")  # fmt: skip
    print(f"\ndefault rate {settings.API_THROTTLE_RATE} per tenant; the quiet tenant sends one "
          f"request every {QUIET_GAP_S * 1000:.0f} ms; the flood: {FLOOD_CLIENTS} clients "
          f"without pause, ignoring Retry-After, for {FLOOD_S:.0f} s\n")  # fmt: skip
    print(table(
        ["quiet tenant", "requests", "p50", "p95", "statuses"],
        [["alone (baseline)", len(base_latencies), ms(percentile(base_latencies, 50)),
          ms(baseline_p95), dict(base_statuses)],
         ["under the flood", len(flooded_latencies), ms(percentile(flooded_latencies, 50)),
          ms(flooded_p95), dict(flooded_statuses)]],
    ))  # fmt: skip
    judged = target("a quiet tenant's p95 under another's flood / alone", f"{ratio:.2f}",
                    f"<= {TARGET_RATIO:.0f}", ratio <= TARGET_RATIO)  # fmt: skip
    print(f"\np95 under the flood / baseline: {ratio:.2f} (target at most {TARGET_RATIO:.0f}: "
          f"{judged})")  # fmt: skip
    flood_s = FLOOD_S + FLOOD_LEAD_S
    print(f"flood: {flood_total} requests, {figures['flood_429']} answered 429, "
          f"{figures['flood_200']} served ({figures['flood_200'] / flood_s:.1f}/s), "
          f"statuses {dict(flood_statuses)}")  # fmt: skip
    print("slowest quiet requests, alone:", ", ".join(ms(x) for x in base_latencies[-4:]),
          "| under the flood:", ", ".join(ms(x) for x in flooded_latencies[-4:]))  # fmt: skip
    return figures
