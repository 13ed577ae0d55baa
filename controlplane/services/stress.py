"""The ``stress`` step of a blue-green deploy: load-test the new slot beside the serving one.

Runs after the smoke inference and before the switch, so a refusal leaves the alias and the
serving release untouched (the blue-green body takes the new slot down). The window is cut
into short phases that alternate between the new slot and the active one, so both meet the
same noise of a shared machine; memory is read once the new slot has loaded (its steady
allocation is not growth) and again after the window. :mod:`controlplane.domain.stress` holds
the figures and the verdict; a refusal is :class:`PreflightFailed` with all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.domain import stress
from controlplane.domain.errors import PreflightFailed
from controlplane.domain.smoke import SmokeSample
from controlplane.domain.stress import Growth, Load, SlotFigures, StressPolicy
from controlplane.ports import InferenceLoad, MemoryFigures
from controlplane.services.tracker import OperationTracker


@dataclass(frozen=True)
class MemoryReading:
    shm_used: int | None
    gpu_used: int | None  # summed over GPUs; None: unreadable or no GPU


class StressCheck:
    def __init__(
        self,
        *,
        load: InferenceLoad,
        figures: MemoryFigures,
        policy_for: Callable[[str], StressPolicy],
    ) -> None:
        self._load = load
        self._figures = figures
        self._policy_for = policy_for

    def enabled(self, model: str) -> bool:
        return self._policy_for(model).enabled

    async def run(
        self,
        tracker: OperationTracker,
        model: str,
        *,
        new: str,
        active: str | None,
        sample: SmokeSample | None,
    ) -> None:
        """Drive ``new`` (and ``active``, when there is one) for the model's window; record
        the figures on the step and raise :class:`PreflightFailed` when the verdict refuses."""
        policy = self._policy_for(model)
        before = await self._memory()
        loads = {new: Load(), **({active: Load()} if active else {})}
        for role, seconds in stress.phases(policy.seconds, with_active=active is not None):
            slot = new if role == stress.NEW else active
            assert slot is not None
            loads[slot] += await self._load.drive(
                slot, sample, concurrency=policy.concurrency, seconds=seconds
            )
        after = await self._memory()
        verdict = stress.judge(
            policy,
            SlotFigures.of(new, loads[new]),
            SlotFigures.of(active, loads[active]) if active else None,
            [
                Growth("shm", "shared memory (/dev/shm)", before.shm_used, after.shm_used),
                Growth("gpu_memory", "GPU memory", before.gpu_used, after.gpu_used),
            ],
        )
        detail = verdict.as_detail()
        tracker.detail(**detail)
        if not verdict.ok:
            raise PreflightFailed(
                f"stress test of {new}: {verdict.describe()}; the serving release keeps "
                "serving. Fix the release, or loosen preflight.stress for this model",
                details={"stress": detail},
            )

    async def _memory(self) -> MemoryReading:
        shm = await asyncio.to_thread(self._figures.shm)
        gpus = await self._figures.gpu_memory()
        return MemoryReading(
            shm_used=None if shm is None else shm.used,
            gpu_used=sum(g.used for g in gpus.values()) if gpus else None,
        )
