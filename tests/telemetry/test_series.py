"""The history selector's shape: per GPU, one list per column, aligned and in time order, a
GPU read in several windows (a task's attempts) giving one series."""

from __future__ import annotations

import statistics
from datetime import timedelta

import pytest
from django.utils import timezone

from telemetry import selectors
from telemetry.models import GpuSample


@pytest.fixture
def sampled(workstation):
    """A minute of samples of GPUs 0 and 1 ending a minute ago; GPU 2 has none."""
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=2)
    gpus = list(workstation.gpus.order_by("index"))
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpu, at=start + timedelta(seconds=s), util_gpu=(s * 7 + gpu.index) % 101,
                  memory_used_mb=1000 + s, temperature_c=40 + s % 30, power_w=100.0 + s)
        for gpu in gpus[:2]
        for s in range(60)
    )  # fmt: skip
    return start, gpus


def test_each_gpu_is_columns_aligned_in_time_order_one_series_across_windows(sampled):
    start, (zero, one, two, *_) = sampled
    at = lambda s: start + timedelta(seconds=s)  # noqa: E731
    windows = [
        # Given out of order: the later attempt first.
        selectors.Window(zero.pk, at(40), at(50)),
        selectors.Window(zero.pk, at(0), at(10)),
        selectors.Window(one.pk, at(0), at(60)),
        selectors.Window(two.pk, at(0), at(60)),
    ]

    data = selectors.series(windows=windows, start=at(0), end=at(60), step_s=1)

    assert data["source"] == "raw" and data["columns"] == selectors.COLUMNS
    assert [s["index"] for s in data["series"]] == [0, 1]  # GPU 2 sampled nothing
    first = dict(zip(data["columns"], data["series"][0]["values"], strict=True))
    seconds = [*range(10), *range(40, 50)]
    assert first["time"] == [int(at(s).timestamp()) for s in seconds]
    assert first["util_gpu"] == [float(s * 7 % 101) for s in seconds]
    assert first["memory_used_mb"] == [1000.0 + s for s in seconds]
    assert first["util_gpu_max"] == first["util_gpu"] and first["samples"] == [1] * 20
    assert {len(column) for column in data["series"][1]["values"]} == {60}


def test_a_coarser_step_gives_each_buckets_mean_peak_and_count(sampled):
    start, (zero, *_) = sampled
    windows = [selectors.Window(zero.pk, start, start + timedelta(seconds=60))]

    data = selectors.series(windows=windows, start=start, end=start + timedelta(minutes=1),
                            step_s=20)  # fmt: skip

    [series] = data["series"]
    values = dict(zip(data["columns"], series["values"], strict=True))
    assert values["time"] == [int(start.timestamp()) + 20 * b for b in range(3)]
    for bucket in range(3):
        utils = [(s * 7) % 101 for s in range(20 * bucket, 20 * bucket + 20)]
        assert values["util_gpu"][bucket] == pytest.approx(statistics.fmean(utils))
        assert values["util_gpu_max"][bucket] == max(utils)
        assert values["samples"][bucket] == 20
