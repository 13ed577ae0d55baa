"""Blue-green: load the new release beside the old one, prove it, move all traffic at once.

Deploy: stage -> place into an idle slot -> load -> preflight (signature, smoke inference)
-> stress (optional: the new slot load-tested beside the active one, :mod:`.stress`) -> switch
(re-point the alias, then READY and one inference through it) -> record. The old
slot stays loaded for ``retire_after`` so that a rollback is one re-point; then a retire
operation drains it (Triton's pending-request gauge at 0, or a maximum drain time), unloads
it, waits for UNAVAILABLE and removes its dir.

Invariants:

* Nothing changes the active slot or the alias before the switch (the stress step only sends
  the active slot requests), so any failure before it leaves the serving release serving; a
  failed re-point is pointed back at once (Triton leaves a failed ensemble reload
  unavailable, checked against the real server).
* What serves and both slots are recorded in one transaction (:meth:`SlotBook.commit`).
* A load that times out is abandoned (its unload asked for, never waited on past a few
  seconds): Triton may hold the slot LOADING until it restarts, since a Python ``initialize()``
  that never returns cannot be stopped from outside, and the daemon kills nothing it did not
  start. Such a slot stays FAILED (reconcile takes it down once Triton lets go) and the next
  deploy loads into a spare name instead (``<model>__green-2``), so it succeeds.
* Cut short by a rollback budget, a body puts its records back at once and leaves the Triton
  side to reconcile; cut short by shutdown, it leaves everything to start-up reconcile.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.domain.errors import ControlPlaneError, TritonTimeout
from controlplane.domain.operations import Cause, OperationKind
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.smoke import SMOKE_NAME, SmokeSample, parse_smoke
from controlplane.domain.traffic import Signature, TrafficPolicy, check_aliasable
from controlplane.ports import Clock, IndexEntry, MetricsSource, Serving, Staging, Triton
from controlplane.services.coordination import LoadSlots, TaskOwner
from controlplane.services.headroom import HeadroomPolicy, check_headroom
from controlplane.services.memory import MemoryWatch
from controlplane.services.operations import OperationClient
from controlplane.services.prepare import Preparer
from controlplane.services.runner import Run, any_holder
from controlplane.services.slots import SlotBook, serving_after, unload_best_effort
from controlplane.services.stress import StressCheck
from controlplane.services.tracker import OperationTracker
from controlplane.timing import poll

log = logging.getLogger(__name__)
DRAIN_POLL = 0.2
RETIRE_RETRY = 1.0
POINT_BACK = 0.8  # a re-point back after a cut: a few ms when the slot is warm
BUSY = frozenset({"LOADING", "UNLOADING"})  # Triton is still working on the name
IDLE = (SlotState.ABSENT, SlotState.UNAVAILABLE)
HOLDING = (SlotState.READY, SlotState.ACTIVE, SlotState.RETIRING, SlotState.UPDATING)


@dataclass(frozen=True)
class Bounds:
    unload: float = 120.0  # an unload to reach UNAVAILABLE
    abandon: float = 3.0  # after a load timed out, to see Triton leave LOADING


class BlueGreen:
    """The blue-green bodies of operations, and the timers that retire old slots."""

    def __init__(
        self,
        *,
        preparer: Preparer,
        staging: Staging,
        triton: Triton,
        slots: SlotBook,
        load_slots: LoadSlots,
        metrics: MetricsSource,
        memory: MemoryWatch,
        headroom: HeadroomPolicy,
        clock: Clock,
        client: OperationClient,
        timers: TaskOwner,
        policy_for: Callable[[str], TrafficPolicy],
        bounds: Bounds,
        stress: StressCheck | None = None,
    ) -> None:
        self._preparer = preparer
        self._staging = staging
        self._triton = triton
        self._slots = slots
        self._load_slots = load_slots
        self._metrics = metrics
        self._memory = memory
        self._headroom = headroom
        self._clock = clock
        self._client = client
        self._timers = timers
        self._policy_for = policy_for
        self._bounds = bounds
        self._stress = stress

    # --- reading the model's slots ------------------------------------------------------

    async def slots(self, model: str) -> list[Slot]:
        """The model's slots: both base slots, and any spare the database knows."""
        policy = self._policy_for(model)
        record = await self._slots.record(model)
        known = {s.name: s for s in (record.slots if record else ()) if policy.owns(model, s.name)}
        for name in policy.slots(model):
            known.setdefault(name, await self._slots.get(model, name))
        return sorted(known.values(), key=lambda s: _slot_order(policy, model, s.name))

    async def active(self, model: str) -> Slot | None:
        return next((s for s in await self.slots(model) if s.state is SlotState.ACTIVE), None)

    async def warm(self, model: str, release: str) -> Slot | None:
        """A retiring slot still loaded with ``release``: a rollback to it is a re-point."""
        return next(
            (
                s
                for s in await self.slots(model)
                if s.state is SlotState.RETIRING and s.release == release
            ),
            None,
        )

    # --- deploy ---------------------------------------------------------------------------

    async def deploy(self, run: Run, *, revision: str | None, force: bool = False) -> None:
        tracker = run.tracker
        model, release = run.model, run.operation.release
        assert release is not None
        active = await self.active(model)
        target = await self._choose_target(model, active)
        prepared = await self._preparer.prepare(
            tracker, model, release, target=target.name, revision=revision
        )
        async with tracker.step("check"):
            check_aliasable(
                model,
                decoupled=prepared.summary.decoupled,
                sequence_batching=prepared.summary.sequence_batching,
            )
            sample = await _smoke_sample(prepared.path)
            tracker.detail(slot=target.name, smoke=SMOKE_NAME if sample else "generated")
        # At most one release stays warm beside the one that serves: with a spare slot (after
        # a load that never ended) a third slot could otherwise be loaded while two others are.
        extras = await self._also_loaded(model, keep={target.name, active.name if active else ""})
        if target.state not in IDLE or extras:
            async with tracker.step("free"):
                if target.state not in IDLE:
                    tracker.detail(slot=target.name, release=target.release)
                    target = await self.take_down(model, target, run.trigger, f"room for {release}")
                if extras:
                    tracker.detail(also={s.name: s.release for s in extras})
                for extra in extras:
                    await self.take_down(model, extra, run.trigger, f"room for {release}")
        await check_headroom(tracker, self._headroom, prepared, force=force)

        async with self._load_slots.hold(tracker):
            async with tracker.step("place"):
                await asyncio.to_thread(self._staging.ensure_alias_dir, model)
                placement = await asyncio.to_thread(
                    self._staging.place, prepared.path, target.name, owner=model
                )
                await asyncio.to_thread(self._staging.discard, placement)
                tracker.detail(slot=target.name)
            async with tracker.step("load"):
                slot = await self._slots.stage_and_load(model, target, run.trigger, release)
                try:
                    async with self._memory.loading(slot.name):
                        await self._triton.load(slot.name)
                except BaseException as exc:
                    held = await self._after_failed_load(run, slot, exc, first=active is None)
                    if held and isinstance(exc, TritonTimeout):
                        raise TritonTimeout(
                            f"{exc.message}; Triton still holds {slot.name} LOADING, so the next "
                            "deploy of this model loads into a spare slot",
                            details={"slot_held_by_triton": slot.name},
                        ) from exc
                    raise
                slot = await self._slots.move(model, slot, SlotState.READY, run.trigger, "loaded")

        try:
            async with tracker.step("preflight"):
                signature = await self._triton.signature(slot.name)
                current = await self._alias_signature(model)
                changed = current is not None and not current.same_as(signature)
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
                tracker.detail(outputs=await self._triton.smoke(slot.name, sample))
            # Not on the way back: a rollback returns to a release that has served, and must
            # be quick (an automatic one has a budget of seconds, on a GPU already overloaded).
            rollback = run.operation.kind is OperationKind.ROLLBACK
            if self._stress is not None and self._stress.enabled(model) and not rollback:
                async with tracker.step("stress"):
                    await self._stress.run(
                        tracker,
                        model,
                        new=slot.name,
                        active=active.name if active else None,
                        sample=sample,
                    )
            async with tracker.step("switch"):
                await self._switch(tracker, model, slot.name, signature, sample, back_to=active)
        except BaseException as exc:
            await self._after_failed_switch(run, slot, exc, first=active is None)
            raise

        async with tracker.step("record"):
            await self._record(tracker, model, release, new=slot, old=active)

    async def _choose_target(self, model: str, active: Slot | None) -> Slot:
        """The slot to load into: an idle one Triton is not busy with, else a busy-free one
        that holds something (freed first), else a new spare beside a slot Triton holds."""
        policy = self._policy_for(model)
        slots = [s for s in await self.slots(model) if active is None or s.name != active.name]
        busy = await self._busy_in_triton({s.name for s in slots})
        free = [s for s in slots if s.name not in busy]
        for slot in free:
            if slot.state in IDLE:
                return slot
        if free:
            return free[0]
        taken = {s.name for s in await self.slots(model)}
        for base in policy.slots(model):
            if active is not None and base == active.name:
                continue
            number = 2
            while policy.spare(base, number) in taken:
                number += 1
            name = policy.spare(base, number)
            log.warning(
                "Triton still holds %s (%s); loading into the spare slot %s instead",
                ", ".join(sorted(busy)),
                "a load that never ended; freed when Triton restarts",
                name,
            )
            return await self._slots.get(model, name)
        raise AssertionError("a model always has a base slot that is not active")

    async def _also_loaded(self, model: str, keep: set[str]) -> list[Slot]:
        """Slots other than ``keep`` that hold a loaded release Triton is not busy with."""
        others = [s for s in await self.slots(model) if s.name not in keep and s.state in HOLDING]
        busy = await self._busy_in_triton({s.name for s in others})
        return [s for s in others if s.name not in busy]

    async def _busy_in_triton(self, names: set[str]) -> set[str]:
        try:
            index = await self._triton.index()
        except ControlPlaneError:
            return set()  # the load itself will say what is wrong with Triton
        return {e.name for e in index if e.name in names and e.state in BUSY}

    async def _after_failed_load(
        self, run: Run, slot: Slot, exc: BaseException, *, first: bool
    ) -> bool:
        """Clean up after a load that failed, timed out or was cut short; True when Triton
        still holds the slot (a load that does not end)."""
        model = run.model
        if isinstance(exc, asyncio.CancelledError):
            # Cut short: Triton goes on loading. Record the slot as failed at once; reconcile
            # takes it down when Triton has let go (or start-up reconcile, at shutdown).
            await asyncio.shield(
                self._slots.move(model, slot, SlotState.FAILED, run.trigger, "load cut short")
            )
            return False
        reason = getattr(exc, "code", "unexpected error")
        if isinstance(exc, TritonTimeout):
            left = await self._triton.abandon(slot.name, self._bounds.abandon)
            if not left:
                await self._slots.move(
                    model,
                    slot,
                    SlotState.FAILED,
                    run.trigger,
                    "its load never ended: Triton holds it LOADING (initialize() did not "
                    "return); the next deploy uses a spare slot, and this one is removed once "
                    "Triton lets go of it or restarts",
                )
                return True
        failed = await self._slots.move(model, slot, SlotState.FAILED, run.trigger, reason)
        await self.take_down(model, failed, run.trigger, reason)
        if first:
            await self._remove_alias(model)
        return False

    async def _after_failed_switch(
        self, run: Run, slot: Slot, exc: BaseException, *, first: bool
    ) -> None:
        model = run.model
        reason = f"preflight or switch failed: {getattr(exc, 'code', 'interrupted')}"
        if isinstance(exc, asyncio.CancelledError):
            await asyncio.shield(
                self._slots.move(model, slot, SlotState.UNLOADING, run.trigger, reason)
            )
            return
        await self.take_down(model, slot, run.trigger, reason)
        if first:  # a first deploy: no alias is left pointing at nothing
            await self._remove_alias(model)

    # --- rollback inside the retire window ------------------------------------------------

    async def repoint_back(self, run: Run, slot_name: str) -> None:
        """Traffic back to a warm retiring slot: one re-point, no load."""
        tracker = run.tracker
        model, release = run.model, run.operation.release
        assert release is not None
        warm = next(s for s in await self.slots(model) if s.name == slot_name)
        active = await self.active(model)
        async with tracker.step("switch"):
            signature = await self._triton.signature(warm.name)
            await self._switch(tracker, model, warm.name, signature, None, back_to=active)
        async with tracker.step("record"):
            await self._record(tracker, model, release, new=warm, old=active)

    # --- retire, unload -------------------------------------------------------------------

    def schedule_retire(self, model: str, slot_name: str, *, now: bool = False) -> None:
        """Retire ``slot_name`` after the model's retire window (or at once)."""
        key = f"retire-{slot_name}"
        self._timers.cancel(key)  # a newer switch restarts the slot's retire window
        policy = self._policy_for(model)
        if policy.keep_warm and not now:
            log.info("%s stays warm for a rollback (keep_fallback_warm)", slot_name)
            return
        delay = 0.0 if now else policy.retire_after
        self._timers.spawn(key, self._retire_later(model, slot_name, delay))

    def cancel_retire(self, slot_name: str) -> None:
        self._timers.cancel(f"retire-{slot_name}")

    def retire_timer(self, slot_name: str) -> bool:
        """Whether a retire of ``slot_name`` is scheduled (or running)."""
        return self._timers.get(f"retire-{slot_name}") is not None

    async def _retire_later(self, model: str, slot_name: str, delay: float) -> None:
        await self._clock.sleep(delay)
        await self._client.housekeeping(
            OperationKind.RETIRE,
            model,
            lambda run: self.retire(run, slot_name),
            cause=Cause(
                reason=f"{slot_name} no longer serves: kept warm for {delay:g} s "
                "(retire_after), then freed"
                if delay
                else f"{slot_name} no longer serves: freed"
            ),
            patience=any_holder(math.inf),  # another operation first (each is bounded); then
        )

    async def retire(self, run: Run, slot_name: str) -> None:
        model = run.model
        slot = next((s for s in await self.slots(model) if s.name == slot_name), None)
        if slot is None or slot.state in (SlotState.ABSENT,):
            async with run.tracker.step("skip"):
                run.tracker.detail(reason=f"slot {slot_name} is gone")
            return
        if slot.state is SlotState.RETIRING:
            await self._drain_and_remove(run.tracker, model, slot)
            return
        if slot.state is SlotState.ACTIVE:
            async with run.tracker.step("skip"):
                run.tracker.detail(reason=f"slot {slot_name} serves again")
            return
        # Left on disk after a restart, failed, or not needed: no traffic to drain.
        async with run.tracker.step("unload"):
            await self.take_down(model, slot, run.trigger, "not needed")

    async def unload(self, run: Run) -> None:
        model = run.model
        slots = await self.slots(model)
        for slot in slots:
            self.cancel_retire(slot.name)
        async with run.tracker.step("unload"):
            await self._triton.unload(model)
            await self._triton.wait_unavailable(model, self._bounds.unload)
            await asyncio.to_thread(self._staging.remove, model)
        gone: list[Slot] = []
        for slot in slots:
            if slot.state is not SlotState.ABSENT:
                gone.append(await self.take_down(model, slot, run.trigger, "unload requested"))
        async with run.tracker.step("record"):
            record = await self._slots.record(model)
            await self._slots.commit(
                model,
                serving=Serving(active=None, previous=record.active_release if record else None),
            )

    # --- pieces ---------------------------------------------------------------------------

    async def _record(
        self, tracker: OperationTracker, model: str, release: str, *, new: Slot, old: Slot | None
    ) -> None:
        """What serves, the new active slot and the retiring one: one transaction."""
        trigger = tracker.operation.trigger
        serving = await serving_after(self._slots, model, release)
        self.cancel_retire(new.name)  # back in service: its old retire timer must not fire
        moved: list[Slot] = [
            self._slots.moved(new, SlotState.ACTIVE, trigger, f"serving {release}")
        ]
        if old is not None:
            moved.append(
                self._slots.moved(
                    old, SlotState.RETIRING, trigger, f"warm for rollback to {old.release}"
                )
            )
        await self._slots.commit(model, *moved, serving=serving)
        if old is not None:
            self.schedule_retire(model, old.name)
        tracker.detail(active=release, previous=serving.previous, slot=new.name)

    async def _switch(
        self,
        tracker: OperationTracker,
        model: str,
        slot_name: str,
        signature: Signature,
        sample: SmokeSample | None,
        *,
        back_to: Slot | None,
    ) -> None:
        """Re-point the alias at ``slot_name`` and prove it with one inference; on failure
        (or a cut) point it back at ``back_to``."""
        started = self._clock.monotonic()
        try:
            await self._triton.point_alias(model, slot_name, signature)
            tracker.detail(repoint_ms=round((self._clock.monotonic() - started) * 1000, 2))
            await self._triton.smoke(model, sample)
        except BaseException as exc:
            if back_to is not None:
                code = getattr(exc, "code", "cut short")
                log.error("re-point of %s failed (%s); pointing it back", model, code)
                back = self._point_back(model, back_to.name)
                if isinstance(exc, asyncio.CancelledError):
                    await asyncio.shield(asyncio.wait_for(back, POINT_BACK))
                else:
                    await back
                tracker.detail(pointed_back_to=back_to.name)
            raise
        tracker.detail(target=slot_name)

    async def _point_back(self, model: str, slot_name: str) -> None:
        signature = await self._triton.signature(slot_name)
        await self._triton.point_alias(model, slot_name, signature)

    async def _remove_alias(self, model: str) -> None:
        await unload_best_effort(self._triton, model, self._bounds.unload)
        await asyncio.to_thread(self._staging.remove, model)

    async def _alias_signature(self, model: str) -> Signature | None:
        states = {e.name: e.state for e in await self._triton.index()}
        if states.get(model) != "READY":
            return None
        return await self._triton.signature(model)

    async def _drain_and_remove(self, tracker: OperationTracker, model: str, slot: Slot) -> None:
        policy = self._policy_for(model)
        async with tracker.step("drain"):
            pending: int | None = None

            async def drained() -> bool:
                nonlocal pending
                pending = await self._metrics.pending_requests(slot.name)
                return not pending

            await poll(self._clock, drained, every=DRAIN_POLL, timeout=policy.drain_timeout)
            tracker.detail(slot=slot.name, pending=pending, timed_out=bool(pending))
        async with tracker.step("unload"):
            await self.take_down(model, slot, tracker.operation.trigger, "retired", tracker)

    async def take_down(
        self,
        model: str,
        slot: Slot,
        trigger: str,
        reason: str,
        tracker: OperationTracker | None = None,
    ) -> Slot:
        """Unload a slot (best effort), wait for UNAVAILABLE, remove its dir, audit residue.

        Ends ABSENT; FAILED when Triton did not let go within the unload bound (reconcile
        tries again)."""
        if slot.state is SlotState.LOADING:
            slot = await self._slots.move(model, slot, SlotState.FAILED, trigger, reason)
        if slot.state is SlotState.STAGED:
            await asyncio.to_thread(self._staging.remove, slot.name)
            return await self._slots.move(model, slot, SlotState.ABSENT, trigger, reason)
        if slot.state in (*HOLDING, SlotState.FAILED):
            slot = await self._slots.move(model, slot, SlotState.UNLOADING, trigger, reason)
        unloaded = True
        async with self._memory.unloading(slot.name, tracker):
            if slot.state is SlotState.UNLOADING:
                unloaded = await unload_best_effort(self._triton, slot.name, self._bounds.unload)
            await asyncio.to_thread(self._staging.remove, slot.name)
        if not unloaded:
            return await self._slots.move(
                model,
                slot,
                SlotState.FAILED,
                trigger,
                f"{reason}; Triton did not unload it within {self._bounds.unload:g} s",
            )
        done = slot
        if done.state is SlotState.UNLOADING:
            done = self._slots.moved(done, SlotState.UNAVAILABLE, trigger, f"{reason}; unloaded")
        if done.state is SlotState.UNAVAILABLE:
            done = self._slots.moved(done, SlotState.ABSENT, trigger, f"{reason}; dir removed")
        await self._slots.commit(model, done)
        return done


async def _smoke_sample(release_dir: Path) -> SmokeSample | None:
    path = release_dir / SMOKE_NAME
    if not await asyncio.to_thread(path.is_file):
        return None
    return parse_smoke(await asyncio.to_thread(path.read_text, encoding="utf-8"))


def _slot_order(policy: TrafficPolicy, model: str, name: str) -> tuple[int, str]:
    bases = policy.slots(model)
    return (bases.index(name), name) if name in bases else (len(bases), name)


def index_by_name(entries: Sequence[IndexEntry]) -> dict[str, IndexEntry]:
    """Triton's index as a dict; a READY row wins when a model lists several versions."""
    found: dict[str, IndexEntry] = {}
    for entry in entries:
        if entry.name not in found or entry.state == "READY":
            found[entry.name] = entry
    return found
