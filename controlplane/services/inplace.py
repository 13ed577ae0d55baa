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

Repairs (for the reconcile loop): the model's dir holds the desired release, so a model Triton
does not have READY, or that was left mid-way, is loaded from it; a dir of a first deploy that
never finished, when nothing should serve, is removed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.domain.drift import Action, Assessment, Observed
from controlplane.domain.errors import ControlPlaneError, TritonTimeout
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.traffic import Strategy
from controlplane.domain.triton import TritonState
from controlplane.ports import IndexEntry, Placement, ReleaseMarker, Staging, Triton
from controlplane.services.memory import HeadroomPolicy, MemoryWatch, check_headroom
from controlplane.services.prepare import Preparer
from controlplane.services.runner import Run
from controlplane.services.slots import (
    LoadSlots,
    SlotBook,
    SlotSnapshot,
    load_from_disk,
    record_serving,
    serving_after,
    unload_best_effort,
    unloaded,
)

log = logging.getLogger(__name__)
READY = TritonState.READY


@dataclass
class _Placed:
    """The placement one running deploy made, until it is recorded or put back."""

    placement: Placement | None = None
    loading: bool = False


class Inplace:
    """The inplace strategy (:class:`~controlplane.services.strategy.ModelStrategy`)."""

    kind = Strategy.INPLACE

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

    # --- what the snapshot says -----------------------------------------------------------

    def slot_names(self, model: str) -> tuple[str, ...]:
        return (model,)

    def serving_name(self, snapshot: SlotSnapshot) -> str | None:
        slot = snapshot.slot(snapshot.model)
        return slot.name if slot.state is SlotState.ACTIVE else None

    def warm(self, snapshot: SlotSnapshot, release: str) -> Slot | None:
        return None  # one slot: going back to another release is a load

    async def roll_back(self, run: Run, snapshot: SlotSnapshot, warm: Slot) -> None:
        raise AssertionError("inplace has no warm slot to go back to")

    # --- deploy ---------------------------------------------------------------------------

    async def deploy(
        self, run: Run, snapshot: SlotSnapshot, *, revision: str | None, force: bool
    ) -> None:
        placed = _Placed()
        try:
            await self._steps(run, snapshot, placed, revision=revision, force=force)
        except asyncio.CancelledError:
            if placed.placement is not None and not (placed.loading and run.stopping):
                # Shielded: the repository must be put back whatever else is cancelled.
                await asyncio.shield(asyncio.to_thread(self._staging.restore, placed.placement))
            raise
        except BaseException:
            if placed.placement is not None:
                await asyncio.shield(asyncio.to_thread(self._staging.restore, placed.placement))
            raise

    async def _steps(
        self,
        run: Run,
        snapshot: SlotSnapshot,
        placed: _Placed,
        *,
        revision: str | None,
        force: bool,
    ) -> None:
        tracker = run.tracker
        model, release = run.model, run.operation.release
        assert release is not None
        prepared = await self._preparer.prepare(
            tracker, model, release, target=model, revision=revision
        )
        await check_headroom(tracker, self._headroom, prepared, force=force)
        slot = snapshot.slot(model)
        replacing = slot.state.loaded
        async with self._load_slots.hold(tracker):
            async with tracker.step("place"):
                placed.placement = await asyncio.to_thread(
                    self._staging.place, prepared.path, model, owner=model
                )
                tracker.detail(replaced=placed.placement.replaced is not None)
            async with tracker.step("load"):
                slot = await self._load(run, placed, slot, release, replacing=replacing)
        async with tracker.step("record"):
            await self._record(run, snapshot, placed, slot, release, replacing=replacing)

    async def _load(
        self, run: Run, placed: _Placed, slot: Slot, release: str, *, replacing: bool
    ) -> Slot:
        """Triton loads the placed files; on a failure, what was there is put back."""
        model = run.model
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
            await self._after_failed_load(run, placed, slot, exc, replacing=replacing)
            if exc is raised:
                raise
            raise exc from raised
        placed.loading = False
        return slot

    async def _after_failed_load(
        self, run: Run, placed: _Placed, slot: Slot, exc: ControlPlaneError, *, replacing: bool
    ) -> None:
        model = run.model
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
            await self._slots.move(model, failed, SlotState.ABSENT, run.trigger, exc.code)

    async def _record(
        self,
        run: Run,
        snapshot: SlotSnapshot,
        placed: _Placed,
        slot: Slot,
        release: str,
        *,
        replacing: bool,
    ) -> None:
        """What serves and the slot, in one transaction; the replaced dir is deleted after."""
        trigger = run.trigger
        serving = serving_after(snapshot, release)
        if replacing:
            done = self._slots.moved(
                slot, SlotState.ACTIVE, trigger, f"serving {release}", release=release
            )
        else:
            ready = self._slots.moved(slot, SlotState.READY, trigger, "loaded", release=release)
            done = self._slots.moved(ready, SlotState.ACTIVE, trigger, f"serving {release}")
        await self._slots.commit(run.model, done, serving=serving)
        placement, placed.placement = placed.placement, None
        if placement is not None:
            await asyncio.to_thread(self._staging.discard, placement)
        run.tracker.detail(active=release, previous=serving.previous)

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

    async def unload(self, run: Run, snapshot: SlotSnapshot) -> None:
        tracker = run.tracker
        model = run.model
        slot = snapshot.slot(model)
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
            await self._slots.commit(model, slot, serving=unloaded(snapshot))

    # --- repairs ----------------------------------------------------------------------------

    async def observe(
        self,
        snapshot: SlotSnapshot,
        index: Mapping[str, IndexEntry],
        placed: Mapping[str, ReleaseMarker],
    ) -> Observed:
        model = snapshot.model
        marker = placed.get(model)
        return Observed(
            model=model,
            desired=snapshot.active_release,
            strategy=Strategy.INPLACE,
            slots=[snapshot.slot(model)],
            on_disk=(
                {model: marker.release}
                if marker is not None and marker.model == model and not marker.edited
                else {}  # an edited dir holds no release: it is placed again
            ),
            triton={model: index[model].state} if model in index else {},
        )

    async def settle(self, seen: Observed) -> None:
        model = seen.model
        record = next((s for s in seen.slots if s.name == model), None)
        state, release = seen.triton.get(model), seen.on_disk.get(model)
        if state is READY and record is not None and record.state.loaded:
            return
        settled = (
            SlotState.ACTIVE
            if state is READY
            else SlotState.FAILED
            if state is not None and state.busy
            else SlotState.UNAVAILABLE
            if release is not None
            else SlotState.ABSENT
        )
        await self._slots.observe(model, settled, release, "as found by reconcile")

    async def repair(self, run: Run, seen: Observed, assessment: Assessment) -> None:
        tracker, model = run.tracker, seen.model
        tracker.operation_detail({"why": assessment.why, "action": assessment.action.value})
        if assessment.action is Action.REMOVE:
            async with tracker.step("remove"):
                await unload_best_effort(self._triton, model, self._unload_timeout)
                await asyncio.to_thread(self._staging.remove, model)
                await self._slots.observe(
                    model, SlotState.ABSENT, None, "unconfirmed deploy removed"
                )
        if assessment.action is Action.LOAD and assessment.slot is not None:
            async with self._load_slots.hold(tracker):
                await load_from_disk(tracker, self._triton, self._slots, seen, model)
            async with tracker.step("record"):
                await record_serving(self._slots, model, model, seen.desired)

    def not_serving(self, snapshot: SlotSnapshot, index: Mapping[str, IndexEntry]) -> str | None:
        model = snapshot.model
        entry = index.get(model)
        if entry is None or entry.state is not READY:
            state = entry.state if entry is not None else "not loaded"
            return f"{model} is {state} in Triton"
        return None
