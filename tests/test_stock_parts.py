"""GPUPLATFORM_STOCK: each of the platform's own parts can be switched back to the stock
component it replaces (settings; `make bench` measures both), and only that part changes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuplatform import gctune
from tests.live import ROOT, process_env

# What a web process runs with, reported by a fresh interpreter that imported the ASGI entry.
REPORT = """
import gc, json
import gpuplatform.asgi as entry
from django.conf import settings
from django_q.brokers import get_broker
print(json.dumps({
    "handler": f"{type(entry.django_asgi_app).__module__}.{type(entry.django_asgi_app).__name__}",
    "young": gc.get_threshold()[0],
    "frozen": gc.get_freeze_count(),
    "broker": type(get_broker()).__name__,
}))
"""

OURS = {
    "handler": "gpuplatform.asgi_handler.ASGIHandler",
    "young": gctune.YOUNG_THRESHOLD,
    "broker": "NotifyingOrm",
}
STOCK = {
    "asgi": {"handler": "django.core.handlers.asgi.ASGIHandler"},
    "gc": {"young": 700},
    "broker": {"broker": "ORM"},
}


def web_process(stock: str) -> dict:
    found = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", REPORT],
        cwd=ROOT, env=process_env(GPUPLATFORM_STOCK=stock),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    report = json.loads(found.stdout.splitlines()[-1])
    frozen = report.pop("frozen")
    assert (frozen > 0) == (report["young"] == gctune.YOUNG_THRESHOLD)
    return report


@pytest.mark.parametrize("part", ["", *STOCK])
def test_each_part_switched_to_stock_changes_that_part_alone(part):
    assert web_process(part) == {**OURS, **STOCK.get(part, {})}


def test_several_parts_switch_together():
    expected = {**OURS, **STOCK["asgi"], **STOCK["gc"], **STOCK["broker"]}
    assert web_process("asgi, gc,broker") == expected


def test_an_unknown_part_stops_start_up_naming_the_variable():
    found = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT, env=process_env(GPUPLATFORM_STOCK="asgi,gcc"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert found.returncode != 0
    assert "GPUPLATFORM_STOCK" in found.stderr and "gcc" in found.stderr
