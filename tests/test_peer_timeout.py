"""DB_PEER_TIMEOUT: the server drops a platform process's session soon after the process goes
silent (its host dead or cut off), releasing its locks (tests/hosts/test_scheduler_failover.py
shows why)."""

import pytest
from django.db import connection


@pytest.mark.django_db
def test_the_platforms_sessions_ask_the_server_to_drop_a_silent_client_within_seconds():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('tcp_user_timeout'), current_setting('tcp_keepalives_idle'),"
            " current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count')"
        )
        user_timeout, idle, interval, count = cursor.fetchone()
    assert user_timeout == "3000"  # milliseconds
    # Over TCP these are the session's own values; over a Unix socket the server reports 0.
    assert (idle, interval, count) in {("1", "1", "2"), ("0", "0", "0")}
