"""The web processes' pooled database connections, checked as the pool lends them without a
round trip where the socket says enough. No Django here: the settings name the class."""

from __future__ import annotations

import select

import psycopg
from psycopg.pq import ConnStatus, TransactionStatus


def quiet(pgconn) -> bool:
    """An idle session in good order whose socket has nothing to read (one ``poll``, no wait).

    An idle session is sent nothing unasked but a notification, or its end: a server that ends
    it (a restart, a terminated backend) sends why, then closes the socket. So a quiet socket
    is a live session; anything else (something came) needs a look by the server, which
    replaces a session that is gone. A server that goes away after this and before the first
    statement fails that statement, as it could after a round trip's check."""
    if pgconn.status != ConnStatus.OK or pgconn.transaction_status != TransactionStatus.IDLE:
        return False
    waiting = select.poll()
    waiting.register(pgconn.socket, select.POLLIN)
    return not waiting.poll(0)


class PooledConnection(psycopg.Connection):
    """The pool's ``connection_class`` (settings). The pool checks each connection it lends
    (Django passes ``ConnectionPool.check_connection`` with ``CONN_HEALTH_CHECKS``) by sending
    an empty query: a round trip for every request. A quiet session (``quiet``) answers that
    check here; any other goes to the server, and one that is gone fails it, so the pool drops
    it and lends another."""

    def execute(self, query, params=None, **kwargs):
        if query == "" and params is None and not kwargs and quiet(self.pgconn):
            return self.cursor()
        return super().execute(query, params, **kwargs)
