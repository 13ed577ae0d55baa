"""The slot state machine: the table is the only way between states, except ``observe``."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.domain.errors import InvalidTransition
from controlplane.domain.operations import Trigger
from controlplane.domain.slots import (
    ON_CPU_ONLY,
    TRANSITIONS,
    Slot,
    SlotState,
    absent,
    can_transition,
    observe,
    transition,
)

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
T1 = T0 + timedelta(seconds=5)
ALL_PAIRS = list(itertools.product(SlotState, SlotState))
VALID = [(a, b) for a, b in ALL_PAIRS if b in TRANSITIONS[a]]
INVALID = [(a, b) for a, b in ALL_PAIRS if b not in TRANSITIONS[a]]


def slot_in(state: SlotState, release: str | None = "r1") -> Slot:
    return Slot(
        name="resnet__blue",
        state=state,
        release=release,
        trigger=Trigger.API,
        reason="r0",
        since=T0,
    )


def test_every_state_has_a_row_in_the_table() -> None:
    assert set(TRANSITIONS) == set(SlotState)
    assert all(set(targets) <= set(SlotState) for targets in TRANSITIONS.values())


def test_the_documented_lifecycle_is_allowed() -> None:
    path = ["ABSENT", "STAGED", "LOADING", "READY", "ACTIVE", "RETIRING", "UNLOADING"]
    path.append("UNAVAILABLE")
    for source, target in itertools.pairwise(path):
        assert can_transition(SlotState(source), SlotState(target)), (source, target)
    assert can_transition(SlotState.LOADING, SlotState.FAILED)
    assert can_transition(SlotState.READY, SlotState.UPDATING)
    assert can_transition(SlotState.UPDATING, SlotState.READY)


def test_shortcuts_are_not_allowed() -> None:
    assert not can_transition(SlotState.ABSENT, SlotState.READY)
    assert not can_transition(SlotState.STAGED, SlotState.ACTIVE)
    assert not can_transition(SlotState.LOADING, SlotState.ACTIVE)
    assert not can_transition(SlotState.UNLOADING, SlotState.ACTIVE)


@pytest.mark.parametrize(("source", "target"), VALID, ids=[f"{a}->{b}" for a, b in VALID])
def test_valid_transitions_record_why(source: SlotState, target: SlotState) -> None:
    before = slot_in(source)

    after = transition(before, target, trigger=Trigger.API, at=T1, reason="op-1", release="r2")

    assert after == Slot(
        name="resnet__blue",
        state=target,
        release="r2",
        trigger=Trigger.API,
        reason="op-1",
        since=T1,
    )
    assert before == slot_in(source)  # the original is untouched


@pytest.mark.parametrize(("source", "target"), VALID[:3], ids=[f"{a}->{b}" for a, b in VALID[:3]])
def test_release_is_kept_unless_given(source: SlotState, target: SlotState) -> None:
    after = transition(slot_in(source, release="r7"), target, trigger=Trigger.API, at=T1)
    assert after.release == "r7"
    assert after.reason == ""


@pytest.mark.parametrize(("source", "target"), INVALID, ids=[f"{a}->{b}" for a, b in INVALID])
def test_pairs_outside_the_table_raise(source: SlotState, target: SlotState) -> None:
    before = slot_in(source)

    with pytest.raises(InvalidTransition) as caught:
        transition(before, target, trigger=Trigger.API, at=T1, reason="op-1")

    assert caught.value.code == "invalid_transition"
    assert f"from {source} to {target}" in caught.value.message
    assert "'resnet__blue'" in caught.value.message
    assert before == slot_in(source)


def test_the_exhaustive_split_covers_every_pair() -> None:
    assert len(VALID) + len(INVALID) == len(SlotState) ** 2
    assert len(VALID) == sum(len(targets) for targets in TRANSITIONS.values())
    assert INVALID  # self-loops at least are refused
    assert all((state, state) in INVALID for state in SlotState)


def test_slots_are_frozen() -> None:
    slot = slot_in(SlotState.READY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        slot.state = SlotState.ACTIVE  # type: ignore[misc]
    assert slot.state is SlotState.READY


@pytest.mark.parametrize(
    ("source", "target"), INVALID[:8], ids=[f"{a}->{b}" for a, b in INVALID[:8]]
)
def test_observe_bypasses_the_table(source: SlotState, target: SlotState) -> None:
    before = slot_in(source)

    after = observe(before, target, release=None, at=T1, reason="triton says so")

    assert after == Slot(
        name="resnet__blue",
        state=target,
        release=None,
        trigger=Trigger.RECONCILE,
        reason="triton says so",
        since=T1,
    )
    assert before == slot_in(source)


def test_absent_starts_empty() -> None:
    assert absent("m", T0) == Slot(
        name="m", state=SlotState.ABSENT, release=None, trigger=None, reason="", since=T0
    )


def test_the_cpu_only_mark_follows_a_slot_until_it_is_loaded_again() -> None:
    """The rollback chain's CPU-only reload lives in Triton until the slot is loaded from its
    files: re-pointed away and back (blue-green), the slot still serves on CPU."""
    s = SlotState
    on_cpu = transition(
        slot_in(s.UPDATING),
        s.ACTIVE,
        trigger=Trigger.ALERT,
        at=T1,
        reason=f"serving {ON_CPU_ONLY}",
        cpu_only=True,
    )
    assert on_cpu.cpu_only
    retiring = transition(on_cpu, s.RETIRING, trigger=Trigger.API, at=T1, reason="r2 switched in")
    back = transition(retiring, s.ACTIVE, trigger=Trigger.API, at=T1, reason="rolled back to r1")
    assert (retiring.cpu_only, back.cpu_only) == (True, True)
    assert back.reason == "rolled back to r1"  # the mark is a field, never words to read
    # Reloaded (an in-place deploy), or unloaded: gone.
    reloaded = transition(
        transition(back, s.UPDATING, trigger=Trigger.API, at=T1, reason="updating to r3"),
        s.ACTIVE,
        trigger=Trigger.API,
        at=T1,
        reason="r3 serves",
    )
    unloading = transition(retiring, s.UNLOADING, trigger=Trigger.SCHEDULE, at=T1, reason="retired")
    assert (reloaded.cpu_only, unloading.cpu_only) == (False, False)
    # A failed CPU-only reload never marks the slot, whatever its reason says.
    failed = transition(
        slot_in(s.UPDATING),
        s.ACTIVE,
        trigger=Trigger.ALERT,
        at=T1,
        reason=f"CPU-only reload failed; not {ON_CPU_ONLY}",
    )
    assert not failed.cpu_only
    # What reconcile observes is not known to be the CPU-only reload's.
    assert not observe(back, s.READY, release="r1", at=T1, reason="as found").cpu_only
