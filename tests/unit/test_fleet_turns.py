"""Turns out of rotation, taken and given back in the fleet's desired state (FleetTurns).

The records are :class:`FakeDesiredStates` (compare-and-swap as the stores do it) and time is a
:class:`FakeClock`, so a test decides who beats and when; what it reads is what an operator
would: the turns in the record, the ``turn`` step of the operation, the error of a wait that
ran out.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from controlplane.domain import rollout_controls
from controlplane.domain.errors import FleetTimeout, Superseded
from controlplane.domain.fleet import DesiredModel
from controlplane.domain.operations import OperationKind, StepStatus, Trigger
from controlplane.domain.turns import Turn
from controlplane.services.fleet_turns import TURN_POLL, FleetTurns
from controlplane.services.rotation import Rotation
from tests.unit.test_fleet_ledger import ME, MODEL, Rig, beat, scenario


def turns_of(r: Rig) -> list[tuple[str, str]]:
    record = r.records.read(MODEL)
    assert record is not None
    return [(t.member, t.incarnation) for t in record.turns]


def holding(r: Rig, member: str, incarnation: str) -> DesiredModel:
    """The record with ``member`` (as ``incarnation``) holding a turn."""
    current = r.records.read(MODEL)
    assert current is not None
    held = replace(current, turns=(Turn(member, incarnation, r.clock.now(), "r2"),))
    r.records.desired[MODEL] = held
    return held


def test_a_turn_is_held_in_the_record_while_the_block_runs_then_given_back(
    tmp_path: Path,
) -> None:
    async def body(
        r: Rig,
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict[str, object]]:
        r.record("r1")
        r.alive("a", "b")
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        run = r.run(OperationKind.DEPLOY, "r2")
        async with turns.turn(run.tracker, MODEL, "r2", max_unavailable=1, timeout=60):
            during = turns_of(r)
        step = next(s for s in (await r.journal(run)).steps if s.name == "turn")
        assert step.status is StepStatus.SUCCEEDED
        return during, turns_of(r), dict(step.detail)

    during, after, detail = scenario(tmp_path, body)

    assert during == [("a", "a-inc-1")]
    assert after == []
    assert detail == {"waited_seconds": 0.0, "behind": [], "max_unavailable": 1}


def test_without_a_record_the_turn_is_this_members_at_once_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    async def body(r: Rig) -> int:
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        run = r.run(OperationKind.DEPLOY, "r1")
        async with turns.turn(run.tracker, MODEL, "r1", max_unavailable=1, timeout=60):
            pass
        return len(r.records.desired)

    assert scenario(tmp_path, body) == 0


def test_a_member_waits_behind_a_live_turn_and_takes_it_once_given_back(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[list[tuple[str, str]], dict[str, object]]:
        r.record("r1")
        r.alive("a", "b")
        holding(r, "b", "b-inc-1")
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        run = r.run(OperationKind.DEPLOY, "r2")
        seen: list[list[tuple[str, str]]] = []

        async def mine() -> None:
            async with turns.turn(run.tracker, MODEL, "r2", max_unavailable=1, timeout=60):
                seen.append(turns_of(r))

        task = asyncio.create_task(mine())
        await r.clock.sleeping()
        assert not seen  # b holds the only turn
        current = r.records.read(MODEL)
        assert current is not None
        r.records.desired[MODEL] = current.changed(
            by="b", at=r.clock.now(), trigger="turn", reason="b is back", turns=()
        )
        r.alive("b")
        r.clock.advance(TURN_POLL)
        await task
        step = next(s for s in (await r.journal(run)).steps if s.name == "turn")
        return seen[0], dict(step.detail)

    during, detail = scenario(tmp_path, body)

    assert during == [("a", "a-inc-1")]
    assert detail["behind"] == ["b"]
    assert detail["waited_seconds"] == TURN_POLL


@pytest.mark.parametrize(
    ("why", "incarnation", "beats"),
    [("not alive", "b-inc-1", False), ("restarted", "b-inc-0", True)],
)
def test_a_turn_whose_holder_is_gone_holds_nothing(
    tmp_path: Path, why: str, incarnation: str, beats: bool
) -> None:
    async def body(r: Rig) -> tuple[list[tuple[str, str]], str]:
        r.record("r1")
        holding(r, "b", incarnation)  # taken by b before it died, or by its earlier process
        r.clock.advance(60)  # b's last beat (at the start) is 12 beats old
        r.alive("a")
        if beats:
            r.alive("b")  # b beats again, as a new process
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        run = r.run(OperationKind.DEPLOY, "r2")
        async with turns.turn(run.tracker, MODEL, "r2", max_unavailable=1, timeout=60):
            record = r.records.read(MODEL)
            assert record is not None
            return turns_of(r), record.reason

    during, reason = scenario(tmp_path, body)

    assert during == [("a", "a-inc-1")], why
    assert "given up by b: not alive" in reason


def test_a_member_in_rotation_counts_a_live_member_out_without_a_turn(tmp_path: Path) -> None:
    """b restarted after a crash mid-update: its old turn lapsed with its process, but it is
    out of rotation still (starting) and the load balancer sends it nothing: a leaves no one
    more out, and says who it waits for."""

    async def body(r: Rig) -> tuple[bool, object, list[tuple[str, str]]]:
        r.record("r1")
        holding(r, "b", "b-inc-0")  # by b's earlier process
        r.alive("a")
        r.records.heartbeats["b"] = replace(
            beat("b", r.clock, incarnation="b-inc-1"), out_of_rotation="starting"
        )
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        run = r.run(OperationKind.DEPLOY, "r2")
        taken: list[list[tuple[str, str]]] = []

        async def mine() -> None:
            async with turns.turn(run.tracker, MODEL, "r2", max_unavailable=1, timeout=60):
                taken.append(turns_of(r))

        task = asyncio.create_task(mine())
        await r.clock.sleeping()
        waited = not taken
        r.alive("b")  # converged: in rotation again
        r.clock.advance(TURN_POLL)
        await task
        step = next(s for s in (await r.journal(run)).steps if s.name == "turn")
        return waited, step.detail["behind"], taken[0]

    waited, behind, during = scenario(tmp_path, body)

    assert waited
    assert behind == ["b (starting)"]
    assert during == [("a", "a-inc-1")]


def test_a_member_that_is_out_itself_counts_turns_only(tmp_path: Path) -> None:
    """Two members restarting at once, both out of rotation: each taking a turn adds nobody
    out, so neither waits for the other's state (only for a turn held)."""

    async def body(r: Rig) -> list[tuple[str, str]]:
        r.record("r1")
        r.alive("a")
        r.records.heartbeats["b"] = replace(beat("b", r.clock), out_of_rotation="starting")
        starting = Rotation(asyncio.Event())  # this member's start-up is not done
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock, rotation=starting)
        run = r.run(OperationKind.DEPLOY, "r2")
        async with turns.turn(run.tracker, MODEL, "r2", max_unavailable=1, timeout=60):
            return turns_of(r)

    assert scenario(tmp_path, body) == [("a", "a-inc-1")]


def test_a_wait_for_a_turn_is_bounded_and_names_who_holds_it(tmp_path: Path) -> None:
    async def body(r: Rig) -> FleetTimeout:
        r.record("r1")
        holding(r, "b", "b-inc-1")
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        run = r.run(OperationKind.DEPLOY, "r2")

        async def keep_b_alive() -> None:
            while True:
                r.records.heartbeats["b"] = beat("b", r.clock)
                r.records.heartbeats["a"] = beat("a", r.clock)
                await r.clock.sleeping()  # the member, waiting for its next look
                r.clock.advance(TURN_POLL)
                await asyncio.sleep(0)

        keeper = asyncio.create_task(keep_b_alive())
        try:
            with pytest.raises(FleetTimeout) as caught:
                async with turns.turn(run.tracker, MODEL, "r2", max_unavailable=1, timeout=10):
                    pass
        finally:
            keeper.cancel()
        return caught.value

    error = scenario(tmp_path, body)

    assert "no turn out of rotation" in error.message
    assert "held by b" in error.message
    assert "rollout.max_unavailable 1" in error.message


def test_two_members_may_be_out_at_once_when_max_unavailable_says_so(tmp_path: Path) -> None:
    async def body(r: Rig) -> list[tuple[str, str]]:
        r.record("r1")
        r.alive("a", "b")
        holding(r, "b", "b-inc-1")
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        run = r.run(OperationKind.DEPLOY, "r2")
        async with turns.turn(run.tracker, MODEL, "r2", max_unavailable=2, timeout=60):
            return turns_of(r)

    assert scenario(tmp_path, body) == [("b", "b-inc-1"), ("a", "a-inc-1")]


def test_a_member_following_the_fleet_gives_up_waiting_once_the_fleet_wants_another_release(
    tmp_path: Path,
) -> None:
    """It waited behind b for r2; meanwhile the fleet moved to r3: it leaves nothing (no turn
    taken, no unload) and says so, to follow r3 instead."""

    async def body(r: Rig) -> tuple[str, list[tuple[str, str]]]:
        r.record("r2")
        r.alive("a", "b")
        holding(r, "b", "b-inc-1")
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        run = r.run(OperationKind.DEPLOY, "r2", trigger=Trigger.FLEET)

        async def mine() -> None:
            async with turns.turn(run.tracker, MODEL, "r2", max_unavailable=1, timeout=60):
                raise AssertionError("took a turn for a release the fleet replaced")

        task = asyncio.create_task(mine())
        await r.clock.sleeping()
        current = r.records.read(MODEL)
        assert current is not None
        r.records.desired[MODEL] = current.changed(
            by="b", at=r.clock.now(), trigger="api", reason="r3, please", release="r3"
        )
        r.clock.advance(TURN_POLL)
        with pytest.raises(Superseded) as raised:
            await task
        return raised.value.message, turns_of(r)

    message, turns_then = scenario(tmp_path, body)

    assert "the fleet wants r3 here now" in message
    assert "not r2" in message
    assert turns_then == [("b", "b-inc-1")]  # b's still; this member took none


def test_no_follower_takes_a_turn_while_the_rollout_is_paused_and_one_does_once_resumed(
    tmp_path: Path,
) -> None:
    """A rolling update paused between two members: the next follower waits with every turn
    free, and takes one once a person resumes it; a person's own deploy is no follower."""

    async def body(r: Rig) -> tuple[list[list[tuple[str, str]]], list[tuple[str, str]]]:
        r.record("r2")
        r.alive("a", "b")
        current = r.records.read(MODEL)
        assert current is not None
        r.records.desired[MODEL] = rollout_controls.pause(
            current, r.records.heartbeats, r.clock.now(), member="b", trigger="cli"
        )
        turns = FleetTurns(records=r.records, member=ME, clock=r.clock)
        follower = r.run(OperationKind.DEPLOY, "r2", trigger=Trigger.FLEET)
        seen: list[list[tuple[str, str]]] = []

        async def mine() -> None:
            async with turns.turn(follower.tracker, MODEL, "r2", max_unavailable=1, timeout=60):
                seen.append(turns_of(r))

        task = asyncio.create_task(mine())
        for _look in range(3):
            await r.clock.sleeping()
            assert not seen  # paused: no turn, though none is taken
            r.clock.advance(TURN_POLL)
        paused = r.records.read(MODEL)
        assert paused is not None
        r.records.desired[MODEL] = rollout_controls.resume(
            paused, r.clock.now(), member="b", trigger="cli"
        )
        r.alive("a", "b")
        r.clock.advance(TURN_POLL)
        await task
        # A person's deploy through this member goes on while paused.
        again = r.records.read(MODEL)
        assert again is not None
        r.records.desired[MODEL] = rollout_controls.pause(
            again, {}, r.clock.now(), member="b", trigger="cli"
        )
        mine_too: list[tuple[str, str]] = []
        person = r.run(OperationKind.DEPLOY, "r3")
        async with turns.turn(person.tracker, MODEL, "r3", max_unavailable=1, timeout=60):
            mine_too = turns_of(r)
        return seen, mine_too

    seen, person = scenario(tmp_path, body)

    assert seen == [[("a", "a-inc-1")]]
    assert person == [("a", "a-inc-1")]
