"""The service gateway's overhead: a small answer's latency and a 100 MB download, direct to a
service and through ``/services/<id>/`` on daphne.

One service (``scripts/echo_service.py``) on a free loopback port, one daphne process serving
the platform, a running task whose attempt points at the service, and an API token of its
tenant. Latency: sequential GETs of a small page on one kept-alive connection, direct and
through the gateway; the added latency is the difference of their percentiles. Throughput: a
100 MB body read to the end, best of a few runs each way.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from django.contrib.auth.models import User
from django.utils import timezone

from bench.bench_api import server_env
from bench.common import ROOT, clear_tasks, ms, percentile, table, target, web_server
from scheduling.models import Node, Pool, Task, TaskAttempt
from tenants import services as tenant_services
from tenants.models import Membership, Role, Tenant

NEEDS_DATABASE = True

REQUESTS = 2_000
WARM_UP = 100
DOWNLOAD_BYTES = 100 * 1000 * 1000
DOWNLOADS = 3
# Most of the added latency is the platform's own authentication (as for an API request: the
# caller, then the service's replicas, from the database) before the service is asked.
TARGET_ADDED_P50_S = 0.010
TARGET_ADDED_P99_S = 0.050
# A gigabit link carries about 117 MB/s: the gateway should not be what holds a download back.
TARGET_MB_S = 100


def _service() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(  # noqa: S603 - fixed argv
        [sys.executable, str(ROOT / "scripts" / "echo_service.py"), "bench"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, int(proc.stdout.readline())


def _rows(port: int) -> tuple[int, str]:
    tenant = Tenant.objects.create(name="bench-proxy")
    user = User.objects.create(username="bench-proxy")
    Membership.objects.create(user=user, tenant=tenant, role=Role.MEMBER)
    _, secret = tenant_services.apitoken_create(user=user, tenant=tenant, name="bench")
    pool, _ = Pool.objects.get_or_create(name="default")
    node = Node.objects.create(name="bench-proxy-node", pool=pool, backend="simulated")
    task = Task.objects.create(
        tenant=tenant, owner=user, name="echo", command="echo", state="running", node=node
    )
    TaskAttempt.objects.create(
        task=task, number=1, node=node, service_port=port, started_at=timezone.now()
    )
    return task.pk, secret


def _latencies(client: httpx.Client, url: str) -> list[float]:
    for _ in range(WARM_UP):
        client.get(url).raise_for_status()
    took = []
    for _ in range(REQUESTS):
        began = time.perf_counter()
        client.get(url).raise_for_status()
        took.append(time.perf_counter() - began)
    return took


def _download(client: httpx.Client, url: str) -> float:
    """Best MB/s of DOWNLOADS reads of the whole body."""
    best = 0.0
    for _ in range(DOWNLOADS):
        began = time.perf_counter()
        got = 0
        with client.stream("GET", url) as answer:
            answer.raise_for_status()
            for chunk in answer.iter_raw():
                got += len(chunk)
        if got != DOWNLOAD_BYTES:
            raise RuntimeError(f"read {got} bytes of {DOWNLOAD_BYTES}")
        best = max(best, DOWNLOAD_BYTES / 1e6 / (time.perf_counter() - began))
    return best


def main() -> dict:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    clear_tasks()
    service, port = _service()
    try:
        task_id, secret = _rows(port)
        with (
            tempfile.TemporaryDirectory() as tmp,
            web_server("daphne", 1, Path(tmp), server_env()) as (web, _),
        ):
            direct = f"http://127.0.0.1:{port}/services/{task_id}"
            proxied = f"http://127.0.0.1:{web}/services/{task_id}"
            headers = {"Authorization": f"Bearer {secret}"}
            timeout = httpx.Timeout(60)
            with (
                httpx.Client(timeout=timeout) as plain,
                httpx.Client(timeout=timeout, headers=headers) as gated,
            ):
                small_direct = _latencies(plain, f"{direct}/hello")
                small_proxied = _latencies(gated, f"{proxied}/hello")
                big = f"/bytes?n={DOWNLOAD_BYTES}"
                rate_direct = _download(plain, direct + big)
                rate_proxied = _download(gated, proxied + big)
    finally:
        service.kill()
        service.wait()
    figures = {
        "direct_p50_s": percentile(small_direct, 50),
        "direct_p99_s": percentile(small_direct, 99),
        "proxied_p50_s": percentile(small_proxied, 50),
        "proxied_p99_s": percentile(small_proxied, 99),
        "download_direct_mb_s": rate_direct,
        "download_proxied_mb_s": rate_proxied,
    }
    added_p50 = figures["proxied_p50_s"] - figures["direct_p50_s"]
    added_p99 = figures["proxied_p99_s"] - figures["direct_p99_s"]
    figures.update(added_p50_s=added_p50, added_p99_s=added_p99)
    rows = [
        ["direct", ms(figures["direct_p50_s"]), ms(figures["direct_p99_s"]), mb_s(rate_direct)],
        ["through /services/", ms(figures["proxied_p50_s"]), ms(figures["proxied_p99_s"]),
         mb_s(rate_proxied)],
    ]  # fmt: skip
    print(table(["path", "p50", "p99", f"{DOWNLOAD_BYTES // 10**6} MB download"], rows))
    share = rate_proxied / rate_direct if rate_direct else 0.0
    judged = [
        ("gateway added latency p50, small answer", ms(added_p50),
         f"< {ms(TARGET_ADDED_P50_S)}", added_p50 < TARGET_ADDED_P50_S),
        ("gateway added latency p99, small answer", ms(added_p99),
         f"< {ms(TARGET_ADDED_P99_S)}", added_p99 < TARGET_ADDED_P99_S),
        ("gateway 100 MB download", f"{mb_s(rate_proxied)} ({share:.0%} of direct)",
         f">= {mb_s(TARGET_MB_S)}", rate_proxied >= TARGET_MB_S),
    ]  # fmt: skip
    for figure, value, goal, met in judged:
        print(f"{figure}: {value} (target {goal}): {target(figure, value, goal, met)}")
    return figures


def mb_s(rate: float) -> str:
    return f"{rate:,.0f} MB/s"
