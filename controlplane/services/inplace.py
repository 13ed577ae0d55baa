"""Deploy and unload under the ``inplace`` strategy: the model's own dir, reloaded by Triton.

One deploy: resolve -> fetch -> verify -> headroom -> place -> load -> record. Invariants:

* Any failure before ``record`` leaves the repository exactly as it was and the serving
  release serving: a failed placement is undone with the same atomic exchange that made it,
  and Triton keeps the loaded version when a reload fails (checked against the real server).
* A load cut short by shutdown leaves the placement for start-up reconcile, since Triton may
  still be reading the placed files.

:class:`~controlplane.services.deploy.DeployService` runs these bodies under the model's lock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.slots import SlotState
from controlplane.ports import Placement
from controlplane.services.headroom import check_headroom
from controlplane.services.pipeline import PipelineDeps
from controlplane.services.slots import SlotBook, unload_best_effort
from controlplane.services.tracker import OperationTracker


@dataclass
class _Context:
    """What one running deploy has built so far, for clean-up on failure."""

    placement: Placement | None = None
    loading: bool = False
    recorded: bool = False


class Inplace:
    def __init__(self, deps: PipelineDeps) -> None:
        self._d = deps
        self._slots = SlotBook(deps.repo, deps.clock)

    # --- deploy ---------------------------------------------------------------------------

    async def deploy(self, tracker: OperationTracker, *, force: bool = False) -> None:
        op = tracker.operation
        model, release = op.model, op.release
        assert release is not None
        context = _Context()
        try:
            await self._steps(tracker, model, release, context, force=force)
        except BaseException as exc:
            # Cancelled (shutdown) while Triton loads: Triton goes on reading the placed files,
            # so swapping the dirs back now could make it load a mix of two releases. Leave
            # the placement; the next start-up reconcile converges to the desired release.
            cut_mid_load = isinstance(exc, asyncio.CancelledError) and context.loading
            if context.placement is not None and not context.recorded and not cut_mid_load:
                # Shielded from cancellation: the repository must be put back either way.
                await asyncio.shield(asyncio.to_thread(self._d.staging.restore, context.placement))
            raise

    async def _steps(
        self,
        tracker: OperationTracker,
        model: str,
        release: str,
        context: _Context,
        *,
        force: bool,
    ) -> None:
        op = tracker.operation
        prepared = await self._d.prepare(tracker, model, release, target=model)
        dest = prepared.path
        await check_headroom(tracker, self._d.headroom, prepared, force=force)

        slot = self._slots.get(model)
        replacing = slot.state.value in ("ACTIVE", "READY")
        async with self._d.load_slots:
            async with tracker.step("place"):
                context.placement = await asyncio.to_thread(self._d.staging.place, dest, model)
                tracker.detail(replaced=context.placement.replaced is not None)

            async with tracker.step("load"):
                if replacing:
                    slot = self._slots.move(slot, "UPDATING", op.trigger, f"reloading as {release}")
                else:
                    slot = self._slots.stage_and_load(slot, op.trigger, release)
                context.loading = True
                try:
                    async with self._d.memory.loading(model):
                        await self._d.triton.load(model)
                except Exception as raised:
                    exc = (
                        raised
                        if isinstance(raised, ControlPlaneError)
                        else ControlPlaneError(f"unexpected error during the load: {raised!r}")
                    )
                    await asyncio.shield(
                        asyncio.to_thread(self._d.staging.restore, context.placement)
                    )
                    context.placement = None
                    if replacing:
                        # Triton keeps the loaded version when a reload fails.
                        self._slots.move(slot, "ACTIVE", op.trigger, f"reload failed: {exc.code}")
                    else:
                        self._slots.move(slot, "FAILED", op.trigger, exc.message[:500])
                        await unload_best_effort(self._d.triton, model, self._d.unload_timeout)
                        self._slots.move(self._slots.get(model), "ABSENT", op.trigger, exc.code)
                    if exc is raised:
                        raise
                    raise exc from raised
                context.loading = False

        async with tracker.step("record"):
            previous = self._d.record_serving(model, release)
            context.recorded = True
            if replacing:
                self._slots.move(slot, "ACTIVE", op.trigger, f"serving {release}", release=release)
            else:
                slot = self._slots.move(slot, "READY", op.trigger, "loaded", release=release)
                self._slots.move(slot, "ACTIVE", op.trigger, f"serving {release}")
            await asyncio.to_thread(self._d.staging.discard, context.placement)
            tracker.detail(active=release, previous=previous)

    # --- unload -----------------------------------------------------------------------

    async def unload(self, tracker: OperationTracker) -> None:
        op = tracker.operation
        model = op.model
        slot = self._slots.get(model)
        async with self._d.memory.unloading(model, tracker):  # the residue: on "remove"
            async with tracker.step("unload"):
                slot = self._slots.move(slot, "UNLOADING", op.trigger, "unload requested")
                try:
                    await self._d.triton.unload(model)
                    await self._d.triton.wait_unavailable(model, self._d.unload_timeout)
                except ControlPlaneError as exc:
                    # The model still serves as far as anyone can tell: say so, so that the next
                    # deploy or unload of it starts from a valid state.
                    self._slots.observe(
                        model, SlotState.ACTIVE, slot.release, f"unload failed: {exc.code}"
                    )
                    raise
                slot = self._slots.move(slot, "UNAVAILABLE", op.trigger, "unloaded")
            async with tracker.step("remove"):
                removed = await asyncio.to_thread(self._d.staging.remove, model)
                tracker.detail(removed=removed)
                self._slots.move(slot, "ABSENT", op.trigger, "dir removed")
        async with tracker.step("record"):
            self._d.record_unloaded(model)
