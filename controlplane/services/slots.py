"""The slot book: a model's slots as recorded, table-checked transitions, one commit each.

Under the ``inplace`` strategy a model has one slot, named after the model itself. A change
that touches several rows (a switch moves two slots and what serves) is one :meth:`commit`,
one transaction. :meth:`observe` records what reconcile saw, whatever the table says; normal
operations move slots only through :meth:`moved` and :meth:`move`, with their own trigger.
"""

from __future__ import annotations

import dataclasses
import logging

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.slots import Slot, SlotState, absent, observe, transition
from controlplane.ports import Clock, ModelRecord, Serving, ServingRepo, Triton

log = logging.getLogger(__name__)


class SlotBook:
    def __init__(self, serving: ServingRepo, clock: Clock) -> None:
        self._serving = serving
        self._clock = clock

    async def record(self, model: str) -> ModelRecord | None:
        return await self._serving.get(model)

    async def get(self, model: str, slot_name: str | None = None) -> Slot:
        name = slot_name or model
        record = await self._serving.get(model)
        if record is not None:
            for slot in record.slots:
                if slot.name == name:
                    return slot
        return absent(name, self._clock.now())

    def moved(
        self,
        slot: Slot,
        target: SlotState,
        trigger: str,
        reason: str,
        *,
        release: str | None = None,
    ) -> Slot:
        """``slot`` moved to ``target`` if the table allows it (not saved: see commit)."""
        moved = transition(
            slot,
            target,
            trigger=str(trigger),
            at=self._clock.now(),
            reason=reason,
            release=release,
        )
        if moved.state is SlotState.ABSENT:
            moved = dataclasses.replace(moved, release=None)
        return moved

    async def move(
        self,
        model: str,
        slot: Slot,
        target: SlotState,
        trigger: str,
        reason: str,
        *,
        release: str | None = None,
    ) -> Slot:
        moved = self.moved(slot, target, trigger, reason, release=release)
        await self.commit(model, moved)
        return moved

    async def commit(self, model: str, *slots: Slot, serving: Serving | None = None) -> None:
        """Save slots (and what serves) of ``model`` in one transaction."""
        await self._serving.commit(model, self._clock.now(), serving=serving, slots=slots)

    async def stage_and_load(self, model: str, slot: Slot, trigger: str, release: str) -> Slot:
        """From any resting state to LOADING, through STAGED, recorded in one commit."""
        staged = slot
        if slot.state in (SlotState.ABSENT, SlotState.UNAVAILABLE, SlotState.FAILED):
            staged = self.moved(
                slot, SlotState.STAGED, trigger, f"{release} placed", release=release
            )
        loading = self.moved(
            staged, SlotState.LOADING, trigger, f"loading {release}", release=release
        )
        await self.commit(model, loading)
        return loading

    async def observe(
        self,
        model: str,
        state: SlotState,
        release: str | None,
        reason: str,
        *,
        slot_name: str | None = None,
    ) -> Slot:
        slot = await self.get(model, slot_name)
        seen = observe(slot, state, release=release, at=self._clock.now(), reason=reason)
        await self.commit(model, seen)
        return seen


async def serving_after(book: SlotBook, model: str, release: str) -> Serving:
    """What serves once ``release`` does: the release it replaces becomes the previous."""
    record = await book.record(model)
    previous = record.previous_release if record else None
    if record and record.active_release and record.active_release != release:
        previous = record.active_release
    return Serving(active=release, previous=previous)


async def unload_best_effort(triton: Triton, name: str, timeout: float) -> bool:
    """Unload ``name`` and wait for UNAVAILABLE; log instead of raising (clean-up paths)."""
    try:
        await triton.unload(name)
        await triton.wait_unavailable(name, timeout)
    except ControlPlaneError as exc:
        log.warning("could not unload %s: %s", name, exc)
        return False
    return True
