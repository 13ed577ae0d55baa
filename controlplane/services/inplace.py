"""Deploy and unload under the ``inplace`` strategy: the model's own dir, reloaded by Triton.

One deploy: resolve -> fetch -> verify -> headroom -> place -> load -> record. Invariants:

* Any failure before ``record`` leaves the repository exactly as it was and the serving
  release serving: a failed placement is undone with the same atomic exchange that made it,
  and Triton keeps the loaded version when a reload fails (checked against the real server).
* A reload that does not end in time (its timeout, or a rollback budget) is put back at once:
  the placement is exchanged back and the slot recorded STALE, because Triton may still finish
  loading the other files; the reconcile loop reloads the model from disk once Triton is idle,
  and a deploy reloads it as well. Nothing is left UPDATING, so the next deploy starts from a
  valid state.
* A load cut short by shutdown leaves the placement for start-up reconcile, which converges to
  the desired release (the daemon is going away; it cannot follow Triton's load).

Under this strategy a load that never ends holds the model's own name in Triton until Triton
restarts (blue-green loads into a spare slot instead): the old version keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from controlplane.domain.errors import ControlPlaneError, TritonTimeout
from controlplane.domain.slots import SlotState
from controlplane.ports import Placement, Serving, Staging, Triton
from controlplane.services.coordination import LoadSlots
from controlplane.services.headroom import HeadroomPolicy, check_headroom
from controlplane.services.memory import MemoryWatch
from controlplane.services.prepare import Preparer
from controlplane.services.runner import Run
from controlplane.services.slots import SlotBook, serving_after, unload_best_effort

log = logging.getLogger(__name__)
SERVING = (SlotState.ACTIVE, SlotState.READY, SlotState.STALE)


@dataclass
class _Placed:
    """The placement one running deploy made, until it is recorded or put back."""

    placement: Placement | None = None
    loading: bool = False


class Inplace:
    def __init__(
        self,
        *,
        preparer: Preparer,
        staging: Staging,
        triton: Triton,
        slots: SlotBook,
        load_slots: LoadSlots,
        memory: MemoryWatch,
        headroom: HeadroomPolicy,
        unload_timeout: float,
    ) -> None:
        self._preparer = preparer
        self._staging = staging
        self._triton = triton
        self._slots = slots
        self._load_slots = load_slots
        self._memory = memory
        self._headroom = headroom
        self._unload_timeout = unload_timeout

    # --- deploy ---------------------------------------------------------------------------

    async def deploy(self, run: Run, *, revision: str | None, force: bool = False) -> None:
        placed = _Placed()
        try:
            await self._steps(run, placed, revision=revision, force=force)
        except asyncio.CancelledError:
            if placed.placement is not None and not (placed.loading and run.stopping):
                # Shielded: the repository must be put back whatever else is cancelled.
                await asyncio.shield(asyncio.to_thread(self._staging.restore, placed.placement))
            raise
        except BaseException:
            if placed.placement is not None:
                await asyncio.shield(asyncio.to_thread(self._staging.restore, placed.placement))
            raise

    async def _steps(self, run: Run, placed: _Placed, *, revision: str | None, force: bool) -> None:
        tracker = run.tracker
        model, release = run.model, run.operation.release
        assert release is not None
        prepared = await self._preparer.prepare(
            tracker, model, release, target=model, revision=revision
        )
        await check_headroom(tracker, self._headroom, prepared, force=force)

        slot = await self._slots.get(model)
        replacing = slot.state in SERVING
        async with self._load_slots.hold(tracker):
            async with tracker.step("place"):
                placed.placement = await asyncio.to_thread(
                    self._staging.place, prepared.path, model, owner=model
                )
                tracker.detail(replaced=placed.placement.replaced is not None)

            async with tracker.step("load"):
                if replacing:
                    slot = await self._slots.move(
                        model, slot, SlotState.UPDATING, run.trigger, f"reloading as {release}"
                    )
                else:
                    slot = await self._slots.stage_and_load(model, slot, run.trigger, release)
                placed.loading = True
                try:
                    async with self._memory.loading(model):
                        await self._triton.load(model)
                except asyncio.CancelledError:
                    if not run.stopping:
                        await asyncio.shield(self._put_back(run, placed, slot.state, "cut short"))
                    raise
                except Exception as raised:
                    exc = (
                        raised
                        if isinstance(raised, ControlPlaneError)
                        else ControlPlaneError(f"unexpected error during the load: {raised!r}")
                    )
                    if isinstance(exc, TritonTimeout):
                        await self._put_back(run, placed, slot.state, exc.code)
                    elif replacing:
                        await self._restore(placed)
                        # Triton keeps the loaded version when a reload fails.
                        await self._slots.move(
                            model, slot, SlotState.ACTIVE, run.trigger, f"reload failed: {exc.code}"
                        )
                    else:
                        await self._restore(placed)
                        failed = await self._slots.move(
                            model, slot, SlotState.FAILED, run.trigger, exc.message[:500]
                        )
                        await unload_best_effort(self._triton, model, self._unload_timeout)
                        await self._slots.move(
                            model, failed, SlotState.ABSENT, run.trigger, exc.code
                        )
                    if exc is raised:
                        raise
                    raise exc from raised
                placed.loading = False

        async with tracker.step("record"):
            serving = await serving_after(self._slots, model, release)
            if replacing:
                done = self._slots.moved(
                    slot, SlotState.ACTIVE, run.trigger, f"serving {release}", release=release
                )
            else:
                ready = self._slots.moved(
                    slot, SlotState.READY, run.trigger, "loaded", release=release
                )
                done = self._slots.moved(ready, SlotState.ACTIVE, run.trigger, f"serving {release}")
            await self._slots.commit(model, done, serving=serving)
            placement, placed.placement = placed.placement, None
            if placement is not None:
                await asyncio.to_thread(self._staging.discard, placement)
            tracker.detail(active=release, previous=serving.previous)

    async def _restore(self, placed: _Placed) -> None:
        placement, placed.placement = placed.placement, None
        if placement is not None:
            await asyncio.to_thread(self._staging.restore, placement)

    async def _put_back(self, run: Run, placed: _Placed, state: SlotState, why: str) -> None:
        """A load that did not end in time: the placement goes back at once, and the slot is
        recorded as Triton may now see it (a reload cut short: STALE; a first load: FAILED),
        for the reconcile loop to settle once Triton is idle."""
        model = run.model
        await self._restore(placed)
        slot = await self._slots.get(model)
        if state is SlotState.UPDATING:
            await self._slots.move(
                model,
                slot,
                SlotState.STALE,
                run.trigger,
                f"reload {why}: the previous files are back; Triton may still finish loading "
                "the new ones, so the model is reloaded from disk once Triton is idle",
            )
        elif slot.state is SlotState.LOADING:
            await self._slots.move(model, slot, SlotState.FAILED, run.trigger, f"load {why}")
        log.warning("%s: load %s; placement put back", model, why)

    # --- unload -----------------------------------------------------------------------

    async def unload(self, run: Run) -> None:
        tracker = run.tracker
        model = run.model
        slot = await self._slots.get(model)
        async with self._memory.unloading(model, tracker):  # the residue: on "remove"
            async with tracker.step("unload"):
                slot = await self._slots.move(
                    model, slot, SlotState.UNLOADING, run.trigger, "unload requested"
                )
                try:
                    await self._triton.unload(model)
                    await self._triton.wait_unavailable(model, self._unload_timeout)
                except ControlPlaneError as exc:
                    # It may still serve: say so, so that reconcile tries the unload again
                    # and the next deploy or unload starts from a valid state.
                    await self._slots.move(
                        model, slot, SlotState.FAILED, run.trigger, f"unload failed: {exc.code}"
                    )
                    raise
                slot = self._slots.moved(slot, SlotState.UNAVAILABLE, run.trigger, "unloaded")
            async with tracker.step("remove"):
                removed = await asyncio.to_thread(self._staging.remove, model)
                tracker.detail(removed=removed)
                slot = self._slots.moved(slot, SlotState.ABSENT, run.trigger, "dir removed")
        async with tracker.step("record"):
            record = await self._slots.record(model)
            await self._slots.commit(
                model,
                slot,
                serving=Serving(active=None, previous=record.active_release if record else None),
            )
