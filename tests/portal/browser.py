"""Headless Chromium for the portal's browser tests: Debian's chromium driven by Playwright
(``playwright install`` cannot download browsers here), and a check that a Chinese page shows
no string of our catalogue untranslated."""

from __future__ import annotations

import gettext
import re
import shutil
from pathlib import Path

import pytest
from django.conf import settings

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
SCREENSHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"


def chromium(playwright):
    if not Path(CHROMIUM).exists():
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def catalogue() -> dict[str, str]:
    """Our Chinese catalogue (locale/zh_Hans), msgid -> msgstr, singular messages only."""
    mo = Path(settings.BASE_DIR) / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.mo"
    with mo.open("rb") as handle:
        entries = gettext.GNUTranslations(handle)._catalog
    return {k: v for k, v in entries.items() if isinstance(k, str) and k and k != v}


VISIBLE_TEXT = """() => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const parent = node.parentElement;
    if (!parent || ["SCRIPT", "STYLE", "CODE"].includes(parent.tagName)) continue;  // code: literal
    const text = node.textContent.trim();
    if (text) out.push(text);
  }
  document.querySelectorAll("input[type=submit], [aria-label], [title]").forEach((el) => {
    for (const value of [el.value, el.getAttribute("aria-label"), el.getAttribute("title")]) {
      if (typeof value === "string" && value.trim()) out.push(value.trim());
    }
  });
  return out;
}"""


def untranslated(page) -> list[str]:
    """The catalogue's English strings that this (Chinese) page shows as they are, outside
    ``<code>`` (literal values: ``batch`` as a spec's default is YAML, not English)."""
    english = catalogue()
    found = []
    for text in page.evaluate(VISIBLE_TEXT):
        for candidate in (text, text.rstrip(":：").strip()):
            if candidate in english and candidate not in found:
                found.append(candidate)
    return found


# Words a Chinese page may show in Latin letters: product and technical names, units.
PRODUCT_NAMES = frozenset(
    """
gpuplatform GPU GPUs CUDA YAML JSON API gpuctl NVIDIA GeForce RTX MiB GiB KiB TiB MB GB UTC
CPU Bearer Python Django uPlot Prometheus JavaScript English CSV
""".split()
)
ENGLISH_WORD = re.compile(r"[A-Za-z]{3,}")
# Literal text: URLs and paths (a word of "/api/v1/tasks/3/metrics/" is not prose).
LITERAL = re.compile(r"\S*/\S*")
# The visible text outside <code>, <pre> and text boxes (a spec as submitted is YAML, not
# prose, and so is the YAML editor's example).
PROSE_TEXT = VISIBLE_TEXT.replace('"CODE"]', '"CODE", "PRE", "TEXTAREA"]')


def english_words(page, user_data: list[str] = ()) -> list[str]:
    """Words of three ASCII letters or more that this (Chinese) page shows outside ``<code>``,
    product names (PRODUCT_NAMES) and ``user_data`` (task names, commands, user, tenant and node
    names: what people typed, in whatever language they typed it)."""
    allowed = set(PRODUCT_NAMES)
    for text in user_data:
        allowed.update(ENGLISH_WORD.findall(text))
    found = []
    for text in page.evaluate(PROSE_TEXT):
        for word in ENGLISH_WORD.findall(LITERAL.sub(" ", text)):
            if word not in allowed and word not in found:
                found.append(word)
    return found
