"""A spec's problems, and the words for them: every problem is kept against its field path
(``resources.gpus``, ``[1].policy.after[0]``, ``template.env.LR``), in the caller's language.

Pydantic finds most problems (scheduling.spec.schema declares what each field takes); this
module words them. A field's own words (``Says``) come first, then the ones below, which every
field shares. The reasons are translated when the problem is found: the request's language.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import annotated_types
from django.utils.translation import gettext
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from gpuplatform.errors import FieldErrors

PROBLEMS = "spec_problems"  # the pydantic error type of a rule that found several problems


class SpecError(FieldErrors):
    """A spec with problems: ``errors`` maps each field path to the reasons, in the order found."""


class Problems:
    """The problems found so far, by path; ``len`` counts every add, repeats included, so
    "did this part add any?" is exact."""

    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, path: str, reason: str) -> None:
        self.count += 1
        reasons = self.errors.setdefault(path or "spec", [])
        if reason not in reasons:
            reasons.append(reason)

    def add_invalid(self, path: str, exc: ValidationError, model: type[BaseModel] | None) -> None:
        """Pydantic's errors for the data at ``path``, validated as ``model``."""
        for error in exc.errors(include_url=False):
            for where, reason in explain(error, model):
                self.add(at(path, where) if where else path, reason)

    def raise_if_any(self) -> None:
        if self.errors:
            raise SpecError(self.errors)


@dataclass(frozen=True, slots=True, eq=False)  # hashed by identity: typing hashes metadata
class Says:
    """A field's own reasons, by pydantic error type (``int_type``, ``less_than_equal``, ...),
    each a message id marked with gettext_noop. The message may use ``%(got)s`` (the value),
    ``%(limit)s`` and ``%(n)s`` (a length limit and the length), ``%(low)s`` and ``%(high)s``
    (the field's bounds)."""

    reasons: Mapping[str, str]

    @classmethod
    def of(cls, message: str, *kinds: str) -> Says:
        return cls(dict.fromkeys(kinds, message))


def problems(found: Iterable[tuple[str, str]]) -> PydanticCustomError:
    """The error a rule raises for several problems at once: ``(where, reason)`` pairs, where is
    a path below the field (``"LR"``, ``"[1]"``, ``"lr[0]"``) or "" for the field itself."""
    return PydanticCustomError(PROBLEMS, "spec problems", {"problems": list(found)})


def explain(error: ErrorDetails, model: type[BaseModel] | None) -> list[tuple[str, str]]:
    """``(path below the validated data, reason)`` for one of pydantic's errors."""
    kind, loc = error["type"], error["loc"]
    where = path_of(loc)
    if kind == PROBLEMS:
        return [(_below(where, sub), reason) for sub, reason in error["ctx"]["problems"]]
    if kind in ("extra_forbidden", "invalid_key"):
        _, parent = walk(model, loc[:-1])
        return [(where, unknown_key(loc[-1], keys(parent) if parent else ()))]
    field, _ = walk(model, loc)
    return [(where, reason(error, field.metadata if field else ()))]


def reason(error: ErrorDetails, metadata: Iterable[object] = ()) -> str:
    """The words for one of pydantic's errors on a field with ``metadata`` (its Says and its
    bounds)."""
    kind = error["type"]
    value = error.get("input")
    ctx: dict[str, Any] = error.get("ctx") or {}
    says = next((m for m in metadata if isinstance(m, Says)), None)
    if says is not None and kind in says.reasons:
        template = gettext(says.reasons[kind])
    elif kind == "value_error":
        return str(ctx["error"])
    elif kind == "missing":
        return gettext("is required")
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        template = gettext("must be a mapping, got %(got)s")
    elif kind == "string_type":
        template = (
            gettext("must be a string, got %(got)s; put it in quotes")
            if isinstance(value, int | float)  # bool too: YAML reads an unquoted yes as true
            else gettext("must be a string, got %(got)s")
        )
    elif kind == "string_unicode" and isinstance(value, str):
        return lone_surrogate(value) or error["msg"]
    elif kind == "string_too_short":
        return gettext("must not be empty")
    elif kind == "string_too_long":
        template = at_most_characters()
    elif kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        template = from_to()
    else:
        return error["msg"]  # pydantic's own sentence: no field of the schema gets here
    low, high = bounds(metadata)
    return template % {
        "got": got(value),
        "limit": ctx.get("max_length"),
        "n": ctx.get("actual_length", len(value) if isinstance(value, str) else None),
        "low": low,
        "high": high,
    }


def unknown_key(key: object, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    close = difflib.get_close_matches(key, allowed, n=1) if isinstance(key, str) else []
    hint = (
        gettext("did you mean %(key)r?") % {"key": close[0]}
        if close
        else gettext("expected one of %(keys)s") % {"keys": ", ".join(allowed)}
    )
    return gettext("unknown key; %(hint)s") % {"hint": hint}


def walk(
    model: type[BaseModel] | None, loc: tuple[str | int, ...]
) -> tuple[FieldInfo | None, type[BaseModel] | None]:
    """The field of ``model`` (or of a model inside it) that ``loc`` names, and the model that
    field holds (None when it holds none). (None, None) when ``loc`` goes on past fields (into
    a mapping or a list) or names none; ``()`` names ``model`` itself."""
    field = None
    for part in loc:
        field = keys(model).get(part) if model is not None and isinstance(part, str) else None
        if field is None:
            return None, None
        held = field.annotation
        model = held if isinstance(held, type) and issubclass(held, BaseModel) else None
    return field, model


def keys(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """The model's fields by the key a spec writes them under, in their order."""
    return {field.alias or name: field for name, field in model.model_fields.items()}


def bounds(metadata: Iterable[object]) -> tuple[object, object]:
    low = high = None
    for item in metadata:
        if isinstance(item, annotated_types.Ge | annotated_types.Gt):
            low = item.ge if isinstance(item, annotated_types.Ge) else item.gt
        elif isinstance(item, annotated_types.Le | annotated_types.Lt):
            high = item.le if isinstance(item, annotated_types.Le) else item.lt
    return low, high


def limit_of(metadata: Iterable[object]) -> int | None:
    """The field's length limit (the last one declared wins, as in pydantic)."""
    found = None
    for item in metadata:
        if isinstance(item, annotated_types.MaxLen):
            found = item.max_length
    return found


def path_of(loc: tuple[str | int, ...]) -> str:
    """A location as a path: ``("policy", "after")`` -> ``policy.after``. Every key in a
    location is a mapping's (lists are read by rules, which word their own paths), so a
    number is a key too: YAML's ``env: {1: x}`` is ``env.1``. ``[key]``, pydantic's mark of
    a problem with the key rather than its value, is left out."""
    path = ""
    for part in loc:
        if part == "[key]":
            continue
        path = at(path, part)
    return path


def at(path: str, key: object) -> str:
    # A field path is the same in every language: the words for an odd key stay English.
    key_text = key if isinstance(key, str) else got(key, translate=False)
    return f"{path}.{key_text}" if path else key_text


def _below(path: str, sub: str) -> str:
    if not sub:
        return path
    if sub.startswith("["):
        return f"{path}{sub}"
    return at(path, sub)


def got(value: object, *, translate: bool = True) -> str:
    words = gettext if translate else str
    if isinstance(value, dict):
        return words("a mapping")
    if isinstance(value, list | tuple):
        return words("a list")
    try:
        return short(repr(value))
    except ValueError:  # an int too long to print
        return f"a {type(value).__name__}"


def short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def lone_surrogate(text: str) -> str | None:
    """Why ``text`` cannot be stored, if it holds a lone surrogate (JSON's "\\ud800" decodes
    to one; it has no UTF-8 form): refused as bad input rather than failing the INSERT."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        return gettext("must be valid Unicode text, got a lone surrogate %(bad)r") % {"bad": bad}
    return None


# Reasons several fields share, translated when the problem is found (the request's language).
def at_most_characters() -> str:
    return gettext("must be at most %(limit)s characters, got %(n)s")


def from_to() -> str:
    return gettext("must be from %(low)s to %(high)s, got %(got)s")
