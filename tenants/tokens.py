"""API token format: ``gpup_<8-char id>_<40-char secret>``.

The ``gpup_`` marker makes a leaked token recognisable to secret scanners; the id part is
stored in clear (``ApiToken.prefix``) to find the row; only a SHA-256 of the whole token is
stored. A high-entropy random secret needs no slow password hash.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string

MARKER = "gpup"
_ALPHABET = string.ascii_letters + string.digits
_ID_LENGTH = 8
_SECRET_LENGTH = 40


def _random(length: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def generate() -> tuple[str, str]:
    """Return (token, prefix): the token to show once and the prefix to store."""
    prefix = f"{MARKER}_{_random(_ID_LENGTH)}"
    return f"{prefix}_{_random(_SECRET_LENGTH)}", prefix


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def prefix_of(token: str) -> str | None:
    """The stored prefix of a well-formed token, or None for anything else."""
    parts = token.split("_")
    if (
        len(parts) != 3
        or parts[0] != MARKER
        or len(parts[1]) != _ID_LENGTH
        or len(parts[2]) != _SECRET_LENGTH
    ):
        return None
    return f"{parts[0]}_{parts[1]}"


def matches(token: str, key_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), key_hash)
