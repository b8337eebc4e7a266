"""What each process's PostgreSQL connections are called, and the documented cap."""

from __future__ import annotations

import json
import subprocess
import sys

from django.conf import settings
from django.db import connection

from gpuplatform import connections


def test_each_process_names_itself():
    name = connections.application_name
    assert name(True, ["/usr/lib/python3/dist-packages/daphne/__main__.py"]) == "gpuplatform web"
    assert name(False, ["manage.py", "qcluster"], {}) == "gpuplatform qcluster"
    assert name(False, ["manage.py", "qcluster"], {"Q_CLUSTER_NAME": "ws-1"}) == (
        "gpuplatform qcluster ws-1"
    )
    assert name(False, ["/srv/gpuplatform/manage.py", "node_agent", "--node", "ws-1"], {}) == (
        "gpuplatform node_agent"
    )
    # A supervisor forked by the spawner sets Django up after the fork, with its argv.
    assert name(False, ["/srv/gpuplatform/nodeagent/launcher/spawner.py", "ws-1"], {}) == (
        "gpuplatform supervisor"
    )
    assert name(False, ["/srv/gpuplatform/nodeagent/launcher/supervisor.py", "7", "1"], {}) == (
        "gpuplatform supervisor"
    )
    assert name(False, ["/venv/lib/python3.11/site-packages/pytest/__main__.py"], {}) == (
        "gpuplatform pytest"
    )
    assert len(name(False, ["manage.py", "qcluster"], {"Q_CLUSTER_NAME": "n" * 99}).encode()) == 63


def test_this_process_connects_under_its_name(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('application_name')")
        (current,) = cursor.fetchone()
    assert current == settings.APPLICATION_NAME == "gpuplatform pytest"


def test_the_cap_for_two_web_processes_with_four_nodes():
    cap = connections.budget(web_workers=2, db_pool_size=8, q_workers=2, nodes=4)
    # web: 2 x (8 pooled + 4 channel layer + 1 listening); the scheduler 2 worker threads + 2
    # (claims and its LISTEN); each node its agent's 5 (main loop, sampler, relay, job thread
    # and its LISTEN).
    assert (cap.web, cap.scheduler, cap.nodes, cap.total) == (26, 4, 20, 50)
    assert cap.node_count == 4


def test_the_channel_layer_names_itself_and_keeps_what_database_url_says():
    from gpuplatform.dburl import current_database_url
    from tests.live import ROOT, process_env

    script = (
        "import json, django\ndjango.setup()\nfrom django.conf import settings\n"
        "print(json.dumps(settings.CHANNEL_LAYERS['default']['CONFIG']['OPTIONS']))"
    )
    url = current_database_url()
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=process_env(
            DJANGO_SETTINGS_MODULE="gpuplatform.settings",
            CHANNEL_LAYER="postgres",
            DATABASE_URL=url + ("&" if "?" in url else "?") + "sslmode=disable",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    options = json.loads(result.stdout.splitlines()[-1])
    assert options == {
        "sslmode": "disable",
        "application_name": "gpuplatform -c channels",
        # DB_PEER_TIMEOUT's client side (3 s): a vanished server is given up on as soon.
        "keepalives": 1,
        "keepalives_idle": 1,
        "keepalives_interval": 1,
        "keepalives_count": 2,
        "tcp_user_timeout": 3000,
    }


def test_every_name_a_process_gives_itself_counts_in_its_role_of_the_budget():
    name, role = connections.application_name, connections.budget_role
    assert role(name(True, [])) == role(f"{name(True, [])} channels") == "web"
    assert role(name(False, ["manage.py", "scheduler"], {})) == "scheduler"
    assert role(name(False, ["manage.py", "qcluster"], {})) == "scheduler"
    assert role(name(False, ["manage.py", "qcluster"], {"Q_CLUSTER_NAME": "ws-1"})) == "nodes"
    assert role(name(False, ["manage.py", "node_agent"], {})) == "nodes"
    assert role(name(False, ["/srv/nodeagent/launcher/spawner.py", "ws-1"], {})) == "nodes"
    assert role(name(False, ["manage.py", "migrate"], {})) is None  # a command, not counted
    assert role("psql") is None
