"""A checkout where other users cannot pass (root's home is 0700 on Debian, and so is a
``mktemp -d`` directory) still runs tasks as their tenants' users: the README's sweep example,
which runs the shipped examples, passes there. As root only: elsewhere tasks run as the
platform's own user, who can read its own checkout."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
SWEEP_TEST = "tests/test_examples.py::test_the_sweep_example_runs_as_written_through_the_api"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: tasks run as tenant users there"),
]


def copy_checkout(into: Path) -> Path:
    """This checkout's files as a clone of it would hold them (tracked and not ignored, as
    they are now), with the virtualenv it was set up with."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    clone = into / "gpuplatform"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    (clone / ".venv").symlink_to(Path(sys.prefix))
    return clone


def test_the_readme_sweep_runs_from_a_checkout_under_a_0700_directory():
    home = Path(tempfile.mkdtemp(prefix="gpuplatform-0700-"))
    try:
        assert home.stat().st_mode & 0o777 == 0o700
        clone = copy_checkout(home)
        environ = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("GPUPLATFORM_", "DATABASE_URL", "PYTEST_"))
        }
        environ["GPUPLATFORM_TESTING"] = "1"
        result = subprocess.run(
            [sys.executable, "scripts/database_url.py", "--checkout", "gpuplatform", "--",
             sys.executable, "-m", "pytest", "-q", SWEEP_TEST],
            cwd=clone, env=environ, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        assert "1 passed" in result.stdout
    finally:
        shutil.rmtree(home, ignore_errors=True)
        # The copy's own system directory (settings.SYSTEM_DIR of a checkout at that path).
        digest = hashlib.sha256(str(home / "gpuplatform").encode()).hexdigest()[:8]
        system = Path(settings.SYSTEM_DIR).parent / f"gpuplatform-{digest}"
        shutil.rmtree(system, ignore_errors=True)
