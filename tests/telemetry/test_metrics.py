"""/metrics: dcgm-exporter's names and labels plus the holding tenant and task, the platform's
own metrics, and who may scrape it."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.sampler import Sampler


def scrape(client, **headers) -> dict:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    return {family.name: family for family in text_string_to_metric_families(response.text)}


@pytest.fixture
def sampled(backend, running):
    Sampler(node_name="workstation-1", backend=backend).tick()
    return running


def test_gpu_gauges_carry_dcgm_labels_and_the_holding_tenant(client, sampled, lab):
    families = scrape(client)

    util = {s.labels["gpu"]: s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert set(util) == {"0", "1", "2", "3"}
    busy = util["0"]
    assert busy.labels["tenant"] == lab.name and busy.labels["task"] == str(sampled.pk)
    assert busy.labels["Hostname"] == "workstation-1"
    assert busy.labels["modelName"] == "NVIDIA GeForce RTX 4090"
    assert busy.labels["UUID"].startswith("GPU-") and busy.labels["simulated"] == "true"
    assert busy.value >= 85 and util["1"].value == 0 and util["1"].labels["tenant"] == ""
    used = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_FB_USED"].samples}
    free = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_FB_FREE"].samples}
    assert (used["0"], free["0"]) == (20480, 24576 - 20480)
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"):
        assert len(families[name].samples) == 4


def test_platform_metrics_count_tasks_by_state_and_tenant(client, sampled, lab):
    client.get("/api/v1/")
    families = scrape(client)

    tasks = {
        (s.labels["state"], s.labels["tenant"]): s.value
        for s in families["gpuplatform_tasks"].samples
    }
    assert tasks == {("running", lab.name): 1}
    assert families["gpuplatform_placements"].samples[0].value == 1
    assert "gpuplatform_queue_wait_seconds" in families
    assert "gpuplatform_launch_latency_seconds" in families
    assert "gpuplatform_scheduler_passes" in families
    requests = families["gpuplatform_api_requests"].samples
    assert any(s.name == "gpuplatform_api_requests_total" and s.value >= 1 for s in requests)


def test_a_scraper_from_elsewhere_is_refused_without_the_token(client, db, settings):
    settings.METRICS_TOKEN = "s3cret"
    elsewhere = {"REMOTE_ADDR": "192.0.2.7"}

    assert client.get("/metrics", **elsewhere).status_code == 401
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope", **elsewhere)
    assert wrong.status_code == 401
    scrape(client, HTTP_AUTHORIZATION="Bearer s3cret", **elsewhere)


def test_allowed_networks_are_served_without_a_token(client, db, settings):
    settings.METRICS_ALLOWED_ADDRESSES = ["10.0.0.0/8"]

    assert client.get("/metrics").status_code == 403  # loopback no longer listed
    scrape(client, REMOTE_ADDR="10.1.2.3")
