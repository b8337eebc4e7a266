"""Every string the pages' scripts translate (``gettext(...)``, ``pgettext(...)`` in
static/**/*.js) has its Chinese in locale/zh_Hans/LC_MESSAGES/djangojs.po, which /jsi18n/ serves."""

from __future__ import annotations

import gettext
import re
from pathlib import Path

import pytest
from django.conf import settings

STATIC = Path(settings.BASE_DIR) / "static"
CATALOGUE = Path(settings.BASE_DIR) / "locale" / "zh_Hans" / "LC_MESSAGES" / "djangojs.mo"
CALL = re.compile(r'\b(?:gettext\(|pgettext\("(?P<context>[^"]+)",\s*)"(?P<text>[^"]+)"\)')


def script_strings() -> set[tuple[str | None, str]]:
    found = set()
    for script in STATIC.glob("*/*.js"):  # ours; the vendored libraries sit a level deeper
        for match in CALL.finditer(script.read_text()):
            found.add((match["context"], match["text"]))
    return found


def test_the_scripts_use_translated_strings():
    assert len(script_strings()) >= 10


@pytest.mark.parametrize("context,text", sorted(script_strings(), key=str))
def test_each_script_string_is_in_the_chinese_catalogue(context, text):
    with CATALOGUE.open("rb") as handle:  # compiled by `make messages`, as the site reads it
        entries = gettext.GNUTranslations(handle)._catalog
    key = text if context is None else f"{context}\x04{text}"
    assert entries.get(key, text) != text, f"{text!r} (context {context!r}) is not translated"
