"""Child processes (supervisors, test servers) reach the very database their parent uses."""

import pytest
from django.db import connections

from gpuplatform.dburl import current_database_url, parse_database_url


@pytest.mark.parametrize(
    "url",
    [
        "postgres://postgres@127.0.0.1:5432/gpuplatform",
        "postgres://u:p%40ss@db.example:6432/x",
        # pgserver's form for the embedded server: the socket directory as a query parameter
        "postgresql://postgres:@/gpuplatform?host=/work/var/pgdata",
        # libpq's list of hosts, as a standby to fail over to is given
        "postgres://u:p@10.0.0.1:5432,10.0.0.2:5433/x?target_session_attrs=read-write&connect_timeout=3",
    ],
)
def test_the_url_round_trips_through_the_settings_parser(monkeypatch, url):
    parsed = parse_database_url(url)
    wrapper = connections["default"]
    monkeypatch.setattr(wrapper, "settings_dict", {**wrapper.settings_dict, **parsed})
    again = parse_database_url(current_database_url())
    for key in ("NAME", "USER", "PASSWORD", "PORT"):
        assert str(again[key] or "") == str(parsed[key] or "")
    for name in ("target_session_attrs", "connect_timeout"):
        assert again.get("OPTIONS", {}).get(name) == parsed.get("OPTIONS", {}).get(name)
    assert (again["HOST"] or again.get("OPTIONS", {}).get("host")) == (
        parsed["HOST"] or parsed.get("OPTIONS", {}).get("host")
    )


def test_a_list_of_hosts_becomes_libpqs_host_and_port():
    parsed = parse_database_url("postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write")
    assert (parsed["HOST"], parsed["PORT"]) == ("h1,h2", "5432,5433")
    assert parsed["OPTIONS"]["target_session_attrs"] == "read-write"
    assert parse_database_url("postgres://u@h1,h2/db")["PORT"] == ""


@pytest.mark.parametrize("url", ["postgres://u@h1:x,h2/db", "postgres://u@h1,,h2/db"])
def test_a_bad_host_list_is_refused_saying_why(url):
    with pytest.raises(ValueError, match="host"):
        parse_database_url(url)
