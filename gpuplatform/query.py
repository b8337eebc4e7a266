"""Query parameters, read through DRF serializers like request bodies: a malformed or
out-of-range value is a 400 naming the parameter and the reason, never a 500 and never
silently replaced by a default. The same serializer documents the parameters in the OpenAPI
schema (``extend_schema(parameters=[TheQuery])``).

Whole numbers that reach PostgreSQL are bounded by what they land in: ids, OFFSET and LIMIT
are ``bigint``, attempt numbers ``integer``."""

from __future__ import annotations

from collections.abc import Mapping

from rest_framework import serializers

BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
SHOWN = 40  # characters of a bad value quoted back


class WholeNumber(serializers.IntegerField):
    """A whole number from ``minimum`` to ``maximum`` (a bigint by default), with one reason
    for every way of missing it, quoting the value."""

    def __init__(self, *, minimum: int = 0, maximum: int = BIGINT_MAX, **kwargs) -> None:
        super().__init__(min_value=minimum, max_value=maximum, **kwargs)

    def run_validation(self, data=serializers.empty):
        try:
            return super().run_validation(data)
        except serializers.ValidationError:
            shown = data if not isinstance(data, str) or len(data) <= SHOWN else data[:SHOWN] + "…"
            raise serializers.ValidationError(
                f"must be a whole number from {self.min_value} to {self.max_value}, got {shown!r}"
            ) from None


def parse(query: type[serializers.Serializer], params: Mapping) -> dict:
    """``params`` (``request.query_params``, ``request.GET``, or a websocket's query string as
    ``parse_qs`` gives it) read by the serializer ``query``'s fields, then its ``validate()``;
    raises DRF's ValidationError naming each bad parameter (the API answers it as a 400). A
    parameter given more than once counts its last value, unless the field takes a list. Given
    empty, a number is refused (empty is no number), anything else counts as not given (an
    empty filter filters nothing).

    The fields of one instance of ``query`` serve every call: a serializer built per request
    deep-copies its fields, which cost more than the rest of reading a page's parameters."""
    reader = _readers.get(query) or _readers.setdefault(query, query())
    fields = reader.fields
    data: dict = {}
    errors: dict[str, list[str]] = {}
    for name in params:
        field = fields.get(name)
        if field is None:
            continue
        value = _given(field, params.getlist(name) if hasattr(params, "getlist") else params[name])
        if value is serializers.empty:
            continue
        try:
            data[field.source] = field.run_validation(value)
        except serializers.ValidationError as exc:
            errors[name] = exc.detail if isinstance(exc.detail, list) else [exc.detail]
    for name, field in fields.items():
        if field.source in data or name in errors:
            continue
        if field.required:
            errors[name] = [field.error_messages["required"]]
        elif field.default is not serializers.empty:
            data[field.source] = field.get_default()
    if errors:
        raise serializers.ValidationError(errors)
    return reader.validate(data)


_readers: dict[type, serializers.Serializer] = {}


def _given(field: serializers.Field, values) -> object:
    """What a query string gives ``field``: its values for a list, else the last; ``empty``
    when not given, or given empty for anything but a number."""
    if values is None:
        return serializers.empty
    if isinstance(values, str):
        values = [values]
    if isinstance(field, serializers.ListField):
        values = [value for value in values if value != ""]
        return values or serializers.empty
    if not values or (values[-1] == "" and not isinstance(field, serializers.IntegerField)):
        return serializers.empty
    return values[-1]


def problems(error: serializers.ValidationError) -> dict[str, list[str]]:
    """A query's ValidationError as {parameter: [reasons]}, for pages that are not the API's."""
    detail = error.detail if isinstance(error.detail, dict) else {"request": error.detail}
    return {
        field: [str(reason) for reason in (reasons if isinstance(reasons, list) else [reasons])]
        for field, reasons in detail.items()
    }
