"""This member's writes to the fleet's desired state.

An operation that a person, CI, the release watcher or a fleet-scope automatic rollback asked
of this member *publishes* its result as its last step (``publish``), still holding the model:
only once this member serves the release does the desired state move, so a release that fails
to load or preflight here never reaches the others, and this member's own sync loop can never
see the new local state before the fleet's (it would otherwise "repair" it back).

The write is a compare-and-swap on the record read when the request arrived: if another member
changed it meanwhile, the request gets ``desired_state_conflict`` naming the winner, unless the
winner wants the same release (two members that roll back the same overload both succeed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.domain.errors import DesiredStateConflict
from controlplane.domain.fleet import (
    Degraded,
    DesiredModel,
    Rollout,
    RolloutPhase,
    first_generation,
)
from controlplane.domain.operations import OperationKind
from controlplane.domain.rollout import RolloutPolicy, stable_release, start
from controlplane.ports import Clock, DesiredStates
from controlplane.services.runner import Run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """Who this daemon is in the fleet."""

    name: str
    incarnation: str  # this process: a restarted member is another incarnation
    version: str


@dataclass(frozen=True)
class Publication:
    """What an operation writes to the desired state once it serves here."""

    base: DesiredModel | None  # the record read when the request arrived
    release: str | None  # None: unloaded
    latch: str | None = None  # a release rolled back from: latched degraded for the fleet


class FleetLedger:
    def __init__(
        self,
        *,
        records: DesiredStates,
        member: Member,
        clock: Clock,
        rollout_for: Callable[[str], RolloutPolicy],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.records = records
        self.member = member
        self._clock = clock
        self._rollout_for = rollout_for
        self._wake = wake

    async def read(self, model: str) -> DesiredModel | None:
        return await asyncio.to_thread(self.records.read, model)

    async def publish(self, run: Run, publication: Publication) -> DesiredModel:
        """The ``publish`` step: write the desired state this operation has made true here."""
        async with run.tracker.step("publish"):
            new = await self._next(run, publication)
            try:
                await asyncio.to_thread(self.records.swap, new)
            except DesiredStateConflict:
                current = await self.read(run.model)
                if current is None or current.release != publication.release:
                    raise
                run.tracker.detail(generation=current.generation, already=current.set_by)
                log.info(
                    "%s: the fleet's desired state already says %s (generation %d, set by %s)",
                    run.model,
                    publication.release,
                    current.generation,
                    current.set_by,
                )
                return current
            run.tracker.detail(
                generation=new.generation,
                phase=new.rollout.phase.value,
                **({"canaries": list(new.rollout.canaries)} if new.rollout.canaries else {}),
            )
            log.info(
                "%s: the fleet's desired state is now %s (generation %d, %s)",
                run.model,
                new.release or "unloaded",
                new.generation,
                new.rollout.phase.value,
            )
        self._wake()
        return new

    async def _next(self, run: Run, publication: Publication) -> DesiredModel:
        operation = run.operation
        now = self._clock.now()
        base = publication.base or first_generation(
            operation.model, by=self.member.name, at=now, trigger="none", reason=""
        )
        release = publication.release
        rollout = Rollout(RolloutPhase.COMPLETE)
        stable = stable_release(publication.base)
        policy = self._rollout_for(operation.model)
        if operation.kind is OperationKind.DEPLOY and policy.progressive and stable != release:
            beats = await asyncio.to_thread(self.records.beats)
            rollout = start(
                policy,
                first=self.member.name,
                alive=[m for m, beat in beats.items() if beat.alive(now)],
                stable=stable,
                generation=base.generation + 1,
            )
        elif base.rollout.in_progress and publication.latch == base.release:
            rollout = Rollout(
                RolloutPhase.ROLLED_BACK,
                stable=base.rollout.stable,
                canaries=base.rollout.canaries,
                since_generation=base.rollout.since_generation,
                note=f"rolled back by {operation.trigger.value} on {self.member.name}",
            )
        degraded = base.unlatched(release)  # a release served on purpose is no longer degraded
        latch = publication.latch
        if latch is not None and latch != release and not base.is_degraded(latch):
            reason = f"rolled back from by {operation.trigger.value} (operation {operation.id})"
            degraded = (*degraded, Degraded(latch, now, reason))
        what = release or "unloaded"
        return base.changed(
            by=self.member.name,
            at=now,
            trigger=operation.trigger.value,
            reason=f"{operation.kind.value} of {what} by {operation.trigger.value} through "
            f"{self.member.name} (operation {operation.id})",
            release=release,
            previous=base.release if base.release != release else base.previous,
            degraded=degraded,
            rollout=rollout,
            claim=None if base.claim is None or base.claim.release == release else base.claim,
        )
