"""The slot state machine.

A slot is one Triton model dir the daemon manages (the model itself under the ``inplace``
strategy). Its states mirror what Triton reports, plus the daemon's own steps around them::

    ABSENT -> STAGED -> LOADING -> READY -> ACTIVE -> RETIRING -> UNLOADING -> UNAVAILABLE
                           └-> FAILED        └-> UPDATING -> ACTIVE | READY | FAILED
                                                                      UNLOADING -> FAILED
                                                     UPDATING -> STALE -> UPDATING | UNLOADING

An inplace slot is STALE when its reload was cut short (a timeout, a rollback budget): its
placement is put back at once, but Triton may still finish loading the other files, so the
reconcile loop reloads it from disk once Triton is idle (a deploy reloads it as well).

A slot is FAILED when its load failed, was cut short, or timed out and Triton still holds it
(a load that never ends keeps its name until Triton restarts), and when its unload did not
finish; the reconcile loop takes such a slot down once Triton lets go of it.

A slot the rollback chain's last step reloaded on CPU-only instances says so
(:attr:`Slot.cpu_only`): Triton keeps that override until it loads the slot from its files
again, so the mark follows the slot through the moves that keep what Triton holds (READY,
ACTIVE, RETIRING) and is gone after any other.

Transitions are a table; :func:`transition` refuses anything not in it and returns a new
frozen value that records why the slot moved (its trigger and reason). :func:`observe` is the
one escape hatch: reconcile records what Triton and the disk actually show, whatever the table
says, because reality wins over bookkeeping.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from controlplane.domain.errors import InvalidTransition
from controlplane.domain.operations import Trigger


class SlotState(StrEnum):
    ABSENT = "ABSENT"
    STAGED = "STAGED"
    LOADING = "LOADING"
    READY = "READY"
    ACTIVE = "ACTIVE"
    UPDATING = "UPDATING"
    RETIRING = "RETIRING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"
    FAILED = "FAILED"
    STALE = "STALE"  # inplace: a reload was cut short; Triton may serve other files than placed

    @property
    def loaded(self) -> bool:
        """Triton holds a release of the slot, as the records last knew, and nothing is
        under way: the one meaning of "loaded" (UPDATING is a load in motion)."""
        return self in LOADED

    @property
    def idle(self) -> bool:
        """Nothing of the slot is in the repository or in Triton: a load may go into it."""
        return self in (SlotState.ABSENT, SlotState.UNAVAILABLE)


S = SlotState
TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    S.ABSENT: frozenset({S.STAGED}),
    S.STAGED: frozenset({S.LOADING, S.ABSENT}),
    S.LOADING: frozenset({S.READY, S.FAILED}),
    S.READY: frozenset({S.ACTIVE, S.UPDATING, S.UNLOADING}),
    S.ACTIVE: frozenset({S.UPDATING, S.RETIRING, S.UNLOADING}),
    S.UPDATING: frozenset({S.ACTIVE, S.READY, S.FAILED, S.STALE}),
    S.RETIRING: frozenset({S.ACTIVE, S.UNLOADING}),
    S.UNLOADING: frozenset({S.UNAVAILABLE, S.FAILED}),
    S.UNAVAILABLE: frozenset({S.STAGED, S.ABSENT}),
    S.FAILED: frozenset({S.STAGED, S.UNLOADING, S.ABSENT}),
    S.STALE: frozenset({S.UPDATING, S.UNLOADING}),
}


LOADED = frozenset({S.READY, S.ACTIVE, S.RETIRING, S.STALE})
# Moves between these keep the model Triton holds as it is (no load from the slot's files).
_KEEPS_LOADED = frozenset({S.READY, S.ACTIVE, S.RETIRING})
ON_CPU_ONLY = "on CPU-only instances"  # how a reason says it (status, logs)


@dataclass(frozen=True)
class Slot:
    """What the daemon knows about one slot, and why it is in its state: what moved it
    (``trigger``: None for a slot never touched) and the ``reason`` in words."""

    name: str
    state: SlotState
    release: str | None
    trigger: Trigger | None
    reason: str
    since: datetime
    cpu_only: bool = False  # the rollback chain reloaded it on CPU-only instances


def can_transition(source: SlotState, target: SlotState) -> bool:
    return target in TRANSITIONS[source]


def transition(
    slot: Slot,
    target: SlotState,
    *,
    trigger: Trigger,
    at: datetime,
    reason: str = "",
    release: str | None = None,
    cpu_only: bool = False,
) -> Slot:
    """Move ``slot`` to ``target`` if the table allows it; keep its release unless given.
    ``cpu_only``: this move is the CPU-only reload; otherwise the mark stays only through the
    moves that keep what Triton holds."""
    if not can_transition(slot.state, target):
        raise InvalidTransition(
            f"slot {slot.name!r} cannot go from {slot.state} to {target} ({trigger}: {reason})"
        )
    keeps = cpu_only or (slot.cpu_only and slot.state in _KEEPS_LOADED and target in _KEEPS_LOADED)
    return dataclasses.replace(
        slot,
        state=target,
        release=slot.release if release is None else release,
        trigger=trigger,
        reason=reason,
        since=at,
        cpu_only=keeps,
    )


def observe(
    slot: Slot, state: SlotState, *, release: str | None, at: datetime, reason: str
) -> Slot:
    """Record the state reconcile observed, bypassing the table (reality wins). What Triton
    holds is not known to be the CPU-only reload's any more."""
    return dataclasses.replace(
        slot,
        state=state,
        release=release,
        trigger=Trigger.RECONCILE,
        reason=reason,
        since=at,
        cpu_only=False,
    )


def absent(name: str, at: datetime) -> Slot:
    return Slot(name=name, state=S.ABSENT, release=None, trigger=None, reason="", since=at)
