"""The database is unreachable: how every interface recognises it and what it answers."""

from __future__ import annotations

import logging
import time

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


class OutageLog:
    """An outage logged once, for a loop that retries through it: ``failed`` logs the first
    failure in a row at ``level`` and each one after it at debug; ``reached`` says, once, at
    info, that it is over and how long it lasted. A process that retries every few seconds
    otherwise writes a warning each time for as long as the database is away (a revoked node
    credential: two a second)."""

    def __init__(self, logger: logging.Logger, level: int = logging.WARNING) -> None:
        self.logger = logger
        self.level = level
        self.since: float | None = None  # when the current outage began (monotonic)

    def failed(self, message: str, *args: object) -> None:
        if self.since is None:
            self.since = time.monotonic()
            self.logger.log(self.level, message, *args)
        else:
            self.logger.debug(message, *args)

    def reached(self, message: str, *args: object) -> None:
        """The outage, if there was one, is over: ``message`` with its length in seconds
        appended as the last argument."""
        if self.since is not None:
            self.logger.info(message, *args, time.monotonic() - self.since)
            self.since = None
