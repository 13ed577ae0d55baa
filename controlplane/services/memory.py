"""Memory around loads and unloads: room for a load, the residue audit and the leak trend.

* **Headroom** (the ``headroom`` step): a load the GPU, the host or ``/dev/shm`` has no room
  for is refused, unless forced. It runs after the release is verified and before anything is
  placed (blue-green: after the idle slot is freed, since that frees memory too). A refusal
  is ``insufficient_memory`` with the figures; ``force`` loads anyway and says so.

* **Residue audit**: every slot the daemon unloads is snapshotted while still loaded and
  audited once it is UNAVAILABLE and its dir is gone. Findings go into the operation (the
  step's ``residue`` detail), into metrics, and into a warning in the log. When Triton's
  processes cannot be seen, the audit says it was skipped and why.
* **Leak trend**: after every completed swap (deploy or rollback) Triton's memory is sampled
  and stored; growth over the last N swaps above the threshold is logged as a suspected leak
  and exported as ``controlplane_triton_memory_growth_bytes``. GPU memory comes from Triton's
  metrics; host memory is Triton's resident memory plus shared memory in use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from controlplane.domain import headroom
from controlplane.domain.errors import InsufficientMemory
from controlplane.domain.memory import LeakTrend, MemorySample, ResidueReport, leak_trend
from controlplane.domain.operations import Operation
from controlplane.ports import Clock, MemoryBook, MemoryFigures, Telemetry, TritonProcesses
from controlplane.services.prepare import PreparedRelease
from controlplane.services.telemetry import NO_TELEMETRY
from controlplane.services.tracker import OperationTracker

log = logging.getLogger(__name__)
GPU_TOLERANCE = 64 * 1024**2  # allocator slack: less than this not returned is no finding


@dataclass(frozen=True)
class LeakPolicy:
    window: int = 10
    threshold: int = 1024**3


class MemoryWatch:
    def __init__(
        self,
        *,
        processes: TritonProcesses | None,
        figures: MemoryFigures | None,
        book: MemoryBook,
        clock: Clock,
        policy: LeakPolicy,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self._processes = processes
        self._figures = figures
        self._book = book
        self._clock = clock
        self._policy = policy
        self._telemetry = telemetry
        self._load_delta: dict[str, int] = {}  # slot -> GPU memory its load took
        self._flagged: set[str] = set()

    # --- loads: what each slot took on the GPU ---------------------------------------------

    @asynccontextmanager
    async def loading(self, slot: str) -> AsyncIterator[None]:
        """Around a slot's load: remember how much GPU memory it took (for the audit)."""
        if self._processes is None:  # no audit will ask
            yield
            return
        before = await self._gpu_used()
        yield
        after = await self._gpu_used()
        if before is not None and after is not None:
            self._load_delta[slot] = max(0, after - before)

    # --- unloads: the residue audit ------------------------------------------------------

    @asynccontextmanager
    async def unloading(
        self, slot: str, tracker: OperationTracker | None = None
    ) -> AsyncIterator[None]:
        """Around unloading ``slot`` and removing its dir: audit what it left behind."""
        if self._processes is None:
            yield
            return
        probe = await asyncio.to_thread(self._processes.probe, slot)
        gpu_before = await self._gpu_used()
        yield
        report = await asyncio.to_thread(probe.finish)
        report = await self._with_gpu(report, slot, gpu_before)
        self._telemetry.residue_found(report)
        if tracker is not None:
            tracker.detail(residue=report.as_detail())
        if report.skipped is None and not report.clean:
            log.warning("unloading %s left residue: %s", slot, report.describe())
        else:
            log.info("residue audit of %s: %s", slot, report.describe())

    async def _with_gpu(
        self, report: ResidueReport, slot: str, gpu_before: int | None
    ) -> ResidueReport:
        took = self._load_delta.pop(slot, None)
        gpu_after = await self._gpu_used()
        if report.skipped is not None or took is None or gpu_before is None or gpu_after is None:
            return report
        missing = took - (gpu_before - gpu_after)
        return dataclasses.replace(
            report, gpu_not_returned=missing if missing > GPU_TOLERANCE else None
        )

    # --- swaps: the leak trend -----------------------------------------------------------

    async def after_swap(self, operation: Operation) -> list[LeakTrend]:
        if self._processes is None:
            return []
        memory = await asyncio.to_thread(self._processes.memory)
        if memory is None:
            return []
        sample = MemorySample(
            at=self._clock.now(),
            operation_id=operation.id,
            model=operation.model,
            host_bytes=memory.host_bytes,
            gpu_bytes=await self._gpu_used(),
        )
        await self._book.record(sample)
        trends = await self.trends()
        self._telemetry.memory_observed(memory, trends)
        for trend in trends:
            if trend.flagged and trend.kind not in self._flagged:
                log.warning(
                    "Triton's %s memory grew by %d bytes over the last %d swaps (threshold %d): "
                    "a leak is likely; see docs/memory.md on allocators (LD_PRELOAD tcmalloc)",
                    trend.kind,
                    trend.growth,
                    trend.samples,
                    self._policy.threshold,
                )
            if trend.flagged:
                self._flagged.add(trend.kind)
            else:
                self._flagged.discard(trend.kind)
        return trends

    async def trends(self) -> list[LeakTrend]:
        samples = await self._book.recent(self._policy.window)
        return [
            leak_trend(
                samples, kind=kind, window=self._policy.window, threshold=self._policy.threshold
            )
            for kind in ("host", "gpu")
        ]

    async def recent(self) -> list[MemorySample]:
        return await self._book.recent(self._policy.window)

    def skipped(self) -> str | None:
        if self._processes is None:
            return "the audit is off (memory.audit: false)"
        return self._processes.skipped()

    async def _gpu_used(self) -> int | None:
        if self._figures is None:
            return None
        gpus = await self._figures.gpu_memory()
        if not gpus:
            return None
        return sum(g.used for g in gpus.values())


# --- headroom: room for a load -------------------------------------------------------------


@dataclass(frozen=True)
class HeadroomPolicy:
    figures: MemoryFigures | None = None  # None: the check is off
    factor: float = 1.5
    shm_per_instance: int = 1024**2
    shm_backends: tuple[str, ...] = ("python",)
    shm_margin: int = 32 * 1024**2


async def check_headroom(
    tracker: OperationTracker,
    policy: HeadroomPolicy,
    prepared: PreparedRelease,
    *,
    force: bool,
    refuse: bool = True,
) -> bool:
    """The ``headroom`` step: whether the release fits now; without room it is refused
    (:class:`InsufficientMemory`) unless ``force``, or, not ``refuse``, the answer is False
    (``auto`` then rolls instead)."""
    async with tracker.step("headroom"):
        if policy.figures is None:
            tracker.detail(checked=False)
            return True
        summary = prepared.summary
        need, basis = headroom.estimate_need(
            prepared.size_bytes, policy.factor, summary.memory_hint
        )
        gpus = await policy.figures.gpu_memory() if summary.may_use_gpu else {}
        host = await asyncio.to_thread(policy.figures.host_available)
        shm = await asyncio.to_thread(policy.figures.shm)
        found = headroom.check(
            need,
            basis,
            gpu_free=None if gpus is None else {uuid: g.free for uuid, g in gpus.items()},
            host_available=host,
            shm=headroom.shm_need(
                summary.backend,
                summary.instances,
                per_instance=policy.shm_per_instance,
                backends=policy.shm_backends,
                free=None if shm is None else shm.free,
                margin=policy.shm_margin,
                where="/dev/shm" if shm is None else shm.path,  # noqa: S108
            ),
        )
        tracker.detail(
            need_bytes=found.need,
            basis=found.basis,
            gpu_free_bytes=found.gpu_free,
            gpus="unreadable" if gpus is None else len(gpus),
            host_available_bytes=found.host_available,
            **_shm_detail(found.shm, summary.backend, policy.shm_backends),
            forced=force and not found.ok and refuse,
        )
        if found.ok:
            return True
        if not refuse:
            tracker.detail(fits=False, why=found.describe())
            return False
        if force:
            log.warning(
                "loading anyway (force): %s",
                found.describe(),
                extra={"operation_id": tracker.operation.id},
            )
            return True
        raise InsufficientMemory(
            f"{found.describe()}; free memory first (unload a model) or deploy with force"
        )


def _shm_detail(
    shm: headroom.ShmNeed | None, backend: str, backends: tuple[str, ...]
) -> dict[str, object]:
    if shm is None:
        return {"shm": "unreadable" if backend in backends else f"not used by {backend}"}
    return {
        "shm_need_bytes": shm.need,
        "shm_basis": shm.basis,
        "shm_free_bytes": shm.free,
        "shm_margin_bytes": shm.margin,
    }
