"""The base of every mapping of the task spec's schema (scheduling.spec.schema)."""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from scheduling.spec.errors import keys


class _Spec(BaseModel):
    """A mapping of a spec. A key given as null is not given (``_null_is_not_given``), so an
    optional key's default None is never validated: its type need not admit None."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    refused_even_if_null: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            known = _keys(cls)
            return {k: v for k, v in data.items() if v is not None or k not in known}
        return data


@cache
def _keys(model: type[_Spec]) -> frozenset[str]:
    """The keys of ``model`` whose null means "not given"."""
    return frozenset(keys(model)) - model.refused_even_if_null
