"""The database `make` gives the platform, and, for `make test`, a run's own databases.

python scripts/database_url.py NAME
    Print the URL to use: DATABASE_URL if set, else database NAME on a local PostgreSQL
    server on 127.0.0.1:5432 (user postgres, trust auth) if one answers (created if
    missing), else nothing, in which case the settings start the embedded PostgreSQL under
    var/.

python scripts/database_url.py --checkout NAME -- COMMAND ...
    Run COMMAND with DATABASE_URL set as above, but with NAME made this checkout's own
    (NAME_<folder>_<hash of the checkout's absolute path>), so two checkouts testing at once
    on one host never share a database; when the command ends, however it ends, drop that
    database and the test_ one pytest-django made from it. With DATABASE_URL set the command
    runs against it unchanged and nothing is dropped (pytest-django still drops its test_
    database itself); without a local server the embedded one under this checkout's var/
    is used, which is this checkout's own already. Exits with the command's status.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

LOCAL = "postgres://postgres@127.0.0.1:5432/{name}"
CHECKOUT = Path(__file__).resolve().parent.parent
# PostgreSQL cuts identifiers at 63 bytes; pytest-django adds "test_".
MAX_NAME = 63 - len("test_")


def checkout_database_name(name: str, checkout: Path) -> str:
    """``name`` made unique to one checkout and stable for it: the folder's name for people
    reading a list of databases, a hash of the absolute path for uniqueness."""
    path = str(checkout.resolve())
    digest = hashlib.sha256(path.encode()).hexdigest()[:10]
    folder = re.sub(r"[^a-z0-9]+", "_", checkout.resolve().name.lower()).strip("_")
    room = MAX_NAME - len(name) - len(digest) - 2
    folder = folder[: max(room, 0)].strip("_")
    return "_".join(part for part in (name, folder, digest) if part)


def database_create(*, server: str, name: str) -> bool:
    """Create ``name`` on ``server`` (a URL to its maintenance database) unless it exists.
    True if this call created it."""
    import psycopg

    with psycopg.connect(server, connect_timeout=2, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        conn.execute(f'CREATE DATABASE "{name}"')
        return True


def database_drop(*, server: str, name: str) -> None:
    """Drop ``name`` if it exists, closing whatever still holds a connection to it (a task's
    supervisor left behind by an interrupted run)."""
    import psycopg

    with psycopg.connect(server, connect_timeout=5, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def local_url(name: str) -> str | None:
    """DATABASE_URL if set; else ``name`` on the local server, created if missing; else None
    (no usable local server)."""
    if os.environ.get("DATABASE_URL"):
        return os.environ["DATABASE_URL"]
    try:
        # Django's checks look at the database itself (pytest makes its own test_ one).
        database_create(server=LOCAL.format(name="postgres"), name=name)
    except Exception:  # noqa: BLE001 - any failure means "no usable local server"
        return None
    return LOCAL.format(name=name)


def run_with_database(
    command: list[str], *, name: str, server: str | None, checkout: Path = CHECKOUT
) -> int:
    """Run ``command`` against this checkout's database ``name`` on ``server`` (the URL of a
    maintenance database there; None: the embedded server), then drop what the run made."""
    env = dict(os.environ)
    if env.get("DATABASE_URL"):
        print(f"tests use {env['DATABASE_URL']}", flush=True)
        return subprocess.run(command, env=env, check=False).returncode  # noqa: S603
    env.pop("DATABASE_URL", None)
    if server is None:
        print("tests use the embedded PostgreSQL under var/", flush=True)
        return subprocess.run(command, env=env, check=False).returncode  # noqa: S603
    own = checkout_database_name(name, checkout)
    database_create(server=server, name=own)
    env["DATABASE_URL"] = with_database(server, own)
    print(f"tests use {env['DATABASE_URL']} (dropped at the end)", flush=True)
    try:
        return subprocess.run(command, env=env, check=False).returncode  # noqa: S603
    finally:
        for database in (f"test_{own}", own):
            database_drop(server=server, name=database)


def local_server() -> str | None:
    """The local server's maintenance database, if one answers."""
    server = LOCAL.format(name="postgres")
    try:
        import psycopg

        with psycopg.connect(server, connect_timeout=2):
            pass
    except Exception:  # noqa: BLE001 - any failure means "no usable local server"
        return None
    return server


def main(argv: list[str]) -> int:
    if argv[:1] == ["--checkout"]:
        if len(argv) < 4 or argv[2] != "--":
            print("usage: database_url.py --checkout NAME -- COMMAND ...", file=sys.stderr)
            return 2
        # SIGTERM (a CI runner giving up) unwinds like Ctrl-C, so the databases are dropped.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        server = None if os.environ.get("DATABASE_URL") else local_server()
        return run_with_database(argv[3:], name=argv[1], server=server)
    url = local_url(argv[0] if argv else "gpuplatform")
    if url:
        print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
