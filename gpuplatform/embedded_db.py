"""The embedded PostgreSQL used when DATABASE_URL is unset.

pgserver ships PostgreSQL binaries in a wheel. The server is started on first use, keeps its
data under ``var/pgdata`` and keeps running after the process that started it exits
(cleanup_mode=None), so every platform process (web, scheduler, node agent, manage.py) finds and
reuses the same server through its Unix socket. Production sets DATABASE_URL instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

DATABASE_NAME = "gpuplatform"


def embedded_database_url(var_dir: Path) -> str:
    import pgserver  # imported lazily: only needed without DATABASE_URL
    import psycopg

    # pgserver narrates every start at INFO, before Django's logging is configured.
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    pgdata = var_dir / "pgdata"
    pgdata.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode=None)
    admin_url = server.get_uri("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    return server.get_uri(DATABASE_NAME)


def stop_embedded_database(var_dir: Path) -> bool:
    """Stop the embedded server if it runs; used by ``make stop-db``."""
    import pgserver

    pgdata = var_dir / "pgdata"
    if not (pgdata / "PG_VERSION").exists():
        return False
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    server.cleanup()
    return True
