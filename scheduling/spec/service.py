"""The task spec's ``service:`` block, declared as the rest of the schema is
(scheduling.spec.schema): a port the platform gives the task, a health check, replicas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from django.utils.translation import gettext, gettext_noop
from pydantic import BeforeValidator, Field, PlainValidator

from gpuplatform.units import parse_duration_s
from scheduling.spec.base import _Spec
from scheduling.spec.errors import Says, got

MIN_SERVICE_PORT, MAX_SERVICE_PORT = 1024, 65535  # below 1024 needs root, which tasks lack
MAX_REPLICAS = 16
MAX_HEALTH_PATH = 1024
MAX_HEALTH_S = 86400  # a health check's interval or start-up time: at most a day
# One check's timeout: the supervisor waits for the answer in its watch loop, so a cancel or a
# pause is heard at most this late.
MAX_HEALTH_TIMEOUT_S = 30
MAX_HEALTH_FAILURES = 100
_TYPE_AND_RANGE = ("int_type", "greater_than_equal", "less_than_equal")


def whole_number(high: int):
    """An int from 1 to ``high``, its error saying so (the field's own message)."""
    return Annotated[
        int,
        Field(ge=1, le=high),
        Says.of(
            gettext_noop("must be a whole number from 1 to %(high)s, got %(got)s"),
            *_TYPE_AND_RANGE,
        ),
    ]


def _port(value: object) -> str | int:
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool):
        if MIN_SERVICE_PORT <= value <= MAX_SERVICE_PORT:
            return value
    raise ValueError(
        gettext('must be "auto" or a port number from %(low)s to %(high)s, got %(got)s')
        % {"low": MIN_SERVICE_PORT, "high": MAX_SERVICE_PORT, "got": got(value)}
    )


def _health_timeout(value: object) -> int:
    seconds = parse_duration_s(value, field="")
    if seconds > MAX_HEALTH_TIMEOUT_S:
        raise ValueError(gettext("must be at most 30s, got %(got)s") % {"got": got(value)})
    return seconds


def _health_seconds(value: object) -> int:
    seconds = parse_duration_s(value, field="")
    if seconds > MAX_HEALTH_S:
        raise ValueError(gettext("must be at most 1d, got %(got)s") % {"got": got(value)})
    return seconds


def _health_path(value: object) -> object:
    """A health check given as its path alone: ``health: /health``."""
    return {"path": value} if isinstance(value, str) else value


Port = Annotated[
    Any,
    PlainValidator(
        _port,
        json_schema_input_type=Literal["auto"]
        | Annotated[int, Field(ge=MIN_SERVICE_PORT, le=MAX_SERVICE_PORT)],
    ),
]
HealthTimeout = Annotated[
    Any,
    PlainValidator(
        _health_timeout,
        json_schema_input_type=Annotated[str, Field(examples=["2s"])]
        | Annotated[int, Field(ge=1, le=MAX_HEALTH_TIMEOUT_S, json_schema_extra={"x-unit": "s"})],
    ),
]
HealthSeconds = Annotated[
    Any,
    PlainValidator(
        _health_seconds,
        json_schema_input_type=Annotated[str, Field(examples=["10s", "5m"])]
        | Annotated[int, Field(ge=1, le=MAX_HEALTH_S, json_schema_extra={"x-unit": "s"})],
    ),
]
HealthPath = Annotated[
    str,
    Field(max_length=MAX_HEALTH_PATH, pattern=r"^/[!-~]*$"),
    Says.of(
        gettext_noop("must be a URL path starting with '/', without spaces, got %(got)s"),
        "string_type",
        "string_pattern_mismatch",
        "string_too_long",
    ),
]


class HealthInput(_Spec):
    """The service's health check: ``GET http://127.0.0.1:<port><path>`` on its node."""

    path: HealthPath = Field(description=gettext_noop("The path to ask, such as /health."))
    interval: HealthSeconds = Field(
        default=10, description=gettext_noop("Time between checks, such as 10s.")
    )
    timeout: HealthTimeout = Field(
        default=2, description=gettext_noop("How long one check may take to answer.")
    )
    start_period: HealthSeconds = Field(
        default=300,
        description=gettext_noop(
            "How long start-up may take (loading a model): failed checks then do not count."
        ),
    )
    failures: whole_number(MAX_HEALTH_FAILURES) = Field(
        default=3,
        description=gettext_noop(
            "Failed checks in a row, after start-up, that restart the task (a failure)."
        ),
    )


class ServiceInput(_Spec):
    """A long-running service: a port the platform gives it, a health check, replicas."""

    port: Port = Field(
        default="auto",
        validate_default=True,
        description=gettext_noop(
            "`auto` (a free port on the node, given to the task as `$PORT`) or a number."
        ),
    )
    health: Annotated[HealthInput, BeforeValidator(_health_path)] = Field(
        default=None,
        description=gettext_noop("A path such as /health, or {path, interval, timeout, ...}."),
    )
    replicas: whole_number(MAX_REPLICAS) = Field(
        default=1,
        description=gettext_noop("Copies of the service, each a task with its own GPUs."),
    )
