"""Retire timers: an old slot kept warm for ``retire_after``, then freed by an operation.

After a switch the slot that served stays loaded, so that a rollback is one re-point; once its
window ends a ``retire`` operation (trigger ``schedule``) drains and frees it, through the
operation client like every other operation, waiting behind whatever holds the model. A newer
switch restarts the window; a slot that serves again has its timer cancelled; ``keep_warm``
schedules none. The reconcile loop schedules a timer again for a warm slot it finds without
one (after a restart), so the window survives the daemon.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from controlplane.domain.operations import Cause, OperationKind, any_holder
from controlplane.domain.traffic import TrafficPolicy
from controlplane.ports import Clock
from controlplane.services.operations import OperationClient
from controlplane.services.runner import Body
from controlplane.services.tasks import TaskOwner

log = logging.getLogger(__name__)


class RetireTimers:
    def __init__(
        self,
        *,
        client: OperationClient,
        clock: Clock,
        tasks: TaskOwner,
        policy_for: Callable[[str], TrafficPolicy],
    ) -> None:
        self._client = client
        self._clock = clock
        self._tasks = tasks
        self._policy_for = policy_for

    def schedule(self, model: str, slot: str, body: Body, *, now: bool = False) -> None:
        """Run ``body`` as the retire of ``slot`` after the model's window (or at once)."""
        key = _key(slot)
        self._tasks.cancel(key)  # a newer switch restarts the slot's retire window
        policy = self._policy_for(model)
        if policy.keep_warm and not now:
            log.info("%s stays warm for a rollback (keep_fallback_warm)", slot)
            return
        delay = 0.0 if now else policy.retire_after
        self._tasks.spawn(key, self._later(model, slot, body, delay))

    def cancel(self, slot: str) -> None:
        self._tasks.cancel(_key(slot))

    def scheduled(self, slot: str) -> bool:
        """Whether a retire of ``slot`` is scheduled (or running)."""
        return self._tasks.get(_key(slot)) is not None

    async def _later(self, model: str, slot: str, body: Body, delay: float) -> None:
        await self._clock.sleep(delay)
        reason = (
            f"{slot} no longer serves: kept warm for {delay:g} s (retire_after), then freed"
            if delay
            else f"{slot} no longer serves: freed"
        )
        await self._client.housekeeping(
            OperationKind.RETIRE,
            model,
            body,
            cause=Cause(reason=reason),
            patience=any_holder(math.inf),  # another operation first (each is bounded)
        )


def _key(slot: str) -> str:
    return f"retire-{slot}"
