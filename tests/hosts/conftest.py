"""Fixtures of the many-host harness (tests/hosts/harness.py; docs/multi-host-testing.md).

One estate (network, PostgreSQL, migrated tables) per test session, built on first use; each
test starts the processes it needs, and every host's processes are killed after it, whatever
happened. Skipped, saying why, where namespaces cannot be made (not root, no `ip netns`) or no
PostgreSQL server binaries are installed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hosts import netns, postgres
from tests.hosts.harness import Estate


@pytest.fixture(scope="session")
def estate_once() -> Iterator[Estate]:
    reason = netns.unavailable() or postgres.unavailable()
    if reason:
        pytest.skip(reason)
    estate = Estate()
    try:
        estate.build()
        yield estate
    finally:
        estate.remove()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.hosts_failed = True
    return report


@pytest.fixture
def estate(estate_once: Estate, request: pytest.FixtureRequest) -> Iterator[Estate]:
    """The session's estate, with no process running on any host after the test (whose
    processes' output is printed when it failed)."""
    try:
        yield estate_once
    finally:
        if getattr(request.node, "hosts_failed", False):
            print(f"\nthe hosts' output:\n{estate_once.logs()}")
        estate_once.stop_hosts()
        estate_once.fresh_database()
