"""Browser fixtures: headless Chromium (Debian's, driven by Playwright) against a real daphne.

Registered for every test module by tests/conftest.py (``pytest_plugins``). Without
/usr/bin/chromium or the playwright package the browser tests skip and say why; ``make setup``
installs Chromium where it can (root with apt).

    def test_something(browser_page, browser_server, operator):
        page = browser_page(operator)
        page.goto(browser_server + "/dashboard/")
        screenshot(page, "something")
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.live import web_server

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Flags that work for Debian's Chromium in containers and CI (NOTES.md).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = settings.BASE_DIR / "var" / "screenshots"


def screenshot(page, name: str) -> Path:
    """Save the page as var/screenshots/<name>.png for people to look at."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium per test module. Not per session: Playwright's sync API keeps an
    event loop running in this thread until it stops, and pytest-asyncio's tests cannot run
    their own loop meanwhile (so keep async tests out of modules that use a browser)."""
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}: run `make setup` as root, or set CHROMIUM")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is not installed"
    )
    # Playwright's sync API runs an event loop in this thread; Django refuses database calls
    # made while one runs unless told they are safe (they are: the test owns this thread).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def browser_server(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """daphne on a free loopback port with the PostgreSQL channel layer, so that events
    published by other processes reach the pages it serves; yields its base URL."""
    log = tmp_path_factory.mktemp("daphne") / "daphne.log"
    with web_server(log=log, CHANNEL_LAYER="postgres") as base:
        yield base


@pytest.fixture
def browser_page(chromium, browser_server) -> Iterator[Callable]:
    """A factory of pages logged in as a user: the session is made directly (no login form)
    and its cookie handed to a fresh browser context."""
    from django.test import Client

    contexts = []

    def make(user, *, width: int = 1600, height: int = 1000, locale: str = "en-GB"):
        client = Client()
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME]
        context = chromium.new_context(viewport={"width": width, "height": height}, locale=locale)
        context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": cookie.value, "url": browser_server}]
        )
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)  # two shared cores: generous waits, never assertions
        return page

    yield make
    for context in contexts:
        context.close()
