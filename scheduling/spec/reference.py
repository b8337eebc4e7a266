"""What the rest of the platform reads from the spec's schema rather than writing it again:
the OpenAPI schema of a submission (scheduling.api), the limits of the portal's task form and
the rows of the YAML editor's help (portal.forms)."""

from dataclasses import dataclass
from functools import cache
from typing import Any

from django.utils.html import conditional_escape, escape, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from pydantic import BaseModel, RootModel

from gpuplatform.units import format_duration_s, format_memory_mb
from scheduling.spec.errors import limit_of, walk
from scheduling.spec.schema import SweepInput, TaskInput


class SubmissionInput(RootModel[TaskInput | SweepInput | list[TaskInput | SweepInput]]):
    """A task, a sweep, or a list of them (``kind`` tells a sweep from a task)."""


def openapi_schema(ref_template: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The schema of a submission as a request body takes it, and the schemas it refers to
    (``ref_template``, e.g. ``#/components/schemas/{model}``) by name, in OpenAPI 3.0's
    dialect of JSON Schema."""
    schema = _openapi_30(
        SubmissionInput.model_json_schema(ref_template=ref_template, mode="validation")
    )
    return schema, schema.pop("$defs", {})


def _openapi_30(schema: Any) -> Any:
    """Pydantic writes JSON Schema 2020-12; OpenAPI 3.0 has no const, examples (but example)
    or patternProperties (a mapping's values are its additionalProperties)."""
    if isinstance(schema, list):
        return [_openapi_30(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "const":
            out["enum"] = [value]
        elif key == "examples" and isinstance(value, list):
            out["example"] = value[0]
        elif key == "patternProperties" and len(value) == 1:
            out["additionalProperties"] = _openapi_30(next(iter(value.values())))
        elif key in ("properties", "$defs"):
            out[key] = {name: _openapi_30(item) for name, item in value.items()}
        else:
            out[key] = _openapi_30(value)
    return out


def max_length(path: str) -> int | None:
    """The length limit of a task's key (``name``, ``resources.pool``), None if it has none."""
    field, _ = walk(TaskInput, tuple(path.split(".")))
    if field is None:
        raise KeyError(path)
    return limit_of(field.metadata)


@dataclass(frozen=True)
class HelpRow:
    key: str  # as written in YAML: resources.gpus
    description: SafeString  # translated, `literal values` (as OpenAPI's Markdown) in <code>
    limits: SafeString  # translated, literal values in <code>; "" if none
    default: str  # as written in YAML, "" if none
    required: bool


def help_rows() -> tuple[list[HelpRow], list[HelpRow]]:
    """Every key of a task, and a sweep's own keys, in the active language."""
    return _rows(TaskInput, _schema(TaskInput), ""), _rows(SweepInput, _schema(SweepInput), "")


@cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(mode="validation")


def _rows(model: type[BaseModel], schema: dict[str, Any], prefix: str) -> list[HelpRow]:
    """One row a key; a key that holds a task's keys of its own (resources, policy) gives
    one row each of them instead, a sweep's template one row for all."""
    rows = []
    required = set(schema.get("required", ()))
    for key, field in schema["properties"].items():
        nested_model = walk(model, (key,))[1]
        if nested_model is not None and not issubclass(nested_model, TaskInput):
            nested = schema["$defs"][field["$ref"].rsplit("/", 1)[-1]]
            rows += _rows(nested_model, {**nested, "$defs": schema["$defs"]}, f"{prefix}{key}.")
            continue
        rows.append(
            HelpRow(
                key=f"{prefix}{key}",
                description=_marked_up(gettext(field.get("description", ""))),
                limits=_joined(_limits(field)),
                default=_literal(field.get("default")),
                required=key in required,
            )
        )
    return rows


def _joined(limits: list[str | SafeString]) -> SafeString:
    """A key's limits in one line of HTML (each escaped unless it is HTML already)."""
    return mark_safe("; ".join(conditional_escape(text) for text in limits))  # noqa: S308


def _marked_up(text: str) -> SafeString:
    """A description as HTML: what it quotes in backticks (Markdown's code, as the OpenAPI
    schema shows it) in <code>."""
    parts = escape(text).split("`")
    return mark_safe(  # noqa: S308 - every part escaped above
        "".join(f"<code>{part}</code>" if n % 2 else part for n, part in enumerate(parts))
    )


def _limits(schema: dict[str, Any]) -> list[str | SafeString]:
    """The limits a key's JSON schema states, in words. Where the key takes one value or a
    list (policy.after), the list's limit."""
    branches = schema.get("anyOf", ())
    lists = [branch for branch in branches if branch.get("type") == "array"]
    said: list[str] = []
    for part in lists or [schema, *branches]:
        for text in _limits_of(part):
            if text not in said:
                said.append(text)
    values = schema.get("additionalProperties") or next(
        iter(schema.get("patternProperties", {}).values()), None
    )
    if isinstance(values, dict):
        lengths = [v["maxLength"] for v in [values, *values.get("anyOf", ())] if "maxLength" in v]
        if lengths:
            said.append(gettext("values at most %(n)s characters") % {"n": lengths[0]})
    return said


def _limits_of(schema: dict[str, Any]) -> list[str | SafeString]:
    said: list[str | SafeString] = []
    unit = schema.get("x-unit")
    if "enum" in schema and len(schema["enum"]) > 1:
        # The values are literal (YAML), not words to translate: each in <code>.
        values = format_html_join(", ", "<code>{}</code>", ((v,) for v in schema["enum"]))
        said.append(mark_safe(escape(gettext("one of %(values)s")) % {"values": values}))  # noqa: S308
    if "maxLength" in schema:
        said.append(gettext("at most %(n)s characters") % {"n": schema["maxLength"]})
    if "maximum" in schema and unit:
        said.append(gettext("at most %(n)s") % {"n": _with_unit(schema["maximum"], unit)})
    elif "maximum" in schema:
        said.append(
            gettext("%(low)s to %(high)s") % {"low": schema["minimum"], "high": schema["maximum"]}
        )
    if "maxProperties" in schema:
        said.append(gettext("at most %(n)s entries") % {"n": schema["maxProperties"]})
    if "maxItems" in schema:
        said.append(gettext("at most %(n)s of them") % {"n": schema["maxItems"]})
    if "x-maxTasks" in schema:
        said.append(gettext("at most %(n)s tasks in all") % {"n": schema["x-maxTasks"]})
    return said


def _with_unit(value: int, unit: str) -> str:
    if unit == "MiB":
        return format_memory_mb(value)
    return format_duration_s(value)


def _literal(value: object) -> str:
    """A default as YAML writes it; nothing for "not given" (None, "", {}, [])."""
    if value is None or value in ("", {}, []):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
