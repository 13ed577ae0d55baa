"""The slot book: reads a model's slot, applies table-checked transitions, persists each one.

Under the ``inplace`` strategy a model has one slot, named after the model itself.
"""

from __future__ import annotations

import dataclasses
import logging

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.slots import Slot, SlotState, absent, observe, transition
from controlplane.ports import Clock, StateRepo, Triton

log = logging.getLogger(__name__)


class SlotBook:
    def __init__(self, repo: StateRepo, clock: Clock) -> None:
        self._repo = repo
        self._clock = clock

    def get(self, model: str, slot_name: str | None = None) -> Slot:
        name = slot_name or model
        record = self._repo.get_model(model)
        if record is not None:
            for slot in record.slots:
                if slot.name == name:
                    return slot
        return absent(name, self._clock.now())

    def move(
        self,
        slot: Slot,
        target: str,
        trigger: str,
        reason: str,
        *,
        release: str | None = None,
        model: str | None = None,
    ) -> Slot:
        moved = transition(
            slot,
            SlotState(target),
            trigger=str(trigger),
            at=self._clock.now(),
            reason=reason,
            release=release,
        )
        if moved.state is SlotState.ABSENT:
            moved = dataclasses.replace(moved, release=None)
        self._repo.save_slot(model or slot.name, moved)
        return moved

    def stage_and_load(
        self, slot: Slot, trigger: str, release: str, *, model: str | None = None
    ) -> Slot:
        """From any resting state to LOADING, through STAGED, recording each step."""
        if slot.state in (SlotState.ABSENT, SlotState.UNAVAILABLE, SlotState.FAILED):
            slot = self.move(
                slot, "STAGED", trigger, f"{release} placed", release=release, model=model
            )
        return self.move(
            slot, "LOADING", trigger, f"loading {release}", release=release, model=model
        )

    def observe(
        self,
        model: str,
        state: SlotState,
        release: str | None,
        reason: str,
        *,
        slot_name: str | None = None,
    ) -> Slot:
        slot = self.get(model, slot_name)
        seen = observe(slot, state, release=release, at=self._clock.now(), reason=reason)
        self._repo.save_slot(model, seen)
        return seen


async def unload_best_effort(triton: Triton, name: str, timeout: float) -> bool:
    """Unload ``name`` and wait for UNAVAILABLE; log instead of raising (clean-up paths)."""
    try:
        await triton.unload(name)
        await triton.wait_unavailable(name, timeout)
    except ControlPlaneError as exc:
        log.warning("could not unload %s: %s", name, exc)
        return False
    return True
