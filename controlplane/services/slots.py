"""The slot book: a model's slots as recorded, table-checked transitions, one commit each.

Under the ``inplace`` strategy a model has one slot, named after the model itself. A change
that touches several rows (a switch moves two slots and what serves) is one :meth:`commit`,
one transaction. :meth:`observe` records what reconcile saw, whatever the table says; normal
operations move slots only through :meth:`moved` and :meth:`move`, with their own trigger.

A slot is freed in one way, :meth:`SlotFreer.take_down`, whoever frees it (a deploy making
room, a retire, an unload, a repair), so every unload is audited for residue.

An operation reads its model once, as a :class:`SlotSnapshot` (what serves, every slot its
strategy names), when it has taken the model's lock: nothing else changes the records until it
ends, so the snapshot and the slots the operation moves are all it needs to know.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

from controlplane.domain.drift import Observed
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.operations import Trigger
from controlplane.domain.slots import Slot, SlotState, absent, observe, transition
from controlplane.ports import Clock, ModelRecord, Serving, ServingRepo, Staging, Triton
from controlplane.services.memory import MemoryWatch
from controlplane.services.tracker import OperationTracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotSnapshot:
    """One model as recorded at one moment: what serves, what served before, and every slot
    its strategy knows (those never recorded as ABSENT), in the strategy's order."""

    model: str
    record: ModelRecord | None
    slots: tuple[Slot, ...]
    at: datetime  # when it was read

    @property
    def active_release(self) -> str | None:
        """What should serve: the one place this is read from."""
        return self.record.active_release if self.record is not None else None

    @property
    def previous_release(self) -> str | None:
        return self.record.previous_release if self.record is not None else None

    def slot(self, name: str) -> Slot:
        found = next((s for s in self.slots if s.name == name), None)
        return found if found is not None else absent(name, self.at)

    def active(self) -> Slot | None:
        """The slot that serves what should serve (ACTIVE); None when none does."""
        return next((s for s in self.slots if s.state is SlotState.ACTIVE), None)

    def warm(self, release: str) -> Slot | None:
        """A retiring slot still loaded with ``release``: serving it again is a re-point."""
        return next(
            (s for s in self.slots if s.state is SlotState.RETIRING and s.release == release),
            None,
        )


class SlotBook:
    def __init__(self, serving: ServingRepo, clock: Clock) -> None:
        self._serving = serving
        self._clock = clock

    async def record(self, model: str) -> ModelRecord | None:
        return await self._serving.get(model)

    async def snapshot(self, model: str, names: Iterable[str] = ()) -> SlotSnapshot:
        """The model in one read; ``names`` are the slots its strategy always has (filled in
        as ABSENT when never recorded), listed first and in that order."""
        return self.snapshot_of(model, await self._serving.get(model), names)

    def snapshot_of(
        self, model: str, record: ModelRecord | None, names: Iterable[str] = ()
    ) -> SlotSnapshot:
        """:meth:`snapshot` from a record read already (reconcile reads every model at once)."""
        now = self._clock.now()
        recorded = {s.name: s for s in (record.slots if record is not None else ())}
        base = list(dict.fromkeys(names))
        ordered = [recorded.get(n) or absent(n, now) for n in base]
        ordered += [s for name, s in sorted(recorded.items()) if name not in base]
        return SlotSnapshot(model, record, tuple(ordered), now)

    async def get(self, model: str, slot_name: str | None = None) -> Slot:
        name = slot_name or model
        record = await self._serving.get(model)
        if record is not None:
            for slot in record.slots:
                if slot.name == name:
                    return slot
        return absent(name, self._clock.now())

    def moved(
        self,
        slot: Slot,
        target: SlotState,
        trigger: Trigger,
        reason: str,
        *,
        release: str | None = None,
        cpu_only: bool = False,
    ) -> Slot:
        """``slot`` moved to ``target`` if the table allows it (not saved: see commit)."""
        moved = transition(
            slot,
            target,
            trigger=trigger,
            at=self._clock.now(),
            reason=reason,
            release=release,
            cpu_only=cpu_only,
        )
        if moved.state is SlotState.ABSENT:
            moved = dataclasses.replace(moved, release=None)
        return moved

    async def move(
        self,
        model: str,
        slot: Slot,
        target: SlotState,
        trigger: Trigger,
        reason: str,
        *,
        release: str | None = None,
        cpu_only: bool = False,
    ) -> Slot:
        moved = self.moved(slot, target, trigger, reason, release=release, cpu_only=cpu_only)
        await self.commit(model, moved)
        return moved

    async def commit(self, model: str, *slots: Slot, serving: Serving | None = None) -> None:
        """Save slots (and what serves) of ``model`` in one transaction."""
        await self._serving.commit(model, self._clock.now(), serving=serving, slots=slots)

    async def stage_and_load(self, model: str, slot: Slot, trigger: Trigger, release: str) -> Slot:
        """From any resting state to LOADING, through STAGED, recorded in one commit."""
        staged = slot
        if slot.state in (SlotState.ABSENT, SlotState.UNAVAILABLE, SlotState.FAILED):
            staged = self.moved(
                slot, SlotState.STAGED, trigger, f"{release} placed", release=release
            )
        loading = self.moved(
            staged, SlotState.LOADING, trigger, f"loading {release}", release=release
        )
        await self.commit(model, loading)
        return loading

    async def observe(
        self,
        model: str,
        state: SlotState,
        release: str | None,
        reason: str,
        *,
        slot_name: str | None = None,
    ) -> Slot:
        slot = await self.get(model, slot_name)
        seen = observe(slot, state, release=release, at=self._clock.now(), reason=reason)
        await self.commit(model, seen)
        return seen

    async def forget(self, model: str, names: Iterable[str]) -> None:
        """Drop slot rows that no longer mean anything (a spare whose dir is gone)."""
        await self._serving.forget_slots(model, list(names))


class LoadSlots:
    """At most ``size`` loads at once across models (Triton's own load threads are the real
    bound: more at once only queue inside Triton, where no one sees them wait)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("at least one load slot is needed")
        self.size = size
        self._slots = asyncio.Semaphore(size)

    @asynccontextmanager
    async def hold(self, tracker: OperationTracker | None = None) -> AsyncIterator[None]:
        """Hold a load slot; a wait for one is recorded as the step ``queue``."""
        if tracker is not None and self._slots.locked():
            async with tracker.step("queue"):
                tracker.detail(load_slots=self.size)
                await self._slots.acquire()
        else:
            await self._slots.acquire()
        try:
            yield
        finally:
            self._slots.release()


def serving_after(snapshot: SlotSnapshot, release: str) -> Serving:
    """What serves once ``release`` does: the release it replaces becomes the previous."""
    previous = snapshot.previous_release
    if snapshot.active_release and snapshot.active_release != release:
        previous = snapshot.active_release
    return Serving(active=release, previous=previous)


def unloaded(snapshot: SlotSnapshot) -> Serving:
    """What serves once the model is unloaded: nothing, and what served is the previous."""
    return Serving(active=None, previous=snapshot.active_release)


async def unload_best_effort(triton: Triton, name: str, timeout: float) -> bool:
    """Unload ``name`` and wait for UNAVAILABLE; log instead of raising (clean-up paths)."""
    try:
        await triton.unload(name)
        await triton.wait_unavailable(name, timeout)
    except ControlPlaneError as exc:
        log.warning("could not unload %s: %s", name, exc)
        return False
    return True


class SlotFreer:
    """Takes a slot down: unloads it (best effort), waits for UNAVAILABLE, removes its dir and
    audits what it left behind (the residue, in the current step of the operation), recorded
    at each move. The one way a slot is freed, whichever strategy or loop asks."""

    def __init__(
        self,
        *,
        book: SlotBook,
        triton: Triton,
        staging: Staging,
        memory: MemoryWatch,
        unload_seconds: float,
    ) -> None:
        self._book = book
        self._triton = triton
        self._staging = staging
        self._memory = memory
        self.unload_seconds = unload_seconds

    async def take_down(self, tracker: OperationTracker, slot: Slot, reason: str) -> Slot:
        """Ends ABSENT; FAILED when Triton did not let go within the unload bound (reconcile
        tries again)."""
        model, trigger = tracker.operation.model, tracker.operation.trigger
        book = self._book
        if slot.state is SlotState.LOADING:
            slot = await book.move(model, slot, SlotState.FAILED, trigger, reason)
        if slot.state is SlotState.STAGED:
            await asyncio.to_thread(self._staging.remove, slot.name)
            return await book.move(model, slot, SlotState.ABSENT, trigger, reason)
        if slot.state.loaded or slot.state in (SlotState.UPDATING, SlotState.FAILED):
            slot = await book.move(model, slot, SlotState.UNLOADING, trigger, reason)
        unloaded = True
        async with self._memory.unloading(slot.name, tracker):
            if slot.state is SlotState.UNLOADING:
                unloaded = await unload_best_effort(self._triton, slot.name, self.unload_seconds)
            await asyncio.to_thread(self._staging.remove, slot.name)
        if not unloaded:
            return await book.move(
                model,
                slot,
                SlotState.FAILED,
                trigger,
                f"{reason}; Triton did not unload it within {self.unload_seconds:g} s",
            )
        done = slot
        if done.state is SlotState.UNLOADING:
            done = book.moved(done, SlotState.UNAVAILABLE, trigger, f"{reason}; unloaded")
        if done.state is SlotState.UNAVAILABLE:
            done = book.moved(done, SlotState.ABSENT, trigger, f"{reason}; dir removed")
        await book.commit(model, done)
        return done


async def load_from_disk(
    tracker: OperationTracker, triton: Triton, book: SlotBook, seen: Observed, slot: str
) -> None:
    """Load ``slot`` from the files its dir holds (a repair: no store, no fetch)."""
    async with tracker.step("load"):
        tracker.detail(slot=slot, release=seen.desired)
        try:
            await triton.load(slot)
        except ControlPlaneError as exc:
            await book.observe(
                seen.model,
                SlotState.UNAVAILABLE,
                seen.desired,
                f"on disk; the repair's load failed ({exc.code}), tried again next beat",
                slot_name=slot,
            )
            raise


async def record_serving(book: SlotBook, model: str, slot: str, desired: str | None) -> None:
    await book.observe(
        model, SlotState.ACTIVE, desired, "serving (repaired by reconcile)", slot_name=slot
    )
