"""Task specs: check what users submit (YAML, JSON, the web form) and turn it into typed values.

The API, the CLI, the web form and the tests share one schema (``schema``: pydantic models,
their limits and their reasons) and one set of messages. Nothing here touches the database;
Django is used only for its translations (a problem is worded in the request's language).
Every problem in a spec is collected against its field path (``resources.gpus``,
``[1].policy.after[0]``, ``template.env.LR``) because someone fixing a spec wants the whole
list at once, not one round trip per typo.

- ``schema``: the keys, types, limits and rules, declared once;
- ``parse``: documents (a task, a sweep, a list, YAML) in, TaskSpecs out;
- ``sweep``: a sweep's tasks; ``task``: TaskSpec; ``errors``: the words for problems;
- ``reference``: what the OpenAPI schema, the portal's form and its YAML help read.
"""

from scheduling.spec.errors import SpecError
from scheduling.spec.parse import parse_priority, parse_spec, parse_specs, parse_yaml
from scheduling.spec.schema import (
    MAX_AFTER,
    MAX_COMMAND_LENGTH,
    MAX_CPUS,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_GPU_MEMORY_MB,
    MAX_GPUS,
    MAX_MEMORY_MB,
    MAX_NAME,
    MAX_PIDS,
    MAX_QUEUE,
    MAX_RETRIES,
    MAX_SLUG,
    MAX_SWEEP_TASKS,
    MAX_TASK_ID,
    MAX_TIMEOUT_S,
    MAX_WORKDIR,
    PRIORITIES,
    TASK_CLASSES,
)
from scheduling.spec.task import TaskSpec

__all__ = [
    "MAX_AFTER",
    "MAX_COMMAND_LENGTH",
    "MAX_CPUS",
    "MAX_ENV",
    "MAX_ENV_VALUE",
    "MAX_GPU_MEMORY_MB",
    "MAX_GPUS",
    "MAX_MEMORY_MB",
    "MAX_NAME",
    "MAX_PIDS",
    "MAX_QUEUE",
    "MAX_RETRIES",
    "MAX_SLUG",
    "MAX_SWEEP_TASKS",
    "MAX_TASK_ID",
    "MAX_TIMEOUT_S",
    "MAX_WORKDIR",
    "PRIORITIES",
    "TASK_CLASSES",
    "SpecError",
    "TaskSpec",
    "parse_priority",
    "parse_spec",
    "parse_specs",
    "parse_yaml",
]
