"""The systemd units and environment files under deploy/ (docs/multi-host.md): each runs what
`make run` runs for its role, keeps the default KillMode (supervisors leave the agent's unit
themselves: nodeagent.launcher.unitcgroup), the agent as root and the rest not, and carries
exactly the documented settings; `systemd-analyze verify` accepts them where it is installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest

from scripts.run import STOP_GRACE, commands
from tests.live import ROOT, process_env

UNITS = ROOT / "deploy" / "systemd"
ENVS = ROOT / "deploy" / "env"
INSTALL = "/opt/gpuplatform"
PYTHON = f"{INSTALL}/.venv/bin/python"
ROLES = {
    "web": "gpuplatform-web",
    "scheduler": "gpuplatform-scheduler",
    "agent": "gpuplatform-agent",
}
# The whole set a GPU host's agent is configured with (issue 42; docs/multi-host.md).
AGENT_SETTINGS = {
    "DATABASE_URL_FILE", "SECRET_KEY_FILE", "GPUPLATFORM_CONFIG", "GPUPLATFORM_VAR_DIR",
    "NODE_NAME", "NODE_ADVERTISE_ADDRESS",
}  # fmt: skip


def parse_unit(path) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values, in order]}} (keys repeat: ExecStart=, ...)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service(name: str) -> dict[str, list[str]]:
    return parse_unit(UNITS / f"{name}.service")["Service"]


def env_file(name: str) -> dict[str, str]:
    pairs = {}
    for line in (ENVS / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def environment(unit: dict[str, list[str]]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in unit.get("Environment", []))


@pytest.mark.parametrize("role", ROLES)
def test_each_unit_runs_what_make_run_runs_for_its_role(role):
    unit = service(ROLES[role])
    (exec_start,) = unit["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == PYTHON
    assert unit["WorkingDirectory"] == [INSTALL]
    expected = commands(PYTHON, "${HOST}", "${PORT}")[role]
    if role == "web":  # make run's -w comes from WEB_WORKERS too
        expected = [*expected[:-1], "${WEB_WORKERS}"]
    assert argv == expected


@pytest.mark.parametrize("role", ROLES)
def test_each_unit_keeps_the_default_kill_mode_and_restarts(role):
    unit = service(ROLES[role])
    assert unit["KillMode"] == ["control-group"], "supervisors leave the agent's unit themselves"
    assert unit["Restart"] == ["on-failure"]
    assert float(unit["TimeoutStopSec"][0]) >= STOP_GRACE, "as long as make run's grace"


def test_only_the_agent_runs_as_root():
    assert service("gpuplatform-agent")["User"] == ["root"]
    for name in ("gpuplatform-web", "gpuplatform-scheduler", "gpuplatform-setup"):
        assert service(name)["User"] == ["gpuplatform"]


def test_secrets_come_from_systemd_credentials():
    for name in (*ROLES.values(), "gpuplatform-setup"):
        unit = service(name)
        assert sorted(unit["LoadCredential"]) == [
            "database_url:/etc/gpuplatform/database_url",
            "secret_key:/etc/gpuplatform/secret_key",
        ]
        assert environment(unit) == {
            "DATABASE_URL_FILE": "%d/database_url",
            "SECRET_KEY_FILE": "%d/secret_key",
        }


def test_the_setup_unit_prepares_the_database_as_make_setup_does():
    unit = service("gpuplatform-setup")
    assert unit["Type"] == ["oneshot"]
    steps = [shlex.split(line)[2:4] for line in unit["ExecStart"]]
    assert steps == [["migrate", "--noinput"], ["createcachetable"], ["collectstatic", "--noinput"]]
    for name in ("gpuplatform-web", "gpuplatform-scheduler"):
        unit = parse_unit(UNITS / f"{name}.service")["Unit"]
        assert "gpuplatform-setup.service" in unit["After"][0]
        # Requires, not Wants: a failed migration holds them back instead of starting them on a
        # half-migrated database.
        assert unit["Requires"] == ["gpuplatform-setup.service"]


def test_the_agent_is_configured_with_exactly_the_documented_set():
    unit = service("gpuplatform-agent")
    assert unit["EnvironmentFile"] == ["/etc/gpuplatform/agent.env"]
    assert set(env_file("agent.env")) | set(environment(unit)) == AGENT_SETTINGS


def test_every_setting_in_the_env_files_is_documented():
    documented = (ROOT / "docs" / "configuration.md").read_text()
    for name in ("agent.env", "control.env"):
        for key in env_file(name):
            assert re.search(rf"`{key}`", documented), f"{name}: {key} is not in configuration.md"


def test_the_control_hosts_settings_pass_check_deploy():
    env = {k: v for k, v in process_env().items() if k not in ("GPUPLATFORM_TESTING", "DEBUG")}
    env.update(env_file("control.env"), SECRET_KEY="a-long-random-production-secret-" + "q" * 40)
    env.pop("GPUPLATFORM_CONFIG")  # /etc/gpuplatform/scheduler.yaml is not on this machine
    env.pop("GPUPLATFORM_VAR_DIR")
    result = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verifies_the_units(tmp_path):
    """With the install's paths pointed at this checkout (verify wants ExecStart to exist)."""
    for path in UNITS.glob("*.service"):
        text = path.read_text().replace(INSTALL, str(ROOT))
        (tmp_path / path.name).write_text(text.replace("/etc/gpuplatform/", f"{tmp_path}/"))
    for name in ("agent.env", "control.env"):
        (tmp_path / name).write_text((ENVS / name).read_text())
    units = sorted(p.name for p in tmp_path.glob("*.service"))
    assert len(units) == 4
    result = subprocess.run(  # noqa: S603 - a fixed tool
        ["systemd-analyze", "verify", "--man=no", *units],  # noqa: S607
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Unknown" not in result.stderr, result.stderr
