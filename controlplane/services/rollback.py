"""Automatic rollback: the chain from an overloaded release back to something that serves.

For one model: the fallback release within its budget; if that fails or runs out of time, the
serving release reloaded on CPU-only instances within the CPU budget; if that fails too, an
error in the log and in the record. The release rolled back from is latched degraded first, so
that nothing automatic (the release watcher, a retried alert) promotes it while the chain runs,
or after.

The fallback's budget depends on what it takes: a warm fallback (its slot still loaded, inside
the retire window or kept warm by policy) is a re-point, a few milliseconds, so it gets the
short budget; a cold one must be loaded, which no real GPU model does in 3 s, so it gets the
cold budget, sized for a load. The record says which applied. A step that runs past its budget
is cut short with the reason ``budget`` (its placement and slot are put back at once); the
whole chain ends within the sum of its budgets plus the one-second grace of that clean-up.

In a fleet (``rollback.scope: fleet``) during a canary rollout of the model, the chain stops
the rollout on whichever member runs it: the fallback is the stable release, even where it
serves already, and the canary's release is the one latched and rolled back from
(:func:`~controlplane.domain.rollout.rollback_aim`, on the desired state as the fleet sync last
read it, so that no store read eats into the budget).

Automatic triggers (the overload watcher, an alert) are held back by the cooldown after the
model's last automatic rollback and counted on it; a person (the runbook route) is not.
Actions on one model are serialized here, so a watcher breach and an alert arriving together
make one rollback and one counted trigger.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any

from controlplane.domain.errors import ControlPlaneError, ModelNotFound
from controlplane.domain.names import validate_model_name
from controlplane.domain.operations import (
    Cause,
    Trigger,
    any_holder,
)
from controlplane.domain.rollback import (
    AUTOMATIC,
    DegradedRelease,
    RollbackOutcome,
    RollbackRecord,
    choose_fallback,
    cooldown_until,
)
from controlplane.domain.rollout import RollbackAim, rollback_aim
from controlplane.domain.turns import RollingPolicy
from controlplane.ports import Clock, ModelRecord, RollbackBook, ServingRepo, Telemetry
from controlplane.services.deploy import DeployService
from controlplane.services.fleet_ledger import FleetLedger
from controlplane.services.operations import Begin, Ended, OperationClient, Outcome
from controlplane.services.telemetry import NO_TELEMETRY
from controlplane.timing import seconds_left

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RollbackBudgets:
    fallback: float = 3.0  # a warm fallback: one re-point
    cold_fallback: float = 120.0  # a cold fallback: a load
    cpu: float = 2.0
    cooldown: float = 300.0


@dataclass(frozen=True)
class RollbackResult:
    model: str
    acted: bool
    record: RollbackRecord | None
    note: str


class AutoRollback:
    def __init__(
        self,
        *,
        deploy: DeployService,
        client: OperationClient,
        serving: ServingRepo,
        book: RollbackBook,
        clock: Clock,
        budgets: RollbackBudgets,
        configured_fallback: Callable[[str], str | None],
        enabled: Callable[[str], bool],
        telemetry: Telemetry = NO_TELEMETRY,
        fleet: FleetLedger | None = None,
        previous_of: Callable[[ModelRecord], str | None] | None = None,
        rolling_for: Callable[[str], RollingPolicy | None] = lambda _model: None,
    ) -> None:
        self._telemetry = telemetry
        # A model that may roll (strategy rolling or auto): its cold fallback may have to
        # drain, unload and wait for the GPU memory before the load, and its budget says so.
        self._rolling_for = rolling_for
        self._deploy = deploy
        self._client = client
        self._serving = serving
        self._book = book
        self._clock = clock
        self._budgets = budgets
        self._configured_fallback = configured_fallback
        self._enabled = enabled
        self._locks: dict[str, asyncio.Lock] = {}
        self._fleet = fleet  # rollback.scope: fleet
        # In a fleet, what served before is the fleet's previous release, not this member's
        # (a member that lost a race, or joined late, went through releases the fleet never had).
        self._previous_of = previous_of or _own_previous

    @property
    def cooldown(self) -> float:
        return self._budgets.cooldown

    async def fallback(self, model: str) -> str | None:
        record = await self._serving.get(model)
        if record is None:
            return None
        return self.fallback_of(record, await self._book.latched(model))

    def fallback_of(self, record: ModelRecord, degraded: Iterable[DegradedRelease]) -> str | None:
        """:meth:`fallback` from what was read already (status reads many models at once).
        During a canary rollout (``rollback.scope: fleet``): the stable release, on every
        member, even where it serves already (a rollback there stops the rollout)."""
        return self._fallback(record, self._stopping(record), degraded)

    def _fallback(
        self,
        record: ModelRecord,
        stopping: RollbackAim | None,
        degraded: Iterable[DegradedRelease],
    ) -> str | None:
        latched = {d.release for d in degraded}
        if stopping is not None:
            return stopping.to if stopping.to not in latched else None
        return choose_fallback(
            configured=self._configured_fallback(record.name),
            active=record.active_release,
            previous=self._previous_of(record),
            degraded=latched,
        )

    def _stopping(self, record: ModelRecord) -> RollbackAim | None:
        """With ``rollback.scope: fleet``, while the fleet (as its sync last read it) runs a
        canary rollout of the model: the rollback that stops it, whatever serves here."""
        if self._fleet is None:
            return None
        aim = rollback_aim(
            self._fleet.known(record.name),
            active=record.active_release,
            previous=self._previous_of(record),
        )
        return aim if aim.stops_rollout else None

    async def candidates(self, *, automatic: bool = True) -> list[str]:
        """Models serving here that have a fallback (and, for automatic triggers, have
        automatic rollback on)."""
        return [
            record.name
            for record in await self._serving.all()
            if record.active_release is not None
            and (self._enabled(record.name) or not automatic)
            and await self.fallback(record.name) is not None
        ]

    async def cooldown_until(self, model: str) -> datetime | None:
        """When the cooldown after the last automatic rollback of ``model`` ends; None if over."""
        return self.cooldown_after(await self._book.last(model))

    def cooldown_after(self, last: RollbackRecord | None) -> datetime | None:
        """:meth:`cooldown_until` from the model's last rollback record, read already."""
        until = cooldown_until(last, self.cooldown)
        return until if until is not None and until > self._clock.now() else None

    async def on_overload(
        self, models: Sequence[str] | None, *, trigger: Trigger, reason: str
    ) -> list[RollbackResult]:
        """Act on each named model, or on every candidate when none is named."""
        targets = list(models) if models is not None else await self.candidates()
        results = []
        for model in targets:
            if trigger in AUTOMATIC and not self._enabled(model):
                log.info("automatic rollback is off for %s (auto_rollback: false)", model)
                results.append(RollbackResult(model, False, None, "auto_rollback is off"))
                continue
            try:
                results.append(await self.act(model, trigger=trigger, reason=reason))
            except ControlPlaneError as exc:
                log.warning("automatic rollback of %s refused: %s", model, exc)
                results.append(RollbackResult(model, False, None, str(exc)))
        return results

    async def act(self, model: str, *, trigger: Trigger, reason: str) -> RollbackResult:
        validate_model_name(model)
        async with self._locks.setdefault(model, asyncio.Lock()):
            record = await self._serving.get(model)
            if record is None or record.active_release is None:
                raise ModelNotFound(f"model {model!r} is not serving here; nothing to roll back")
            last = await self._book.last(model)
            until = cooldown_until(last, self.cooldown)
            if trigger in AUTOMATIC and last and until and self._clock.now() < until:
                await self._book.count_suppressed(last.id)
                self._telemetry.rollback_suppressed(model)
                note = f"in cooldown until {until.isoformat()}; counted"
                log.info("rollback trigger for %s held back: %s", model, note)
                return RollbackResult(model, False, last, note)
            done = await self._chain(record, record.active_release, trigger=trigger, reason=reason)
            return RollbackResult(model, done.outcome.acted, done, done.outcome.value)

    async def _chain(
        self, record: ModelRecord, serving: str, *, trigger: Trigger, reason: str
    ) -> RollbackRecord:
        model, started = record.name, self._clock.now()
        # During a canary rollout the canary's release is what is rolled back from, whatever
        # serves here (a member that is not a canary serves the stable release).
        stopping = self._stopping(record)
        away = (stopping.away_from if stopping is not None else None) or serving
        await self._book.latch(DegradedRelease(model, away, started, reason))
        log.warning("rolling back %s from %s: %s", model, away, reason, extra={"model": model})
        steps = _Steps()
        if stopping is not None:
            steps.detail["rollout"] = stopping.said
        fallback = self._fallback(record, stopping, await self._book.latched(model))
        cause = Cause(reason=reason)
        deadline = self._clock.monotonic() + self._budgets.cpu
        outcome, target = RollbackOutcome.FAILED, None
        if fallback is None:
            steps.detail["fallback"] = "none: no configured or previous good release"
        else:
            fallback_budget = await self._fallback_budget(model, fallback, steps)
            deadline += fallback_budget
            begin = partial(self._deploy.rollback, model, to=fallback, trigger=trigger, cause=cause)
            attempt = await self._attempt(begin, fallback_budget, f"the fallback {fallback}")
            if steps.note("fallback", attempt):
                outcome, target = RollbackOutcome.FALLBACK, fallback
        if not outcome.acted:
            cpu_budget = min(self._budgets.cpu, seconds_left(self._clock, deadline))
            on_cpu = partial(self._deploy.serve_on_cpu, model, trigger=trigger, cause=cause)
            attempt = await self._attempt(on_cpu, cpu_budget, "the CPU-only reload")
            if steps.note("cpu", attempt):
                outcome, target = RollbackOutcome.CPU, serving
        elapsed = (self._clock.now() - started).total_seconds()
        steps.detail["seconds"] = round(elapsed, 3)
        if outcome is RollbackOutcome.FALLBACK and target is not None and trigger in AUTOMATIC:
            steps.detail["fleet"] = await self._move_fleet(model, away, target, trigger, reason)
        done = RollbackRecord(
            id=uuid.uuid4().hex[:16],
            model=model,
            at=started,
            trigger=trigger,
            reason=reason,
            from_release=away,
            to_release=target,
            outcome=outcome,
            operation_ids=tuple(steps.operations),
            detail=steps.detail,
        )
        await self._book.save(done)
        self._telemetry.rollback_recorded(done)
        _say(done, elapsed)
        return done

    async def _fallback_budget(self, model: str, fallback: str, steps: _Steps) -> float:
        """A warm fallback (its slot still loaded) is a re-point: the short budget; a cold one
        must be loaded, which no real GPU model does in 3 s: the cold budget, and for a model
        that may roll, the rolling update's waits on top (out of rotation, drain, the GPU
        memory's return). Recorded."""
        warm = await self._deploy.is_warm(model, fallback)
        rolling = None if warm else self._rolling_for(model)
        if warm:
            kind, budget = "warm", self._budgets.fallback
            why = f"{fallback}'s slot is still loaded: a re-point"
        elif rolling is None:
            kind, budget = "cold", self._budgets.cold_fallback
            why = f"{fallback} must be loaded (rollback.cold_fallback_budget_seconds)"
        else:
            kind, budget = "rolling", self._budgets.cold_fallback + rolling.waits
            why = (
                f"{fallback} must be loaded, and {model} may fit once in GPU memory: this "
                f"member may leave rotation, drain, unload and wait for the memory first "
                f"(rollback.cold_fallback_budget_seconds {self._budgets.cold_fallback:g} s + "
                f"{rolling.waits:g} s of waits: rollout.unready_seconds twice, "
                "drain_timeout_seconds, memory.return_seconds, and with restart-triton "
                "memory.restart_seconds and the memory's return again)"
            )
        steps.detail["fallback_budget"] = {"kind": kind, "seconds": budget, "why": why}
        return budget

    async def _move_fleet(
        self, model: str, active: str, target: str, trigger: Trigger, reason: str
    ) -> str:
        """``rollback.scope: fleet``: every member goes back to ``target`` too. After the
        chain, so the store's answer never eats into the rollback's budget; meanwhile this
        member's latch keeps its sync from going back to ``active``."""
        if self._fleet is None:
            return "member scope: only this member rolled back"
        try:
            moved = await self._fleet.roll_back(
                model, away_from=active, to=target, trigger=trigger.value, reason=reason
            )
        except ControlPlaneError as exc:
            log.error(
                "%s: rolled back here, but the fleet's desired state could not be moved to "
                "%s: %s; the other members keep serving %s",
                model,
                target,
                exc,
                active,
            )
            return f"not moved: {exc}"
        if moved is None:
            return "unchanged: the fleet's desired state had moved already"
        return f"the fleet's desired state is {target} (generation {moved.generation})"

    async def _attempt(self, begin: Begin, budget: float, what: str) -> Outcome:
        """Start an operation (waiting for the model within the budget) and see it end within
        it; past it, the operation is cut short (reason: budget) and its clean-up runs."""
        outcome = await self._client.run(begin, patience=any_holder(budget), budget=budget)
        if outcome.ended is Ended.BUSY:
            held = f"another operation held the model past {budget:g} s"
            return replace(outcome, message=held)
        if outcome.ended is Ended.CUT_SHORT:
            cut = f"{what} did not finish within {budget:g} s; cut short"
            return replace(outcome, message=cut)
        return outcome


def _said(attempt: Outcome) -> str:
    """What the record says of an attempt that did not succeed (as it always has: the
    message alone when the client wrote it, else ``code: message``)."""
    if attempt.ended in (Ended.BUSY, Ended.CUT_SHORT) and attempt.message:
        return attempt.message
    return attempt.error


def _own_previous(record: ModelRecord) -> str | None:
    """A lone daemon's "previous": the release that served before here."""
    return record.previous_release


@dataclass
class _Steps:
    """What the chain records as it goes: each step's result, and the operations it ran."""

    detail: dict[str, Any] = field(default_factory=dict)
    operations: list[str] = field(default_factory=list)

    def note(self, step: str, attempt: Outcome) -> bool:
        """Record ``attempt`` as ``step``; whether it succeeded."""
        if attempt.operation is not None:
            self.operations.append(attempt.operation.id)
        self.detail[step] = "succeeded" if attempt.succeeded else _said(attempt)
        return attempt.succeeded


def _say(done: RollbackRecord, elapsed: float) -> None:
    model, detail = done.model, done.detail
    if done.outcome is RollbackOutcome.FAILED:
        log.error(
            "ROLLBACK FAILED for %s: the fallback (%s) and the CPU-only reload (%s) both "
            "failed; %s %s still serves. Act by hand: "
            "controlplane rollback %s --to <release>",
            model,
            detail.get("fallback"),
            detail.get("cpu"),
            model,
            done.from_release,
            model,
            extra={"model": model},
        )
        return
    log.warning(
        "rolled back %s: %s now serves (%s) in %.2f s",
        model,
        f"{done.to_release} on CPU" if done.outcome is RollbackOutcome.CPU else done.to_release,
        done.outcome.value,
        elapsed,
        extra={"model": model},
    )
