"""What a node agent knows about its GPUs, independent of where it learned it."""

import abc
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Self

from scheduling.agentapi.messages import GpuInfo, GpuProcess, GpuSample, XidEvent

__all__ = [
    "BackendUnavailable",
    "GpuBackend",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "XidEvent",
    "gpu_type_for",
]


class BackendUnavailable(Exception):
    """The GPU backend cannot be used on this machine; the message says why."""


class GpuBackend(abc.ABC):
    name: str
    # Replaced by each processes() call: the GPUs it could not list, and why.
    unlisted_gpus: frozenset[str] = frozenset()
    process_problems: tuple[str, ...] = ()

    @abc.abstractmethod
    def discover(self) -> list[GpuInfo]:
        """Return the GPUs currently visible, sorted by index."""

    def processes(self) -> list[GpuProcess]:
        """Return the processes holding memory on each GPU; one entry per (GPU, pid).

        A GPU whose processes could not be listed has its UUID in ``unlisted_gpus`` (a GPU with no
        entries there and none here really runs nothing) and the reason in ``process_problems``.
        Backends that cannot see processes list none.
        """
        return []

    def sample(self, *, reserved_mb: Mapping[str, int] | None = None) -> list[GpuSample]:
        """Read every GPU once; one batch per tick, with one ``at`` for the batch.

        ``reserved_mb`` (GPU UUID -> MiB the platform reserved on it for running tasks) is what
        the sampler knows of the GPUs' work; real hardware ignores it, a simulation follows it.
        Backends that cannot sample return none.
        """
        return []

    def xid_events(self) -> list[XidEvent]:
        """XID events that arrived since the last call; never blocks."""
        return []

    @abc.abstractmethod
    def close(self) -> None:
        """Release the backend; calling it twice is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# Tokens that say nothing about what a GPU can compute: the vendor and brand names, and the form
# factor and memory technology (an "A100-SXM4-40GB" and an "A100-PCIE-40GB" run the same jobs).
_NOISE_WORDS = frozenset({"nvidia", "geforce", "tesla", "quadro", "pcie", "nvl", "nvlink"})
_NOISE_PATTERN = re.compile(r"\d+(?:\.\d+)?(?:gb|gib|g)|hbm\d*e?|gddr\d*x?|sxm\d*")


def gpu_type_for(model: str, memory_mb: int) -> str:
    """Derive a schedulable label such as "rtx4090-24g" from the model name and memory.

    Memory comes from the measured size, not the marketing name, rounded to the nearest GiB with
    halves rounded up (an L40S's 46068 MiB = 44.99 GiB -> "45g", an H100's 81559 MiB -> "80g").
    Cards under half a GiB get "<n>m" so the label never says "0g".
    """
    tokens = re.split(r"[^a-z0-9]+", model.lower())
    kept = [t for t in tokens if t and t not in _NOISE_WORDS and not _NOISE_PATTERN.fullmatch(t)]
    stem = "".join(kept) or "gpu"
    gib = (memory_mb + 512) // 1024
    size = f"{gib}g" if gib >= 1 else f"{memory_mb}m"
    return f"{stem}-{size}"
