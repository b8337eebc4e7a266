"""The task spec's schema, declared once: every key a task or a sweep may have, with its type,
limits, default, description and the reasons it gives for a value it refuses.

Pydantic checks specs against it (scheduling.spec.parse), and the rest is read from it: the
OpenAPI schema of ``POST /api/v1/tasks/``, the portal form's limits and the YAML editor's help
(scheduling.spec.reference). A limit is a constant below, used by the field that has it.

Pydantic checks the shape (known keys, mappings, required keys), the types (strict: ``"2"`` is
not a number, ``1`` is not a name) and the declared limits; a rule (a function below) does what
a type cannot: ``"1-4"`` GPUs, ``20Gi``, ``6h``, a workdir that must not climb, env names that
would subvert the launcher. A rule raises ValueError with the reason, or
``errors.problems(...)`` when it finds several. A ``None`` value is "not given": YAML writes an
empty key (``env:``) as null.

The limits keep one submission from costing more than a page of YAML should, and keep values
inside what the Task columns hold.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from django.utils.translation import gettext, gettext_lazy, gettext_noop
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo

from gpuplatform.units import parse_duration_s, parse_memory_mb
from scheduling.spec.base import _Spec
from scheduling.spec.errors import (
    Says,
    from_to,
    got,
    lone_surrogate,
    problems,
    reason,
)
from scheduling.spec.service import ServiceInput

MAX_COMMAND_LENGTH = 16384  # characters; anything longer belongs in a script in the workdir
MAX_ENV = 100  # entries in env
MAX_ENV_VALUE = 8192  # characters in one env value
MAX_NAME = 200  # characters in a task name (Task.name)
MAX_QUEUE = 100  # characters in a queue name (Task.queue)
MAX_WORKDIR = 1024  # characters in a workdir (Task.workdir)
MAX_SLUG = 63  # characters in a pool, node or GPU type name (a DNS label)
MAX_SWEEP_TASKS = 1000  # tasks one sweep may expand to
MAX_GPUS = 64  # GPUs one task may ask for
MAX_GPU_MEMORY_MB = 1024 * 1024  # 1 TiB per GPU: no card comes near, so more is a typo
MAX_MEMORY_MB = 64 * 1024 * 1024  # 64 TiB of host memory: more is a typo
MIN_CPUS = 0.01
MAX_CPUS = 1024
MAX_PIDS = 4_194_304  # the kernel's own pid_max ceiling
MAX_TIMEOUT_S = 365 * 86400  # a year; longer is a typo, and stays inside Task.timeout_s
MAX_RETRIES = 10
MAX_AFTER = 50  # tasks one task may wait for
MAX_TASK_ID = 2**63 - 1  # BigAutoField
MAX_PRIORITY = 100

PRIORITIES = {"low": 10, "normal": 50, "high": 90}
TASK_CLASSES = ("batch", "online")

# Task and queue names are written by people in any script ("训练-🚀"): anything but spaces,
# control and invisible format characters (zero-width, bidi overrides) and ASCII punctuation
# other than "." "_" "-", which may not lead. Nothing on a host is named after a task (its
# directories, logs and cgroups use ids), so no machine needs them narrower. Spelt as a negated
# class, which Python's re, pydantic's Rust regex and JavaScript read alike.
_NOT_IN_NAMES = (
    r"\s\x00-\x1f\x7f-\x9f!-,/:-@\[-\^`{-~"
    r"\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff0-\uffff"
)
NAME = rf"[^{_NOT_IN_NAMES}._-][^{_NOT_IN_NAMES}]*"
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_SLUG = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
_GPU_TYPE = r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?"
# At most four digits each side, so a pasted million-digit number never reaches int().
GPU_RANGE = r"\s*([0-9]{1,4})\s*(?:-\s*([0-9]{1,4})\s*)?"

# Env names a task may not set, and why. The command runs through /bin/sh under the platform's
# launcher, so these would act on the shell, the loader or the launcher before the user's command
# does. PATH stays allowed: users point it at their venv or conda, and the platform starts
# /bin/sh by absolute path.
_LOADER = gettext_lazy(
    "changes how the dynamic loader starts every program, the platform's launcher included"
)
_SHELL = gettext_lazy("makes the shell run a file before the command")
_INTERPRETER = gettext_lazy(
    "would load code into the platform's own launcher; set it inside the command instead, "
    "e.g. 'PYTHONPATH=src python train.py'"
)
_GPU = gettext_lazy("is set by the platform to the GPUs it gives the task")
_PLATFORM = gettext_lazy("is reserved for the platform's own configuration")
RESERVED_PREFIXES = {"LD_": _LOADER, "DYLD_": _LOADER, "GPUPLATFORM_": _PLATFORM}
RESERVED_NAMES = {
    "IFS": gettext_lazy("changes how the shell splits the command into words"),
    **dict.fromkeys(["BASH_ENV", "ENV"], _SHELL),
    **dict.fromkeys(["PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME"], _INTERPRETER),
    **dict.fromkeys(["PERL5LIB", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS"], _INTERPRETER),
    **dict.fromkeys(["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"], _GPU),
    **dict.fromkeys(["DATABASE_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"], _PLATFORM),
}

_TYPE_AND_RANGE = ("int_type", "greater_than_equal", "less_than_equal")
_IDENTIFIER_RE = re.compile(IDENTIFIER)
_GPU_RANGE_RE = re.compile(GPU_RANGE)


def _whole(pattern: str) -> str:
    return f"^{pattern}$"


def _or_empty(pattern: str) -> str:
    return f"^(|{pattern})$"


# --- Rules ---------------------------------------------------------------------------------------


def _check_text(text: str) -> str:
    """What PostgreSQL cannot store in text: NUL, and lone surrogates (pydantic refuses them
    in some values but not all, e.g. not in what a BeforeValidator returns)."""
    if "\0" in text:
        raise ValueError(gettext("must not contain NUL bytes"))
    if not text.isascii() and (problem := lone_surrogate(text)):
        raise ValueError(problem)
    return text


def _command(text: str) -> str:
    if not text.strip():
        raise ValueError(gettext("must not be empty"))
    return _check_text(text)


def _workdir(text: str) -> str:
    _check_text(text)
    if text.startswith("/"):
        raise ValueError(
            gettext("must be relative to your tenant's root directory, got %(got)s")
            % {"got": got(text)}
        )
    parts = [part for part in text.split("/") if part not in ("", ".")]
    # Checked on the parts, not the text: "a/../../b" and "a/.." both climb.
    if ".." in parts:
        raise ValueError(
            gettext("must not contain '..': a task stays inside your tenant's root directory")
        )
    if any(part.startswith("~") for part in parts):
        raise ValueError(
            gettext("must not use '~' (a home directory), got %(got)s") % {"got": got(text)}
        )
    return "/".join(parts)


def _scalar_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(
        gettext("must be a string, number or boolean, got %(got)s") % {"got": got(value)}
    )


def _env_name(key: object) -> str:
    if not isinstance(key, str) or not _IDENTIFIER_RE.fullmatch(key):
        raise ValueError(
            gettext("is not a valid variable name (like MY_VAR), got %(got)s") % {"got": got(key)}
        )
    # Compared in upper case: no one needs a lower-case ld_preload, and refusing it costs nothing.
    upper = key.upper()
    why = RESERVED_NAMES.get(upper) or next(
        (why for prefix, why in RESERVED_PREFIXES.items() if upper.startswith(prefix)), None
    )
    if why:
        raise ValueError(gettext("cannot be set: it %(reason)s") % {"reason": why})
    return key


def _priority_name(value: object) -> object:
    return PRIORITIES.get(value, value) if isinstance(value, str) else value


def _gpus(value: object) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        low, high, ranged = value, value, False
    elif isinstance(value, str) and (match := _GPU_RANGE_RE.fullmatch(value)):
        low, ranged = int(match[1]), match[2] is not None
        high = int(match[2]) if ranged else low
    else:
        raise ValueError(
            gettext('must be a whole number of GPUs or a range like "1-4", got %(got)s')
            % {"got": got(value)}
        )
    if not 0 <= low <= MAX_GPUS or not 0 <= high <= MAX_GPUS:
        raise ValueError(from_to() % {"low": 0, "high": MAX_GPUS, "got": got(value)})
    if ranged and not 1 <= low <= high:
        raise ValueError(
            gettext('a range must go from at least 1 up, like "1-4", got %(got)s')
            % {"got": got(value)}
        )
    return low, high


def _gpu_memory(value: object) -> int:
    mb = parse_memory_mb(value, field="")
    if mb > MAX_GPU_MEMORY_MB:
        raise ValueError(gettext("must be at most 1Ti per GPU, got %(got)s") % {"got": got(value)})
    return mb


def _host_memory(value: object) -> int:
    mb = parse_memory_mb(value, field="")
    if mb > MAX_MEMORY_MB:
        raise ValueError(gettext("must be at most 64Ti, got %(got)s") % {"got": got(value)})
    return mb


def _timeout(value: object) -> int:
    seconds = parse_duration_s(value, field="")
    if seconds > MAX_TIMEOUT_S:
        raise ValueError(gettext("must be at most 365d, got %(got)s") % {"got": got(value)})
    return seconds


def _after(value: object) -> tuple[str | int, ...]:
    """One task reference or a list of them; each problem is reported at its item."""
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_AFTER:
        raise ValueError(
            gettext("may name at most %(limit)s tasks, got %(n)s")
            % {"limit": MAX_AFTER, "n": len(items)}
        )
    refs: list[str | int] = []
    found = []
    for index, item in enumerate(items):
        where = f"[{index}]" if isinstance(value, list) else ""
        try:
            ref = _task_ref(item)
        except ValueError as exc:
            found.append((where, str(exc)))
            continue
        if ref in refs:
            found.append((where, gettext("duplicate %(ref)r") % {"ref": ref}))
        else:
            refs.append(ref)
    if found:
        raise problems(found)
    return tuple(refs)


def _task_ref(value: object) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_TASK_ID:
            raise ValueError(
                gettext("must be a positive task id, got %(got)s") % {"got": got(value)}
            )
        return value
    if isinstance(value, str):
        return check_name(value)
    raise ValueError(gettext("must be a task name or id, got %(got)s") % {"got": got(value)})


def _parameters(value: object) -> dict[str, list[str]]:
    """A sweep's grid: each name's values as text (they fill {name} placeholders)."""
    if not isinstance(value, dict) or not value:
        raise ValueError(
            gettext("must be a mapping of names to lists of values, got %(got)s")
            % {"got": got(value)}
        )
    grid: dict[str, list[str]] = {}
    found = []
    for key, values in value.items():
        if not isinstance(key, str) or not _IDENTIFIER_RE.fullmatch(key):
            found.append(
                (key, gettext("parameter names must be identifiers, like lr or batch_size"))
            )
        elif not isinstance(values, list) or not values:
            found.append(
                (
                    key,
                    gettext("must be a non-empty list of values, got %(got)s")
                    % {"got": got(values)},
                )
            )
        else:
            grid[key] = []
            for index, item in enumerate(values):
                try:
                    grid[key].append(_scalar_text(item))
                except ValueError as exc:
                    found.append((f"{key}[{index}]", str(exc)))
    count = 1
    for values in grid.values():
        count *= len(values)
    if count > MAX_SWEEP_TASKS:
        found.append(
            (
                "",
                gettext("expands to %(n)s tasks, more than the limit of %(limit)s")
                % {"n": count, "limit": MAX_SWEEP_TASKS},
            )
        )
    if found:
        raise problems((_key_text(key), why) for key, why in found)
    return grid


def _key_text(key: object) -> str:
    return key if isinstance(key, str) else got(key, translate=False)


def _named_by_the_sweep(value: object) -> None:
    raise ValueError(gettext("not allowed in a template: the sweep names its tasks"))


# --- Types ---------------------------------------------------------------------------------------

_NAME_SAYS = gettext_noop(
    "must start with a letter, digit or symbol and hold no spaces, invisible characters or "
    "punctuation other than '.', '_' and '-', got %(got)s"
)
_SLUG_SAYS = gettext_noop(
    "must be lowercase letters, digits, inner '-', at most 63 characters, got %(got)s"
)
_GPU_TYPE_SAYS = gettext_noop(
    "must be lowercase letters, digits, '.', inner '-', at most 63 characters, got %(got)s"
)
_PATTERN_AND_LENGTH = ("string_pattern_mismatch", "string_too_long")

Name = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME, pattern=_whole(NAME)),
    Says.of(_NAME_SAYS, "string_pattern_mismatch"),
]
Queue = Annotated[
    str,
    Field(
        max_length=MAX_QUEUE,
        pattern=_or_empty(NAME),
        description=gettext_noop(
            "Tasks in one queue of a tenant run one at a time, in order. Empty: no queue."
        ),
    ),
    Says.of(_NAME_SAYS, "string_pattern_mismatch"),
]
Percent = Annotated[int, Field(ge=0, le=MAX_PRIORITY)]
Priority = Annotated[
    Percent,
    BeforeValidator(
        _priority_name, json_schema_input_type=Literal["low", "normal", "high"] | Percent
    ),
    Says.of(
        gettext_noop("must be low, normal, high or a whole number 0-100, got %(got)s"),
        *_TYPE_AND_RANGE,
    ),
]
TaskClass = Annotated[
    Literal["batch", "online"],
    Says.of(gettext_noop("must be 'batch' or 'online', got %(got)s"), "literal_error"),
]
Command = Annotated[
    str,
    Field(min_length=1, max_length=MAX_COMMAND_LENGTH),
    AfterValidator(_command),
    Says.of(
        gettext_noop(
            "must be at most %(limit)s characters, got %(n)s; put a long command in a script"
        ),
        "string_too_long",
    ),
]
Workdir = Annotated[str, Field(max_length=MAX_WORKDIR), AfterValidator(_workdir)]
EnvName = Annotated[
    str,
    PlainValidator(
        _env_name, json_schema_input_type=Annotated[str, Field(pattern=_whole(IDENTIFIER))]
    ),
]
EnvValue = Annotated[
    str,
    BeforeValidator(
        _scalar_text,
        json_schema_input_type=Annotated[str, Field(max_length=MAX_ENV_VALUE)] | int | float | bool,
    ),
    Field(max_length=MAX_ENV_VALUE),
    AfterValidator(_check_text),
]
Env = Annotated[
    dict[EnvName, EnvValue],
    Field(max_length=MAX_ENV),
    Says(
        {
            "dict_type": gettext_noop("must be a mapping of names to values, got %(got)s"),
            "too_long": gettext_noop("must have at most %(limit)s entries, got %(n)s"),
        }
    ),
]
# A rule's type is Any: the rule says what it returns (gpus: (low, high)), and pydantic then
# writes the default of the JSON schema as it is given (1, not [1, 1]).
Gpus = Annotated[
    Any,
    PlainValidator(
        _gpus,
        json_schema_input_type=Annotated[int, Field(ge=0, le=MAX_GPUS)]
        | Annotated[str, Field(pattern=_whole(GPU_RANGE))],
    ),
]


def _size(max_mb: int) -> Any:
    """A size as a spec writes it: text with a unit, or a whole number of MiB."""
    return (
        Annotated[str, Field(examples=["24Gi", "20480Mi"])]
        | Annotated[int, Field(ge=1, le=max_mb, json_schema_extra={"x-unit": "MiB"})]
    )


GpuMemory = Annotated[
    Any, PlainValidator(_gpu_memory, json_schema_input_type=_size(MAX_GPU_MEMORY_MB))
]
HostMemory = Annotated[
    Any, PlainValidator(_host_memory, json_schema_input_type=_size(MAX_MEMORY_MB))
]
Slug = Annotated[
    str,
    Field(max_length=MAX_SLUG, pattern=_or_empty(_SLUG)),
    Says.of(_SLUG_SAYS, *_PATTERN_AND_LENGTH),
]
GpuType = Annotated[
    str,
    Field(max_length=MAX_SLUG, pattern=_or_empty(_GPU_TYPE)),
    Says.of(_GPU_TYPE_SAYS, *_PATTERN_AND_LENGTH),
]
Cpus = Annotated[
    float,
    Field(ge=MIN_CPUS, le=MAX_CPUS),
    Says.of(gettext_noop("must be a number of CPUs such as 4 or 0.5, got %(got)s"), "float_type"),
]
Pids = Annotated[
    int,
    Field(ge=1, le=MAX_PIDS),
    Says.of(gettext_noop("must be a whole number of processes, got %(got)s"), "int_type"),
]
Timeout = Annotated[
    Any,
    PlainValidator(
        _timeout,
        json_schema_input_type=Annotated[str, Field(examples=["30m", "6h", "1h30m"])]
        | Annotated[int, Field(ge=1, le=MAX_TIMEOUT_S, json_schema_extra={"x-unit": "s"})],
    ),
]
Retries = Annotated[
    int,
    Field(ge=0, le=MAX_RETRIES),
    Says.of(
        gettext_noop("must be a whole number from 0 to %(high)s, got %(got)s"), *_TYPE_AND_RANGE
    ),
]
Preemptible = Annotated[
    bool, Says.of(gettext_noop("must be true or false, got %(got)s"), "bool_type")
]
TaskRef = Annotated[int, Field(ge=1, le=MAX_TASK_ID)] | Name
After = Annotated[
    Any,
    PlainValidator(
        _after,
        json_schema_input_type=TaskRef | Annotated[list[TaskRef], Field(max_length=MAX_AFTER)],
    ),
]
Scalar = str | int | float | bool
Parameters = Annotated[
    Any,
    PlainValidator(
        _parameters,
        json_schema_input_type=Annotated[
            dict[
                Annotated[str, Field(pattern=_whole(IDENTIFIER))],
                Annotated[list[Scalar], Field(min_length=1)],
            ],
            Field(min_length=1),
        ],
    ),
]


# --- Models --------------------------------------------------------------------------------------


class ResourcesInput(_Spec):
    """What the task needs. Host limits (memory, cpus, pids) are enforced by the attempt's
    cgroup where the node has cgroups."""

    gpus: Gpus = Field(
        default=1,
        validate_default=True,
        description=gettext_noop(
            'GPUs: a number, or a range like "1-4" (takes as many as are free, up to 4); '
            "0 for a task without GPUs."
        ),
    )
    gpu_memory: GpuMemory = Field(
        default=None,
        description=gettext_noop(
            "Memory per GPU, such as 20Gi: lets tasks share a card. Not given: whole GPUs."
        ),
    )
    gpu_type: GpuType = Field(default="", description=gettext_noop("Only GPUs of this type."))
    pool: Slug = Field(default="", description=gettext_noop("Only nodes of this pool."))
    node: Slug = Field(default="", description=gettext_noop("Only this node."))
    memory: HostMemory = Field(default=None, description=gettext_noop("Host memory, such as 64Gi."))
    cpus: Cpus = Field(default=None, description=gettext_noop("CPUs, such as 4 or 0.5."))
    pids: Pids = Field(
        default=None, description=gettext_noop("Processes the task may run at once.")
    )

    @model_validator(mode="after")
    def _gpus_for_gpu_wants(self) -> Self:
        if self.gpus[1] == 0:
            wants = ("gpu_memory", self.gpu_memory), ("gpu_type", self.gpu_type)
            found = [
                (key, gettext("not allowed with gpus: 0 (a CPU-only task)"))
                for key, given in wants
                if given
            ]
            if found:
                raise problems(found)
        return self


class PolicyInput(_Spec):
    """How the task is run, retried and preempted."""

    timeout: Timeout = Field(
        default=None,
        description=gettext_noop("How long an attempt may run, such as 30m or 6h."),
    )
    retries: Retries = Field(
        default=0,
        description=gettext_noop(
            "Failures of the task retried with backoff (infrastructure failures requeue it)."
        ),
    )
    preemptible: Preemptible = Field(
        default=None,
        description=gettext_noop(
            "Whether a task of higher priority may preempt it. "
            "Not given: batch tasks may be, online tasks never."
        ),
    )
    after: After = Field(
        default=(),
        description=gettext_noop("Start only after these tasks succeeded: names or ids."),
    )


class TaskInput(_Spec):
    """One task (``kind: task``, the default)."""

    kind: Annotated[
        Literal["task"],
        Says.of(gettext_noop("must be 'task' or 'sweep', got %(got)s"), "literal_error"),
    ] = Field(default="task", description=gettext_noop("`task` (the default) or `sweep`."))
    name: Name = Field(
        description=gettext_noop(
            "In any script (训练-🚀): no spaces, invisible characters or punctuation but '.', '_' "
            "and '-', which may not lead."
        )
    )
    queue: Queue = ""
    priority: Priority = Field(
        default="normal",
        validate_default=True,
        description=gettext_noop("`low`, `normal`, `high` (10, 50, 90) or a whole number."),
    )
    task_class: TaskClass = Field(
        default="batch",
        alias="class",
        description=gettext_noop(
            "`batch` (may be preempted) or `online` (a service, never preempted)."
        ),
    )
    command: Command = Field(
        description=gettext_noop("Run by `/bin/sh -c` in the working directory.")
    )
    workdir: Workdir = Field(
        default="",
        description=gettext_noop("The working directory, relative to your tenant's directory."),
    )
    env: Env = Field(
        default_factory=dict, description=gettext_noop("Environment variables: `NAME: value`.")
    )
    resources: ResourcesInput = Field(default_factory=ResourcesInput)
    policy: PolicyInput = Field(default_factory=PolicyInput)
    service: ServiceInput = Field(
        default=None,
        description=gettext_noop(
            "Makes the task a service (class `online` unless given): port, health, replicas."
        ),
    )

    @model_validator(mode="after")
    def _online_never_preempted(self) -> Self:
        if self.task_class == "online" and self.policy.preemptible:
            raise problems(
                [
                    (
                        "policy.preemptible",
                        gettext("online tasks are never preempted; use class: batch"),
                    )
                ]
            )
        return self


def _template_schema(schema: dict[str, Any]) -> None:
    for key in ("name", "kind"):
        schema["properties"].pop(key, None)
    schema["required"] = [key for key in schema.get("required", ()) if key not in ("name", "kind")]


class TemplateInput(TaskInput):
    """A sweep's task, without name and kind: the sweep names its tasks. ``{parameter}`` in its
    command, workdir and env values is replaced by each of the parameter's values."""

    model_config = ConfigDict(json_schema_extra=_template_schema)
    refused_even_if_null = frozenset({"name", "kind"})

    kind: Annotated[None, PlainValidator(_named_by_the_sweep)] = None  # type: ignore[assignment]
    name: Annotated[None, PlainValidator(_named_by_the_sweep)] = None  # type: ignore[assignment]


class SweepInput(_Spec):
    """``kind: sweep``: one task for each combination of the parameters' values, named
    ``<name>-0``, ``<name>-1``, ... in parameter then value order."""

    kind: Literal["sweep"] = Field(description=gettext_noop("`sweep`."))
    name: Name = Field(description=gettext_noop("The tasks are named `<name>-0`, `<name>-1`, ..."))
    parameters: Parameters = Field(
        description=gettext_noop(
            "Each parameter's list of values; one task for each combination, "
            "with `{parameter}` in `command`, `workdir` and `env` values replaced."
        ),
        json_schema_extra={"x-maxTasks": MAX_SWEEP_TASKS},
    )
    template: TemplateInput = Field(
        description=gettext_noop("The tasks' keys, as a task's but without `name` and `kind`.")
    )


# --- Checking one value outside a spec -----------------------------------------------------------


class Check:
    """One type of the schema, to check a value outside a spec (a form's priority, a name)."""

    def __init__(self, declared: Any) -> None:
        self.adapter = TypeAdapter(declared, config=ConfigDict(strict=True))
        self.metadata = [
            item
            for given in getattr(declared, "__metadata__", ())
            for item in (given.metadata if isinstance(given, FieldInfo) else [given])
        ]

    def __call__(self, value: object) -> Any:
        """``value`` as the type takes it; ValueError with the reason if it refuses."""
        try:
            return self.adapter.validate_python(value)
        except ValidationError as exc:
            raise ValueError(reason(exc.errors(include_url=False)[0], self.metadata)) from None


check_name = Check(Name)
check_priority = Check(Priority)
