"""What the deploy pipelines (``inplace`` and ``blue-green``) share: their ports and policies,
the prepare step, and how they record what serves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.domain.traffic import TrafficPolicy
from controlplane.ports import (
    Clock,
    MetricsSource,
    ModelConfigEditor,
    ModelStore,
    Staging,
    StateRepo,
    Triton,
)
from controlplane.services.headroom import HeadroomPolicy
from controlplane.services.memory import MemoryWatch
from controlplane.services.prepare import PreparedRelease, prepare_release
from controlplane.services.tracker import OperationTracker


@dataclass(frozen=True)
class PipelineDeps:
    store: ModelStore
    staging: Staging
    editor: ModelConfigEditor
    triton: Triton
    metrics: MetricsSource
    repo: StateRepo
    clock: Clock
    load_slots: asyncio.Semaphore  # bounds loads across models
    require_checksums: bool
    unload_timeout: float
    policy_for: Callable[[str], TrafficPolicy]
    memory: MemoryWatch
    headroom: HeadroomPolicy = field(default_factory=HeadroomPolicy)

    async def prepare(
        self, tracker: OperationTracker, model: str, release: str, *, target: str
    ) -> PreparedRelease:
        """Fetch and verify ``release`` into staging, its config naming ``target``."""
        return await prepare_release(
            tracker,
            store=self.store,
            staging=self.staging,
            editor=self.editor,
            require_checksums=self.require_checksums,
            model=model,
            release=release,
            target=target,
        )

    def record_serving(self, model: str, release: str) -> str | None:
        """``release`` serves now; the one it replaced becomes the previous. Returns that."""
        record = self.repo.get_model(model)
        previous = record.previous_release if record else None
        if record and record.active_release and record.active_release != release:
            previous = record.active_release
        self.repo.set_serving(model, active=release, previous=previous, at=self.clock.now())
        return previous

    def record_unloaded(self, model: str) -> None:
        """Nothing serves now; what served becomes the previous."""
        record = self.repo.get_model(model)
        self.repo.set_serving(
            model,
            active=None,
            previous=record.active_release if record else None,
            at=self.clock.now(),
        )
