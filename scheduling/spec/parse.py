"""Reading specs: YAML or JSON-like data in, TaskSpecs out, or a SpecError with every problem.

A submission is a task, a sweep, or a list of them (YAML: several documents). Each document is
checked against the schema (scheduling.spec.schema); a problem is reported at its path, the
document's index first when there are several (``[1].resources.gpus``).
"""

import yaml
from django.utils.translation import gettext

from scheduling.spec.errors import Problems, SpecError, at, got
from scheduling.spec.schema import check_name, check_priority
from scheduling.spec.sweep import expand_sweep
from scheduling.spec.task import TaskSpec, task_spec


def parse_spec(data: object) -> TaskSpec:
    """Check one task mapping (kind: task) and return it typed, or raise SpecError."""
    problems = Problems()
    if isinstance(data, dict) and data.get("kind") == "sweep":
        problems.add("kind", gettext("must be 'task' here: a sweep submits several tasks"))
        problems.raise_if_any()
    spec = task_spec(data, problems, "")
    if spec is None:
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


def parse_priority(value: object) -> int:
    """A priority as a spec or a form gives it (low, normal, high or 0-100); ValueError if not."""
    return check_priority(value)


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
    problems = Problems()
    tasks: list[TaskSpec] = []
    alike: dict[str, TaskSpec] = {}
    for index, document in documents:
        path = f"[{index}]" if len(documents) > 1 else ""
        tasks.extend(_document(document, problems, path, alike))
    problems.raise_if_any()
    return tasks


def _document(
    data: object, problems: Problems, path: str, alike: dict[str, TaskSpec]
) -> list[TaskSpec]:
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind is None or kind == "task":
        spec = _task_like(data, problems, path, alike)
        return [] if spec is None else [spec]
    if kind == "sweep":
        return expand_sweep(data, problems, path)
    problems.add(
        at(path, "kind"), gettext("must be 'task' or 'sweep', got %(got)s") % {"got": got(kind)}
    )
    return []


def _task_like(
    data: object, problems: Problems, path: str, alike: dict[str, TaskSpec]
) -> TaskSpec | None:
    """``task_spec``, reusing what an earlier task of the same list that differed only in its
    name parsed to (``alike``, keyed by the rest of the mapping's ``repr``): a list of a
    thousand specs is most often one spec under a thousand names, and checking each in full
    is a large share of the web process's CPU for such a submission (``make bench``).
    ``repr`` tells apart every value JSON and YAML (safe_load) give, types included (``1``,
    ``1.0``, ``True``, ``"1"``), and only a mapping that parsed without problems is reused.
    No field's check depends on the task's own name, which is still checked for each."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return task_spec(data, problems, path)
    key = repr([(k, v) for k, v in data.items() if k != "name"])
    template = alike.get(key)
    if template is None:
        spec = task_spec(data, problems, path)
        if spec is not None:
            alike[key] = spec
        return spec
    try:
        name = check_name(data["name"])
    except ValueError as exc:
        problems.add(at(path, "name"), str(exc))
        return None
    # A copy with its own name: what dataclasses.replace makes (it shares env too), without
    # its field-by-field __init__.
    spec = object.__new__(TaskSpec)
    spec.__dict__.update(template.__dict__, name=name)
    return spec
