"""Alerts read from samples: an allocated GPU idle for its window warns the tenant and, by
policy, is reclaimed after the grace period; temperature and ECC alerts open and resolve
themselves."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone, translation

from monitoring.models import Alert
from nodeagent.sampler import Sampler
from scheduling.agentapi import reports
from scheduling.config import parse_config
from scheduling.models import TaskAttempt
from telemetry import alerts, jobs, services
from telemetry.models import GpuSample


@pytest.fixture
def policy(monkeypatch):
    """Idle: at or under 5 % for 10 minutes warns; 5 more minutes reclaims."""
    config = parse_config(
        {
            "nodes": [{"name": "workstation-1"}],
            "telemetry": {"idle": {"window": "10m", "grace": "5m", "reclaim": True}},
        },
        "test.yaml",
    )
    monkeypatch.setattr("scheduling.estate.config", lambda: config)
    return config


def idle_history(gpu, task, *, start, minutes, util=0):
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpu, at=start + timedelta(seconds=s), task=task, tenant_id=task.tenant_id,
                  util_gpu=util)
        for s in range(0, minutes * 60, 5)
    )  # fmt: skip
    jobs.rollup_minutes(start=start, end=start + timedelta(minutes=minutes))


def test_an_idle_allocated_gpu_warns_after_its_window_then_is_reclaimed(
    policy, running, workstation
):
    gpu = workstation.gpus.get(index=0)
    now = timezone.now().replace(second=0, microsecond=0)
    start = now - timedelta(minutes=20)
    running.allocations.update(started_at=start)
    TaskAttempt.objects.create(task=running, number=1, node=workstation)
    idle_history(gpu, running, start=start, minutes=20)

    assert alerts.check_idle(now=start + timedelta(minutes=9)) == {"idle": 0, "reclaimed": 0}

    assert alerts.check_idle(now=now) == {"idle": 1, "reclaimed": 0}
    alert = Alert.objects.get(kind="gpu_idle", resolved_at=None)
    assert alert.task == running and alert.gpu == gpu
    assert "reclaimed 5 min after this warning" in alert.message

    Alert.objects.filter(pk=alert.pk).update(opened_at=now - timedelta(minutes=6))
    assert alerts.check_idle(now=now) == {"idle": 1, "reclaimed": 1}
    running.refresh_from_db()
    assert running.reason.startswith("reclaimed: GPU 0 of workstation-1 stayed at or under 5 %")
    # As data too, which each reader reads in their language.
    assert running.reason_code == "idle_reclaimed"
    with translation.override("zh-hans"):
        assert running.reason_text.startswith("已收回：workstation-1 的 GPU 0 利用率")
    assert TaskAttempt.objects.get(task=running).stop_requested == "violation"
    # Its supervisor reports the stop: it fails with the same reason, still as data.
    assert reports.attempt_finished(running.pk, running.attempt, 143) == "failed"
    running.refresh_from_db()
    assert (running.state, running.reason_code) == ("failed", "idle_reclaimed")


def test_a_busy_gpu_raises_nothing_and_a_busy_minute_resolves_the_alert(
    policy, running, workstation
):
    gpu = workstation.gpus.get(index=0)
    now = timezone.now().replace(second=0, microsecond=0)
    start = now - timedelta(minutes=12)
    running.allocations.update(started_at=start)
    idle_history(gpu, running, start=start, minutes=11)
    alerts.check_idle(now=now)
    assert Alert.objects.filter(kind="gpu_idle", resolved_at=None).count() == 1

    idle_history(gpu, running, start=start + timedelta(minutes=11), minutes=1, util=60)
    assert alerts.check_idle(now=now + timedelta(minutes=1))["idle"] == 0
    assert not Alert.objects.filter(kind="gpu_idle", resolved_at=None).exists()


def test_temperature_alert_opens_with_the_reading_and_resolves_when_it_cools(backend, workstation):
    gpu = workstation.gpus.get(index=3)
    sampler = Sampler(node_name="workstation-1", backend=backend)
    services.fault_inject(gpu=gpu, kind="temperature", value=93)
    sampler.tick()
    alert = Alert.objects.get(kind="gpu_over_temperature", resolved_at=None)
    assert alert.gpu == gpu and "93 °C (limit 85 °C) (simulated)" in alert.message

    services.fault_inject(gpu=gpu, kind="clear")
    sampler.tick()
    assert not Alert.objects.filter(kind="gpu_over_temperature", resolved_at=None).exists()


def test_the_rollup_schedule_runs_rollups_and_the_idle_check(running, backend):
    Sampler(node_name="workstation-1", backend=backend).tick()
    from telemetry import tasks

    result = tasks.rollup()
    assert result["minutes"] == 4 and result["idle"] == 0
