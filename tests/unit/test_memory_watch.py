"""MemoryWatch: GPU memory a slot's load took and its unload did not return, and the leak
trend's arithmetic. GPU figures cannot exist here, so they are scripted; the /proc side is
covered against the real Triton in tests/integration/test_memory_hygiene.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from controlplane.adapters.persistence import SqliteRepos
from controlplane.domain.memory import MemorySample, ResidueReport, leak_trend
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    Trigger,
)
from controlplane.ports import GpuMemory, ShmSpace, TritonMemory
from controlplane.services.memory import LeakPolicy, MemoryWatch
from controlplane.services.tracker import OperationTracker
from tests.support.fakes import FakeClock

GIB = 1024**3


class ScriptedGpu:
    """GPU memory in use, as the test moves it."""

    def __init__(self) -> None:
        self.used = 2 * GIB

    async def gpu_memory(self) -> dict[str, GpuMemory] | None:
        return {"GPU-a": GpuMemory(total=16 * GIB, used=self.used)}

    def host_available(self) -> int | None:
        return 64 * GIB

    def shm(self) -> ShmSpace | None:
        return None


class VisibleTriton:
    """Triton's processes, seen: nothing left on the host side; memory as the test sets it."""

    def __init__(self) -> None:
        self.resident = 4 * GIB

    def probe(self, slot: str) -> _CleanProbe:
        return _CleanProbe(slot)

    def memory(self) -> TritonMemory | None:
        return TritonMemory(
            pid=42, resident_bytes=self.resident, shm_bytes=0, host_total_bytes=None
        )

    def skipped(self) -> str | None:
        return None

    def stop(self, grace: float) -> str | None:
        return "the memory watch never stops Triton"


class _CleanProbe:
    def __init__(self, slot: str) -> None:
        self._slot = slot

    def finish(self) -> ResidueReport:
        return ResidueReport(self._slot, triton_pid=42)


def _watch(repos: SqliteRepos, gpu: ScriptedGpu, triton: VisibleTriton) -> MemoryWatch:
    return MemoryWatch(
        processes=triton,
        figures=gpu,
        book=repos.memory,
        clock=FakeClock(),
        policy=LeakPolicy(window=3, threshold=GIB),
    )


def _operation(n: int, kind: OperationKind = OperationKind.DEPLOY) -> Operation:
    return Operation(
        id=f"op{n}",
        kind=kind,
        model="m",
        release=f"r{n}",
        trigger=Trigger.API,
        status=OperationStatus.RUNNING,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_gpu_memory_a_load_took_and_the_unload_kept_is_a_finding(tmp_path: Path) -> None:
    async def scenario() -> list[dict[str, object]]:
        gpu, residues = ScriptedGpu(), []
        repos = SqliteRepos.open(tmp_path / "state.db")
        try:
            watch = _watch(repos, gpu, VisibleTriton())
            for n, kept in enumerate((3 * GIB, 0)):
                async with watch.loading("m__blue"):
                    gpu.used += 4 * GIB  # the load takes 4 GiB
                tracker = OperationTracker(
                    _operation(n, OperationKind.RETIRE), repos.operations, FakeClock()
                )
                async with tracker.step("unload"), watch.unloading("m__blue", tracker):
                    gpu.used -= 4 * GIB - kept  # the unload returns all but `kept`
                residue = tracker.operation.steps[-1].detail["residue"]
                assert isinstance(residue, dict)
                residues.append(residue)
        finally:
            repos.close()
        return residues

    leaking, clean = asyncio.run(scenario())

    assert leaking["gpu_not_returned_bytes"] == 3 * GIB
    assert leaking["clean"] is False
    assert clean["gpu_not_returned_bytes"] is None
    assert clean["clean"] is True


def test_host_memory_growing_over_the_window_is_flagged() -> None:
    def sample(n: int, host: int) -> MemorySample:
        return MemorySample(datetime(2026, 1, 1, tzinfo=UTC), f"op{n}", "m", host, None)

    growing = [sample(n, 4 * GIB + n * GIB // 2) for n in range(5)]
    steady = [sample(n, 4 * GIB + (n % 2) * 1024) for n in range(5)]

    flagged = leak_trend(growing, kind="host", window=3, threshold=GIB // 2)
    quiet = leak_trend(steady, kind="host", window=3, threshold=GIB // 2)

    assert (flagged.samples, flagged.growth, flagged.flagged) == (3, GIB, True)
    assert quiet.flagged is False
    assert leak_trend(growing[:1], kind="host", window=3, threshold=0).growth is None
    assert leak_trend(growing, kind="gpu", window=3, threshold=0).samples == 0


def test_samples_after_swaps_feed_the_trend(tmp_path: Path) -> None:
    async def scenario() -> list[bool]:
        triton = VisibleTriton()
        repos = SqliteRepos.open(tmp_path / "state.db")
        try:
            watch = _watch(repos, ScriptedGpu(), triton)
            flags = []
            for n in range(4):
                triton.resident += GIB  # every swap leaves a GiB more behind
                operation = _operation(n)
                trends = await watch.after_swap(operation)
                flags.append(next(t for t in trends if t.kind == "host").flagged)
        finally:
            repos.close()
        return flags

    # Two samples grow 1 GiB (not above the threshold); three grow 2 GiB.
    assert asyncio.run(scenario()) == [False, False, True, True]
