"""DATABASE_URL in and out: parse it into Django's settings, and hand a connection's database
on to the processes this one starts.

libpq accepts several hosts in one URL (``postgres://u:p@h1:5432,h2:5432/db?
target_session_attrs=read-write``): it tries them in turn and keeps the first that takes
writes, which is how a client finds the new primary after a fail-over. dj_database_url refuses
a port on each host (it reads ``5432,h2:5432`` as one port), so the host list is taken out
before it parses and put back as libpq's comma-separated ``host`` and ``port``.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode

import dj_database_url
from django.db import connection

# scheme://[userinfo@]netloc[/...]: the netloc is what lies between them.
# libpq parameters a URL may carry that a child process must get too.
URL_PARAMETERS = ("target_session_attrs", "connect_timeout", "sslmode")
_NETLOC = re.compile(
    r"^(?P<head>[a-z][a-z0-9+.-]*://(?:[^@/?#]*@)?)(?P<netloc>[^/?#]*)(?P<tail>.*)$"
)


def parse_database_url(url: str, **kwargs) -> dict:
    """dj_database_url.parse, accepting libpq's list of hosts (``h1:5432,h2:5433``): HOST and
    PORT then hold the comma-separated hosts and ports libpq expects. Raises ValueError naming
    what is wrong."""
    match = _NETLOC.match(url)
    if not match or "," not in match["netloc"]:
        return dj_database_url.parse(url, **kwargs)
    hosts, ports = [], []
    for part in match["netloc"].split(","):
        host, _, port = part.rpartition(":") if not part.endswith("]") else (part, "", "")
        if not host:
            host, port = part, ""
        if not host:
            raise ValueError(f"an empty host in the host list {match['netloc']!r}")
        if port and not port.isdigit():
            raise ValueError(f"port {port!r} of host {host!r} is not a number")
        hosts.append(host)
        ports.append(port)
    parsed = dj_database_url.parse(match["head"] + "placeholder" + match["tail"], **kwargs)
    parsed["HOST"] = ",".join(hosts)
    # libpq: one port for every host, or one per host (an empty one means the default).
    parsed["PORT"] = ",".join(ports) if any(ports) else ""
    return parsed


def database_host(db: dict) -> str:
    """The host of a connection's settings: a name, an address, a comma-separated list of
    them, or a Unix socket directory (the embedded server's), which may sit in HOST or in
    OPTIONS["host"]."""
    return db.get("HOST") or db.get("OPTIONS", {}).get("host") or ""


def current_database_url() -> str:
    """Point a child process at exactly this connection's database (in tests: the test one),
    with every host of a multi-host connection."""
    db = connection.settings_dict
    auth = quote(db["USER"] or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    host = database_host(db)
    if host.startswith("/"):
        return f"postgres://{auth}@{quote(host, safe='')}/{db['NAME']}"
    return f"postgres://{auth}@{hosts_netloc(host, db.get('PORT'))}/{db['NAME']}{query(db)}"


def hosts_netloc(host: str, port: object) -> str:
    """``h1:p1,h2:p2`` from libpq's comma-separated ``host`` and ``port`` (one port for all
    hosts, one per host, or none)."""
    hosts = host.split(",")
    ports = str(port or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return ",".join(f"{h}:{p}" if p else h for h, p in zip(hosts, ports, strict=False))


def query(db: dict) -> str:
    """The URL's query: the libpq parameters of the connection's settings that say where and
    how to connect (which of several hosts: the primary; how long to try each one)."""
    options = db.get("OPTIONS", {})
    given = [
        (name, options[name]) for name in URL_PARAMETERS if options.get(name) not in (None, "")
    ]
    return ("?" + urlencode(given)) if given else ""
