"""Blue-green: load the new release beside the old one, prove it, move all traffic at once.

Deploy: stage -> place into the idle slot -> load -> preflight (signature, smoke inference)
-> switch (re-point the alias, then READY and one inference through it) -> record. The old
slot stays loaded for ``retire_after`` so that a rollback is one re-point; then a retire
operation drains it (Triton's pending-request gauge at 0, or a maximum drain time), unloads
it, waits for UNAVAILABLE and removes its dir.

Invariants: nothing touches the active slot or the alias before the switch, so any failure
before it leaves the serving release serving; a failed re-point is pointed back at once
(Triton leaves a failed ensemble reload unavailable, checked against the real server).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.smoke import SMOKE_NAME, SmokeSample, parse_smoke
from controlplane.domain.traffic import (
    alias_config,
    check_aliasable,
    same_signature,
)
from controlplane.services.headroom import check_headroom
from controlplane.services.pipeline import PipelineDeps
from controlplane.services.slots import SlotBook, unload_best_effort
from controlplane.services.tracker import OperationTracker

log = logging.getLogger(__name__)
DRAIN_POLL = 0.2


class BlueGreen:
    """The blue-green bodies of operations; :class:`DeployService` runs them under its lock."""

    def __init__(
        self,
        deps: PipelineDeps,
        schedule_retire: Callable[[str, str], None],
        cancel_retire: Callable[[str], None],
    ) -> None:
        self._d = deps
        self._slots = SlotBook(deps.repo, deps.clock)
        self._schedule_retire = schedule_retire
        self._cancel_retire = cancel_retire

    # --- reading the model's slots ------------------------------------------------------

    def slots(self, model: str) -> tuple[Slot, Slot]:
        blue, green = self._d.policy_for(model).slots(model)
        return self._slots.get(model, blue), self._slots.get(model, green)

    def active(self, model: str) -> Slot | None:
        return next((s for s in self.slots(model) if s.state is SlotState.ACTIVE), None)

    def warm(self, model: str, release: str) -> Slot | None:
        """A retiring slot still loaded with ``release``: a rollback to it is a re-point."""
        return next(
            (
                s
                for s in self.slots(model)
                if s.state is SlotState.RETIRING and s.release == release
            ),
            None,
        )

    # --- deploy ---------------------------------------------------------------------------

    async def deploy(self, tracker: OperationTracker, *, force: bool = False) -> None:
        op = tracker.operation
        model, release = op.model, op.release
        assert release is not None
        active = self.active(model)
        target = next(s for s in self.slots(model) if active is None or s.name != active.name)
        prepared = await self._d.prepare(tracker, model, release, target=target.name)
        async with tracker.step("check"):
            check_aliasable(
                model,
                decoupled=prepared.summary.decoupled,
                sequence_batching=prepared.summary.sequence_batching,
            )
            smoke_path = prepared.path / SMOKE_NAME
            sample = (
                parse_smoke(await asyncio.to_thread(smoke_path.read_text, encoding="utf-8"))
                if await asyncio.to_thread(smoke_path.is_file)
                else None
            )
            tracker.detail(slot=target.name, smoke=SMOKE_NAME if sample else "generated")
        already_gone = target.state is SlotState.UNAVAILABLE and target.release is None
        if target.state is not SlotState.ABSENT and not already_gone:
            async with tracker.step("free"):
                tracker.detail(slot=target.name, release=target.release)
                target = await self._take_down(
                    model, target, op.trigger, f"room for {release}", tracker
                )
        await check_headroom(tracker, self._d.headroom, prepared, force=force)

        async with self._d.load_slots:
            async with tracker.step("place"):
                await asyncio.to_thread(self._d.staging.ensure_alias_dir, model)
                placement = await asyncio.to_thread(
                    self._d.staging.place, prepared.path, target.name
                )
                await asyncio.to_thread(self._d.staging.discard, placement)
                tracker.detail(slot=target.name)
            async with tracker.step("load"):
                slot = self._slots.stage_and_load(target, op.trigger, release, model=model)
                try:
                    async with self._d.memory.loading(target.name):
                        await self._d.triton.load(target.name)
                except BaseException as exc:
                    reason = getattr(exc, "code", "interrupted")
                    slot = self._slots.move(slot, "FAILED", op.trigger, reason, model=model)
                    await asyncio.shield(self._take_down(model, slot, op.trigger, reason, tracker))
                    if active is None:
                        await asyncio.shield(self._remove_alias(model))
                    raise
                slot = self._slots.move(slot, "READY", op.trigger, "loaded", model=model)

        try:
            async with tracker.step("preflight"):
                slot_config = await self._d.triton.model_config(slot.name)
                current = await self._alias_config(model)
                changed = current is not None and not same_signature(current, slot_config)
                tracker.detail(
                    signature_changed=changed, smoke=SMOKE_NAME if sample else "generated"
                )
                if changed:
                    tracker.operation_detail(
                        {
                            "note": "the release changes the model's inputs or outputs; the alias "
                            "is rebuilt from the new slot"
                        }
                    )
                tracker.detail(outputs=await self._d.triton.smoke(slot.name, sample))
            async with tracker.step("switch"):
                fallback = await self._slot_config(active) if active else None
                await self._repoint(tracker, model, slot_config, sample, fallback)
        except BaseException as exc:
            reason = f"preflight or switch failed: {getattr(exc, 'code', 'interrupted')}"
            await asyncio.shield(self._take_down(model, slot, op.trigger, reason, tracker))
            if active is None:  # a first deploy: no alias is left pointing at nothing
                await asyncio.shield(self._remove_alias(model))
            raise

        async with tracker.step("record"):
            self._record(tracker, model, release, new=slot, old=active)

    # --- rollback inside the retire window ------------------------------------------------

    async def repoint_back(self, tracker: OperationTracker, slot_name: str) -> None:
        """Traffic back to a warm retiring slot: one re-point, no load."""
        op = tracker.operation
        model, release = op.model, op.release
        assert release is not None
        warm = next(s for s in self.slots(model) if s.name == slot_name)
        active = self.active(model)
        async with tracker.step("switch"):
            config = await self._d.triton.model_config(warm.name)
            fallback = await self._slot_config(active) if active else None
            await self._repoint(tracker, model, config, None, fallback)
        async with tracker.step("record"):
            self._record(tracker, model, release, new=warm, old=active)

    # --- retire, unload -------------------------------------------------------------------

    async def retire(self, tracker: OperationTracker, slot_name: str) -> None:
        model = tracker.operation.model
        slot = next(s for s in self.slots(model) if s.name == slot_name)
        if slot.state is SlotState.UNAVAILABLE and slot.release is not None:
            # Left on disk after a restart and not needed: no traffic to drain.
            async with tracker.step("unload"):
                await self._take_down(model, slot, tracker.operation.trigger, "not needed", tracker)
            return
        if slot.state is not SlotState.RETIRING:
            async with tracker.step("skip"):
                tracker.detail(reason=f"slot {slot_name} is {slot.state}, not retiring")
            return
        await self._drain_and_remove(tracker, model, slot)

    async def unload(self, tracker: OperationTracker) -> None:
        model = tracker.operation.model
        for slot in self.slots(model):
            self._cancel_retire(slot.name)
        async with tracker.step("unload"):
            await self._d.triton.unload(model)
            await self._d.triton.wait_unavailable(model, self._d.unload_timeout)
            await asyncio.to_thread(self._d.staging.remove, model)
        for slot in self.slots(model):
            if slot.state not in (SlotState.ABSENT, SlotState.UNAVAILABLE):
                await self._take_down(
                    model, slot, tracker.operation.trigger, "unload requested", tracker
                )
        async with tracker.step("record"):
            self._d.record_unloaded(model)

    # --- pieces ---------------------------------------------------------------------------

    def _record(
        self, tracker: OperationTracker, model: str, release: str, *, new: Slot, old: Slot | None
    ) -> None:
        trigger = tracker.operation.trigger
        previous = self._d.record_serving(model, release)
        self._cancel_retire(new.name)  # back in service: its old retire timer must not fire
        self._slots.move(new, "ACTIVE", trigger, f"serving {release}", model=model)
        if old is not None:
            self._slots.move(
                old, "RETIRING", trigger, f"warm for rollback to {old.release}", model=model
            )
            self._schedule_retire(model, old.name)
        tracker.detail(active=release, previous=previous, slot=new.name)

    async def _repoint(
        self,
        tracker: OperationTracker,
        model: str,
        slot_config: dict[str, Any],
        sample: SmokeSample | None,
        fallback: dict[str, Any] | None,
    ) -> None:
        started = self._d.clock.monotonic()
        try:
            await self._d.triton.load(
                model, config_json=json.dumps(alias_config(model, slot_config))
            )
            tracker.detail(repoint_ms=round((self._d.clock.monotonic() - started) * 1000, 2))
            await self._d.triton.smoke(model, sample)
        except ControlPlaneError as exc:
            if fallback is not None:
                log.error("re-point of %s failed (%s); pointing it back", model, exc.code)
                await self._d.triton.load(
                    model, config_json=json.dumps(alias_config(model, fallback))
                )
                tracker.detail(pointed_back_to=str(fallback.get("name")))
            raise
        tracker.detail(target=str(slot_config.get("name")))

    async def _remove_alias(self, model: str) -> None:
        await unload_best_effort(self._d.triton, model, self._d.unload_timeout)
        await asyncio.to_thread(self._d.staging.remove, model)

    async def _alias_config(self, model: str) -> dict[str, Any] | None:
        states = {e.name: e.state for e in await self._d.triton.index()}
        if states.get(model) != "READY":
            return None
        return await self._d.triton.model_config(model)

    async def _slot_config(self, slot: Slot) -> dict[str, Any] | None:
        try:
            return await self._d.triton.model_config(slot.name)
        except ControlPlaneError:
            return None

    async def _drain_and_remove(self, tracker: OperationTracker, model: str, slot: Slot) -> None:
        # The deadline is on the injected clock; the pause between polls is real time.
        policy = self._d.policy_for(model)
        async with tracker.step("drain"):
            deadline = self._d.clock.monotonic() + policy.drain_timeout
            pending = await self._d.metrics.pending_requests(slot.name)
            while pending and self._d.clock.monotonic() < deadline:
                await asyncio.sleep(DRAIN_POLL)
                pending = await self._d.metrics.pending_requests(slot.name)
            tracker.detail(slot=slot.name, pending=pending, timed_out=bool(pending))
        async with tracker.step("unload"):
            await self._take_down(model, slot, tracker.operation.trigger, "retired", tracker)

    async def _take_down(
        self,
        model: str,
        slot: Slot,
        trigger: str,
        reason: str,
        tracker: OperationTracker | None = None,
    ) -> Slot:
        """Unload a slot (best effort), wait for UNAVAILABLE, remove its dir, audit residue."""
        if slot.state in (SlotState.READY, SlotState.ACTIVE, SlotState.RETIRING):
            slot = self._slots.move(slot, "UNLOADING", trigger, reason, model=model)
        async with self._d.memory.unloading(slot.name, tracker):
            await unload_best_effort(self._d.triton, slot.name, self._d.unload_timeout)
            await asyncio.to_thread(self._d.staging.remove, slot.name)
        return self._slots.observe(
            model, SlotState.UNAVAILABLE, None, f"{reason}; unloaded", slot_name=slot.name
        )
