"""The GPU estate (pools, nodes, simulated GPUs) as the operator describes it in YAML.

Loading either returns a fully typed EstateConfig or raises ConfigError listing every problem,
one line each, as "<file>: <key path>: <problem>", so the operator can fix them all in one pass.
"""

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from gpuplatform.units import format_duration_s, parse_duration_s, parse_memory_mb
from scheduling.policy.model import PolicySettings

_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _dns_label(value: str) -> str:
    if not _DNS_LABEL.fullmatch(value):
        raise ValueError(
            f"must be lowercase letters, digits and '-', at most 63 characters, starting and "
            f"ending with a letter or digit, got {value!r}"
        )
    return value


def _slug(value: str) -> str:
    if not _SLUG.fullmatch(value):
        raise ValueError(f"must be lowercase letters and digits joined by '-', got {value!r}")
    return value


def _duration(value: object) -> object:
    # Ints pass through to the strict int check (and its > 0 bound); anything else is parsed so
    # that a bad value is explained in terms of durations, not Python types.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_duration_s(value, field="")


def _memory(value: object) -> object:
    # Same split as _duration: an int is already MiB.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_memory_mb(value, field="")


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
DurationS = Annotated[int, BeforeValidator(_duration), Field(gt=0)]
MemoryMb = Annotated[int, BeforeValidator(_memory), Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# What ``lost_after`` must exceed beyond ``fence_after`` and the stop grace: a supervisor's fence
# check period, reports in flight, and the clocks of two hosts that disagree a little.
LEASE_MARGIN_S = 5
DEFAULT_STOP_GRACE_S = 30  # TASK_STOP_GRACE's default, when no Django settings say otherwise


class HeartbeatConfig(_Strict):
    """The node's lease: a supervisor that has not seen its node's heartbeat in the database for
    ``fence_after`` stops its task (SIGTERM, TASK_STOP_GRACE, SIGKILL); the scheduler requeues
    the tasks of a node silent for ``lost_after``, which comes only after that stop is over."""

    interval_s: DurationS = Field(default=5, alias="interval")
    offline_after_s: DurationS = Field(default=30, alias="offline_after")
    fence_after_s: DurationS = Field(default=60, alias="fence_after")
    # Tasks on a node silent this long are lost and requeued elsewhere.
    lost_after_s: DurationS = Field(default=120, alias="lost_after")

    @field_validator("offline_after_s")
    @classmethod
    def _outlasts_interval(cls, value: int, info: ValidationInfo) -> int:
        interval = info.data.get("interval_s")
        # Without slack, one late heartbeat would flap the node offline.
        if interval is not None and value <= interval:
            raise ValueError(
                f"must be longer than heartbeat.interval ({format_duration_s(interval)}), "
                f"got {format_duration_s(value)}"
            )
        return value

    @model_validator(mode="after")
    def _lease_ends_before_requeue(self, info: ValidationInfo) -> Self:
        """Checked here, not on the fields: their defaults must obey the rules too."""
        # The heartbeat renews the lease: a lease of one interval lapses between two of them.
        if self.fence_after_s < 2 * self.interval_s:
            raise ValueError(
                f"fence_after ({format_duration_s(self.fence_after_s)}) must be at least twice "
                f"interval ({format_duration_s(self.interval_s)})"
            )
        grace = (info.context or {}).get("stop_grace_s", DEFAULT_STOP_GRACE_S)
        least = self.fence_after_s + grace + LEASE_MARGIN_S
        if self.lost_after_s <= least:
            raise ValueError(
                f"lost_after ({format_duration_s(self.lost_after_s)}) must exceed "
                f"fence_after ({format_duration_s(self.fence_after_s)}) + "
                f"TASK_STOP_GRACE ({format_duration_s(grace)}) + a margin of "
                f"{format_duration_s(LEASE_MARGIN_S)} = {format_duration_s(least)}: a partitioned "
                "node's tasks must be stopped before they are requeued elsewhere"
            )
        return self


class PoolConfig(_Strict):
    name: DnsLabel
    description: str = ""


class SimulatedGpus(_Strict):
    model: str = Field(min_length=1)
    memory_mb: MemoryMb = Field(alias="memory")
    count: int = Field(ge=1, le=64)
    gpu_type: Annotated[str, AfterValidator(_slug)] | None = None


class NodeConfig(_Strict):
    name: DnsLabel
    pool: DnsLabel = "default"
    simulate: SimulatedGpus | None = None


class SchedulingConfig(_Strict):
    """How the scheduler shares the GPUs (see docs/scheduling.md)."""

    # Guaranteed share of the GPUs for each class, in percent; each may borrow what the other
    # leaves idle, and online may preempt batch work to get its guarantee back.
    online_share: int = Field(default=30, ge=0, le=100)
    # Usage older than this counts half as much in fair share.
    fair_share_half_life_s: DurationS = Field(default=24 * 3600, alias="fair_share_half_life")
    backfill: bool = True
    preemption: bool = True
    starvation_after_s: DurationS = Field(default=2 * 3600, alias="starvation_after")
    preempt_max_runtime_s: DurationS = Field(default=3600, alias="preempt_max_runtime")
    # A class under its guaranteed share takes back what the other class borrowed (preempting
    # it, services included) once its task has waited this long: the bound of the guarantee.
    reclaim_after_s: DurationS = Field(default=2 * 3600, alias="reclaim_after")
    # A task using more GPU memory than it reserved: raise an alert, or also stop it (failed).
    gpu_memory_overuse: Literal["alert", "kill"] = "alert"
    # While tasks wait, no GPU is idle and successors are listed, a pass starts at least this
    # long after the last one ended (``passes.defer_while_busy``); 0 runs every pass at once.
    busy_pass_gap_ms: int = Field(default=100, ge=0, le=60_000)

    def policy_settings(self) -> PolicySettings:
        share = self.online_share / 100
        return PolicySettings(
            class_shares={"online": share, "batch": 1 - share},
            backfill=self.backfill,
            preemption=self.preemption,
            starvation_after_s=self.starvation_after_s,
            preempt_max_runtime_s=self.preempt_max_runtime_s,
            reclaim_after_s=self.reclaim_after_s,
        )


XidAction = Literal["drain", "fail_task", "ignore"]

# NVIDIA's XID catalogue: the application's own faults fail its task and leave the GPU in
# service; these mean the GPU (or its bus, NVLink, memory) is broken: drain it, stop its tasks
# and requeue them elsewhere as infrastructure failures. Returning a drained GPU to service is
# an operator's decision. XIDs not listed are recorded and alerted, nothing more.
DEFAULT_XID_ACTIONS: dict[int, XidAction] = {
    13: "fail_task",  # graphics engine exception (out-of-range access in a kernel)
    31: "fail_task",  # GPU memory page fault
    43: "fail_task",  # GPU stopped processing (the application's fault)
    45: "fail_task",  # preemptive cleanup after a failed context
    68: "fail_task",  # video processor exception
    48: "drain",  # double-bit ECC error
    63: "drain",  # ECC page retirement / row remapping event
    64: "drain",  # ECC page retirement / row remapping failure
    74: "drain",  # NVLink error
    79: "drain",  # GPU has fallen off the bus
    92: "drain",  # high single-bit ECC error rate
    94: "drain",  # contained ECC error
    95: "drain",  # uncontained ECC error
    154: "drain",  # GPU recovery action changed (reset or reboot required)
}


class IdleGpuConfig(_Strict):
    """A GPU allocated to a running task but idle: warn, then optionally reclaim."""

    # Utilisation (percent) at or below which an allocated GPU counts as idle.
    threshold: int = Field(default=5, ge=0, le=100)
    # Idle for this long (every sample in the window) raises the alert for the tenant.
    window_s: DurationS = Field(default=30 * 60, alias="window")
    # Still idle this long after the alert opened: reclaim (when reclaim is true).
    grace_s: DurationS = Field(default=30 * 60, alias="grace")
    reclaim: bool = False


class TelemetryConfig(_Strict):
    """GPU sampling, history and the alerts that read it (see docs/operator-guide.md)."""

    # How often the node agent samples every GPU (NVML averages utilisation over up to 1 s:
    # sampling faster buys nothing).
    sample_interval_s: DurationS = Field(default=1, alias="sample_interval")
    # How often a node none of whose GPUs a task holds samples them instead (never more often
    # than sample_interval): their samples feed the dashboard and the history, not usage, and
    # the node is back at sample_interval as soon as a task is launched there. At most 10 s:
    # the dashboard greys out a GPU after 15 s without a sample.
    unheld_sample_interval_s: DurationS = Field(default=5, le=10, alias="unheld_sample_interval")
    raw_retention_s: DurationS = Field(default=48 * 3600, alias="raw_retention")
    minute_retention_s: DurationS = Field(default=30 * 86400, alias="minute_retention")
    hour_retention_s: DurationS = Field(default=365 * 86400, alias="hour_retention")
    idle: IdleGpuConfig = Field(default_factory=IdleGpuConfig)
    # Degrees Celsius at or above which a GPU raises the over-temperature alert.
    max_temperature_c: int = Field(default=85, ge=30, le=120, alias="max_temperature")
    # Uncorrected ECC errors (volatile count) at or above which a GPU raises the ECC alert.
    ecc_uncorrected_errors: int = Field(default=1, ge=1)
    # Overrides of DEFAULT_XID_ACTIONS, by XID number: drain | fail_task | ignore.
    xid: dict[int, XidAction] = Field(default_factory=dict)
    # Optional: alerts are POSTed there as JSON when they open and resolve (retried).
    webhook_url: str = ""

    @field_validator("webhook_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not re.match(r"https?://[^\s/]+", value):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    def xid_action(self, xid: int) -> XidAction | None:
        return self.xid.get(xid, DEFAULT_XID_ACTIONS.get(xid))


def _default_pools() -> list[PoolConfig]:
    return [PoolConfig(name="default")]


class EstateConfig(_Strict):
    heartbeat: HeartbeatConfig = Field(default_factory=HeartbeatConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    pools: list[PoolConfig] = Field(default_factory=_default_pools, min_length=1)
    nodes: list[NodeConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_references(self) -> Self:
        problems = _reference_problems(self)
        if problems:
            # One pydantic error cannot carry several locations; _messages() unpacks these.
            raise PydanticCustomError("estate_references", "{problems}", {"problems": problems})
        return self

    def node(self, name: str) -> NodeConfig | None:
        return next((node for node in self.nodes if node.name == name), None)


def _reference_problems(config: EstateConfig) -> list[tuple[tuple[str | int, ...], str]]:
    problems: list[tuple[tuple[str | int, ...], str]] = []
    pool_names: list[str] = []
    for i, pool in enumerate(config.pools):
        if pool.name in pool_names:
            problems.append((("pools", i, "name"), f"duplicate pool name {pool.name!r}"))
        pool_names.append(pool.name)
    node_names: list[str] = []
    for i, node in enumerate(config.nodes):
        if node.name in node_names:
            first = node_names.index(node.name)
            problems.append(
                (("nodes", i, "name"), f"duplicate node name {node.name!r} (also nodes[{first}])")
            )
        node_names.append(node.name)
        if node.pool not in pool_names:
            defined = ", ".join(dict.fromkeys(pool_names))
            problems.append(
                (("nodes", i, "pool"), f"unknown pool {node.pool!r} (defined: {defined})")
            )
    return problems


def load_config(path: str | Path, *, stop_grace_s: int | None = None) -> EstateConfig:
    """``stop_grace_s``: the longest a task may take to stop (TASK_STOP_GRACE when None)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{source}: file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{source}: cannot read the file: {exc}"]) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: {_yaml_problem(exc)}"]) from None
    return parse_config(data, source, stop_grace_s=stop_grace_s)


def settings_stop_grace_s() -> int:
    """TASK_STOP_GRACE, the longest a stopped task is given, from Django's settings when they
    are loaded (any task may be stopped with it: the spec has no grace of its own)."""
    from django.conf import settings

    return settings.TASK_STOP_GRACE if settings.configured else DEFAULT_STOP_GRACE_S


def parse_config(data: object, source: str, *, stop_grace_s: int | None = None) -> EstateConfig:
    if data is None:
        raise ConfigError([f"{source}: the file is empty; it needs at least a nodes: list"])
    if not isinstance(data, dict):
        raise ConfigError(
            [
                f"{source}: the top level must be a mapping of keys (nodes:, pools:, ...), "
                f"got {_describe(data)}"
            ]
        )
    try:
        grace = settings_stop_grace_s() if stop_grace_s is None else stop_grace_s
        return EstateConfig.model_validate(data, context={"stop_grace_s": grace})
    except ValidationError as exc:
        raise ConfigError(
            [f"{source}: {line}" for error in exc.errors() for line in _messages(error)]
        ) from None


def _messages(error: ErrorDetails) -> list[str]:
    if error["type"] == "estate_references":
        problems = error.get("ctx", {})["problems"]
        return [f"{_path(loc)}: {message}" for loc, message in problems]
    return [f"{_path(error['loc'])}: {_reason(error)}"]


def _path(loc: tuple[str | int, ...]) -> str:
    """("nodes", 0, "simulate", "count") -> "nodes[0].simulate.count"."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path or "(top level)"


def _reason(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx: dict[str, Any] = error.get("ctx", {})
    got = _describe(error["input"])
    simple = {
        "missing": "required",
        "extra_forbidden": "unknown key",
        "int_type": f"must be an integer, got {got}",
        "string_type": f"must be a string, got {got}",
        "list_type": f"must be a list, got {got}",
        "model_type": f"must be a mapping of keys, got {got}",
        "model_attributes_type": f"must be a mapping of keys, got {got}",
        "dict_type": f"must be a mapping of keys, got {got}",
    }
    if kind in simple:
        return simple[kind]
    if kind == "value_error":
        return str(ctx["error"])
    if kind in {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}:
        return _bound_reason(kind, ctx, got)
    if kind == "too_short":
        return f"must have at least {ctx['min_length']} item(s)"
    if kind == "string_too_short":
        return "must not be empty"
    # Pydantic's own sentence is readable; only its repr of the whole input is not.
    return error["msg"]


def _bound_reason(kind: str, ctx: dict[str, Any], got: str) -> str:
    words = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("more than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    phrase, key = words[kind]
    return f"must be {phrase} {ctx[key]}, got {got}"


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"YAML syntax error: {problem}"
    return f"line {mark.line + 1}, column {mark.column + 1}: YAML syntax error: {problem}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping.

    Plain YAML keeps the last value silently, so a node pasted twice would lose its first half.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # unhashable key: the base class reports it properly
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
