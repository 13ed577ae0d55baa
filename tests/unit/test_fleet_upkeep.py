"""The fleet's upkeep: members gone for good are forgotten, the living and this one are not."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from controlplane.domain.fleet import MemberBeat
from controlplane.services.fleet_upkeep import DEPARTED_AFTER, forget_departed
from tests.support.fakes import FakeDesiredStates

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
