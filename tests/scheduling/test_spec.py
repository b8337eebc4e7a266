"""Task specs: the DESIGN.md example parses, each rule accepts and refuses, problems add up."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.spec import (
    MAX_AFTER,
    MAX_COMMAND_LENGTH,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_NAME,
    MAX_SWEEP_TASKS,
    SpecError,
    TaskSpec,
    parse_priority,
    parse_spec,
    parse_specs,
    parse_yaml,
)

DESIGN_EXAMPLE = """
kind: task
name: qwen-sft
queue: sft                 # optional: tasks in one queue of a tenant run one at a time, in order
priority: high             # low | normal | high (10 / 50 / 90) or 0-100
class: batch               # batch (preemptible by default) | online (services, never preempted)
command: python train.py --epochs 3     # run by /bin/sh -c in workdir
workdir: projects/qwen     # relative to the tenant's root directory
env: {HF_HOME: /data/hf}
resources:
  gpus: 2                  # or "1-4": elastic, takes as many as are free up to 4
  gpu_memory: 20Gi         # per GPU, lets tasks share a card; omitted = whole GPUs, exclusive
  gpu_type: rtx4090-24g    # optional
  pool: training           # optional
policy:
  timeout: 6h
  retries: 2               # user failures retried with backoff; infrastructure failures requeue
  preemptible: true
  after: [prep-data]       # start only after these succeeded
"""

BASE = {"name": "train", "command": "python train.py"}


def errors_of(data: object) -> dict[str, list[str]]:
    with pytest.raises(SpecError) as caught:
        parse_specs(data)
    return caught.value.errors


def assert_refused(data: object, path: str, reason: str) -> None:
    errors = errors_of(data)
    assert path in errors, errors
    assert any(reason in text for text in errors[path]), errors[path]


def sweep(**fields: object) -> dict:
    return {
        "kind": "sweep",
        "name": "lr-sweep",
        "parameters": {"lr": [0.1, 0.01], "bs": [32, 64]},
        "template": {"command": "python train.py --lr {lr} --bs {bs}"},
        **fields,
    }


def test_it_parses_the_design_example():
    [spec] = parse_yaml(DESIGN_EXAMPLE)

    assert spec == TaskSpec(
        name="qwen-sft",
        queue="sft",
        priority=90,
        task_class="batch",
        preemptible=True,
        command="python train.py --epochs 3",
        workdir="projects/qwen",
        env={"HF_HOME": "/data/hf"},
        gpus_min=2,
        gpus_max=2,
        gpu_memory_mb=20 * 1024,
        gpu_type="rtx4090-24g",
        pool="training",
        node="",
        timeout_s=6 * 3600,
        retries=2,
        after=("prep-data",),
    )


def test_it_fills_in_defaults_for_a_minimal_task():
    spec = parse_spec(BASE)

    assert (spec.queue, spec.priority, spec.task_class, spec.preemptible) == ("", 50, "batch", True)
    assert (spec.workdir, spec.env, spec.gpus_min, spec.gpus_max) == ("", {}, 1, 1)
    assert (spec.gpu_memory_mb, spec.gpu_type, spec.pool, spec.node) == (None, "", "", "")
    assert (spec.timeout_s, spec.retries, spec.after) == (None, 0, ())


@pytest.mark.parametrize("name", ["训练-🚀", "Ünïcode_1", "模型.v2", "x"])
def test_names_are_written_in_any_script(name: str):
    [spec] = parse_yaml(f"name: {name}\nqueue: {name}\ncommand: x\n")
    assert (spec.name, spec.queue) == (name, name)


def test_it_treats_empty_yaml_fields_as_not_given():
    [spec] = parse_yaml("name: a\ncommand: x\nenv:\nresources:\npolicy:\nqueue:\n")

    assert spec == TaskSpec(name="a", command="x")


@pytest.mark.parametrize(
    "spec",
    [
        parse_yaml(DESIGN_EXAMPLE)[0],
        TaskSpec(name="n", command="c", gpus_min=1, gpus_max=4, gpu_memory_mb=1500),
        TaskSpec(name="n", command="c", task_class="online", preemptible=False, after=(3, "x")),
        TaskSpec(name="n", command="c", gpus_min=0, gpus_max=0, timeout_s=5400),
    ],
)
def test_it_reads_back_its_own_normalised_form(spec: TaskSpec):
    stored = json.loads(json.dumps(spec.as_dict()))

    assert parse_spec(stored) == spec


@pytest.mark.parametrize(
    ("fields", "attribute", "expected"),
    [
        ({"kind": "task"}, "name", "train"),
        ({"name": "1st.run_v2-B"}, "name", "1st.run_v2-B"),
        ({"name": "a" * MAX_NAME}, "name", "a" * MAX_NAME),
        ({"queue": "sft.v2"}, "queue", "sft.v2"),
        ({"queue": ""}, "queue", ""),
        ({"command": "x" * MAX_COMMAND_LENGTH}, "command", "x" * MAX_COMMAND_LENGTH),
        ({"command": "echo 'multi'\necho line\n"}, "command", "echo 'multi'\necho line\n"),
        ({"priority": "low"}, "priority", 10),
        ({"priority": "normal"}, "priority", 50),
        ({"priority": "high"}, "priority", 90),
        ({"priority": 0}, "priority", 0),
        ({"priority": 100}, "priority", 100),
        ({"class": "online"}, "task_class", "online"),
        ({"class": "online"}, "preemptible", False),
        ({"class": "batch"}, "preemptible", True),
        ({"workdir": "a//b/./c"}, "workdir", "a/b/c"),
        ({"workdir": "./runs/"}, "workdir", "runs"),
        ({"workdir": "."}, "workdir", ""),
        ({"workdir": "backup~/x"}, "workdir", "backup~/x"),
        ({"env": {"PATH": "/venv/bin:/usr/bin"}}, "env", {"PATH": "/venv/bin:/usr/bin"}),
        (
            {"env": {"_A1": 3, "B": 0.5, "C": True, "D": False}},
            "env",
            {"_A1": "3", "B": "0.5", "C": "true", "D": "false"},
        ),  # fmt: skip
        (
            {"env": {f"V{i}": "x" for i in range(MAX_ENV)}},
            "env",
            {f"V{i}": "x" for i in range(MAX_ENV)},
        ),  # fmt: skip
        ({"env": {"V": "x" * MAX_ENV_VALUE}}, "env", {"V": "x" * MAX_ENV_VALUE}),
        ({"resources": {"gpus": 0}}, "gpus_max", 0),
        ({"resources": {"gpus": 64}}, "gpus_min", 64),
        ({"resources": {"gpus": "2"}}, "gpus_max", 2),
        ({"resources": {"gpus": "1-4"}}, "gpus_min", 1),
        ({"resources": {"gpus": " 2 - 8 "}}, "gpus_max", 8),
        ({"resources": {"gpus": "3-3"}}, "gpus_min", 3),
        ({"resources": {"gpu_memory": "20Gi"}}, "gpu_memory_mb", 20480),
        ({"resources": {"gpu_memory": 512}}, "gpu_memory_mb", 512),
        ({"resources": {"gpus": "1-4", "gpu_memory": "8Gi"}}, "gpu_memory_mb", 8192),
        ({"resources": {"gpu_type": "a100.80g"}}, "gpu_type", "a100.80g"),
        ({"resources": {"pool": "training"}}, "pool", "training"),
        ({"resources": {"node": "gpu-01"}}, "node", "gpu-01"),
        ({"resources": {"gpus": 0, "pool": "cpu"}}, "pool", "cpu"),
        ({"resources": {"memory": "64Gi"}}, "memory_mb", 65536),
        ({"resources": {"cpus": 0.5}}, "cpus", 0.5),
        ({"resources": {"cpus": 8}}, "cpus", 8.0),
        ({"resources": {"pids": 4096}}, "pids", 4096),
        ({"policy": {"timeout": "1h30m"}}, "timeout_s", 5400),
        ({"policy": {"timeout": 90}}, "timeout_s", 90),
        ({"policy": {"retries": 10}}, "retries", 10),
        ({"policy": {"preemptible": False}}, "preemptible", False),
        ({"class": "online", "policy": {"preemptible": False}}, "preemptible", False),
        ({"policy": {"after": "prep"}}, "after", ("prep",)),
        ({"policy": {"after": 12}}, "after", (12,)),
        ({"policy": {"after": ["prep", 3, "3"]}}, "after", ("prep", 3, "3")),
        ({"policy": {"after": ["a"] * 0}}, "after", ()),
        (
            {"policy": {"after": [f"t{i}" for i in range(MAX_AFTER)]}},
            "after",
            tuple(f"t{i}" for i in range(MAX_AFTER)),
        ),  # fmt: skip
    ],
)
def test_it_accepts_valid_fields(fields: dict, attribute: str, expected: object):
    spec = parse_spec({**BASE, **fields})

    assert getattr(spec, attribute) == expected


@pytest.mark.parametrize(
    ("fields", "path", "reason"),
    [
        ({"kind": "job"}, "kind", "must be 'task' or 'sweep', got 'job'"),
        ({"colour": "red"}, "colour", "unknown key"),
        ({"comand": "x"}, "comand", "did you mean 'command'?"),
        ({"name": None}, "name", "is required"),
        ({"name": ""}, "name", "must not be empty"),
        ({"name": "-lead"}, "name", "must start with a letter, digit or symbol"),
        ({"name": "has space"}, "name", "hold no spaces"),
        ({"name": "zero\u200bwidth"}, "name", "invisible characters"),
        ({"name": "a;b"}, "name", "punctuation other than"),
        ({"name": "a" * (MAX_NAME + 1)}, "name", f"at most {MAX_NAME} characters"),
        ({"name": 123}, "name", "must be a string, got 123; put it in quotes"),
        ({"queue": "a/b"}, "queue", "punctuation other than"),
        ({"queue": "q" * 101}, "queue", "at most 100 characters"),
        ({"command": None}, "command", "is required"),
        ({"command": "  "}, "command", "must not be empty"),
        ({"command": ["python", "x"]}, "command", "must be a string, got a list"),
        ({"command": "echo \0"}, "command", "NUL"),
        ({"command": "echo \ud800"}, "command", "lone surrogate"),
        ({"command": "x" * (MAX_COMMAND_LENGTH + 1)}, "command", f"at most {MAX_COMMAND_LENGTH}"),
        ({"priority": "urgent"}, "priority", "low, normal, high or a whole number 0-100"),
        ({"priority": 101}, "priority", "got 101"),
        ({"priority": -1}, "priority", "got -1"),
        ({"priority": True}, "priority", "got True"),
        ({"priority": 50.0}, "priority", "got 50.0"),
        ({"class": "service"}, "class", "must be 'batch' or 'online', got 'service'"),
        ({"workdir": "/etc"}, "workdir", "relative to your tenant's root"),
        ({"workdir": "a/../../b"}, "workdir", "'..'"),
        ({"workdir": ".."}, "workdir", "'..'"),
        ({"workdir": "~/x"}, "workdir", "'~'"),
        ({"workdir": "a/~b"}, "workdir", "'~'"),
        ({"workdir": "a\0b"}, "workdir", "NUL"),
        ({"workdir": "a\udc80b"}, "workdir", "lone surrogate"),
        ({"workdir": 7}, "workdir", "must be a string"),
        ({"env": ["A=1"]}, "env", "must be a mapping"),
        ({"env": {"1A": "x"}}, "env.1A", "not a valid variable name"),
        ({"env": {"A-B": "x"}}, "env.A-B", "not a valid variable name"),
        ({"env": {"A": None}}, "env.A", "must be a string, number or boolean, got None"),
        ({"env": {"A": {"b": 1}}}, "env.A", "got a mapping"),
        ({"env": {"A": "a\0b"}}, "env.A", "NUL"),
        ({"env": {"A": "\ud800"}}, "env.A", "lone surrogate"),
        ({"env": {"A": "x" * (MAX_ENV_VALUE + 1)}}, "env.A", f"at most {MAX_ENV_VALUE}"),
        ({"env": {f"V{i}": "x" for i in range(MAX_ENV + 1)}}, "env", f"at most {MAX_ENV} entries"),
        ({"resources": [2]}, "resources", "must be a mapping, got a list"),
        ({"resources": {"gpu": 2}}, "resources.gpu", "did you mean 'gpus'?"),
        ({"resources": {"gpus": "two"}}, "resources.gpus", "a range like \"1-4\", got 'two'"),
        ({"resources": {"gpus": 1.5}}, "resources.gpus", "whole number of GPUs"),
        ({"resources": {"gpus": True}}, "resources.gpus", "whole number of GPUs"),
        ({"resources": {"gpus": -1}}, "resources.gpus", "from 0 to 64"),
        ({"resources": {"gpus": 65}}, "resources.gpus", "from 0 to 64"),
        ({"resources": {"gpus": "1-65"}}, "resources.gpus", "from 0 to 64"),
        ({"resources": {"gpus": "0-2"}}, "resources.gpus", "from at least 1 up"),
        ({"resources": {"gpus": "4-1"}}, "resources.gpus", "from at least 1 up"),
        ({"resources": {"gpus": "9" * 5000}}, "resources.gpus", "whole number of GPUs"),
        ({"resources": {"gpu_memory": "20"}}, "resources.gpu_memory", "needs a unit"),
        ({"resources": {"gpu_memory": "lots"}}, "resources.gpu_memory", "a size such as 24Gi"),
        ({"resources": {"gpu_memory": "2Ti"}}, "resources.gpu_memory", "at most 1Ti"),
        ({"resources": {"gpus": 0, "gpu_memory": "1Gi"}}, "resources.gpu_memory", "gpus: 0"),
        ({"resources": {"memory": "64"}}, "resources.memory", "needs a unit"),
        ({"resources": {"memory": "100Ti"}}, "resources.memory", "at most 64Ti"),
        ({"resources": {"cpus": "4"}}, "resources.cpus", "a number of CPUs"),
        ({"resources": {"cpus": 0}}, "resources.cpus", "from 0.01 to 1024"),
        ({"resources": {"pids": 2.5}}, "resources.pids", "whole number of processes"),
        ({"resources": {"pids": 0}}, "resources.pids", "from 1 to 4194304"),
        ({"resources": {"gpus": 0, "gpu_type": "a100"}}, "resources.gpu_type", "gpus: 0"),
        ({"resources": {"gpu_type": "RTX4090"}}, "resources.gpu_type", "lowercase letters"),
        ({"resources": {"pool": "my.pool"}}, "resources.pool", "lowercase letters"),
        ({"resources": {"pool": "-edge"}}, "resources.pool", "lowercase letters"),
        ({"resources": {"node": "n" * 64}}, "resources.node", "at most 63 characters"),
        ({"policy": "strict"}, "policy", "must be a mapping, got 'strict'"),
        ({"policy": {"timeout": "soon"}}, "policy.timeout", "a duration such as"),
        ({"policy": {"timeout": 0}}, "policy.timeout", "more than zero"),
        ({"policy": {"timeout": "400d"}}, "policy.timeout", "at most 365d"),
        ({"policy": {"retries": 11}}, "policy.retries", "from 0 to 10"),
        ({"policy": {"retries": "2"}}, "policy.retries", "got '2'"),
        ({"policy": {"preemptible": "yes"}}, "policy.preemptible", "true or false"),
        (
            {"class": "online", "policy": {"preemptible": True}},
            "policy.preemptible",
            "online tasks are never preempted",
        ),  # fmt: skip
        ({"policy": {"after": ["a", "a"]}}, "policy.after[1]", "duplicate 'a'"),
        ({"policy": {"after": [0]}}, "policy.after[0]", "positive task id"),
        ({"policy": {"after": [2**63]}}, "policy.after[0]", "positive task id"),
        ({"policy": {"after": [True]}}, "policy.after[0]", "task name or id, got True"),
        ({"policy": {"after": ["bad name"]}}, "policy.after[0]", "hold no spaces"),
        ({"policy": {"after": {"a": 1}}}, "policy.after", "task name or id, got a mapping"),
        (
            {"policy": {"after": list(range(1, MAX_AFTER + 2))}},
            "policy.after",
            f"at most {MAX_AFTER}",
        ),  # fmt: skip
    ],
)
def test_it_refuses_invalid_fields(fields: dict, path: str, reason: str):
    assert_refused({**BASE, **fields}, path, reason)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("LD_PRELOAD", "dynamic loader"),
        ("LD_LIBRARY_PATH", "dynamic loader"),
        ("ld_preload", "dynamic loader"),
        ("DYLD_INSERT_LIBRARIES", "dynamic loader"),
        ("BASH_ENV", "shell run a file"),
        ("ENV", "shell run a file"),
        ("IFS", "splits the command"),
        ("PYTHONPATH", "inside the command instead"),
        ("PYTHONSTARTUP", "platform's own launcher"),
        ("PYTHONHOME", "platform's own launcher"),
        ("PERL5LIB", "platform's own launcher"),
        ("PERL5OPT", "platform's own launcher"),
        ("RUBYOPT", "platform's own launcher"),
        ("NODE_OPTIONS", "platform's own launcher"),
        ("CUDA_VISIBLE_DEVICES", "set by the platform"),
        ("NVIDIA_VISIBLE_DEVICES", "set by the platform"),
        ("CUDA_DEVICE_ORDER", "set by the platform"),
        ("GPUPLATFORM_TOKEN", "reserved for the platform"),
        ("DATABASE_URL", "reserved for the platform"),
        ("SECRET_KEY", "reserved for the platform"),
        ("DJANGO_SETTINGS_MODULE", "reserved for the platform"),
    ],
)
def test_it_refuses_env_names_that_subvert_the_loader_shell_or_platform(name: str, reason: str):
    assert_refused({**BASE, "env": {name: "x"}}, f"env.{name}", "cannot be set")
    assert_refused({**BASE, "env": {name: "x"}}, f"env.{name}", reason)


def test_it_reports_every_problem_of_a_spec_at_once():
    errors = errors_of(
        {
            "name": "bad name",
            "command": "",
            "env": {"LD_PRELOAD": "/x.so"},
            "resources": {"gpus": "two", "gpu_memory": "20"},
            "policy": {"retries": 99},
            "extra": True,
        }
    )

    assert set(errors) == {
        "name",
        "command",
        "env.LD_PRELOAD",
        "resources.gpus",
        "resources.gpu_memory",
        "policy.retries",
        "extra",
    }


def test_it_prints_one_line_per_problem():
    with pytest.raises(SpecError) as caught:
        parse_spec({**BASE, "resources": {"gpus": "two"}, "policy": {"retries": -1}})

    assert str(caught.value).splitlines() == [
        "resources.gpus: must be a whole number of GPUs or a range like \"1-4\", got 'two'",
        "policy.retries: must be a whole number from 0 to 10, got -1",
    ]


@pytest.mark.parametrize(
    ("data", "path", "reason"),
    [
        ("python train.py", "spec", "must be a mapping, got 'python train.py'"),
        (None, "spec", "must be a mapping, got None"),
        (sweep(), "kind", "must be 'task' here"),
    ],
)
def test_parse_spec_takes_exactly_one_task(data: object, path: str, reason: str):
    with pytest.raises(SpecError) as caught:
        parse_spec(data)

    assert any(reason in text for text in caught.value.errors[path])


def test_it_parses_a_list_of_tasks_and_prefixes_errors_with_the_index():
    assert [s.name for s in parse_specs([{**BASE, "name": "a"}, {**BASE, "name": "b"}])] == [
        "a",
        "b",
    ]
    errors = errors_of([BASE, {**BASE, "resources": {"gpus": "two"}}, 5])

    assert list(errors) == ["[1].resources.gpus", "[2]"]
    assert errors["[2]"] == ["must be a mapping, got 5"]


FULL = {
    "command": "python train.py --lr 0.1",
    "queue": "sft",
    "priority": "high",
    "env": {"HF_HOME": "/data/hf"},
    "resources": {"gpus": "1-2", "gpu_memory": "10Gi", "pool": "training", "cpus": 2},
    "policy": {"timeout": "1h", "retries": 2, "after": ["prep", 7]},
}


def test_a_list_of_one_spec_under_many_names_parses_as_each_would_alone():
    """A list's tasks that differ only in their names reuse the first one's checking
    (_task_like): each must still come out exactly as parsed on its own."""
    documents = [{"name": f"run-{i}", **FULL} for i in range(3)]

    tasks = parse_specs(documents)

    assert tasks == [parse_spec(document) for document in documents]
    assert [task.name for task in tasks] == ["run-0", "run-1", "run-2"]
    assert tasks[1].as_dict() == {**tasks[0].as_dict(), "name": "run-1"}
    assert tasks[2].env is tasks[0].env  # reused, not checked again (a check makes a new dict)


def test_a_reused_spec_still_checks_each_name():
    errors = errors_of([{**BASE, "name": "a"}, {**BASE, "name": "-bad"}, {**BASE, "name": ""}])

    assert list(errors) == ["[1].name", "[2].name"]
    assert "must start with a letter, digit or symbol" in errors["[1].name"][0]
    assert errors["[2].name"] == ["must not be empty"]


@pytest.mark.parametrize(
    "value, path",
    [
        (True, "[1].priority"),  # 1 == True, and they hash alike: a dict key would mix them
        ("1", "[1].priority"),
        (1.0, "[1].priority"),
    ],
)
def test_values_that_compare_equal_are_not_taken_for_each_other(value: object, path: str):
    errors = errors_of(
        [{**BASE, "name": "a", "priority": 1}, {**BASE, "name": "b", "priority": value}]
    )

    assert list(errors) == [path]


def test_a_spec_that_failed_is_reported_again_for_each_task():
    bad = {"resources": {"gpus": "two"}}

    errors = errors_of([{**BASE, "name": "a", **bad}, {**BASE, "name": "b", **bad}])

    assert list(errors) == ["[0].resources.gpus", "[1].resources.gpus"]


def test_it_leaves_the_index_out_for_a_list_of_one():
    assert list(errors_of([{**BASE, "priority": "max"}])) == ["priority"]


def test_it_refuses_an_empty_list():
    assert_refused([], "spec", "no tasks")


def test_it_parses_several_yaml_documents_skipping_empty_ones():
    text = "name: a\ncommand: x\n---\n---\nname: b\ncommand: y\npriority: low\n"

    assert [(s.name, s.priority) for s in parse_yaml(text)] == [("a", 50), ("b", 10)]


def test_it_names_the_yaml_document_of_a_problem():
    text = "name: a\ncommand: x\n---\nname: b\nresources: {gpus: 99}\n"

    with pytest.raises(SpecError) as caught:
        parse_yaml(text)

    assert caught.value.errors == {
        "[1].command": ["is required"],
        "[1].resources.gpus": ["must be from 0 to 64, got 99"],
    }


def test_it_reads_a_yaml_list_of_tasks():
    assert len(parse_yaml("- {name: a, command: x}\n- {name: b, command: y}\n")) == 2


@pytest.mark.parametrize("text", ["", "\n", "---\n---\n", "# only a comment\n"])
def test_it_refuses_yaml_without_a_document(text: str):
    with pytest.raises(SpecError) as caught:
        parse_yaml(text)

    assert caught.value.errors == {"spec": ["no tasks: expected a task, a sweep or a list of them"]}


def test_it_reports_a_yaml_syntax_error_with_its_line_and_column():
    with pytest.raises(SpecError) as caught:
        parse_yaml("name: a\ncommand: x\nresources:\n  gpus: [1\n  pool: x\n")

    [reason] = caught.value.errors["yaml"]
    assert reason.startswith("line 5, column 7: ")


def test_it_reports_a_bad_character_in_yaml_with_its_line_and_column():
    with pytest.raises(SpecError) as caught:
        parse_yaml("name: a\ncommand: x\0\n")

    [reason] = caught.value.errors["yaml"]
    assert reason.startswith("line 2, column 11: unacceptable character #x0000")


def test_it_refuses_yaml_tags_that_build_python_objects():
    with pytest.raises(SpecError) as caught:
        parse_yaml("name: !!python/object/apply:os.system ['true']\ncommand: x\n")

    assert "could not determine a constructor" in caught.value.errors["yaml"][0]


def test_it_expands_a_sweep_in_parameter_then_value_order():
    tasks = parse_specs(sweep())

    assert [t.name for t in tasks] == [f"lr-sweep-{i}" for i in range(4)]
    assert [t.command for t in tasks] == [
        "python train.py --lr 0.1 --bs 32",
        "python train.py --lr 0.1 --bs 64",
        "python train.py --lr 0.01 --bs 32",
        "python train.py --lr 0.01 --bs 64",
    ]


def test_it_fills_sweep_placeholders_in_command_workdir_and_env_only():
    template = {
        "command": "cd ${HOME} && echo {lr} {unknown} '{\"json\": 1}' {flag}",
        "workdir": "runs/lr-{lr}",
        "env": {"LR": "{lr}", "FLAG": "{flag}", "N": 3},
        "queue": "sweeps",
    }
    [task] = parse_specs(sweep(parameters={"lr": [0.5], "flag": [True]}, template=template))

    assert task.command == "cd ${HOME} && echo 0.5 {unknown} '{\"json\": 1}' true"
    assert task.workdir == "runs/lr-0.5"
    assert task.env == {"LR": "0.5", "FLAG": "true", "N": "3"}
    assert task.queue == "sweeps"


def test_sweep_tasks_share_no_queue_unless_the_template_says_so():
    assert {t.queue for t in parse_specs(sweep())} == {""}


def test_it_expands_a_sweep_among_other_documents():
    tasks = parse_specs([BASE, sweep()])

    assert [t.name for t in tasks] == ["train"] + [f"lr-sweep-{i}" for i in range(4)]


def test_it_allows_a_sweep_of_exactly_the_limit():
    assert len(parse_specs(sweep(parameters={"i": list(range(MAX_SWEEP_TASKS))}))) == 1000


@pytest.mark.parametrize(
    ("fields", "path", "reason"),
    [
        (
            {"parameters": {"a": list(range(40)), "b": list(range(30))}},
            "parameters",
            f"expands to 1200 tasks, more than the limit of {MAX_SWEEP_TASKS}",
        ),  # fmt: skip
        ({"parameters": None}, "parameters", "is required"),
        ({"parameters": {}}, "parameters", "must be a mapping of names to lists"),
        ({"parameters": {"learning-rate": [1]}}, "parameters.learning-rate", "identifiers"),
        ({"parameters": {"lr": []}}, "parameters.lr", "non-empty list"),
        ({"parameters": {"lr": 0.1}}, "parameters.lr", "non-empty list of values, got 0.1"),
        ({"parameters": {"lr": [0.1, [1]]}}, "parameters.lr[1]", "got a list"),
        ({"parameters": {"lr": [None]}}, "parameters.lr[0]", "got None"),
        ({"template": None}, "template", "is required"),
        ({"template": "python x"}, "template", "must be a mapping"),
        (
            {"template": {"name": "x", "command": "c"}},
            "template.name",
            "the sweep names its tasks",
        ),  # fmt: skip
        ({"template": {"kind": "task", "command": "c"}}, "template.kind", "not allowed"),
        (
            {"template": {"command": "c", "resources": {"gpus": "two"}}},
            "template.resources.gpus",
            "whole number of GPUs",
        ),  # fmt: skip
        (
            {"template": {"command": "c", "policy": {"after": [0]}}},
            "template.policy.after[0]",
            "positive task id",
        ),  # fmt: skip
        ({"template": {"resources": {}}}, "template.command", "is required"),
        ({"queue": "q"}, "queue", "unknown key"),
        ({"name": None}, "name", "is required"),
        ({"name": "x" * (MAX_NAME - 1)}, "name", "too long"),
    ],
)
def test_it_refuses_invalid_sweeps(fields: dict, path: str, reason: str):
    assert_refused(sweep(**fields), path, reason)


def test_it_blames_the_parameter_values_that_make_a_template_invalid():
    data = sweep(
        parameters={"dir": ["ok", "/etc", "../up"]},
        template={"command": "c", "workdir": "{dir}", "env": {"X": "{dir}"}},
    )

    assert errors_of(data) == {
        "template.workdir": ["must be relative to your tenant's root directory, got '/etc' "
                             "(with dir=/etc)"],
    }  # fmt: skip


def test_it_reports_template_and_parameter_problems_together():
    errors = errors_of(sweep(parameters={"lr": []}, template={"command": ""}))

    assert set(errors) == {"parameters.lr", "template.command"}


JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.sampled_from(
                ["kind", "name", "command", "resources", "gpus", "policy", "after", "env"]
                + ["parameters", "template", "workdir", "priority", "gpu_memory", "timeout"]
            )
            | st.text(max_size=10),
            children,
            max_size=6,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON_LIKE)
def test_it_answers_any_json_like_data_with_specs_or_a_spec_error(data: object):
    try:
        tasks = parse_specs(data)
    except SpecError as exc:
        assert exc.errors
        assert all(isinstance(r, str) for reasons in exc.errors.values() for r in reasons)
        assert str(exc)
    else:
        assert all(isinstance(task, TaskSpec) for task in tasks)


@pytest.mark.parametrize(("value", "expected"), [("high", 90), (0, 0), (100, 100)])
def test_parse_priority_takes_a_priority_as_a_spec_does(value: object, expected: int):
    assert parse_priority(value) == expected


@pytest.mark.parametrize("value", ["urgent", "50", 50.0, True, 101, None])
def test_parse_priority_refuses_what_a_spec_refuses_in_the_specs_words(value: object):
    with pytest.raises(ValueError, match="must be low, normal, high or a whole number 0-100"):
        parse_priority(value)
