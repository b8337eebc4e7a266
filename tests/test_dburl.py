"""Child processes (supervisors, test servers) reach the very database their parent uses."""

import dj_database_url
import pytest
from django.db import connections

from gpuplatform.dburl import current_database_url


@pytest.mark.parametrize(
    "url",
    [
        "postgres://postgres@127.0.0.1:5432/gpuplatform",
        "postgres://u:p%40ss@db.example:6432/x",
        # pgserver's form for the embedded server: the socket directory as a query parameter
        "postgresql://postgres:@/gpuplatform?host=/work/var/pgdata",
    ],
)
def test_the_url_round_trips_through_the_settings_parser(monkeypatch, url):
    parsed = dj_database_url.parse(url)
    wrapper = connections["default"]
    monkeypatch.setattr(wrapper, "settings_dict", {**wrapper.settings_dict, **parsed})
    again = dj_database_url.parse(current_database_url())
    for key in ("NAME", "USER", "PASSWORD", "PORT"):
        assert (again[key] or "") == (parsed[key] or "")
    assert (again["HOST"] or again.get("OPTIONS", {}).get("host")) == (
        parsed["HOST"] or parsed.get("OPTIONS", {}).get("host")
    )
