"""Web processes settle the garbage collector once started, django-q2 clusters before they fork
(gpuplatform.gctune)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuplatform import gctune
from tests.live import ROOT, process_env

REPORT = "import gc; print(gc.get_threshold()[0], gc.get_freeze_count())"


@pytest.mark.parametrize("entry", ["gpuplatform.asgi", "gpuplatform.wsgi"])
def test_a_web_entry_point_freezes_what_start_up_loaded(entry):
    """What the web server imports (daphne: the ASGI application; gunicorn: the WSGI one)
    leaves the start-up's objects out of every later collection, and young objects are
    collected less often."""
    found = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", f"import {entry}; {REPORT}"],
        cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    threshold, frozen = map(int, found.stdout.split())
    assert threshold == gctune.YOUNG_THRESHOLD
    assert frozen > 50_000  # Django and the apps, at least


@pytest.mark.parametrize("entry", ["gpuplatform.asgi", "gpuplatform.wsgi"])
def test_with_the_stock_collector_a_web_entry_point_keeps_pythons_defaults(entry):
    found = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", f"import {entry}; {REPORT}"],
        cwd=ROOT, env=process_env(GPUPLATFORM_STOCK="gc"), capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert tuple(map(int, found.stdout.split())) == (700, 0)


def test_other_processes_keep_pythons_defaults():
    """Only what a process imports as its entry point settles it: the settings do not."""
    found = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", f"import django; django.setup(); {REPORT}"],
        cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    threshold, frozen = map(int, found.stdout.split())
    assert (threshold, frozen) == (700, 0)


# `manage.py qcluster` in a fresh interpreter, with django-q2's Cluster (what forks the sentinel,
# which forks the pusher, the monitor and the workers) replaced by one that reports instead.
QCLUSTER = f"""
import django
django.setup()
from django.core.management import call_command
from django_q.management.commands import qcluster

class Cluster:
    def start(self):
        {REPORT}

qcluster.Cluster = Cluster
call_command("qcluster")
"""


def test_a_django_q2_cluster_freezes_what_start_up_loaded_before_it_forks():
    """The scheduler's and each node's cluster: its processes are forks, which keep sharing
    the frozen pages with each other (scheduling's qcluster command)."""
    found = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", QCLUSTER],
        cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    threshold, frozen = map(int, found.stdout.split())
    assert threshold == gctune.YOUNG_THRESHOLD
    assert frozen > 50_000


def test_with_the_stock_collector_a_cluster_keeps_pythons_defaults():
    found = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", QCLUSTER],
        cwd=ROOT, env=process_env(GPUPLATFORM_STOCK="gc"), capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert tuple(map(int, found.stdout.split())) == (700, 0)
