"""Typed readers for configuration from the environment.

Each helper fails loudly with ImproperlyConfigured on a value it cannot read, naming the
variable and the reason, so a typo in a deployment stops start-up instead of silently falling
back to a default. Any variable may instead be given as a file: ``NAME_FILE=/run/secrets/x``
(Docker and systemd credentials), which wins over ``NAME``.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def raw(name: str) -> str | None:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_path}: {exc}") from exc
    return os.environ.get(name)


def string(name: str, default: str | None = None) -> str | None:
    value = raw(name)
    return default if value is None else value


def boolean(name: str, default: bool) -> bool:
    value = raw(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}: expected one of 1/0, true/false, yes/no; got {value!r}")


def integer(name: str, default: int, *, minimum: int | None = None) -> int:
    value = raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}: expected an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}: must be at least {minimum}, got {number}")
    return number


def string_list(name: str, default: list[str]) -> list[str]:
    value = raw(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = raw(name)
    if value is None:
        return default
    if value not in choices:
        raise ImproperlyConfigured(f"{name}: expected one of {', '.join(choices)}; got {value!r}")
    return value
