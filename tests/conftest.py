"""Shared fixtures: factories and the three actors (owner, teammate, outsider)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User

from tenants import services as tenant_services
from tenants.models import Role, Tenant
from tests.factories import (
    MembershipFactory,
    NodeFactory,
    TenantFactory,
    UserFactory,
    make_gpus,
)

# Browser fixtures (headless Chromium against daphne), for any test module: see tests/browser.py.
pytest_plugins = ["tests.browser"]


@dataclass
class Actor:
    user: User
    tenant: Tenant
    token: str


def _actor(tenant: Tenant, role: str, username: str) -> Actor:
    user = UserFactory(username=username)
    MembershipFactory(user=user, tenant=tenant, role=role)
    _, secret = tenant_services.apitoken_create(user=user, tenant=tenant, name="test")
    return Actor(user=user, tenant=tenant, token=secret)


@pytest.fixture(autouse=True)
def _forget_throttled_clients():
    """Each process remembers clients over their rate (gpuplatform.throttle.PACER); tests
    start with none, whatever the test before did."""
    from gpuplatform.throttle import PACER

    PACER.clear()
    yield
    PACER.clear()


@pytest.fixture(autouse=True)
def _no_runtime_history_of_earlier_tests():
    """The runtime history behind expected starts is read at most every few minutes
    (``scheduling.forecasts.history``): what an earlier test's tasks left must not be
    this one's."""
    from scheduling import forecasts

    forecasts.forget_history()


@pytest.fixture(autouse=True)
def _english_after_each_test():
    """LocaleMiddleware activates a request's language in the thread and leaves it there: a
    test that asked for Chinese must not make the next one's messages Chinese."""
    from django.utils import translation

    yield
    translation.deactivate()


@pytest.fixture
def lab(db) -> Tenant:
    return TenantFactory(name="vision-lab")


@pytest.fixture
def owner(lab) -> Actor:
    """Alice: admin of the vision lab."""
    return _actor(lab, Role.ADMIN, "alice")


@pytest.fixture
def teammate(lab) -> Actor:
    """Bob: a member of the same lab."""
    return _actor(lab, Role.MEMBER, "bob")


@pytest.fixture
def outsider(db) -> Actor:
    """Charlie: member of another tenant; must never see the lab's objects."""
    return _actor(TenantFactory(name="nlp-lab"), Role.MEMBER, "charlie")


@pytest.fixture
def workstation(db):
    """One node with 4 x RTX 4090 24 GB, as the default configuration simulates."""
    node = NodeFactory(name="workstation-1")
    make_gpus(node, count=4)
    return node


# The Unix users this run makes for tenants (as root) are named under a prefix of its own, so
# that it removes exactly those when it ends, whatever other runs on the machine are doing.
TEST_USER_PREFIX = f"gput{os.getpid()}-"


def pytest_configure(config):
    """Tests fork supervisors from this process, as a node's spawner does from its own: take
    setproctitle's hold on the environment now, before a test's monkeypatch changes it, or
    those supervisors cannot name themselves (procs.keep_titles_settable). The processes tests
    start read the tenant users' prefix from the environment, this one from its settings."""
    from django.conf import settings

    from nodeagent.launcher import procs

    os.environ["TENANT_USER_PREFIX"] = TEST_USER_PREFIX
    settings.TENANT_USER_PREFIX = TEST_USER_PREFIX
    procs.keep_titles_settable()
    _flush_by_deleting()


# Every TRUNCATE_EVERY-th flush truncates, as Django's does: the dead rows the others leave
# (this machine's PostgreSQL runs without autovacuum) never pile up for long.
TRUNCATE_EVERY = 20


def _flush_by_deleting() -> None:
    """A test with ``transaction=True`` ends with Django's flush: one TRUNCATE of every table
    (each table and index gets new files), most of such a test's time (docs/development.md),
    and the suite has a few hundred. Where the test database's role may skip triggers (a
    superuser: the local and the embedded server's), it deletes their rows instead, foreign
    keys and triggers off for that transaction (``session_replication_role``): the same empty
    tables; sequences are not reset, as Django's flush does not reset them either."""
    import itertools

    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush
    flushes = itertools.count(1)

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        self.connection.ensure_connection()
        superuser = self.connection.connection.info.parameter_status("is_superuser") == "on"
        if (
            reset_sequences
            or allow_cascade
            or not superuser
            or not tables
            or next(flushes) % TRUNCATE_EVERY == 0
        ):
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        deletes = [f"DELETE FROM {self.quote_name(table)}" for table in tables]  # noqa: S608
        return ["SET LOCAL session_replication_role = replica", *deletes]

    DatabaseOperations.sql_flush = sql_flush


@pytest.fixture(scope="session", autouse=True)
def _remove_this_runs_tenant_users():
    """Root cleans up after itself: the Unix users (and their groups) made under this run's
    prefix go when the run ends. (Its cgroups go with the tests that made them.)"""
    yield
    if os.geteuid() != 0:
        return
    from nodeagent.launcher import tenant_users

    problems = tenant_users.remove_all(TEST_USER_PREFIX)
    if problems:
        import warnings

        warnings.warn("tenant users left behind: " + "; ".join(problems), stacklevel=1)


@pytest.fixture(scope="session", autouse=True)
def _compiled_translations(django_db_blocker):
    """The Chinese pages need locale/*.mo, which `make setup` and `make test` compile; a bare
    pytest run compiles them too when a catalogue changed since. Where GNU gettext is missing
    (`pytest -m gpu` on a GPU host set up by hand, scripts/gpu_check.sh) the run goes on with a
    warning: only the tests of Chinese pages can then fail, and they say so themselves."""
    import shutil
    import warnings
    from pathlib import Path

    from django.conf import settings
    from django.core.management import call_command

    for po in Path(settings.BASE_DIR, "locale").glob("*/LC_MESSAGES/django.po"):
        mo = po.with_suffix(".mo")
        if not mo.exists() or mo.stat().st_mtime < po.stat().st_mtime:
            if shutil.which("msgfmt") is None:
                warnings.warn(f"{mo} is missing or stale and GNU gettext (msgfmt) is not "
                              "installed: pages in Chinese show English", stacklevel=1)  # fmt: skip
                break
            call_command("compilemessages", ignore_patterns=[".venv", "var"], verbosity=0)
            break
