"""`make test` runs in databases of the checkout's own and drops them at the end, so two
checkouts can test at once on one PostgreSQL server (scripts/database_url.py --checkout)."""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest

from gpuplatform.dburl import current_database_url
from scripts.database_url import (
    MAX_NAME,
    checkout_database_name,
    run_with_database,
    with_database,
)

MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"


def test_the_name_differs_for_two_checkouts_and_is_stable_for_one(tmp_path):
    one, other = tmp_path / "gpuplatform", tmp_path / "other" / "gpuplatform"

    assert checkout_database_name("gpuplatform", one) == checkout_database_name("gpuplatform", one)
    assert checkout_database_name("gpuplatform", one) != checkout_database_name(
        "gpuplatform", other
    )
    # the same folder named another way (a relative path, a trailing "..") is the same checkout
    assert checkout_database_name("gpuplatform", other / ".." / "gpuplatform") == (
        checkout_database_name("gpuplatform", other)
    )


def test_the_name_is_a_plain_identifier_that_postgresql_does_not_cut(tmp_path):
    name = checkout_database_name("gpuplatform", tmp_path / ("Wörk Tree-" * 20))

    assert name.startswith("gpuplatform_w_rk_tree_w_rk_tree_")
    assert len(name) <= MAX_NAME and len(f"test_{name}") <= 63
    assert name.replace("_", "").isalnum() and name.isascii() and name == name.lower()


def server_url() -> str:
    """The maintenance database of the server this test run uses."""
    return with_database(current_database_url(), "postgres")


def databases_named(prefix: str) -> list[str]:
    with psycopg.connect(server_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"%{prefix}%",)
        ).fetchall()
    return sorted(row[0] for row in rows)


# What the suite does to the database it is given: Django's checks connect to it, pytest-django
# makes test_<name> beside it (and here, like a run killed half-way, leaves it); then it fails.
FAKE_SUITE = """
import os, sys, psycopg
url = os.environ["DATABASE_URL"]
name = url.rsplit("/", 1)[1]
with psycopg.connect(url, autocommit=True) as conn:
    conn.execute(f'CREATE DATABASE "test_{name}"')
print("URL", url)
sys.exit(3)
"""


@pytest.mark.django_db
def test_a_run_gets_its_own_database_and_drops_everything_it_made(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    checkout = tmp_path / "checkout-a"
    own = checkout_database_name("gpuplatform", checkout)

    status = run_with_database(
        [sys.executable, "-c", FAKE_SUITE],
        name="gpuplatform",
        server=server_url(),
        checkout=checkout,
    )

    assert status == 3  # the suite's own status
    out = capfd.readouterr().out
    assert f"URL {with_database(server_url(), own)}" in out
    assert databases_named(own) == []  # neither it nor test_<it> is left


@pytest.mark.django_db
def test_a_database_url_given_is_used_as_it_is_and_never_dropped(monkeypatch, capfd):
    given = current_database_url()
    monkeypatch.setenv("DATABASE_URL", given)
    show = "import os; print('URL', os.environ['DATABASE_URL'])"

    status = run_with_database(
        [sys.executable, "-c", show], name="gpuplatform", server=server_url()
    )

    assert status == 0
    assert f"URL {given}" in capfd.readouterr().out
    assert databases_named(given.rsplit("/", 1)[1]) != []


def test_make_test_runs_the_suite_through_it():
    recipe = MAKEFILE.read_text().split("\ntest: ", 1)[1].split("\n\n", 1)[0]

    assert "scripts/database_url.py --checkout gpuplatform --" in recipe
    assert "pytest" in recipe.split("--checkout", 1)[1]
