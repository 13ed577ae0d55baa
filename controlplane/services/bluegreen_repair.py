"""Blue-green's half for the reconcile loop: what Triton and the repository show of a model,
and the repairs that put it back without the store.

A blue-green model needs a slot that holds the desired release READY, and the alias READY and
pointing at it (:func:`~controlplane.domain.drift.assess`). The repairs: load a slot from its
dir, re-point the alias, remove an alias left by a first deploy that never finished, take down
slots nothing needs, forget spares whose dirs are gone; and a warm previous release keeps its
retire window across a daemon restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from controlplane.domain.drift import Action, Assessment, Observed
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.domain.triton import TritonState
from controlplane.ports import IndexEntry, ReleaseMarker, Staging, Triton
from controlplane.services.alias import Alias
from controlplane.services.retire import RetireTimers
from controlplane.services.runner import Run
from controlplane.services.slots import (
    LoadSlots,
    SlotBook,
    SlotFreer,
    SlotSnapshot,
    load_from_disk,
    record_serving,
)

READY = TritonState.READY


class _Parts(Protocol):
    """What the repairs use of :class:`~controlplane.services.bluegreen.BlueGreen`."""

    _triton: Triton
    _staging: Staging
    _slots: SlotBook
    _freer: SlotFreer
    _load_slots: LoadSlots
    _policy_for: Callable[[str], TrafficPolicy]
    retire_timers: RetireTimers

    def owned(self, snapshot: SlotSnapshot) -> list[Slot]: ...

    def schedule_retire(self, model: str, slot_name: str, *, now: bool = False) -> None: ...

    @property
    def _alias(self) -> Alias: ...


class BlueGreenRepairs:
    async def observe(
        self: _Parts,
        snapshot: SlotSnapshot,
        index: Mapping[str, IndexEntry],
        placed: Mapping[str, ReleaseMarker],
    ) -> Observed:
        model, policy = snapshot.model, self._policy_for(snapshot.model)
        slots = self.owned(snapshot)
        names = {n for n, m in placed.items() if m.model == model and policy.owns(model, n)}
        names |= {s.name for s in slots}
        triton = {n: index[n].state for n in (*names, model) if n in index}
        target = None
        if triton.get(model) is READY:
            target = await self._triton.alias_target(model)
        seen = Observed(
            model=model,
            desired=snapshot.active_release,
            strategy=Strategy.BLUE_GREEN,
            slots=slots,
            on_disk={n: placed[n].release for n in names if n in placed and not placed[n].edited},
            triton=triton,
            alias_target=target,
            alias_on_disk=await asyncio.to_thread(self._staging.is_alias_dir, model),
        )
        if not policy.keep_warm:  # a warm previous release keeps its window, also after a restart
            for slot in slots:
                warm = slot.state is SlotState.RETIRING and triton.get(slot.name) is READY
                if warm and not self.retire_timers.scheduled(slot.name):
                    self.schedule_retire(model, slot.name)
        return seen

    async def settle(self: _Parts, seen: Observed) -> None:
        for name in sorted({s.name for s in seen.slots} | set(seen.on_disk)):
            record = next((s for s in seen.slots if s.name == name), None)
            state = seen.triton.get(name)
            if state is READY and record is not None and record.state.loaded:
                continue
            release = seen.on_disk.get(name)
            await self._slots.observe(
                seen.model,
                _settled(state, release),
                release,
                "as found by reconcile",
                slot_name=name,
            )

    async def repair(self: _Parts, run: Run, seen: Observed, assessment: Assessment) -> None:
        tracker, model = run.tracker, seen.model
        tracker.operation_detail({"why": assessment.why, "action": assessment.action.value})
        if assessment.action is Action.REMOVE:
            async with tracker.step("remove"):
                await self._alias.remove(model)
        slot = assessment.slot
        if slot is not None and assessment.action in (Action.LOAD, Action.REPOINT):
            # One load slot for the slot's load and the alias's: both take one of Triton's
            # load threads, and an alias queued inside Triton behind other models' loads
            # would keep a model that is loaded from serving.
            async with self._load_slots.hold(tracker):
                if assessment.action is Action.LOAD:
                    await load_from_disk(tracker, self._triton, self._slots, seen, slot)
                async with tracker.step("switch"):
                    # The alias's dir may be gone (an unload cut short after removing it,
                    # or a person): Triton loads even an overridden model from its dir.
                    await self._alias.point(model, slot)
                    tracker.detail(target=slot)
            async with tracker.step("record"):
                await record_serving(self._slots, model, slot, seen.desired)
        for name in assessment.retire:
            async with tracker.step("unload"):
                tracker.detail(slot=name)
                current = next((s for s in seen.slots if s.name == name), None)
                if (
                    current is None
                    or current.state is not SlotState.UNAVAILABLE
                    or (name in seen.on_disk)
                ):
                    current = await self._slots.observe(
                        model,
                        _before_take_down(seen.triton.get(name)),
                        seen.on_disk.get(name),
                        "not needed: taken down by reconcile",
                        slot_name=name,
                    )
                await self._freer.take_down(tracker, current, "not needed")
        bases = self._policy_for(model).slots(model)
        stale = [s.name for s in seen.slots if s.state is SlotState.ABSENT and s.name not in bases]
        if stale:
            await self._slots.forget(model, stale)

    def not_serving(
        self: _Parts, snapshot: SlotSnapshot, index: Mapping[str, IndexEntry]
    ) -> str | None:
        model, desired = snapshot.model, snapshot.active_release
        alias = index.get(model)
        holders = [
            s.name
            for s in snapshot.slots
            if s.release == desired
            and (entry := index.get(s.name)) is not None
            and entry.state is READY
        ]
        if alias is None or alias.state is not READY:
            state = alias.state if alias is not None else "not loaded"
            return f"the alias {model} is {state} in Triton"
        if not holders:
            return f"no slot holding {desired} is READY in Triton"
        return None


def _settled(state: TritonState | None, release: str | None) -> SlotState:
    """A slot's record as Triton and its dir show it (blue-green: loaded is READY)."""
    if state is READY:
        return SlotState.READY
    if state is not None and state.busy:
        return SlotState.FAILED
    return SlotState.UNAVAILABLE if release is not None else SlotState.ABSENT


def _before_take_down(state: TritonState | None) -> SlotState:
    """The slot state that matches Triton's, for a slot about to be taken down."""
    if state is READY:
        return SlotState.READY
    if state is not None and state.busy:
        return SlotState.FAILED
    return SlotState.UNAVAILABLE
