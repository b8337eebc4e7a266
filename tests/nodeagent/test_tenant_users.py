"""Root cleans up after itself: test runs name their tenant users under a prefix of their own
(and remove them at the end, tests/conftest.py), and ``manage.py tenant_users`` removes the
users of tenants that no longer exist, never a user the platform did not make."""

from __future__ import annotations

import os
import pwd
import subprocess
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from nodeagent.launcher import identity, tenant_users
from tests.conftest import TEST_USER_PREFIX
from tests.factories import TenantFactory

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating Unix users needs root")


def exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def userdel(*names: str) -> None:
    for name in names:
        subprocess.run(["/usr/sbin/userdel", name], capture_output=True, check=False)  # noqa: S603


def test_this_run_makes_its_tenant_users_under_a_prefix_of_its_own():
    # Never gpu-vision-lab: a run left that user behind, and the next platform reused it.
    assert TEST_USER_PREFIX == f"gput{os.getpid()}-"
    assert settings.TENANT_USER_PREFIX == os.environ["TENANT_USER_PREFIX"] == TEST_USER_PREFIX
    assert identity.tenant_user_name("vision-lab") == f"gput{os.getpid()}-vision-lab"


@needs_root
@pytest.mark.django_db
def test_the_command_removes_an_orphan_it_made_and_nothing_else(tmp_path, settings):
    settings.VAR_DIR = tmp_path / "var"
    TenantFactory(name="live-lab")
    made = {
        tenant: identity._user(
            identity.tenant_user_name(tenant), create=True, home=tmp_path / tenant,
            tenant_name=tenant,
        ).pw_name
        for tenant in ("gone-lab", "live-lab")
    }  # fmt: skip
    # The host's own user, under the same prefix but not marked as the platform's.
    plain = f"{TEST_USER_PREFIX}plain"
    subprocess.run(["/usr/sbin/useradd", "--system", "--comment", "not ours", plain], check=True)  # noqa: S603
    try:
        out = StringIO()
        call_command("tenant_users", "--remove-orphans", stdout=out)
        assert f"{made['gone-lab']}\t" in out.getvalue() and "dry run" in out.getvalue()
        assert plain not in out.getvalue()
        assert exists(made["gone-lab"]), "a dry run removed a user"

        call_command("tenant_users", "--remove-orphans", "--yes", stdout=out)
        assert not exists(made["gone-lab"])
        assert exists(made["live-lab"]) and exists(plain)
        assert f"removed {made['gone-lab']}" in out.getvalue()
    finally:
        userdel(plain, *made.values())


@needs_root
def test_a_run_removes_the_users_it_made_and_only_those(tmp_path, settings):
    settings.VAR_DIR = tmp_path / "var"
    ours = identity._user(
        identity.tenant_user_name("vision-lab"), create=True, home=tmp_path / "v",
        tenant_name="vision-lab",
    ).pw_name  # fmt: skip
    other_run = identity._user(
        identity.tenant_user_name("vision-lab", "gput0-"), create=True, home=tmp_path / "w",
        tenant_name="vision-lab",
    ).pw_name  # fmt: skip
    try:
        assert tenant_users.remove_all(TEST_USER_PREFIX) == []
        assert not exists(ours) and exists(other_run)
    finally:
        userdel(ours, other_run)


def test_yes_alone_is_refused(db):
    with pytest.raises(CommandError, match="--yes: only with --remove-orphans"):
        call_command("tenant_users", "--yes")
