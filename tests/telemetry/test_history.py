"""History: rollups summarise exactly the raw samples they cover, retention removes exactly
what is past its window, and the platform creates its own schedules for both."""

from __future__ import annotations

import random
import statistics
from datetime import UTC, datetime, timedelta

import pytest
from django_q.models import Schedule

from scheduling.passes import scheduler_cluster
from telemetry import jobs
from telemetry.models import GpuRollupHour, GpuRollupMinute, GpuSample

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def write_samples(gpu, start, seconds, *, task=None, seed=1):
    rng = random.Random(seed)
    rows = [
        GpuSample(
            gpu=gpu,
            at=start + timedelta(seconds=s),
            task=task,
            tenant_id=task.tenant_id if task else None,
            util_gpu=rng.randint(0, 100),
            memory_used_mb=rng.randint(0, 24576),
            temperature_c=rng.randint(30, 90),
            power_w=rng.uniform(20, 450),
        )
        for s in range(seconds)
    ]
    GpuSample.objects.bulk_create(rows)
    return rows


@pytest.fixture
def gpu(workstation):
    return workstation.gpus.get(index=0)


def test_minute_rollups_equal_min_mean_max_of_their_raw_samples(gpu):
    rows = write_samples(gpu, T0, 180)

    jobs.rollup_minutes(start=T0, end=T0 + timedelta(minutes=3))

    buckets = list(GpuRollupMinute.objects.filter(gpu=gpu).order_by("start"))
    assert [b.start for b in buckets] == [T0 + timedelta(minutes=m) for m in range(3)]
    for minute, bucket in enumerate(buckets):
        covered = rows[minute * 60 : (minute + 1) * 60]
        assert bucket.samples == 60
        for metric in ("util_gpu", "memory_used_mb", "temperature_c", "power_w"):
            values = [getattr(row, metric) for row in covered]
            assert getattr(bucket, f"{metric}_min") == pytest.approx(min(values))
            assert getattr(bucket, f"{metric}_max") == pytest.approx(max(values))
            assert getattr(bucket, f"{metric}_mean") == pytest.approx(statistics.fmean(values))


def test_hour_rollups_equal_min_mean_max_of_the_whole_hour(gpu):
    # 90 minutes at one sample every 10 s: the hour 10:00 and half of 11:00.
    rows = [
        GpuSample(gpu=gpu, at=T0 + timedelta(seconds=10 * i), util_gpu=i % 97, power_w=i * 0.5)
        for i in range(540)
    ]
    GpuSample.objects.bulk_create(rows)

    jobs.rollup_minutes(start=T0, end=T0 + timedelta(minutes=90))
    jobs.rollup_hours(start=T0, end=T0 + timedelta(hours=2))

    first, second = GpuRollupHour.objects.filter(gpu=gpu).order_by("start")
    hour = [r for r in rows if r.at < T0 + timedelta(hours=1)]
    assert (first.start, first.samples, second.samples) == (T0, 360, 180)
    assert first.util_gpu_mean == pytest.approx(statistics.fmean(r.util_gpu for r in hour))
    assert first.util_gpu_max == max(r.util_gpu for r in hour)
    assert first.power_w_min == min(r.power_w for r in hour)
    assert first.power_w_mean == pytest.approx(statistics.fmean(r.power_w for r in hour))


def test_a_bucket_spanning_two_tasks_is_split_between_them(gpu, running):
    write_samples(gpu, T0, 30)
    write_samples(gpu, T0 + timedelta(seconds=30), 30, task=running, seed=2)

    jobs.rollup_minutes(start=T0, end=T0 + timedelta(minutes=1))

    split = dict(GpuRollupMinute.objects.values_list("task_id", "samples"))
    assert split == {None: 30, running.pk: 30}


def test_rolling_up_again_changes_nothing(gpu):
    write_samples(gpu, T0, 120)
    jobs.rollup_minutes(start=T0, end=T0 + timedelta(minutes=2))
    before = list(GpuRollupMinute.objects.order_by("start").values("start", "util_gpu_mean"))

    jobs.rollup_minutes(start=T0, end=T0 + timedelta(minutes=2))

    after = list(GpuRollupMinute.objects.order_by("start").values("start", "util_gpu_mean"))
    assert after == before


def test_retention_removes_exactly_what_is_past_each_window(gpu):
    now = T0 + timedelta(days=400)
    raw_cutoff = now - timedelta(hours=48)
    GpuSample.objects.bulk_create(
        [
            GpuSample(gpu=gpu, at=raw_cutoff - timedelta(seconds=1)),
            GpuSample(gpu=gpu, at=raw_cutoff),
            GpuSample(gpu=gpu, at=raw_cutoff + timedelta(seconds=1)),
        ]
    )
    for model, window in (
        (GpuRollupMinute, timedelta(days=30)),
        (GpuRollupHour, timedelta(days=365)),
    ):
        for offset in (-60, 0, 60):
            model.objects.create(gpu=gpu, start=now - window + timedelta(seconds=offset),
                                 samples=1)  # fmt: skip

    removed = jobs.retention(now=now)

    assert removed == {"samples": 1, "minutes": 1, "hours": 1}
    assert GpuSample.objects.earliest("at").at == raw_cutoff
    assert GpuRollupMinute.objects.earliest("start").start == now - timedelta(days=30)
    assert GpuRollupHour.objects.earliest("start").start == now - timedelta(days=365)


def test_retention_deletes_a_backlog_larger_than_one_batch(gpu, monkeypatch):
    monkeypatch.setattr(jobs, "DELETE_BATCH", 7)
    write_samples(gpu, T0, 50)

    assert jobs.retention(now=T0 + timedelta(days=3))["samples"] == 50
    assert not GpuSample.objects.exists()


def test_migrate_creates_the_telemetry_schedules_on_the_scheduler_cluster(db):
    rows = Schedule.objects.filter(name__startswith="telemetry-")
    assert sorted(rows.values_list("name", "func", "minutes", "cluster")) == [
        ("telemetry-retention", "telemetry.tasks.retention", 10, scheduler_cluster()),
        ("telemetry-rollup", "telemetry.tasks.rollup", 1, scheduler_cluster()),
    ]
    assert jobs.schedules_ensure() == 0  # idempotent
    assert rows.count() == 2
