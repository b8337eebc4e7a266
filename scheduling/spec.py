"""Task specs: check what users submit (YAML, JSON, the web form) and turn it into typed values.

Pure on purpose (no Django): the API, the CLI, the web form and the tests share one set of rules
and one set of messages. Every problem in a spec is collected against its field path
(``resources.gpus``, ``[1].policy.after[0]``, ``template.env.LR``) because someone fixing a spec
wants the whole list at once, not one round trip per typo.

The limits below keep one submission from costing more than a page of YAML should, and keep
values inside what the Task columns hold.
"""

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import yaml
from django.utils.translation import gettext, gettext_lazy

from gpuplatform.errors import FieldErrors
from gpuplatform.units import format_duration_s, parse_duration_s, parse_memory_mb

MAX_COMMAND_LENGTH = 16384  # characters; anything longer belongs in a script in the workdir
MAX_ENV = 100  # entries in env
MAX_ENV_VALUE = 8192  # characters in one env value
MAX_NAME = 200  # characters in a task name (Task.name)
MAX_QUEUE = 100  # characters in a queue name (Task.queue)
MAX_WORKDIR = 1024  # characters in a workdir (Task.workdir)
MAX_SWEEP_TASKS = 1000  # tasks one sweep may expand to
MAX_GPUS = 64  # GPUs one task may ask for
MAX_GPU_MEMORY_MB = 1024 * 1024  # 1 TiB per GPU: no card comes near, so more is a typo
MAX_MEMORY_MB = 64 * 1024 * 1024  # 64 TiB of host memory: more is a typo
MAX_CPUS = 1024
MAX_PIDS = 4_194_304  # the kernel's own pid_max ceiling
MAX_TIMEOUT_S = 365 * 86400  # a year; longer is a typo, and stays inside Task.timeout_s
MAX_RETRIES = 10
MAX_AFTER = 50  # tasks one task may wait for
MAX_TASK_ID = 2**63 - 1  # BigAutoField

PRIORITIES = {"low": 10, "normal": 50, "high": 90}
TASK_CLASSES = ("batch", "online")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SLUG_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_GPU_TYPE_RE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?")
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# At most four digits each side, so a pasted million-digit number never reaches int().
_GPUS_RE = re.compile(r"\s*([0-9]{1,4})\s*(?:-\s*([0-9]{1,4})\s*)?")
# Only {identifier}; shell's ${HOME} matches too, but is replaced only when HOME is a parameter.
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

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
_RESERVED_PREFIXES = {"LD_": _LOADER, "DYLD_": _LOADER, "GPUPLATFORM_": _PLATFORM}
_RESERVED_NAMES = {
    "IFS": gettext_lazy("changes how the shell splits the command into words"),
    **dict.fromkeys(["BASH_ENV", "ENV"], _SHELL),
    **dict.fromkeys(["PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME"], _INTERPRETER),
    **dict.fromkeys(["PERL5LIB", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS"], _INTERPRETER),
    **dict.fromkeys(["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"], _GPU),
    **dict.fromkeys(["DATABASE_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"], _PLATFORM),
}

_TASK_KEYS = tuple("kind name queue priority class command workdir env resources policy".split())
_RESOURCE_KEYS = ("gpus", "gpu_memory", "gpu_type", "pool", "node", "memory", "cpus", "pids")
_POLICY_KEYS = ("timeout", "retries", "preemptible", "after")
_SWEEP_KEYS = ("kind", "name", "parameters", "template")


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """One task, checked and normalised; the fields map onto scheduling.models.Task."""

    name: str
    command: str
    queue: str = ""
    priority: int = PRIORITIES["normal"]
    task_class: str = "batch"
    preemptible: bool = True
    workdir: str = ""  # normalised relative POSIX path; "" is the tenant's root
    env: dict[str, str] = field(default_factory=dict)
    gpus_min: int = 1
    gpus_max: int = 1
    gpu_memory_mb: int | None = None
    gpu_type: str = ""
    pool: str = ""
    node: str = ""
    # Host limits, enforced by the attempt's cgroup where the node has cgroups.
    memory_mb: int | None = None
    cpus: float | None = None
    pids: int | None = None
    timeout_s: int | None = None
    retries: int = 0
    after: tuple[str | int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The normalised spec as JSON-able data; parse_spec() reads it back to an equal spec."""
        gpus = (
            self.gpus_min if self.gpus_min == self.gpus_max else f"{self.gpus_min}-{self.gpus_max}"
        )
        memory = self.gpu_memory_mb
        return {
            "kind": "task",
            "name": self.name,
            "queue": self.queue,
            "priority": self.priority,
            "class": self.task_class,
            "command": self.command,
            "workdir": self.workdir,
            "env": dict(self.env),
            "resources": {
                "gpus": gpus,
                # Gi or Mi, never a rounded "24.0 GiB": the stored spec must read back exactly.
                "gpu_memory": None
                if memory is None
                else (f"{memory // 1024}Gi" if memory % 1024 == 0 else f"{memory}Mi"),
                "gpu_type": self.gpu_type,
                "pool": self.pool,
                "node": self.node,
                "memory": None if self.memory_mb is None else f"{self.memory_mb}Mi",
                "cpus": self.cpus,
                "pids": self.pids,
            },
            "policy": {
                "timeout": None if self.timeout_s is None else format_duration_s(self.timeout_s),
                "retries": self.retries,
                "preemptible": self.preemptible,
                "after": list(self.after),
            },
        }


class SpecError(FieldErrors):
    """A spec with problems: ``errors`` maps each field path to the reasons, in the order found."""


def parse_spec(data: object) -> TaskSpec:
    """Check one task mapping (kind: task) and return it typed, or raise SpecError."""
    problems = _Problems()
    if isinstance(data, dict) and data.get("kind") == "sweep":
        problems.add("kind", gettext("must be 'task' here: a sweep submits several tasks"))
    spec = None if problems else _task(data, problems, "")
    if spec is None or problems:
        raise SpecError(problems.errors)
    return spec


def parse_specs(data: object) -> list[TaskSpec]:
    """Check a task, a sweep, or a list of them; return every task, sweeps expanded."""
    documents = data if isinstance(data, list) else [data]
    return _parse_documents(list(enumerate(documents)))


def parse_yaml(text: str) -> list[TaskSpec]:
    """Check YAML text holding one or more documents (``---``); empty documents are skipped."""
    try:
        loaded = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise SpecError({"yaml": [_yaml_problem(exc, text)]}) from exc
    except RecursionError as exc:
        raise SpecError({"yaml": [gettext("nested too deeply")]}) from exc
    documents = [(index, doc) for index, doc in enumerate(loaded) if doc is not None]
    if len(documents) == 1:
        return parse_specs(documents[0][1])  # a single document may itself be a list of tasks
    return _parse_documents(documents)


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        line, column, problem = mark.line + 1, mark.column + 1, getattr(exc, "problem", exc)
    elif isinstance(exc, yaml.reader.ReaderError):  # a bad character: only an offset is known
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        problem = gettext("unacceptable character #x%(code)04x: %(reason)s") % {
            "code": exc.character,
            "reason": exc.reason,
        }
    else:
        return " ".join(str(exc).split())
    return gettext("line %(line)d, column %(column)d: %(problem)s") % {
        "line": line,
        "column": column,
        "problem": problem,
    }


def _parse_documents(documents: list[tuple[int, object]]) -> list[TaskSpec]:
    if not documents:
        raise SpecError({"spec": [gettext("no tasks: expected a task, a sweep or a list of them")]})
    problems = _Problems()
    tasks: list[TaskSpec] = []
    alike: dict[str, TaskSpec] = {}
    for index, document in documents:
        path = f"[{index}]" if len(documents) > 1 else ""
        tasks.extend(_document(document, problems, path, alike))
    problems.raise_if_any()
    return tasks


def _document(
    data: object, problems: "_Problems", path: str, alike: dict[str, TaskSpec]
) -> list[TaskSpec]:
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind is None or kind == "task":
        spec = _task_like(data, problems, path, alike)
        return [] if spec is None else [spec]
    if kind == "sweep":
        return _sweep(data, problems, path)
    problems.add(
        _at(path, "kind"), gettext("must be 'task' or 'sweep', got %(got)s") % {"got": _got(kind)}
    )
    return []


class _Problems:
    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}
        self.count = 0  # every add, repeats included, so "did this part add any?" is exact

    def __len__(self) -> int:
        return self.count

    def add(self, path: str, reason: str) -> None:
        self.count += 1
        reasons = self.errors.setdefault(path or "spec", [])
        if reason not in reasons:
            reasons.append(reason)

    def raise_if_any(self) -> None:
        if self.errors:
            raise SpecError(self.errors)


class _Reader:
    """Reads fields of one mapping; a field's parser raises ValueError with the reason."""

    def __init__(self, data: dict, path: str, problems: _Problems) -> None:
        self.data, self.path, self.problems = data, path, problems

    def get(self, key: str, parse: Callable[[Any], Any], default: Any, *, required: bool = False):
        # None is "not given": YAML writes an empty field (`env:`) as null.
        value = self.data.get(key)
        if value is None:
            if required:
                self.problems.add(_at(self.path, key), gettext("is required"))
            return default
        try:
            return parse(value)
        except ValueError as exc:
            self.problems.add(_at(self.path, key), str(exc))
            return default


def _at(path: str, key: object) -> str:
    # A field path is the same in every language: the words for an odd key stay English.
    key_text = key if isinstance(key, str) else _got(key, translate=False)
    return f"{path}.{key_text}" if path else key_text


def _got(value: object, *, translate: bool = True) -> str:
    words = gettext if translate else str
    if isinstance(value, dict):
        return words("a mapping")
    if isinstance(value, list | tuple):
        return words("a list")
    try:
        return _short(repr(value))
    except ValueError:  # an int too long to print
        return f"a {type(value).__name__}"


# Reasons several fields share, translated when the problem is found (the request's language).
def _at_most_characters() -> str:
    return gettext("must be at most %(limit)s characters, got %(n)s")


def _from_to() -> str:
    return gettext("must be from %(low)s to %(high)s, got %(got)s")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mapping(value: object, problems: _Problems, path: str, allowed: tuple) -> dict | None:
    if not isinstance(value, dict):
        problems.add(path, gettext("must be a mapping, got %(got)s") % {"got": _got(value)})
        return None
    for key in value:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1) if isinstance(key, str) else []
            hint = (
                gettext("did you mean %(key)r?") % {"key": close[0]}
                if close
                else gettext("expected one of %(keys)s") % {"keys": ", ".join(allowed)}
            )
            problems.add(_at(path, key), gettext("unknown key; %(hint)s") % {"hint": hint})
    return value


def _task_like(
    data: object, problems: _Problems, path: str, alike: dict[str, TaskSpec]
) -> TaskSpec | None:
    """``_task``, reusing what an earlier task of the same list that differed only in its name
    parsed to (``alike``, keyed by the rest of the mapping's ``repr``): a list of a thousand
    specs is most often one spec under a thousand names, and checking each in full was much
    of the web process's CPU for such a submission.
    ``repr`` tells apart every value JSON and YAML (safe_load) give, types included (``1``,
    ``1.0``, ``True``, ``"1"``), and only a mapping that parsed without problems is reused.
    No field's check depends on the task's own name, which is still checked for each."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return _task(data, problems, path)
    key = repr([(k, v) for k, v in data.items() if k != "name"])
    template = alike.get(key)
    if template is None:
        spec = _task(data, problems, path)
        if spec is not None:
            alike[key] = spec
        return spec
    name = _Reader(data, path, problems).get("name", _name, None)
    if name is None:
        return None
    # A copy with its own name: what dataclasses.replace makes (it shares env too), without
    # its field-by-field __init__, which costs far more per task.
    spec = object.__new__(TaskSpec)
    spec.__dict__.update(template.__dict__, name=name)
    return spec


def _task(data: object, problems: _Problems, path: str) -> TaskSpec | None:
    found = len(problems)
    spec = _mapping(data, problems, path, _TASK_KEYS)
    if spec is None:
        return None
    read = _Reader(spec, path, problems)
    name = read.get("name", _name, "", required=True)
    task_class = read.get("class", _task_class, "batch")
    fields = {
        "name": name,
        "queue": read.get("queue", _queue, ""),
        "priority": read.get("priority", _priority, PRIORITIES["normal"]),
        "task_class": task_class,
        "command": read.get("command", _command, "", required=True),
        "workdir": read.get("workdir", _workdir, ""),
        "env": _env(spec.get("env"), problems, _at(path, "env")),
        **_resources(spec.get("resources"), problems, _at(path, "resources")),
        **_policy(spec.get("policy"), problems, _at(path, "policy"), task_class),
    }
    return None if len(problems) > found else TaskSpec(**fields)


def _string(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        raise ValueError(
            gettext("must be a string, got %(got)s; put it in quotes") % {"got": _got(value)}
        )
    raise ValueError(gettext("must be a string, got %(got)s") % {"got": _got(value)})


def _name(value: object, limit: int = MAX_NAME) -> str:
    text = _string(value)
    if not text:
        raise ValueError(gettext("must not be empty"))
    if len(text) > limit:
        raise ValueError(_at_most_characters() % {"limit": limit, "n": len(text)})
    if not _NAME_RE.fullmatch(text):
        raise ValueError(
            gettext(
                "must start with a letter or digit and hold only letters, digits, '.', '_' and "
                "'-', got %(got)s"
            )
            % {"got": _got(text)}
        )
    return text


def _queue(value: object) -> str:
    # "" means no queue, as a blank web form field sends it.
    return "" if value == "" else _name(value, MAX_QUEUE)


def parse_priority(value: object) -> int:
    """A priority as a spec or a form gives it (low, normal, high or 0-100); ValueError if not."""
    return _priority(value)


def _priority(value: object) -> int:
    if isinstance(value, str) and value in PRIORITIES:
        return PRIORITIES[value]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 100:
        return value
    raise ValueError(
        gettext("must be low, normal, high or a whole number 0-100, got %(got)s")
        % {"got": _got(value)}
    )


def _task_class(value: object) -> str:
    if value not in TASK_CLASSES:
        raise ValueError(gettext("must be 'batch' or 'online', got %(got)s") % {"got": _got(value)})
    return str(value)


def _check_text(text: str) -> None:
    """What PostgreSQL cannot store: NUL, and lone surrogates (JSON's "\\ud800" decodes to
    one; it has no UTF-8 form), refused here as bad input rather than failing the INSERT."""
    if "\0" in text:
        raise ValueError(gettext("must not contain NUL bytes"))
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            bad = text[exc.start : exc.end]
            raise ValueError(
                gettext("must be valid Unicode text, got a lone surrogate %(bad)r") % {"bad": bad}
            ) from None


def _command(value: object) -> str:
    text = _string(value)
    if not text.strip():
        raise ValueError(gettext("must not be empty"))
    _check_text(text)
    if len(text) > MAX_COMMAND_LENGTH:
        raise ValueError(
            gettext(
                "must be at most %(limit)s characters, got %(n)s; put a long command in a script"
            )
            % {"limit": MAX_COMMAND_LENGTH, "n": len(text)}
        )
    return text


def _workdir(value: object) -> str:
    text = _string(value)
    _check_text(text)
    if len(text) > MAX_WORKDIR:
        raise ValueError(_at_most_characters() % {"limit": MAX_WORKDIR, "n": len(text)})
    if text.startswith("/"):
        raise ValueError(
            gettext("must be relative to your tenant's root directory, got %(got)s")
            % {"got": _got(text)}
        )
    parts = [part for part in text.split("/") if part not in ("", ".")]
    # Checked on the parts, not the text: "a/../../b" and "a/.." both climb.
    if ".." in parts:
        raise ValueError(
            gettext("must not contain '..': a task stays inside your tenant's root directory")
        )
    if any(part.startswith("~") for part in parts):
        raise ValueError(
            gettext("must not use '~' (a home directory), got %(got)s") % {"got": _got(text)}
        )
    return "/".join(parts)


def _scalar_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(
        gettext("must be a string, number or boolean, got %(got)s") % {"got": _got(value)}
    )


def _env(value: object, problems: _Problems, path: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(
            path,
            gettext("must be a mapping of names to values, got %(got)s") % {"got": _got(value)},
        )
        return {}
    if len(value) > MAX_ENV:
        problems.add(
            path,
            gettext("must have at most %(limit)s entries, got %(n)s")
            % {"limit": MAX_ENV, "n": len(value)},
        )
        return {}
    env = {}
    for key, raw in value.items():
        try:
            env[_env_name(key)] = _env_value(raw)
        except ValueError as exc:
            problems.add(_at(path, key), str(exc))
    return env


def _env_name(key: object) -> str:
    if not isinstance(key, str) or not _IDENTIFIER_RE.fullmatch(key):
        raise ValueError(
            gettext("is not a valid variable name (like MY_VAR), got %(got)s") % {"got": _got(key)}
        )
    # Compared in upper case: no one needs a lower-case ld_preload, and refusing it costs nothing.
    upper = key.upper()
    reason = _RESERVED_NAMES.get(upper) or next(
        (why for prefix, why in _RESERVED_PREFIXES.items() if upper.startswith(prefix)), None
    )
    if reason:
        raise ValueError(gettext("cannot be set: it %(reason)s") % {"reason": reason})
    return key


def _env_value(value: object) -> str:
    text = _scalar_text(value)
    _check_text(text)
    if len(text) > MAX_ENV_VALUE:
        raise ValueError(_at_most_characters() % {"limit": MAX_ENV_VALUE, "n": len(text)})
    return text


def _resources(value: object, problems: _Problems, path: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"gpus_min": 1, "gpus_max": 1, "gpu_memory_mb": None}
    fields.update(gpu_type="", pool="", node="", memory_mb=None, cpus=None, pids=None)
    data = None if value is None else _mapping(value, problems, path, _RESOURCE_KEYS)
    if data is None:
        return fields
    read = _Reader(data, path, problems)
    fields["gpus_min"], fields["gpus_max"] = read.get("gpus", _gpus, (1, 1))
    fields["gpu_memory_mb"] = read.get("gpu_memory", _gpu_memory, None)
    fields["gpu_type"] = read.get("gpu_type", _slug(_GPU_TYPE_RE, dots=True), "")
    fields["pool"] = read.get("pool", _slug(_SLUG_RE), "")
    fields["node"] = read.get("node", _slug(_SLUG_RE), "")
    fields["memory_mb"] = read.get("memory", _host_memory, None)
    fields["cpus"] = read.get("cpus", _cpus, None)
    fields["pids"] = read.get("pids", _pids, None)
    if fields["gpus_max"] == 0:
        for key, given in (
            ("gpu_memory", fields["gpu_memory_mb"]),
            ("gpu_type", fields["gpu_type"]),
        ):
            if given:
                problems.add(_at(path, key), gettext("not allowed with gpus: 0 (a CPU-only task)"))
    return fields


def _gpus(value: object) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        low, high, ranged = value, value, False
    elif isinstance(value, str) and (match := _GPUS_RE.fullmatch(value)):
        low, ranged = int(match[1]), match[2] is not None
        high = int(match[2]) if ranged else low
    else:
        # Worded only when needed: translating it for every good spec was a real share of a
        # large submission's CPU.
        raise ValueError(
            gettext('must be a whole number of GPUs or a range like "1-4", got %(got)s')
            % {"got": _got(value)}
        )
    if not 0 <= low <= MAX_GPUS or not 0 <= high <= MAX_GPUS:
        raise ValueError(_from_to() % {"low": 0, "high": MAX_GPUS, "got": _got(value)})
    if ranged and not 1 <= low <= high:
        raise ValueError(
            gettext('a range must go from at least 1 up, like "1-4", got %(got)s')
            % {"got": _got(value)}
        )
    return low, high


def _host_memory(value: object) -> int:
    mb = parse_memory_mb(value, field="")
    if mb > MAX_MEMORY_MB:
        raise ValueError(gettext("must be at most 64Ti, got %(got)s") % {"got": _got(value)})
    return mb


def _cpus(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            gettext("must be a number of CPUs such as 4 or 0.5, got %(got)s") % {"got": _got(value)}
        )
    if not 0.01 <= value <= MAX_CPUS:
        raise ValueError(_from_to() % {"low": 0.01, "high": MAX_CPUS, "got": _got(value)})
    return float(value)


def _pids(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            gettext("must be a whole number of processes, got %(got)s") % {"got": _got(value)}
        )
    if not 1 <= value <= MAX_PIDS:
        raise ValueError(_from_to() % {"low": 1, "high": MAX_PIDS, "got": _got(value)})
    return value


def _gpu_memory(value: object) -> int:
    mb = parse_memory_mb(value, field="")
    if mb > MAX_GPU_MEMORY_MB:
        raise ValueError(gettext("must be at most 1Ti per GPU, got %(got)s") % {"got": _got(value)})
    return mb


def _slug(pattern: re.Pattern, dots: bool = False) -> Callable[[object], str]:
    def parse(value: object) -> str:
        text = _string(value)
        if text and not pattern.fullmatch(text):
            if dots:
                problem = gettext(
                    "must be lowercase letters, digits, '.', inner '-', at most 63 characters, "
                    "got %(got)s"
                )
            else:
                problem = gettext(
                    "must be lowercase letters, digits, inner '-', at most 63 characters, "
                    "got %(got)s"
                )
            raise ValueError(problem % {"got": _got(text)})
        return text

    return parse


def _policy(value: object, problems: _Problems, path: str, task_class: str) -> dict[str, Any]:
    online = task_class == "online"
    fields: dict[str, Any] = {"timeout_s": None, "retries": 0, "preemptible": not online}
    fields["after"] = ()
    data = None if value is None else _mapping(value, problems, path, _POLICY_KEYS)
    if data is None:
        return fields
    read = _Reader(data, path, problems)
    fields["timeout_s"] = read.get("timeout", _timeout, None)
    fields["retries"] = read.get("retries", _retries, 0)
    fields["preemptible"] = read.get("preemptible", _bool, not online)
    if online and fields["preemptible"]:
        problems.add(
            _at(path, "preemptible"), gettext("online tasks are never preempted; use class: batch")
        )
    fields["after"] = _after(data.get("after"), problems, _at(path, "after"))
    return fields


def _timeout(value: object) -> int:
    seconds = parse_duration_s(value, field="")
    if seconds > MAX_TIMEOUT_S:
        raise ValueError(gettext("must be at most 365d, got %(got)s") % {"got": _got(value)})
    return seconds


def _retries(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_RETRIES:
        return value
    raise ValueError(
        gettext("must be a whole number from 0 to %(high)s, got %(got)s")
        % {"high": MAX_RETRIES, "got": _got(value)}
    )


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(gettext("must be true or false, got %(got)s") % {"got": _got(value)})


def _after(value: object, problems: _Problems, path: str) -> tuple[str | int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_AFTER:
        problems.add(
            path,
            gettext("may name at most %(limit)s tasks, got %(n)s")
            % {"limit": MAX_AFTER, "n": len(items)},
        )
        return ()
    refs: list[str | int] = []
    for index, item in enumerate(items):
        item_path = f"{path}[{index}]" if isinstance(value, list) else path
        try:
            ref = _task_ref(item)
        except ValueError as exc:
            problems.add(item_path, str(exc))
            continue
        if ref in refs:
            problems.add(item_path, gettext("duplicate %(ref)r") % {"ref": ref})
        else:
            refs.append(ref)
    return tuple(refs)


def _task_ref(value: object) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_TASK_ID:
            raise ValueError(
                gettext("must be a positive task id, got %(got)s") % {"got": _got(value)}
            )
        return value
    if isinstance(value, str):
        return _name(value)
    raise ValueError(gettext("must be a task name or id, got %(got)s") % {"got": _got(value)})


def _sweep(data: dict, problems: _Problems, path: str) -> list[TaskSpec]:
    found = len(problems)
    _mapping(data, problems, path, _SWEEP_KEYS)
    name = _Reader(data, path, problems).get("name", _name, "sweep", required=True)
    grid = _parameters(data.get("parameters"), problems, _at(path, "parameters"))
    template_path = _at(path, "template")
    template = _template(data.get("template"), problems, template_path)
    # The template is checked once as written, so its own mistakes are reported once and
    # without blaming a parameter; the expansions below catch what a value brings in.
    if template is not None:
        _task({**template, "name": name}, problems, template_path)
    if len(problems) > found or template is None:
        return []
    combinations = list(product(*grid.values()))
    last_name = f"{name}-{len(combinations) - 1}"
    if len(last_name) > MAX_NAME:
        problems.add(
            _at(path, "name"),
            gettext("too long: task names like %(example)s would pass %(limit)s characters")
            % {"example": _got(last_name), "limit": MAX_NAME},
        )
        return []
    tasks = []
    for index, values in enumerate(combinations):
        bound = dict(zip(grid, values, strict=True))
        expanded = _Problems()
        spec = _task(_fill(template, bound, f"{name}-{index}"), expanded, template_path)
        if spec is None:
            with_values = _short(", ".join(f"{key}={value}" for key, value in bound.items()))
            for where, reasons in expanded.errors.items():
                for reason in reasons:
                    problems.add(
                        where,
                        gettext("%(reason)s (with %(values)s)")
                        % {"reason": reason, "values": with_values},
                    )
            return []
        tasks.append(spec)
    return tasks


def _template(value: object, problems: _Problems, path: str) -> dict | None:
    if value is None:
        problems.add(path, gettext("is required"))
        return None
    if not isinstance(value, dict):
        problems.add(path, gettext("must be a mapping, got %(got)s") % {"got": _got(value)})
        return None
    for key in ("name", "kind"):
        if key in value:
            problems.add(
                _at(path, key), gettext("not allowed in a template: the sweep names its tasks")
            )
    return {key: item for key, item in value.items() if key not in ("name", "kind")}


def _parameters(value: object, problems: _Problems, path: str) -> dict[str, list[str]]:
    if value is None:
        problems.add(path, gettext("is required"))
        return {}
    if not isinstance(value, dict) or not value:
        problems.add(
            path,
            gettext("must be a mapping of names to lists of values, got %(got)s")
            % {"got": _got(value)},
        )
        return {}
    grid = {}
    for key, values in value.items():
        key_path = _at(path, key)
        if not isinstance(key, str) or not _IDENTIFIER_RE.fullmatch(key):
            problems.add(
                key_path, gettext("parameter names must be identifiers, like lr or batch_size")
            )
        elif not isinstance(values, list) or not values:
            problems.add(
                key_path,
                gettext("must be a non-empty list of values, got %(got)s") % {"got": _got(values)},
            )
        else:
            grid[key] = [
                _parameter_value(value, problems, f"{key_path}[{i}]")
                for i, value in enumerate(values)
            ]
    count = math.prod(len(values) for values in grid.values())
    if count > MAX_SWEEP_TASKS:
        problems.add(
            path,
            gettext("expands to %(n)s tasks, more than the limit of %(limit)s")
            % {"n": count, "limit": MAX_SWEEP_TASKS},
        )
    return grid


def _parameter_value(value: object, problems: _Problems, path: str) -> str:
    try:
        return _scalar_text(value)
    except ValueError as exc:
        problems.add(path, str(exc))
        return ""


def _fill(template: dict, bound: dict[str, str], name: str) -> dict:
    """The template with {param} placeholders filled in command, workdir and env values."""

    def fill(value: object) -> object:
        if not isinstance(value, str):
            return value
        # Unknown names are left as written, so shell's ${HOME} or a JSON literal survives.
        return _PLACEHOLDER_RE.sub(lambda match: bound.get(match[1], match[0]), value)

    task = {**template, "name": name}
    for key in ("command", "workdir"):
        task[key] = fill(template.get(key))
    if isinstance(template.get("env"), dict):
        task["env"] = {key: fill(value) for key, value in template["env"].items()}
    return task
