"""What the throughput phase submits: the scenarios, and the tasks of each (pure).

The default is what users do: several tenants, each under a GPU quota, each submitting its
tasks in one request at once, with a mix of sizes (mostly one GPU, some two, some sharing a GPU
by memory). A quota moves a backlog off the scheduler's bulk path (measured on 2026-11-28: one
unlimited tenant's 2,000 tasks were placed about 80 a pass, the same tenant's under a quota
about 11), so a bench that only measured an unlimited tenant measured nobody. The unlimited
single tenant stays as a second line: the peers run the same 2,000 one-slot jobs without
quotas, so it is the like-for-like one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

# A kind of task in a mix: its share of a tenant's tasks and the resources it asks for.
ONE_GPU = {"gpus": 1}
TWO_GPUS = {"gpus": 2}
SHARED = {"gpus": 1, "gpu_memory": "4Gi"}  # six fit on one 24 GiB card
MIX = ((0.8, ONE_GPU), (0.1, TWO_GPUS), (0.1, SHARED))


@dataclass(frozen=True)
class Scenario:
    key: str  # the figures' key
    label: str  # how the report names it
    tenants: int
    quota_gpus: int | None  # each tenant's cluster-wide GPU quota; None: no quota
    per_tenant: int  # tasks each tenant submits
    batch: int  # tasks per POST
    mix: tuple[tuple[float, dict], ...]

    @property
    def tasks(self) -> int:
        return self.tenants * self.per_tenant

    def batches(self, pool: str, command: str = "true") -> list[list[list[dict]]]:
        """Per tenant, its POSTs, each a list of task specs."""
        kinds = mixed(self.mix, self.per_tenant)
        out = []
        for t in range(self.tenants):
            specs = [
                {"name": f"{self.key}-{t}-{i}", "command": command,
                 "resources": {**resources, "pool": pool}}
                for i, resources in enumerate(kinds)
            ]  # fmt: skip
            out.append([specs[i : i + self.batch] for i in range(0, len(specs), self.batch)])
        return out

    def describe_mix(self) -> str:
        parts = []
        for share, resources in self.mix:
            size = f"{resources['gpus']} GPU{'s' if resources['gpus'] > 1 else ''}"
            if "gpu_memory" in resources:
                size = f"gpu_memory {resources['gpu_memory']} (sharing)"
            parts.append(f"{share:.0%} {size}")
        return ", ".join(parts)


def mixed(mix: Sequence[tuple[float, dict]], count: int) -> list[dict]:
    """``count`` resources, each kind its share of them (rounded; the first kind takes what
    rounding leaves), spread evenly through the list rather than in blocks, so that every part
    of a submission (and every tenant's first tasks) holds the same mix."""
    counts = [round(share * count) for share, _ in mix]
    counts[0] += count - sum(counts)
    placed = [
        ((i + 0.5) / n, k, resources)
        for k, ((_, resources), n) in enumerate(zip(mix, counts, strict=True))
        for i in range(n)
    ]
    return [dict(resources) for _, _, resources in sorted(placed, key=lambda p: (p[0], p[1]))]


QUOTAS = Scenario(
    key="quotas",
    label="4 tenants, 8-GPU quota each, mixed",
    tenants=4,
    quota_gpus=8,
    per_tenant=500,
    batch=500,
    mix=MIX,
)
UNLIMITED = Scenario(
    key="unlimited",
    label="1 tenant, no quota, one-GPU only",
    tenants=1,
    quota_gpus=None,
    per_tenant=2_000,
    batch=1_000,
    mix=((1.0, ONE_GPU),),
)
# The same tenants and mix under quotas set above what they can use here (4 x 64 GPUs on 32):
# a quota that never binds once cost more than one that does (the pass dropped its tenant's
# listed tasks before it read, and agents had nothing to hand them meanwhile).
ROOMY = replace(
    QUOTAS, key="roomy", label="4 tenants, 64-GPU quota each (never reached), mixed", quota_gpus=64
)
SCENARIOS = (QUOTAS, UNLIMITED, ROOMY)  # the first is the default, the one the targets judge
