"""Pause, resume, promote and abort a model's rollout, through any member.

Each control reads the model's desired-state record, makes its next generation with the pure
rules of :mod:`controlplane.domain.rollout_controls` and writes it compare-and-swap; a race
lost to another change (a member that advanced the rollout meanwhile, a turn taken) is read
again and the control applied to what won, a few times. Then this member looks again and wakes
the others, so they hold or follow now rather than at their next poll.
"""

from __future__ import annotations

import asyncio
import logging
from enum import StrEnum

from controlplane.domain import rollout_controls
from controlplane.domain.errors import DesiredStateConflict, ModelNotFound
from controlplane.domain.fleet import DesiredModel
from controlplane.ports import Clock
from controlplane.services.fleet_ledger import FleetLedger

log = logging.getLogger(__name__)
ATTEMPTS = 5


class Control(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    PROMOTE = "promote"
    ABORT = "abort"


class RolloutControls:
    def __init__(self, *, ledger: FleetLedger, clock: Clock) -> None:
        self._ledger = ledger
        self._records = ledger.records
        self._member = ledger.member.name
        self._clock = clock

    async def apply(
        self, model: str, control: Control, *, trigger: str, reason: str = ""
    ) -> DesiredModel:
        """The record written by ``control`` of ``model``'s rollout; the domain's refusal
        (``no_rollout_in_progress``, ``rollout_not_paused``, ``rollout_already_paused``) when
        there is nothing to do, ``model_not_found`` when the fleet has no record of it."""
        for _attempt in range(ATTEMPTS):
            current = await asyncio.to_thread(self._records.read, model)
            if current is None:
                raise ModelNotFound(
                    f"the fleet has no desired state of {model}: deploy it first "
                    f"(controlplane deploy {model} RELEASE)"
                )
            new = await self._next(current, control, trigger=trigger, reason=reason)
            try:
                await asyncio.to_thread(self._records.swap, new)
            except DesiredStateConflict:
                continue  # another change won: apply the control to it
            log.warning("%s: %s (generation %d)", model, new.reason, new.generation)
            self._ledger.wake_fleet()
            return new
        raise DesiredStateConflict(
            f"the desired state of {model} kept changing under {ATTEMPTS} attempts to "
            f"{control.value} its rollout; try again"
        )

    async def _next(
        self, current: DesiredModel, control: Control, *, trigger: str, reason: str
    ) -> DesiredModel:
        now = self._clock.now()
        who = {"member": self._member, "trigger": trigger, "reason": reason}
        if control is Control.PAUSE:
            beats = await asyncio.to_thread(self._records.beats)
            return rollout_controls.pause(current, beats, now, **who)
        if control is Control.RESUME:
            return rollout_controls.resume(current, now, **who)
        if control is Control.PROMOTE:
            return rollout_controls.promote(current, now, **who)
        return rollout_controls.abort(current, now, **who)
