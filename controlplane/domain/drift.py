"""Drift: how what Triton serves differs from what should serve, and what puts it back.

Pure decisions over what the daemon observed (its records, the markers of the dirs it placed,
Triton's repository index, the alias's target); the reconcile loop gathers the observations,
asks :func:`assess`, and acts. Level-triggered: the same observations give the same answer
whether the daemon missed an event, restarted, or Triton did, so a repair is never a reaction
to *how* things went wrong, only to *what* is wrong now.

What a model needs, by strategy:

* ``inplace``: the model's dir holds the desired release and Triton has it READY (and it is
  not STALE, a reload cut short that Triton may have finished with other files).
* ``blue-green``: a slot holds the desired release and is READY, and the alias is READY and
  points at it. Other slots of the model that hold something are retired, unless they are a
  warm previous release (RETIRING and READY), which keep their retire window.

Triton busy with a name (LOADING, UNLOADING) is waited for, never acted on. A strategy joins
with its own assessment in :data:`_BY_STRATEGY`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.traffic import Strategy
from controlplane.domain.triton import TritonState

READY, UNAVAILABLE = TritonState.READY, TritonState.UNAVAILABLE
# How a drift the reconcile loop must leave alone begins (a model held out of rotation: its
# repair would be the very load that was refused), in GET /v1/models/{name}'s ``drift``.
NOT_REPAIRED = "not repaired: "


class Action(StrEnum):
    NONE = "none"  # serves as it should
    WAIT = "wait"  # Triton is busy with it; look again at the next beat
    LOAD = "load"  # the desired release is on disk, not loaded: load it (and point the alias)
    REPOINT = "repoint"  # the slot serves, the alias does not point at it
    REDEPLOY = "redeploy"  # no dir holds the desired release: deploy it from the store
    REMOVE = "remove"  # nothing should serve, but a dir of an unfinished first deploy is there


# An inplace record in one of these, with no operation running, was left mid-way by a daemon
# that died (or a cut): Triton may serve other files than the ones placed, so reload from disk.
UNSETTLED = frozenset(
    {
        SlotState.STALE,
        SlotState.UPDATING,
        SlotState.LOADING,
        SlotState.STAGED,
        SlotState.UNLOADING,
        SlotState.FAILED,
    }
)


@dataclass(frozen=True)
class Observed:
    """One model as the daemon sees it now."""

    model: str
    desired: str | None
    strategy: Strategy
    slots: Sequence[Slot]  # the records (blue-green: every slot; inplace: the model's own)
    on_disk: Mapping[str, str]  # dir name -> release its marker names (this model's dirs)
    triton: Mapping[str, TritonState]  # name -> Triton's state, for the names Triton lists
    alias_target: str | None = None  # blue-green: the slot the alias points at, if READY
    alias_on_disk: bool = False  # blue-green: the alias's dir is in the repository


@dataclass(frozen=True)
class Assessment:
    model: str
    action: Action
    why: str
    slot: str | None = None  # the slot that serves (or should)
    retire: tuple[str, ...] = ()  # slots to take down (blue-green)
    serving: bool = False  # clients get the desired release now
    # It serves, but the records do not say that ``slot`` is the ACTIVE one (a pass that found
    # the alias pointing at it after a restart): record it so, no repair needed.
    unrecorded: bool = False


def assess(seen: Observed) -> Assessment:
    return _BY_STRATEGY[seen.strategy](seen)


def _inplace(seen: Observed) -> Assessment:
    model = seen.model
    state = seen.triton.get(model, UNAVAILABLE)
    placed = seen.on_disk.get(model)
    record = next((s for s in seen.slots if s.name == model), None)
    if seen.desired is None:
        if placed is not None:
            return Assessment(model, Action.REMOVE, f"{model} holds {placed}, nothing should serve")
        return Assessment(model, Action.NONE, "nothing should serve", serving=True)
    if placed != seen.desired:
        return Assessment(
            model,
            Action.REDEPLOY,
            f"the repository holds {placed or 'nothing'}, {seen.desired} should serve",
            slot=model,
        )
    if state.busy:
        return Assessment(model, Action.WAIT, f"Triton is {state} {model}", slot=model)
    unsettled = record is not None and record.state in UNSETTLED
    if state is not READY or unsettled:
        why = (
            f"{model} was left {record.state} mid-way (a reload cut short, or a daemon that "
            f"died); reloading {seen.desired} from disk"
            if unsettled and state is READY and record is not None
            else f"Triton has {model} {state}; {seen.desired} is on disk"
        )
        return Assessment(model, Action.LOAD, why, slot=model, serving=state is READY)
    return Assessment(model, Action.NONE, f"serves {seen.desired}", slot=model, serving=True)


def _blue_green(seen: Observed) -> Assessment:
    model = seen.model
    records = {s.name: s for s in seen.slots}
    serving = _serving_slot(seen, records)
    retire = _to_retire(seen, records, serving)
    if seen.desired is None:
        if seen.alias_on_disk:  # a first deploy that never finished left the alias's dir
            return Assessment(
                model,
                Action.REMOVE,
                f"the alias {model}'s dir is there, nothing should serve",
                retire=retire,
                serving=True,
            )
        return Assessment(model, Action.NONE, "nothing should serve", retire=retire, serving=True)
    if serving is None:
        return Assessment(
            model,
            Action.REDEPLOY,
            f"no slot holds {seen.desired}",
            retire=retire,
        )
    slot_state = seen.triton.get(serving, UNAVAILABLE)
    alias_state = seen.triton.get(model, UNAVAILABLE)
    if slot_state.busy or alias_state.busy:
        busy = serving if slot_state.busy else model
        return Assessment(
            model, Action.WAIT, f"Triton is {seen.triton[busy]} {busy}", slot=serving, retire=retire
        )
    if slot_state is not READY:
        return Assessment(
            model,
            Action.LOAD,
            f"{serving} holds {seen.desired} but Triton has it {slot_state}",
            slot=serving,
            retire=retire,
        )
    if alias_state is not READY or seen.alias_target != serving:
        where = seen.alias_target if alias_state is READY else alias_state
        return Assessment(
            model,
            Action.REPOINT,
            f"the alias {model} is {where or 'nowhere'}, not {serving}",
            slot=serving,
            retire=retire,
        )
    record = records.get(serving)
    return Assessment(
        model,
        Action.NONE,
        f"serves {seen.desired} from {serving}",
        slot=serving,
        retire=retire,
        serving=True,
        unrecorded=record is None or record.state is not SlotState.ACTIVE,
    )


def _serving_slot(seen: Observed, records: dict[str, Slot]) -> str | None:
    """The slot whose dir holds the desired release: the one the records say is active
    first, then any other holding it."""
    if seen.desired is None:
        return None
    holders = [name for name, release in seen.on_disk.items() if release == seen.desired]
    holders.sort(
        key=lambda name: (
            records.get(name) is None or records[name].state is not SlotState.ACTIVE,
            name,
        )
    )
    return holders[0] if holders else None


def _to_retire(seen: Observed, records: dict[str, Slot], serving: str | None) -> tuple[str, ...]:
    """Slots on disk or in the records that neither serve nor are kept warm, and that Triton
    is not busy with."""
    return tuple(
        sorted(
            name
            for name in set(seen.on_disk) | {s.name for s in seen.slots if _holds(s)}
            if name != serving
            and not _warm(records.get(name), seen.triton.get(name))
            and not seen.triton.get(name, UNAVAILABLE).busy
        )
    )


def _holds(slot: Slot) -> bool:
    """The record says the slot holds something Triton may have loaded."""
    return not slot.state.idle


def _warm(record: Slot | None, state: TritonState | None) -> bool:
    """A previous release kept loaded for a quick rollback: it keeps its retire window."""
    return record is not None and record.state is SlotState.RETIRING and state is READY


_BY_STRATEGY = {
    Strategy.BLUE_GREEN: _blue_green,
    Strategy.ROLLING: _blue_green,  # the same layout: an alias and two slots
    Strategy.AUTO: _blue_green,
    Strategy.INPLACE: _inplace,
}
