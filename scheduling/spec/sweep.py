"""Sweeps: one task for each combination of the parameters' values, from a template.

The sweep is checked against the schema first (``SweepInput``), its template as written
included, so the template's own mistakes are reported once and without blaming a parameter;
each task is then checked as filled in, which catches what a value brings in
(``template.workdir: must be relative ... (with dir=/etc)``).
"""

import re
from itertools import product

from django.utils.translation import gettext
from pydantic import ValidationError

from scheduling.spec.errors import Problems, at, got, short
from scheduling.spec.schema import MAX_NAME, SweepInput
from scheduling.spec.task import TaskSpec, task_spec

# Only {identifier}; shell's ${HOME} matches too, but is replaced only when HOME is a parameter.
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_sweep(data: dict, problems: Problems, path: str) -> list[TaskSpec]:
    """The sweep's tasks, or none with its problems added."""
    try:
        sweep = SweepInput.model_validate(data)
    except ValidationError as exc:
        problems.add_invalid(path, exc, SweepInput)
        return []
    name, grid = sweep.name, sweep.parameters
    template_path = at(path, "template")
    template = data["template"]
    combinations = list(product(*grid.values()))
    last_name = f"{name}-{len(combinations) - 1}"
    if len(last_name) > MAX_NAME:
        problems.add(
            at(path, "name"),
            gettext("too long: task names like %(example)s would pass %(limit)s characters")
            % {"example": got(last_name), "limit": MAX_NAME},
        )
        return []
    tasks = []
    for index, values in enumerate(combinations):
        bound = dict(zip(grid, values, strict=True))
        expanded = Problems()
        spec = task_spec(_fill(template, bound, f"{name}-{index}"), expanded, template_path)
        if spec is None:
            with_values = short(", ".join(f"{key}={value}" for key, value in bound.items()))
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
