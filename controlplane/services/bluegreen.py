"""Blue-green: load the new release beside the old one, prove it, move all traffic at once.

Deploy: stage -> place into an idle slot -> load -> preflight (signature, smoke inference)
-> stress (optional: the new slot load-tested beside the active one, :mod:`.stress`) -> switch
(re-point the alias, then READY and one inference through it) -> record. The old slot stays
loaded for ``retire_after`` (:mod:`.retire`) so that a rollback is one re-point; then a retire
operation drains it (Triton's pending-request gauge at 0, or a maximum drain time) and frees it.

Invariants:

* Nothing changes the active slot or the alias before the switch (the stress step only sends
  the active slot requests), so any failure before it leaves the serving release serving; a
  failed re-point is pointed back at once (Triton leaves a failed ensemble reload
  unavailable, checked against the real server).
* What serves and both slots are recorded in one transaction (:meth:`SlotBook.commit`).
* A load that times out is abandoned (its unload asked for, never waited on past a few
  seconds): Triton may hold the slot LOADING until it restarts, since a Python ``initialize()``
  that never returns cannot be stopped from outside, and the daemon kills nothing it did not
  start. Such a slot stays FAILED (reconcile takes it down once Triton lets go) and the next
  deploy loads into a spare name instead (``<model>__green-2``), so it succeeds.
* Cut short by a rollback budget, a body puts its records back at once and leaves the Triton
  side to reconcile; cut short by shutdown, it leaves everything to start-up reconcile.

The repairs the reconcile loop asks of a blue-green model are in :mod:`.bluegreen_repair`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controlplane.domain.errors import ControlPlaneError, TritonTimeout
from controlplane.domain.operations import OperationKind
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.smoke import SMOKE_NAME, SmokeSample, parse_smoke
from controlplane.domain.traffic import Strategy, TrafficPolicy, check_aliasable
from controlplane.domain.triton import TritonState
from controlplane.ports import Clock, Staging, Triton
from controlplane.services.alias import Alias
from controlplane.services.bluegreen_repair import BlueGreenRepairs
from controlplane.services.memory import HeadroomPolicy, MemoryWatch, check_headroom
from controlplane.services.prepare import PreparedRelease, Preparer
from controlplane.services.retire import RetireTimers
from controlplane.services.runner import Run
from controlplane.services.slots import (
    LoadSlots,
    SlotBook,
    SlotFreer,
    SlotSnapshot,
    serving_after,
    unloaded,
)
from controlplane.services.stress import StressCheck
from controlplane.services.tracker import OperationTracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bounds:
    unload: float = 120.0  # an unload to reach UNAVAILABLE
    abandon: float = 3.0  # after a load timed out, to see Triton leave LOADING


class BlueGreen(BlueGreenRepairs):
    """The blue-green strategy (:class:`~controlplane.services.strategy.ModelStrategy`); its
    repairs are the half in :mod:`.bluegreen_repair`."""

    kind = Strategy.BLUE_GREEN

    def __init__(
        self,
        *,
        preparer: Preparer,
        staging: Staging,
        triton: Triton,
        slots: SlotBook,
        freer: SlotFreer,
        load_slots: LoadSlots,
        memory: MemoryWatch,
        headroom: HeadroomPolicy,
        retire: RetireTimers,
        clock: Clock,
        policy_for: Callable[[str], TrafficPolicy],
        bounds: Bounds,
        stress: StressCheck | None = None,
    ) -> None:
        self._preparer = preparer
        self._staging = staging
        self._triton = triton
        self._slots = slots
        self._freer = freer
        self._load_slots = load_slots
        self._memory = memory
        self._headroom = headroom
        self.retire_timers = retire
        self._clock = clock
        self._alias = Alias(
            triton=triton, staging=staging, clock=clock, unload_seconds=bounds.unload
        )
        self._policy_for = policy_for
        self._bounds = bounds
        self._stress = stress

    # --- what the snapshot says -----------------------------------------------------------

    def slot_names(self, model: str) -> tuple[str, ...]:
        return self._policy_for(model).slots(model)

    def serving_name(self, snapshot: SlotSnapshot) -> str | None:
        active = snapshot.active()
        return active.name if active is not None else None

    def warm(self, snapshot: SlotSnapshot, release: str) -> Slot | None:
        return snapshot.warm(release)

    def owned(self, snapshot: SlotSnapshot) -> list[Slot]:
        """The model's slots: its base slots, and the spares the records know."""
        policy = self._policy_for(snapshot.model)
        return [s for s in snapshot.slots if policy.owns(snapshot.model, s.name)]

    # --- deploy ---------------------------------------------------------------------------

    async def deploy(
        self, run: Run, snapshot: SlotSnapshot, *, revision: str | None, force: bool
    ) -> None:
        tracker = run.tracker
        release = run.operation.release
        assert release is not None
        active = snapshot.active()
        index = await self._index()
        target = self._choose_target(snapshot, active, index)
        prepared = await self._preparer.prepare(
            tracker, run.model, release, target=target.name, revision=revision
        )
        sample = await self._check(tracker, prepared, target)
        target = await self._free(tracker, snapshot, index, target, active, release)
        await check_headroom(tracker, self._headroom, prepared, force=force)
        await self._load_and_switch(run, snapshot, prepared, target, active, sample)

    async def _load_and_switch(
        self,
        run: Run,
        snapshot: SlotSnapshot,
        prepared: PreparedRelease,
        target: Slot,
        active: Slot | None,
        sample: SmokeSample | None,
    ) -> None:
        """``place``, ``load``, ``preflight``, ``stress``, ``switch`` and ``record``: the new
        release beside the serving one (checked for room already), then all traffic to it."""
        tracker, release = run.tracker, run.operation.release or ""
        slot = await self._place_and_load(run, prepared, target, first=active is None)
        try:
            signature = await self._alias.preflight(tracker, slot, sample)
            await self._stress_test(run, slot, active, sample)
            async with tracker.step("switch"):
                await self._alias.switch(tracker, slot.name, signature, sample, back_to=active)
        except BaseException as exc:
            await self._after_failed_switch(run, slot, exc, first=active is None)
            raise
        async with tracker.step("record"):
            await self._record(tracker, snapshot, release, new=slot, old=active)

    async def _check(
        self, tracker: OperationTracker, prepared: PreparedRelease, target: Slot
    ) -> SmokeSample | None:
        """The ``check`` step: an alias can front the model; the smoke sample it ships."""
        async with tracker.step("check"):
            summary = prepared.summary
            check_aliasable(
                tracker.operation.model,
                decoupled=summary.decoupled,
                sequence_batching=summary.sequence_batching,
            )
            sample = await _smoke_sample(prepared.path)
            tracker.detail(slot=target.name, smoke=SMOKE_NAME if sample else "generated")
        return sample

    async def _free(
        self,
        tracker: OperationTracker,
        snapshot: SlotSnapshot,
        index: dict[str, TritonState],
        target: Slot,
        active: Slot | None,
        release: str,
    ) -> Slot:
        """The ``free`` step, when needed: the target emptied, and at most one release left
        warm beside the one that serves (with a spare slot, after a load that never ended, a
        third could otherwise be loaded while two others are)."""
        keep = {target.name, active.name if active else ""}
        extras = [
            s
            for s in self.owned(snapshot)
            if s.name not in keep and _holding(s) and not _busy(index, s.name)
        ]
        if target.state.idle and not extras:
            return target
        async with tracker.step("free"):
            if not target.state.idle:
                tracker.detail(slot=target.name, release=target.release)
                target = await self._freer.take_down(tracker, target, f"room for {release}")
            if extras:
                tracker.detail(also={s.name: s.release for s in extras})
            for extra in extras:
                await self._freer.take_down(tracker, extra, f"room for {release}")
        return target

    async def _place_and_load(
        self, run: Run, prepared: PreparedRelease, target: Slot, *, first: bool
    ) -> Slot:
        """The ``place`` and ``load`` steps, in a load slot; the slot READY."""
        tracker, model, release = run.tracker, run.model, run.operation.release or ""
        async with self._load_slots.hold(tracker):
            async with tracker.step("place"):
                await asyncio.to_thread(self._staging.ensure_alias_dir, model)
                placement = await asyncio.to_thread(
                    self._staging.place, prepared.path, target.name, owner=model
                )
                await asyncio.to_thread(self._staging.discard, placement)
                tracker.detail(slot=target.name)
            async with tracker.step("load"):
                slot = await self._slots.stage_and_load(model, target, run.trigger, release)
                try:
                    async with self._memory.loading(slot.name):
                        await self._triton.load(slot.name)
                except BaseException as exc:
                    held = await self._after_failed_load(run, slot, exc, first=first)
                    if held and isinstance(exc, TritonTimeout):
                        raise TritonTimeout(
                            f"{exc.message}; Triton still holds {slot.name} LOADING, so the next "
                            "deploy of this model loads into a spare slot",
                            details={"slot_held_by_triton": slot.name},
                        ) from exc
                    raise
                return await self._slots.move(model, slot, SlotState.READY, run.trigger, "loaded")

    async def _stress_test(
        self, run: Run, slot: Slot, active: Slot | None, sample: SmokeSample | None
    ) -> None:
        """The ``stress`` step, when the model asks for it. Not on the way back: a rollback
        returns to a release that has served, and must be quick (an automatic one has a budget
        of seconds, on a GPU already overloaded)."""
        if self._stress is None or not self._stress.enabled(run.model):
            return
        if run.operation.kind is OperationKind.ROLLBACK:
            return
        async with run.tracker.step("stress"):
            await self._stress.run(
                run.tracker,
                run.model,
                new=slot.name,
                active=active.name if active else None,
                sample=sample,
            )

    def _choose_target(
        self, snapshot: SlotSnapshot, active: Slot | None, index: dict[str, TritonState]
    ) -> Slot:
        """The slot to load into: an idle one Triton is not busy with, else a busy-free one
        that holds something (freed first), else a new spare beside a slot Triton holds."""
        model, policy = snapshot.model, self._policy_for(snapshot.model)
        owned = self.owned(snapshot)
        candidates = [s for s in owned if active is None or s.name != active.name]
        free = [s for s in candidates if not _busy(index, s.name)]
        for slot in free:
            if slot.state.idle:
                return slot
        if free:
            return free[0]
        taken = {s.name for s in owned}
        for base in policy.slots(model):
            if active is not None and base == active.name:
                continue
            number = 2
            while policy.spare(base, number) in taken:
                number += 1
            name = policy.spare(base, number)
            busy = sorted(s.name for s in candidates if _busy(index, s.name))
            log.warning(
                "Triton still holds %s (a load that never ended; freed when Triton restarts); "
                "loading into the spare slot %s instead",
                ", ".join(busy),
                name,
            )
            return snapshot.slot(name)
        raise AssertionError("a model always has a base slot that is not active")

    async def _index(self) -> dict[str, TritonState]:
        try:
            return {e.name: e.state for e in await self._triton.index()}
        except ControlPlaneError:
            return {}  # the load itself will say what is wrong with Triton

    async def _after_failed_load(
        self, run: Run, slot: Slot, exc: BaseException, *, first: bool
    ) -> bool:
        """Clean up after a load that failed, timed out or was cut short; True when Triton
        still holds the slot (a load that does not end)."""
        model = run.model
        if isinstance(exc, asyncio.CancelledError):
            # Cut short: Triton goes on loading. Record the slot as failed at once; reconcile
            # takes it down when Triton has let go (or start-up reconcile, at shutdown).
            await asyncio.shield(
                self._slots.move(model, slot, SlotState.FAILED, run.trigger, "load cut short")
            )
            return False
        reason = getattr(exc, "code", "unexpected error")
        if isinstance(exc, TritonTimeout):
            left = await self._triton.abandon(slot.name, self._bounds.abandon)
            if not left:
                await self._slots.move(
                    model,
                    slot,
                    SlotState.FAILED,
                    run.trigger,
                    "its load never ended: Triton holds it LOADING (initialize() did not "
                    "return); the next deploy uses a spare slot, and this one is removed once "
                    "Triton lets go of it or restarts",
                )
                return True
        failed = await self._slots.move(model, slot, SlotState.FAILED, run.trigger, reason)
        await self._freer.take_down(run.tracker, failed, reason)
        if first:
            await self._alias.remove(model)
        return False

    async def _after_failed_switch(
        self, run: Run, slot: Slot, exc: BaseException, *, first: bool
    ) -> None:
        model = run.model
        reason = f"preflight or switch failed: {getattr(exc, 'code', 'interrupted')}"
        if isinstance(exc, asyncio.CancelledError):
            await asyncio.shield(
                self._slots.move(model, slot, SlotState.UNLOADING, run.trigger, reason)
            )
            return
        await self._freer.take_down(run.tracker, slot, reason)
        if first:  # a first deploy: no alias is left pointing at nothing
            await self._alias.remove(model)

    # --- rollback inside the retire window, unload --------------------------------

    async def roll_back(self, run: Run, snapshot: SlotSnapshot, warm: Slot) -> None:
        """Traffic back to a warm retiring slot: one re-point, no load."""
        tracker = run.tracker
        release = run.operation.release
        assert release is not None
        active = snapshot.active()
        async with tracker.step("switch"):
            signature = await self._triton.signature(warm.name)
            await self._alias.switch(tracker, warm.name, signature, None, back_to=active)
        async with tracker.step("record"):
            await self._record(tracker, snapshot, release, new=warm, old=active)

    async def unload(self, run: Run, snapshot: SlotSnapshot) -> None:
        """The alias first (clients stop getting answers from the model), then each slot,
        each in a step of its own with its residue audit."""
        model, tracker = run.model, run.tracker
        slots = self.owned(snapshot)
        for slot in slots:
            self.retire_timers.cancel(slot.name)
        async with tracker.step("unload"):
            tracker.detail(alias=model)
            await self._triton.unload(model)
            await self._triton.wait_unavailable(model, self._bounds.unload)
            await asyncio.to_thread(self._staging.remove, model)
        for slot in slots:
            if slot.state is not SlotState.ABSENT:
                async with tracker.step("unload"):
                    tracker.detail(slot=slot.name, release=slot.release)
                    await self._freer.take_down(tracker, slot, "unload requested")
        async with tracker.step("record"):
            await self._slots.commit(model, serving=unloaded(snapshot))

    def schedule_retire(self, model: str, slot_name: str, *, now: bool = False) -> None:
        self.retire_timers.schedule(model, slot_name, now=now)

    # --- the alias and the records --------------------------------------------------------

    async def _record(
        self,
        tracker: OperationTracker,
        snapshot: SlotSnapshot,
        release: str,
        *,
        new: Slot,
        old: Slot | None,
    ) -> None:
        """What serves, the new active slot and the retiring one: one transaction."""
        model, trigger = snapshot.model, tracker.operation.trigger
        serving = serving_after(snapshot, release)
        self.retire_timers.cancel(new.name)  # back in service: its old timer must not fire
        moved = [self._slots.moved(new, SlotState.ACTIVE, trigger, f"serving {release}")]
        if old is not None:
            moved.append(
                self._slots.moved(
                    old, SlotState.RETIRING, trigger, f"warm for rollback to {old.release}"
                )
            )
        await self._slots.commit(model, *moved, serving=serving)
        if old is not None:
            self.schedule_retire(model, old.name)
        tracker.detail(active=release, previous=serving.previous, slot=new.name)


def _holding(slot: Slot) -> bool:
    """The slot holds a loaded release (or one being updated)."""
    return slot.state.loaded or slot.state is SlotState.UPDATING


def _busy(index: dict[str, TritonState], name: str) -> bool:
    state = index.get(name)
    return state is not None and state.busy


async def _smoke_sample(release_dir: Path) -> SmokeSample | None:
    path = release_dir / SMOKE_NAME
    if not await asyncio.to_thread(path.is_file):
        return None
    return parse_smoke(await asyncio.to_thread(path.read_text, encoding="utf-8"))
