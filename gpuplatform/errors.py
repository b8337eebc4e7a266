"""Errors that name the field at fault, for every interface to show the same way."""

from __future__ import annotations


class FieldErrors(Exception):
    """Input with problems: ``errors`` maps each field path to its reasons, in the order found.
    The API answers it with 400 and this mapping; the portal and the CLI print it."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors

    def __str__(self) -> str:
        return "\n".join(
            f"{path}: {reason}" for path, items in self.errors.items() for reason in items
        )
