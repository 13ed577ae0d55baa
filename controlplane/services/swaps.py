"""After a deploy or a rollback succeeded, still holding the model: what the swap leaves.

Triton's memory is sampled for the leak trend, and the degraded latches follow what a person
chose: a release deployed or rolled back to by a person (or CI) is no longer latched, and one a
person rolled back from is latched degraded, so that nothing automatic (the release watcher,
an alert) brings it back and it is never the fallback, until someone deploys it by name.
"""

from __future__ import annotations

import logging

from controlplane.domain.operations import Operation, OperationKind, Trigger
from controlplane.domain.rollback import DegradedRelease
from controlplane.ports import Clock, RollbackBook
from controlplane.services.memory import MemoryWatch

log = logging.getLogger(__name__)
PEOPLE = (Trigger.API, Trigger.CLI)


class SwapFollowUp:
    def __init__(self, *, memory: MemoryWatch, rollbacks: RollbackBook, clock: Clock) -> None:
        self._memory = memory
        self._rollbacks = rollbacks
        self._clock = clock

    async def __call__(self, operation: Operation) -> None:
        """After a deploy or rollback succeeded, still holding the model: sample Triton's
        memory, and update the latches of the releases a person chose or rejected."""
        if operation.kind in (OperationKind.DEPLOY, OperationKind.ROLLBACK):
            await self._memory.after_swap(operation)
        if operation.trigger not in PEOPLE or operation.release is None:
            return
        # A person or CI chose this release: it is no longer latched degraded.
        if await self._rollbacks.unlatch(operation.model, operation.release):
            log.info("%s %s is no longer degraded", operation.model, operation.release)
        rejected = operation.from_release
        if operation.kind is OperationKind.ROLLBACK and rejected and rejected != operation.release:
            await self._rollbacks.latch(
                DegradedRelease(
                    operation.model,
                    rejected,
                    self._clock.now(),
                    f"rolled back from by {operation.trigger.value} (operation {operation.id})",
                )
            )
            log.info(
                "%s %s is latched degraded: a person rolled back from it", operation.model, rejected
            )
