"""Memory hygiene: what an unload left behind, and whether Triton's memory creeps up.

A :class:`ResidueReport` is the audit of one unloaded slot: processes still holding files under
its removed dir, shared-memory segments its Python-backend stubs left, stubs still alive, GPU
memory not returned, and Triton's resident memory before and after. An audit that could not
look (Triton's processes are not visible) says why in ``skipped`` and finds nothing.

The leak trend keeps one :class:`MemorySample` after every completed swap and compares the
newest with the oldest of the last N: growth above the threshold is a suspected leak. It is a
trend, not proof: a model that legitimately caches more will trip it too, which is why it warns
and never acts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

RESIDUE_KINDS = ("open_files", "shm", "processes", "gpu_memory")


@dataclass(frozen=True)
class HeldFile:
    pid: int
    command: str
    path: str  # as the kernel reports it, ' (deleted)' included


@dataclass(frozen=True)
class ResidueReport:
    slot: str
    skipped: str | None = None
    triton_pid: int | None = None
    open_files: tuple[HeldFile, ...] = ()
    shm_segments: tuple[str, ...] = ()
    shm_bytes: int = 0
    stubs_alive: tuple[int, ...] = ()
    rss_before: int | None = None
    rss_after: int | None = None
    gpu_not_returned: int | None = None  # bytes; None when there is no figure to compare

    def findings(self) -> dict[str, int]:
        """How many of each kind of residue (RESIDUE_KINDS); zeros when clean."""
        return {
            "open_files": len(self.open_files),
            "shm": len(self.shm_segments),
            "processes": len(self.stubs_alive),
            "gpu_memory": 1 if self.gpu_not_returned else 0,
        }

    @property
    def clean(self) -> bool:
        return not any(self.findings().values())

    def as_detail(self) -> dict[str, object]:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {
            "clean": self.clean,
            "triton_pid": self.triton_pid,
            "open_files": [
                {"pid": f.pid, "command": f.command, "path": f.path} for f in self.open_files
            ],
            "shm_segments": list(self.shm_segments),
            "shm_bytes": self.shm_bytes,
            "stubs_alive": list(self.stubs_alive),
            "triton_rss_before": self.rss_before,
            "triton_rss_after": self.rss_after,
            "gpu_not_returned_bytes": self.gpu_not_returned,
        }

    def describe(self) -> str:
        if self.skipped is not None:
            return f"audit skipped: {self.skipped}"
        if self.clean:
            return "clean"
        parts = []
        if self.open_files:
            held = ", ".join(f"pid {f.pid} ({f.command}) {f.path}" for f in self.open_files[:3])
            parts.append(f"{len(self.open_files)} file(s) still open: {held}")
        if self.shm_segments:
            parts.append(f"{len(self.shm_segments)} shm segment(s), {self.shm_bytes} bytes")
        if self.stubs_alive:
            parts.append(f"backend process(es) still running: {list(self.stubs_alive)}")
        if self.gpu_not_returned:
            parts.append(f"{self.gpu_not_returned} bytes of GPU memory not returned")
        return "; ".join(parts)


@dataclass(frozen=True)
class MemorySample:
    """Triton's memory right after a completed swap."""

    at: datetime
    operation_id: str
    model: str
    host_bytes: int | None  # Triton's resident memory plus shared memory in use
    gpu_bytes: int | None  # GPU memory in use, all GPUs


@dataclass(frozen=True)
class LeakTrend:
    kind: str  # "host" or "gpu"
    samples: int
    growth: int | None  # newest minus oldest of the window; None with fewer than two
    flagged: bool


def leak_trend(
    samples: Sequence[MemorySample], *, kind: str, window: int, threshold: int
) -> LeakTrend:
    """Growth over the last ``window`` samples (oldest first) of one kind of memory."""
    values = [v for v in (_value(s, kind) for s in samples) if v is not None][-window:]
    if len(values) < 2:
        return LeakTrend(kind, len(values), None, False)
    growth = values[-1] - values[0]
    return LeakTrend(kind, len(values), growth, growth > threshold)


def _value(sample: MemorySample, kind: str) -> int | None:
    return sample.host_bytes if kind == "host" else sample.gpu_bytes
