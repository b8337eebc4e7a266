"""What is read from the spec's schema instead of written again: the portal form's limits, the
OpenAPI schema of a submission and the YAML editor's help all say what the schema says."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.forms import TaskForm
from scheduling.spec import (
    MAX_AFTER,
    MAX_COMMAND_LENGTH,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_GPUS,
    MAX_NAME,
    MAX_QUEUE,
    MAX_RETRIES,
    MAX_SLUG,
    MAX_WORKDIR,
    parse_spec,
)
from scheduling.spec.reference import help_rows, max_length
from scheduling.spec.schema import PolicyInput, ResourcesInput, SweepInput, TaskInput
from scheduling.spec.service import HealthInput, ServiceInput

# Form field -> the spec's key it fills, for every form field the schema limits in length.
FORM_KEYS = {
    "name": "name",
    "command": "command",
    "queue": "queue",
    "workdir": "workdir",
}  # GPU type and pool are choices from the inventory (the spec still refuses a long one)


def schema_property(path: str) -> dict:
    """A task key's JSON schema as pydantic writes it from the models (validation mode)."""
    *parents, key = path.split(".")
    model = TaskInput
    for parent in parents:
        model = {"resources": ResourcesInput, "policy": PolicyInput}[parent]
    return model.model_json_schema(mode="validation")["properties"][key]


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        ("name", MAX_NAME),
        ("command", MAX_COMMAND_LENGTH),
        ("queue", MAX_QUEUE),
        ("workdir", MAX_WORKDIR),
        ("resources.gpu_type", MAX_SLUG),
        ("resources.pool", MAX_SLUG),
    ],
)
def test_the_schema_declares_each_length_limit_once(path: str, limit: int):
    assert max_length(path) == schema_property(path)["maxLength"] == limit
    parse_spec({"name": "n", "command": "c", **nested(path, "a" * limit)})
    assert path in refusal({"name": "n", "command": "c", **nested(path, "a" * (limit + 1))})


def nested(path: str, value: object) -> dict:
    *parents, key = path.split(".")
    data: dict = {key: value}
    for parent in reversed(parents):
        data = {parent: data}
    return data


def refusal(data: dict) -> dict:
    from scheduling.spec import SpecError

    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    return caught.value.errors


@pytest.mark.parametrize(("field", "path"), FORM_KEYS.items())
def test_the_task_forms_length_limits_are_the_schemas(field: str, path: str):
    assert TaskForm.base_fields[field].max_length == schema_property(path)["maxLength"]


def test_the_task_form_has_no_length_limit_the_schema_lacks():
    limited = {n for n, field in TaskForm.base_fields.items() if getattr(field, "max_length", None)}
    assert limited == set(FORM_KEYS)


@pytest.mark.django_db
def test_the_openapi_schema_of_a_submission_is_the_specs():
    schema = APIClient().get("/api/v1/schema/", {"format": "json"}).json()
    body = schema["paths"]["/api/v1/tasks/"]["post"]["requestBody"]["content"]
    components = schema["components"]["schemas"]
    submission = components[body["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]]
    refs = {branch.get("$ref") for branch in submission["anyOf"]}
    assert {"#/components/schemas/TaskInput", "#/components/schemas/SweepInput"} <= refs
    task = components["TaskInput"]["properties"]
    resources = components["ResourcesInput"]["properties"]
    policy = components["PolicyInput"]["properties"]

    assert task["name"]["maxLength"] == MAX_NAME
    assert task["command"]["maxLength"] == MAX_COMMAND_LENGTH
    assert task["queue"]["maxLength"] == MAX_QUEUE
    assert task["workdir"]["maxLength"] == MAX_WORKDIR
    assert task["env"]["maxProperties"] == MAX_ENV
    assert task["env"]["additionalProperties"]["maxLength"] == MAX_ENV_VALUE
    assert {"low", "normal", "high"} <= {
        value for branch in task["priority"]["anyOf"] for value in branch.get("enum", ())
    }
    assert [b["maximum"] for b in resources["gpus"]["anyOf"] if "maximum" in b] == [MAX_GPUS]
    assert resources["pool"]["maxLength"] == resources["gpu_type"]["maxLength"] == MAX_SLUG
    assert policy["retries"]["maximum"] == MAX_RETRIES
    assert [b["maxItems"] for b in policy["after"]["anyOf"] if "maxItems" in b] == [MAX_AFTER]
    assert set(components["TaskInput"]["required"]) == {"name", "command"}
    assert "name" not in components["TemplateInput"]["properties"]
    # Every key of the models is in the API's schema, as the models write it.
    for model in (TaskInput, ResourcesInput, PolicyInput, SweepInput):
        assert set(components[model.__name__]["properties"]) == {
            field.alias or name for name, field in model.model_fields.items()
        }


def test_the_yaml_help_has_a_row_for_every_key_with_the_schemas_limits():
    task_rows, sweep_rows = help_rows()
    rows = {row.key: row for row in task_rows}

    expected = {
        *(field.alias or name for name, field in TaskInput.model_fields.items()),
        *(f"resources.{name}" for name in ResourcesInput.model_fields),
        *(f"policy.{name}" for name in PolicyInput.model_fields),
        *(f"service.{name}" for name in ServiceInput.model_fields),
        *(f"service.health.{name}" for name in HealthInput.model_fields),
    } - {"resources", "policy", "service", "service.health"}
    assert set(rows) == expected
    assert [row.key for row in sweep_rows] == ["kind", "name", "parameters", "template"]
    assert all(row.description for row in [*task_rows, *sweep_rows])
    assert rows["name"].required and rows["command"].required
    assert rows["name"].limits == f"at most {MAX_NAME} characters"
    assert rows["resources.gpus"].limits == f"0 to {MAX_GPUS}"
    assert rows["resources.gpus"].default == "1"
    assert rows["resources.gpu_memory"].limits == "at most 1 TiB"
    assert rows["policy.timeout"].limits == "at most 365d"
    assert rows["policy.after"].limits == f"at most {MAX_AFTER} of them"
    assert rows["env"].limits == (
        f"at most {MAX_ENV} entries; values at most {MAX_ENV_VALUE} characters"
    )
    assert rows["class"].default == "batch"
    assert rows["service.port"].default == "auto"
    assert rows["service.replicas"].limits == "1 to 16"
    assert rows["service.health.path"].required
