"""The alias of a blue-green model: the one-step ensemble clients call, and how it moves.

Re-pointing the alias is the switch: a reload of the ensemble with a config override that
forwards the slot's inputs and outputs (its signature), proven by one inference through the
alias. When that fails, or is cut short, the alias is pointed back at once (Triton leaves a
failed ensemble reload unavailable); a cut one is given :data:`POINT_BACK` s, a few ms of work
when the slot is warm. Before a slot takes traffic its preflight says whether it changes what
the alias forwards.
"""

from __future__ import annotations

import asyncio
import logging

from controlplane.domain.slots import Slot
from controlplane.domain.smoke import SMOKE_NAME, SmokeSample
from controlplane.domain.traffic import Signature
from controlplane.domain.triton import TritonState
from controlplane.ports import Clock, Staging, Triton
from controlplane.services.slots import unload_best_effort
from controlplane.services.tracker import OperationTracker
from controlplane.timing import within

log = logging.getLogger(__name__)
POINT_BACK = 0.8  # a re-point back after a cut: a few ms when the slot is warm


class Alias:
    def __init__(
        self, *, triton: Triton, staging: Staging, clock: Clock, unload_seconds: float
    ) -> None:
        self._triton = triton
        self._staging = staging
        self._clock = clock
        self._unload_seconds = unload_seconds

    async def preflight(
        self, tracker: OperationTracker, slot: Slot, sample: SmokeSample | None
    ) -> Signature:
        """The ``preflight`` step: what the new slot serves, and one checked inference."""
        async with tracker.step("preflight"):
            signature = await self._triton.signature(slot.name)
            current = await self._signature(tracker.operation.model)
            changed = current is not None and not current.same_as(signature)
            tracker.detail(signature_changed=changed, smoke=SMOKE_NAME if sample else "generated")
            if changed:
                tracker.operation_detail(
                    {
                        "note": "the release changes the model's inputs or outputs; the alias "
                        "is rebuilt from the new slot"
                    }
                )
            tracker.detail(outputs=await self._triton.smoke(slot.name, sample))
        return signature

    async def switch(
        self,
        tracker: OperationTracker,
        slot_name: str,
        signature: Signature,
        sample: SmokeSample | None,
        *,
        back_to: Slot | None,
    ) -> None:
        """Re-point the alias at ``slot_name`` and prove it with one inference; on failure
        (or a cut) point it back at ``back_to``."""
        model = tracker.operation.model
        started = self._clock.monotonic()
        try:
            await self._triton.point_alias(model, slot_name, signature)
            tracker.detail(repoint_ms=round((self._clock.monotonic() - started) * 1000, 2))
            await self._triton.smoke(model, sample)
        except BaseException as exc:
            if back_to is not None:
                code = getattr(exc, "code", "cut short")
                log.error("re-point of %s failed (%s); pointing it back", model, code)
                back = self.point(model, back_to.name)
                if isinstance(exc, asyncio.CancelledError):
                    await asyncio.shield(within(self._clock, POINT_BACK, back))
                else:
                    await back
                tracker.detail(pointed_back_to=back_to.name)
            raise
        tracker.detail(target=slot_name)

    async def point(self, model: str, slot_name: str) -> None:
        """The alias at ``slot_name``, forwarding what the slot serves (its dir made first:
        Triton loads even an overridden model from its dir)."""
        await asyncio.to_thread(self._staging.ensure_alias_dir, model)
        signature = await self._triton.signature(slot_name)
        await self._triton.point_alias(model, slot_name, signature)

    async def remove(self, model: str) -> None:
        await unload_best_effort(self._triton, model, self._unload_seconds)
        await asyncio.to_thread(self._staging.remove, model)

    async def _signature(self, model: str) -> Signature | None:
        states = {e.name: e.state for e in await self._triton.index()}
        if states.get(model) is not TritonState.READY:
            return None
        return await self._triton.signature(model)
