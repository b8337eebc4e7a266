"""Memory sizes and durations as operators write them in configs/*.yaml.

Memory is carried as whole MiB (what NVML and CUDA report, what CUDA_VISIBLE_DEVICES schedulers
reason in); durations as whole seconds. Parsing is strict on purpose: a typo in an estate file
should stop start-up with a message the operator can act on, not silently become a default.
"""

import re
from decimal import Decimal

from django.conf import settings
from django.utils.translation import gettext, gettext_noop

_MIB = 1024 * 1024

# Bytes per unit. Kubernetes-style binary suffixes (Ki, Mi, Gi, Ti) and SI decimal ones (K, M, G,
# T); a trailing "B" is accepted because people write "24GB" and "24GiB" interchangeably.
_BYTES_PER_UNIT: dict[str, int] = {
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
}

_SIZE_RE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]*)")

_SECONDS_PER_UNIT: dict[str, int] = {"d": 86400, "h": 3600, "m": 60, "s": 1}

# Units must come largest first and at most once ("1h30m", not "30m1h" or "1h1h"), so a value
# has exactly one reading.
# Parse errors, marked for the catalogue and translated when raised (``_t``).
EXPECTED = gettext_noop("expected %(example)s, got %(value)s")
_DURATION_RE = re.compile(
    r"(?:(?P<d>\d+)\s*d)?\s*(?:(?P<h>\d+)\s*h)?\s*(?:(?P<m>\d+)\s*m)?\s*(?:(?P<s>\d+)\s*s)?"
)


def parse_memory_mb(value: object, *, field: str = "memory") -> int:
    """Return a memory size in whole MiB.

    Accepts an int (already MiB) or a string with a unit: "24Gi", "24GiB", "20480Mi", "1.5Gi",
    "1Ti", "24G"/"24GB" (decimal: 24e9 bytes, rounded down to whole MiB), "24000M".

    A string without a unit ("24576") is rejected: it could mean bytes or MiB, and guessing wrong
    is off by a factor of a million. Zero and sizes under 1 MiB are rejected too: every memory
    quantity the platform handles (a GPU's memory, a task's request) is meaningful only when
    positive, and a task that needs no memory simply leaves the field out.

    Errors are ValueError starting with "<field>: " (nothing when field is "").
    """
    example = gettext_noop("a size such as 24Gi or 20480Mi")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(_problem(field, EXPECTED, example=_t(example), value=repr(value)))
    if isinstance(value, int):
        mb = value
    else:
        mb = _parse_size_string(value, field=field, example=example)
    if mb < 1:
        raise ValueError(
            _problem(
                field, gettext_noop("must be at least 1 MiB, got %(value)s"), value=repr(value)
            )
        )
    return mb


def _parse_size_string(text: str, *, field: str, example: str) -> int:
    match = _SIZE_RE.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(_problem(field, EXPECTED, example=_t(example), value=repr(text)))
    unit = match["unit"]
    if not unit:
        raise ValueError(
            _problem(
                field,
                gettext_noop("needs a unit such as Mi or Gi: %(value)s could be bytes or MiB"),
                value=repr(text),
            )
        )
    if unit not in _BYTES_PER_UNIT:
        raise ValueError(
            _problem(
                field,
                gettext_noop(
                    "unknown unit %(unit)s in %(value)s; "
                    "use Ki, Mi, Gi, Ti (binary) or K, M, G, T (decimal)"
                ),
                unit=repr(unit),
                value=repr(text),
            )
        )
    # Decimal, not float: "1.1Gi" must not lose a MiB to binary rounding.
    total_bytes = Decimal(match["number"]) * _BYTES_PER_UNIT[unit]
    return int(total_bytes // _MIB)


def parse_duration_s(value: object, *, field: str = "duration") -> int:
    """Return a positive duration in whole seconds.

    Accepts an int (seconds) or a string: "90" (seconds), "30s", "5m", "6h", "2d", "1h30m".
    Zero and negative durations are rejected: every duration in the estate (a heartbeat period, a
    timeout) would make no sense at zero. Errors start with "<field>: " unless field is "".
    """
    example = gettext_noop("a duration such as 30s, 5m, 6h or 1h30m")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(_problem(field, EXPECTED, example=_t(example), value=repr(value)))
    if isinstance(value, int):
        seconds = value
    else:
        seconds = _parse_duration_string(value, field=field, example=example)
    if seconds <= 0:
        raise ValueError(
            _problem(
                field, gettext_noop("must be more than zero, got %(value)s"), value=repr(value)
            )
        )
    return seconds


def _parse_duration_string(text: str, *, field: str, example: str) -> int:
    cleaned = text.strip().lower()
    if cleaned.isdigit():
        return int(cleaned)
    match = _DURATION_RE.fullmatch(cleaned)
    if not cleaned or match is None:
        raise ValueError(_problem(field, EXPECTED, example=_t(example), value=repr(text)))
    return sum(
        int(amount) * _SECONDS_PER_UNIT[unit]
        for unit, amount in match.groupdict().items()
        if amount is not None
    )


def _t(message: str, **params: object) -> str:
    """``message`` in the active language where Django is set up (the API and the portal answer
    in the caller's), else as written (a script or a configuration check without settings)."""
    if settings.configured:
        message = gettext(message)
    return message % params if params else message


def _problem(field: str, text: str, **params: object) -> str:
    # An empty field leaves the name out, for callers that print their own location (the
    # configuration loader prefixes the key path).
    text = _t(text, **params)
    return f"{field}: {text}" if field else text


def format_memory_mb(mb: int) -> str:
    """Human-readable size: "24 GiB", "512 MiB", "1 TiB"; "24.0 GiB" when not a whole GiB.

    The decimal point in "24.0 GiB" (24564 MiB, a real RTX 4090) marks the value as rounded.
    """
    if mb < 0:
        raise ValueError(f"memory must not be negative, got {mb}")
    if mb >= 1024 * 1024 and mb % (1024 * 1024) == 0:
        return f"{mb // (1024 * 1024)} TiB"
    if mb >= 1024 and mb % 1024 == 0:
        return f"{mb // 1024} GiB"
    if mb >= 1024:
        return f"{mb / 1024:.1f} GiB"
    return f"{mb} MiB"


def format_duration_s(seconds: int) -> str:
    """Compact duration that parse_duration_s reads back: "6h", "1h30m", "45s", "0s"."""
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {seconds}")
    parts = []
    remaining = seconds
    for unit, size in _SECONDS_PER_UNIT.items():
        amount, remaining = divmod(remaining, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"
