"""Retire timers: an old slot kept warm for ``retire_after``, then freed by an operation.

After a switch the slot that served stays loaded, so that a rollback is one re-point; once its
window ends a ``retire`` operation (trigger ``schedule``) drains it (Triton's pending-request
gauge at 0, or the drain timeout) and frees it, through the operation client like every other
operation, waiting behind whatever holds the model. A newer
switch restarts the window; a slot that serves again has its timer cancelled; ``keep_warm``
schedules none. The reconcile loop schedules a timer again for a warm slot it finds without
one (after a restart), so the window survives the daemon.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial

from controlplane.domain.operations import Cause, OperationKind, any_holder
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.traffic import TrafficPolicy
from controlplane.ports import Clock, MetricsSource
from controlplane.services.operations import OperationClient
from controlplane.services.runner import Run
from controlplane.services.slots import SlotBook, SlotFreer
from controlplane.services.tasks import TaskOwner
from controlplane.services.tracker import OperationTracker
from controlplane.timing import poll

log = logging.getLogger(__name__)
DRAIN_POLL = 0.2


class RetireTimers:
    def __init__(
        self,
        *,
        client: OperationClient,
        slots: SlotBook,
        freer: SlotFreer,
        metrics: MetricsSource,
        clock: Clock,
        tasks: TaskOwner,
        policy_for: Callable[[str], TrafficPolicy],
    ) -> None:
        self._client = client
        self._slots = slots
        self._freer = freer
        self._metrics = metrics
        self._clock = clock
        self._tasks = tasks
        self._policy_for = policy_for

    def schedule(self, model: str, slot: str, *, now: bool = False) -> None:
        """Retire ``slot`` after the model's window (or at once)."""
        key = _key(slot)
        self._tasks.cancel(key)  # a newer switch restarts the slot's retire window
        policy = self._policy_for(model)
        if policy.keep_warm and not now:
            log.info("%s stays warm for a rollback (keep_fallback_warm)", slot)
            return
        delay = 0.0 if now else policy.retire_after
        self._tasks.spawn(key, self._later(model, slot, delay))

    def cancel(self, slot: str) -> None:
        self._tasks.cancel(_key(slot))

    def scheduled(self, slot: str) -> bool:
        """Whether a retire of ``slot`` is scheduled (or running)."""
        return self._tasks.get(_key(slot)) is not None

    async def _later(self, model: str, slot: str, delay: float) -> None:
        await self._clock.sleep(delay)
        reason = (
            f"{slot} no longer serves: kept warm for {delay:g} s (retire_after), then freed"
            if delay
            else f"{slot} no longer serves: freed"
        )
        await self._client.housekeeping(
            OperationKind.RETIRE,
            model,
            partial(self.retire, slot_name=slot),
            cause=Cause(reason=reason),
            patience=any_holder(math.inf),  # another operation first (each is bounded)
        )

    async def retire(self, run: Run, slot_name: str) -> None:
        """The retire operation's body: drain the slot, then free it."""
        model, tracker = run.model, run.tracker
        snapshot = await self._slots.snapshot(model, self._policy_for(model).slots(model))
        slot = next((s for s in snapshot.slots if s.name == slot_name), None)
        if slot is None or slot.state is SlotState.ABSENT:
            async with tracker.step("skip"):
                tracker.detail(reason=f"slot {slot_name} is gone")
            return
        if slot.state is SlotState.ACTIVE:
            async with tracker.step("skip"):
                tracker.detail(reason=f"slot {slot_name} serves again")
            return
        if slot.state is SlotState.RETIRING:
            await self._drain(tracker, slot)
            reason = "retired"
        else:  # left on disk after a restart, failed, or not needed: no traffic to drain
            reason = "not needed"
        async with tracker.step("unload"):
            await self._freer.take_down(tracker, slot, reason)

    async def _drain(self, tracker: OperationTracker, slot: Slot) -> None:
        policy = self._policy_for(tracker.operation.model)
        async with tracker.step("drain"):
            pending: int | None = None

            async def drained() -> bool:
                nonlocal pending
                pending = await self._metrics.pending_requests(slot.name)
                return not pending

            await poll(self._clock, drained, every=DRAIN_POLL, timeout=policy.drain_timeout)
            tracker.detail(slot=slot.name, pending=pending, timed_out=bool(pending))


def _key(slot: str) -> str:
    return f"retire-{slot}"
