"""The spec's service block: defaults, the health shorthand, the class it implies, limits, and
a stored spec that reads back to the same task."""

from __future__ import annotations

import pytest

from scheduling.spec import SpecError, parse_spec, parse_yaml


def one(text: str):
    (spec,) = parse_yaml("name: svc\ncommand: serve\n" + text)
    return spec


def test_a_service_block_is_normalised_and_reads_back_the_same():
    spec = one("service: {health: /health}\n")
    assert spec.service == {
        "port": "auto",
        "health": {"path": "/health", "interval": 10, "timeout": 2, "start_period": 300,
                   "failures": 3},
        "replicas": 1,
    }  # fmt: skip
    assert parse_spec(spec.as_dict()) == spec


def test_a_service_is_online_unless_its_class_is_written():
    assert (one("service: {}\n").task_class, one("service: {}\n").preemptible) == ("online", False)
    batch = one("class: batch\nservice: {port: 8100}\n")
    assert (batch.task_class, batch.preemptible, batch.service["port"]) == ("batch", True, 8100)


def test_a_task_without_a_service_block_stores_none():
    spec = one("")
    assert spec.service is None and "service" not in spec.as_dict()


def test_durations_and_failures_of_the_health_check():
    health = one(
        "service:\n  health: {path: /ready, interval: 30s, timeout: 5s, start_period: 20m,"
        " failures: 5}\n"
    ).service["health"]
    assert health == {"path": "/ready", "interval": 30, "timeout": 5, "start_period": 1200,
                      "failures": 5}  # fmt: skip


@pytest.mark.parametrize(
    "text, path",
    [
        ("service: {port: 1023}", "service.port"),
        ("service: {port: 65536}", "service.port"),
        ("service: {port: true}", "service.port"),
        ("service: {health: /a b}", "service.health.path"),
        ("service: {health: {path: /h, timeout: 1m}}", "service.health.timeout"),
        ("service: {health: {path: /h, start_period: 2d}}", "service.health.start_period"),
        ("service: {health: {path: /h, failures: 101}}", "service.health.failures"),
        ("service: {replicas: '2'}", "service.replicas"),
        ("service: [1]", "service"),
    ],
)
def test_bad_values_name_their_path(text, path):
    with pytest.raises(SpecError) as refused:
        one(text + "\n")
    assert list(refused.value.errors) == [path]
