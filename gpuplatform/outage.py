"""The database is unreachable: how every interface recognises it and what it answers."""

from __future__ import annotations

import psycopg
from django.db import InterfaceError, OperationalError

# Seconds a client is asked to wait before retrying while the database is unreachable.
DATABASE_RETRY_AFTER_S = 5
DATABASE_UNAVAILABLE = "the database is unreachable; retry later"


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether an exception means the database cannot be reached (connection refused or lost,
    pool exhausted): a temporary condition answered 503, not a bug answered 500."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        # psycopg's own classes too: a pool timeout raised outside Django's error wrapper.
        if isinstance(
            exc,
            (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError),
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
