"""A tenant's private root: made 0700 and the tenant's own, refused when it is not a directory,
and refused with the directory to fix when tenant users could not reach it; a tenant's user,
created once on a host however many launches ask for it at once."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from nodeagent.launcher import identity


@pytest.fixture
def tasks_root(tmp_path):
    for directory in (tmp_path, *list(tmp_path.parents)[:2]):
        directory.chmod(0o711)  # as the launcher's fixture does: crossable by tenant users
    return tmp_path / "tasks"


def test_a_missing_root_is_made_private_to_the_tenant(tasks_root):
    root = tasks_root / "lab"
    identity._private_root(root, os.getuid(), os.getgid())
    info = os.lstat(root)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    assert (info.st_uid, info.st_gid) == (os.getuid(), os.getgid())


def test_an_existing_root_gets_its_mode_back_and_keeps_what_is_inside(tasks_root):
    root = tasks_root / "lab"
    root.mkdir(parents=True, mode=0o755)
    root.chmod(0o755)
    (root / "data").write_text("kept")
    identity._private_root(root, os.getuid(), os.getgid())
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700
    assert (root / "data").read_text() == "kept"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_a_root_owned_by_someone_else_is_given_to_the_tenant(tasks_root):
    root = tasks_root / "lab"
    root.mkdir(parents=True)
    identity._private_root(root, 4321, 4322)
    assert (os.lstat(root).st_uid, os.lstat(root).st_gid) == (4321, 4322)


def test_a_root_that_is_a_symbolic_link_is_refused(tasks_root, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    tasks_root.mkdir()
    (tasks_root / "lab").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(identity.IdentityError, match="symbolic link"):
        identity._private_root(tasks_root / "lab", os.getuid(), os.getgid())
    assert (tasks_root / "lab").is_symlink(), "left as it was"


def test_a_root_that_is_a_file_is_refused_and_left_alone(tasks_root):
    tasks_root.mkdir()
    (tasks_root / "lab").write_text("not a directory")
    (tasks_root / "lab").chmod(0o644)
    with pytest.raises(FileExistsError):
        identity._private_root(tasks_root / "lab", os.getuid(), os.getgid())
    assert stat.S_IMODE(os.lstat(tasks_root / "lab").st_mode) == 0o644


def test_a_directory_closed_to_other_users_above_the_roots_is_named(tmp_path):
    for directory in (tmp_path, *list(tmp_path.parents)[:2]):
        directory.chmod(0o711)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    tasks_root = closed / "open" / "tasks"
    tasks_root.mkdir(parents=True, mode=0o755)
    with pytest.raises(identity.IdentityError, match=f"^{closed} is closed to other users"):
        identity._private_root(tasks_root / "lab", os.getuid(), os.getgid())


@pytest.mark.skipif(os.geteuid() != 0, reason="creating Unix users needs root")
def test_concurrent_launches_of_a_new_tenant_all_get_the_one_user_it_ends_up_with(
    tmp_path, settings
):
    # useradd does not serialise itself: unlocked, 16 of these split between two uids.
    settings.VAR_DIR = tmp_path / "var"
    name = f"gpt-race-{os.getpid()}"
    try:
        with ThreadPoolExecutor(16) as pool:
            calls = [
                pool.submit(identity._user, name, create=True, home=tmp_path / "home",
                            tenant_name="race")
                for _ in range(16)
            ]  # fmt: skip
            uids = {call.result().pw_uid for call in calls}
        assert uids == {pwd.getpwnam(name).pw_uid}
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)  # noqa: S607
