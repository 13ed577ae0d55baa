"""Is there room for a load? The estimate of what a release needs, against what is free.

The need is the release's own ``memory_hint`` when it gives one, else its size on disk times a
factor (weights usually take about their file size in memory, plus runtime overhead). It is
compared with the free memory of the GPU that has the least, when the model may run on a GPU
and Triton reports GPUs, and with the host's available memory. A figure that cannot be read
is reported and not held against the load: the check refuses only on numbers it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Headroom:
    need: int
    basis: str  # how the need was estimated
    gpu_free: int | None  # the least free memory on any GPU; None: not checked or unknown
    host_available: int | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        return "; ".join(self.problems) if self.problems else "enough memory"


def estimate_need(size_bytes: int, factor: float, hint: int | None) -> tuple[int, str]:
    if hint is not None:
        return hint, "memory_hint"
    return int(size_bytes * factor), f"size on disk x {factor:g}"


def check(
    need: int,
    basis: str,
    *,
    gpu_free: Mapping[str, int] | None,
    host_available: int | None,
) -> Headroom:
    problems = []
    least = min(gpu_free.values()) if gpu_free else None
    if least is not None and need > least:
        gpu = min(gpu_free or {}, key=lambda uuid: (gpu_free or {})[uuid])
        problems.append(
            f"the load needs about {_size(need)} ({basis}) but GPU {gpu} has {_size(least)} free"
        )
    if host_available is not None and need > host_available:
        problems.append(
            f"the load needs about {_size(need)} ({basis}) but the host has "
            f"{_size(host_available)} available"
        )
    return Headroom(need, basis, least, host_available, tuple(problems))


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
