"""The URL of the database a connection is using, for processes this one starts."""

from __future__ import annotations

from urllib.parse import quote

from django.db import connection


def database_host(db: dict) -> str:
    """The host of a connection's settings: a name, an address, or a Unix socket directory (the
    embedded server's), which may sit in HOST or in OPTIONS["host"]."""
    return db.get("HOST") or db.get("OPTIONS", {}).get("host") or ""


def current_database_url() -> str:
    """Point a child process at exactly this connection's database (in tests: the test one)."""
    db = connection.settings_dict
    auth = quote(db["USER"] or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    host = database_host(db)
    if host.startswith("/"):
        return f"postgres://{auth}@{quote(host, safe='')}/{db['NAME']}"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{db['NAME']}"
