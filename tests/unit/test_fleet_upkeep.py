"""The fleet's upkeep: members gone for good are forgotten, the living and this one are not;
what serves on a member the fleet has no record of becomes the fleet's."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from controlplane.domain.fleet import MemberBeat, first_generation
from controlplane.ports import ModelRecord
from controlplane.services.fleet_upkeep import DEPARTED_AFTER, forget_departed, seed
from tests.support.fakes import FakeClock, FakeDesiredStates

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _beat(member: str, seconds_ago: float) -> MemberBeat:
    return MemberBeat(
        member=member,
        incarnation=f"{member}-1",
        at=NOW - timedelta(seconds=seconds_ago),
        interval=5.0,
        version="1",
    )


def test_members_not_seen_for_an_hour_are_forgotten_but_not_the_living_or_itself() -> None:
    records = FakeDesiredStates()
    for name, ago in (
        ("alive", 2.0),
        ("dead-a-while", 600.0),  # not alive, but it may come back: kept
        ("gone", DEPARTED_AFTER + 1),
        ("me", DEPARTED_AFTER + 100),  # this member's own heartbeat is never deleted by it
    ):
        records.beat(_beat(name, ago))

    assert asyncio.run(forget_departed(records, "me", NOW)) == ["gone"]
    assert sorted(records.beats()) == ["alive", "dead-a-while", "me"]


def test_what_serves_here_without_a_fleet_record_becomes_the_fleet_s_and_says_so() -> None:
    """A member upgraded from a version without a fleet: what it serves is written as the
    fleet's desired state (so its sync wakes the others), and nothing the fleet has is touched."""
    records, clock = FakeDesiredStates(), FakeClock()
    here = {
        "served": ModelRecord("served", "r2", "r1", NOW),
        "unloaded": ModelRecord("unloaded", None, "r1", NOW),
        "known": ModelRecord("known", "r9", None, NOW),
    }
    known = first_generation("known", by="other", at=NOW, trigger="api", reason="")
    records.desired["known"] = known
    desired = {"known": known}

    wrote = asyncio.run(seed(records, "me", clock, here, desired))

    assert wrote is True
    assert sorted(desired) == ["known", "served"]
    written = records.desired["served"]
    assert (written.release, written.previous, written.set_by, written.trigger) == (
        "r2",
        "r1",
        "me",
        "seed",
    )
    assert records.desired["known"] == known
    assert asyncio.run(seed(records, "me", clock, here, dict(records.desired))) is False
