"""Is there room for a load? The estimate of what a release needs, against what is free.

The need is the release's own ``memory_hint`` when it gives one, else its size on disk times a
factor (weights usually take about their file size in memory, plus runtime overhead). It is
compared with the free memory of the GPU that has the least, when the model may run on a GPU
and Triton reports GPUs, and with the host's available memory. A release whose backend maps
shared memory (the Python backend: one region per instance) also needs room in ``/dev/shm``,
where the load must leave at least a margin free: a full ``/dev/shm`` fails the requests of
every Python model on that Triton, not only the new one's. A figure that cannot be read is
reported and not held against the load: the check refuses only on numbers it has.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Headroom:
    need: int
    basis: str  # how the need was estimated
    gpu_free: int | None  # the least free memory on any GPU; None: not checked or unknown
    host_available: int | None
    problems: tuple[str, ...]
    shm: ShmNeed | None = None  # None: the backend maps no shared memory, or not readable

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        return "; ".join(self.problems) if self.problems else "enough memory"


@dataclass(frozen=True)
class ShmNeed:
    """What a load takes of ``/dev/shm``, against what is free there."""

    need: int
    basis: str  # e.g. "2 instances of the python backend x 1.0 MiB"
    free: int
    margin: int
    where: str = "/dev/shm"  # noqa: S108 - the mount read (memory.shm_path)

    @property
    def left(self) -> int:
        return self.free - self.need

    @property
    def ok(self) -> bool:
        return self.left >= self.margin

    def problem(self) -> str:
        return (
            f"the load needs about {size_text(self.need)} of {self.where} ({self.basis}) but "
            f"{self.where} has {size_text(self.free)} free, which would leave "
            f"{size_text(max(0, self.left))}, under the {size_text(self.margin)} margin "
            "(memory.shm_margin_bytes)"
        )


def shm_need(
    backend: str,
    instances: int,
    *,
    per_instance: int,
    backends: Collection[str],
    free: int | None,
    margin: int,
    where: str = "/dev/shm",  # noqa: S108 - the mount read (memory.shm_path)
) -> ShmNeed | None:
    """The ``/dev/shm`` figures of a load; None when ``backend`` maps none or ``free`` is
    unknown."""
    if backend not in backends or free is None:
        return None
    plural = "instance" if instances == 1 else "instances"
    return ShmNeed(
        need=instances * per_instance,
        basis=f"{instances} {plural} of the {backend} backend x {size_text(per_instance)}",
        free=free,
        margin=margin,
        where=where,
    )


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
    shm: ShmNeed | None = None,
) -> Headroom:
    problems = []
    least = min(gpu_free.values()) if gpu_free else None
    if least is not None and need > least:
        gpu = min(gpu_free or {}, key=lambda uuid: (gpu_free or {})[uuid])
        problems.append(
            f"the load needs about {size_text(need)} ({basis}) but GPU {gpu} has "
            f"{size_text(least)} free"
        )
    if host_available is not None and need > host_available:
        problems.append(
            f"the load needs about {size_text(need)} ({basis}) but the host has "
            f"{size_text(host_available)} available"
        )
    if shm is not None and not shm.ok:
        problems.append(shm.problem())
    return Headroom(need, basis, least, host_available, tuple(problems), shm)


def size_text(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
