"""The estate configuration as the running platform sees it: loaded once, reloaded on change."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from scheduling.config import EstateConfig, load_config

_cache: dict[str, tuple[float, EstateConfig]] = {}


def config() -> EstateConfig:
    """The current ``GPUPLATFORM_CONFIG``; an edited file takes effect at the next call."""
    path = Path(settings.GPUPLATFORM_CONFIG)
    mtime = path.stat().st_mtime if path.exists() else 0.0
    cached = _cache.get(str(path))
    if cached is None or cached[0] != mtime:
        cached = _cache[str(path)] = (mtime, load_config(path))
    return cached[1]
