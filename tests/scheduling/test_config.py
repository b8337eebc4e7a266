from pathlib import Path

import pytest

from scheduling.config import ConfigError, EstateConfig, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
heartbeat:
  interval: 5s
  offline_after: 1m
pools:
  - name: default
  - name: training
    description: Big GPUs.
nodes:
  - name: workstation-1
    simulate:
      model: NVIDIA GeForce RTX 4090
      memory: 24Gi
      count: 4
  - name: workstation-2
    pool: training
    simulate:
      model: NVIDIA RTX A6000
      memory: 49152
      count: 2
      gpu_type: a6000
"""


def write(tmp_path: Path, text: str, name: str = "estate.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_for(tmp_path: Path, text: str) -> list[str]:
    """Load text as a file; return each problem after checking it starts with the file's name."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == "\n".join(caught.value.problems)
    prefix = f"{path}: "
    for problem in caught.value.problems:
        assert problem.startswith(prefix), problem
    return [problem.removeprefix(prefix) for problem in caught.value.problems]


def assert_one_problem(problems: list[str], key_path: str, reason: str) -> None:
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{key_path}: "), problems[0]
    assert reason in problems[0], problems[0]


def test_it_loads_a_valid_estate_into_typed_values(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))

    assert config.heartbeat.interval_s == 5
    assert config.heartbeat.offline_after_s == 60
    assert [pool.name for pool in config.pools] == ["default", "training"]
    first, second = config.nodes
    assert first.pool == "default"
    assert first.simulate is not None
    assert first.simulate.memory_mb == 24576
    assert first.simulate.gpu_type is None
    assert second.simulate is not None
    assert second.simulate.memory_mb == 49152
    assert second.simulate.gpu_type == "a6000"


def test_it_finds_a_node_by_name(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))

    node = config.node("workstation-2")
    assert node is not None
    assert node.pool == "training"
    assert config.node("nowhere") is None


def test_it_fills_in_the_defaults() -> None:
    config = parse_config({"nodes": [{"name": "solo"}]}, "inline")

    assert config.heartbeat.interval_s == 5
    assert config.heartbeat.offline_after_s == 30
    assert (config.heartbeat.fence_after_s, config.heartbeat.lost_after_s) == (60, 120)
    assert [pool.name for pool in config.pools] == ["default"]
    assert config.nodes[0].pool == "default"
    assert config.nodes[0].simulate is None


def test_the_guarantee_bound_reaches_the_policy() -> None:
    default = parse_config({"nodes": [{"name": "solo"}]}, "inline").scheduling
    assert default.policy_settings().reclaim_after_s == 2 * 3600
    tuned = {"scheduling": {"reclaim_after": "15m"}, "nodes": [{"name": "solo"}]}
    assert parse_config(tuned, "inline").scheduling.policy_settings().reclaim_after_s == 900


@pytest.mark.parametrize("name", ["configs/scheduler.yaml", "configs/examples/two-nodes.yaml"])
def test_it_loads_the_shipped_configurations(name: str) -> None:
    config = load_config(REPO / name)

    assert isinstance(config, EstateConfig)
    workstation = config.node("workstation-1")
    assert workstation is not None
    assert workstation.simulate is not None
    assert workstation.simulate.model == "NVIDIA GeForce RTX 4090"
    assert workstation.simulate.memory_mb == 24 * 1024
    assert workstation.simulate.count == 4


def test_it_loads_the_second_example_node_into_the_training_pool() -> None:
    config = load_config(REPO / "configs/examples/two-nodes.yaml")

    node = config.node("workstation-2")
    assert node is not None
    assert node.pool == "training"
    assert node.simulate is not None
    assert (node.simulate.model, node.simulate.memory_mb, node.simulate.count) == (
        "NVIDIA RTX A6000",
        48 * 1024,
        2,
    )


def test_it_names_an_unknown_key(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("    simulate:\n", "    simulat:\n", 1))

    # The misspelt section is unknown; nothing else is wrong because simulate: is optional.
    assert_one_problem(problems, "nodes[0].simulat", "unknown key")


def test_it_names_a_wrong_type_with_the_value_given(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("count: 4", "count: four"))

    assert_one_problem(problems, "nodes[0].simulate.count", "must be an integer, got 'four'")


def test_it_refuses_a_quoted_number_where_an_integer_belongs(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("count: 4", 'count: "4"'))

    assert_one_problem(problems, "nodes[0].simulate.count", "must be an integer, got '4'")


def test_it_names_a_missing_field(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("      memory: 24Gi\n", ""))

    assert_one_problem(problems, "nodes[0].simulate.memory", "required")


def test_it_names_a_missing_node_name(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, "nodes:\n  - pool: default\n")

    assert_one_problem(problems, "nodes[0].name", "required")


def test_it_explains_a_bad_memory_size(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("memory: 24Gi", "memory: lots"))

    assert_one_problem(
        problems, "nodes[0].simulate.memory", "expected a size such as 24Gi or 20480Mi, got 'lots'"
    )


def test_it_explains_an_unknown_memory_unit(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("memory: 24Gi", "memory: 24 gigs"))

    assert_one_problem(problems, "nodes[0].simulate.memory", "unknown unit 'gigs' in '24 gigs'")


def test_it_bounds_the_gpu_count(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("count: 4", "count: 65"))

    assert_one_problem(problems, "nodes[0].simulate.count", "must be at most 64, got 65")


def test_it_names_an_unknown_pool_and_lists_the_defined_ones(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("pool: training", "pool: trainnig"))

    assert_one_problem(
        problems, "nodes[1].pool", "unknown pool 'trainnig' (defined: default, training)"
    )


def test_it_rejects_duplicate_node_names(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("workstation-2", "workstation-1"))

    assert_one_problem(problems, "nodes[1].name", "duplicate node name 'workstation-1'")


def test_it_rejects_duplicate_pool_names(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("name: training", "name: default"))

    # nodes[1] still names "training", which no longer exists: both problems are reported.
    assert problems == [
        "pools[1].name: duplicate pool name 'default'",
        "nodes[1].pool: unknown pool 'training' (defined: default)",
    ]


def test_it_rejects_a_node_name_that_is_not_a_dns_label(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("workstation-2", "Workstation_2"))

    assert_one_problem(problems, "nodes[1].name", "got 'Workstation_2'")


def test_it_requires_offline_after_to_outlast_the_interval(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("offline_after: 1m", "offline_after: 5s"))

    assert_one_problem(
        problems, "heartbeat.offline_after", "must be longer than heartbeat.interval (5s), got 5s"
    )


def test_it_reports_every_problem_at_once(tmp_path: Path) -> None:
    text = GOOD.replace("count: 4", "count: four").replace("memory: 49152", "memory: lots")

    problems = problems_for(tmp_path, text)

    assert len(problems) == 2, problems
    assert problems[0].startswith("nodes[0].simulate.count: ")
    assert problems[1].startswith("nodes[1].simulate.memory: ")


def test_it_requires_at_least_one_node(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, "nodes: []\n")

    assert_one_problem(problems, "nodes", "must have at least 1 item")


def test_it_gives_the_line_of_a_yaml_syntax_error(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, "nodes:\n  - name: a\n    pool: [default\n")

    assert len(problems) == 1
    assert problems[0].startswith("line 4, column 1: YAML syntax error: "), problems[0]


def test_it_rejects_a_key_written_twice(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, "nodes:\n  - name: a\n    name: b\n")

    assert problems == ["line 3, column 5: YAML syntax error: duplicate key 'name'"]


def test_it_says_when_the_file_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"

    with pytest.raises(ConfigError) as caught:
        load_config(missing)

    assert caught.value.problems == [f"{missing}: file not found"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("- name: a\n", "the top level must be a mapping"),
        ("just words\n", "the top level must be a mapping"),
        ("", "the file is empty"),
    ],
)
def test_it_requires_a_mapping_at_the_top_level(tmp_path: Path, text: str, reason: str) -> None:
    problems = problems_for(tmp_path, text)

    assert len(problems) == 1
    assert problems[0].startswith(reason), problems[0]


def test_it_never_leaks_pydantic_wording(tmp_path: Path) -> None:
    text = (
        "nodes:\n  - name: a\n    simulate: [1, 2]\n  - 7\npools: nope\nheartbeat: {interval: x}\n"
    )

    problems = problems_for(tmp_path, text)

    joined = "\n".join(problems)
    for leak in ("Input should", "pydantic", "errors.pydantic.dev", "type="):
        assert leak not in joined, joined
    assert sorted(problems) == [
        "heartbeat.interval: expected a duration such as 30s, 5m, 6h or 1h30m, got 'x'",
        "nodes[0].simulate: must be a mapping of keys, got a list",
        "nodes[1]: must be a mapping of keys, got 7",
        "pools: must be a list, got 'nope'",
    ]


def test_it_bounds_the_busy_pass_gap(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD + "scheduling:\n  busy_pass_gap_ms: -5\n")

    assert_one_problem(problems, "scheduling.busy_pass_gap_ms", "must be at least 0, got -5")


def test_it_requires_fence_after_to_last_two_heartbeats(tmp_path: Path) -> None:
    problems = problems_for(tmp_path, GOOD.replace("offline_after: 1m", "fence_after: 9s"))

    assert_one_problem(
        problems, "heartbeat", "fence_after (9s) must be at least twice interval (5s)"
    )


def test_the_default_fence_after_obeys_the_rule_too(tmp_path: Path) -> None:
    """A long heartbeat interval with the default lease is refused, not left to lapse between
    two heartbeats."""
    problems = problems_for(tmp_path, GOOD.replace("interval: 5s", "interval: 31s"))

    assert_one_problem(
        problems, "heartbeat", "fence_after (1m) must be at least twice interval (31s)"
    )


def test_it_refuses_a_lost_after_that_does_not_outlast_the_lease(settings, tmp_path) -> None:
    """A node cut off stops its tasks within fence_after plus the stop grace: requeueing them
    sooner would run them twice."""
    settings.TASK_STOP_GRACE = 30
    text = GOOD.replace("offline_after: 1m", "fence_after: 20s\n  lost_after: 55s")

    problems = problems_for(tmp_path, text)

    assert_one_problem(
        problems,
        "heartbeat",
        "lost_after (55s) must exceed fence_after (20s) + TASK_STOP_GRACE (30s) + a margin "
        "of 5s = 55s",
    )
    settings.TASK_STOP_GRACE = 10  # a shorter grace leaves room
    assert load_config(write(tmp_path, text)).heartbeat.lost_after_s == 55


def test_the_lease_rule_takes_the_grace_it_is_given() -> None:
    data = {"heartbeat": {"fence_after": 20, "lost_after": 40}, "nodes": [{"name": "a"}]}

    assert parse_config(data, "x", stop_grace_s=10).heartbeat.fence_after_s == 20
    with pytest.raises(ConfigError, match=r"TASK_STOP_GRACE \(15s\)"):
        parse_config(data, "x", stop_grace_s=15)
