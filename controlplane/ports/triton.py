"""Triton's seams: its model control in the daemon's intents, its metrics, its memory and its
processes, and inference traffic on purpose.

The adapters own Triton's JSON and protobufs; these speak in intents (``point_alias``,
``reload_cpu_only``), so no service builds a Triton payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from controlplane.domain.memory import ResidueReport
from controlplane.domain.smoke import SmokeSample
from controlplane.domain.stress import Load
from controlplane.domain.traffic import Signature
from controlplane.domain.triton import TritonState


@dataclass(frozen=True)
class IndexEntry:
    """One row of Triton's repository index."""

    name: str
    version: str
    state: TritonState
    reason: str = ""


class Triton(Protocol):
    """Triton's model control, in the daemon's intents; the adapter owns Triton's JSON."""

    async def is_live(self) -> bool: ...

    async def liveness(self) -> str | None:
        """None when Triton answers that it is live; else why not: the address tried, the
        likely cause and what to check, in words for the user."""
        ...

    async def connection_lost(self) -> None:
        """Wait until a connection to Triton that was up goes down (Triton stopped or
        restarted), without calling Triton; while none is up, connect first."""
        ...

    async def load(self, model: str) -> None:
        """Load or reload ``model`` from its files; READY when this returns.

        :class:`TritonLoadFailed` with Triton's reason, or :class:`TritonTimeout` when the
        load did not end within the load timeout (Triton may go on loading: see
        :meth:`abandon`)."""
        ...

    async def unload(self, model: str) -> None: ...

    async def abandon(self, model: str, wait: float) -> bool:
        """After a load timed out: ask for the unload without waiting on it (Triton serves
        it once the load ends), then watch the index up to ``wait`` s. True when ``model``
        left LOADING; False when Triton still holds it (a load that never ends keeps its name
        until Triton restarts)."""
        ...

    async def index(self) -> list[IndexEntry]: ...

    async def wait_unavailable(self, model: str, timeout: float) -> None:
        """Poll the index until ``model`` is UNAVAILABLE (or gone), or raise TritonTimeout."""
        ...

    async def signature(self, model: str) -> Signature:
        """The inputs and outputs ``model`` is served with (after Triton's auto-complete)."""
        ...

    async def point_alias(self, alias: str, slot: str, signature: Signature) -> None:
        """(Re)load ``alias`` as a one-step ensemble that forwards ``signature`` to ``slot``."""
        ...

    async def alias_target(self, alias: str) -> str | None:
        """The slot ``alias`` points at; None when it is not loaded or not an alias."""
        ...

    async def reload_cpu_only(self, model: str) -> list[dict[str, object]]:
        """Reload ``model`` with every instance on CPU (Triton applies it in place: the model
        keeps answering); return the instance groups it now has."""
        ...

    async def smoke(self, model: str, sample: SmokeSample | None) -> dict[str, list[float]]:
        """One checked inference; :class:`PreflightFailed` when it fails or answers wrong."""
        ...

    async def close(self) -> None: ...


class MetricsSource(Protocol):
    async def pending_requests(self, model: str) -> int | None:
        """Requests queued for ``model`` now, or None when the metrics cannot be read."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class GpuMemory:
    total: int
    used: int

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)


class MemoryFigures(Protocol):
    """Free memory where a load would put the model, for the headroom check."""

    async def gpu_memory(self) -> dict[str, GpuMemory] | None:
        """Per GPU (``gpu_uuid``); ``{}`` when Triton reports none, None when unreadable."""
        ...

    def host_available(self) -> int | None:
        """Bytes the host can still give (MemAvailable); None when unreadable."""
        ...

    def shm(self) -> ShmSpace | None:
        """The shared-memory filesystem Triton's backends map (``/dev/shm``); None when it
        cannot be read."""
        ...


@dataclass(frozen=True)
class ShmSpace:
    total: int
    free: int  # what an unprivileged process can still write
    path: str = "/dev/shm"  # noqa: S108 - the mount read (memory.shm_path), for messages

    @property
    def used(self) -> int:
        return max(0, self.total - self.free)


class InferenceLoad(Protocol):
    """Inference traffic on purpose: the stress preflight's load."""

    async def drive(
        self, model: str, sample: SmokeSample | None, *, concurrency: int, seconds: float
    ) -> Load:
        """Send ``model`` the sample's inputs (or inputs generated from its config) from
        ``concurrency`` clients at once, each sending its next request as soon as the last
        answered, for ``seconds``; every latency and failure, none retried."""
        ...


@dataclass(frozen=True)
class TritonMemory:
    """Triton's process as the leak trend sees it."""

    pid: int
    resident_bytes: int | None
    shm_bytes: int | None  # in use under /dev/shm
    host_total_bytes: int | None

    @property
    def host_bytes(self) -> int | None:
        if self.resident_bytes is None:
            return None
        return self.resident_bytes + (self.shm_bytes or 0)


class ResidueProbe(Protocol):
    def finish(self) -> ResidueReport:
        """Audit what the slot left behind; call once its dir is removed."""
        ...


class TritonProcesses(Protocol):
    """Triton's processes, when this daemon can see them (same host, or same pod with
    shareProcessNamespace)."""

    def probe(self, slot: str) -> ResidueProbe:
        """Snapshot a loaded slot before its unload."""
        ...

    def memory(self) -> TritonMemory | None:
        """None when Triton's process is not visible."""
        ...

    def skipped(self) -> str | None:
        """Why the processes cannot be seen; None when they can."""
        ...

    def stop(self, grace: float) -> str | None:
        """Stop Triton's process (SIGTERM, SIGKILL past ``grace`` s) for its supervisor to
        start again: None once it is gone; else why it could not be (not visible, not
        allowed to signal it)."""
        ...


class UtilizationSource(Protocol):
    """GPU utilisation for the overload watcher: Triton's /metrics or a Prometheus query."""

    async def gpu_utilization(self) -> dict[str, float] | None:
        """Utilisation per GPU (or per series); ``{}`` when there is none, None when the
        source could not be read (the watcher then holds: unknown)."""
        ...

    async def close(self) -> None: ...
