"""A member's heartbeat is written when due and when what it says changes; not on every pass."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.adapters.stores.fleet_local import LocalDesiredStates
from controlplane.domain.errors import StoreUnavailable
from controlplane.domain.fleet import MemberBeat, MemberModel, MemberState
from controlplane.services.heartbeat import HeartbeatWriter
from tests.support.fake_clock import FakeClock

START = datetime(2026, 12, 1, tzinfo=UTC)


class Records(LocalDesiredStates):
    """The local store's records, counting heartbeats, failing on demand."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.written: list[MemberBeat] = []
        self.failing = False

    def beat(self, beat: MemberBeat) -> None:
        if self.failing:
            raise StoreUnavailable("the store is down")
        super().beat(beat)
        self.written.append(beat)


def _beat(at: float, **models: MemberState) -> MemberBeat:
    return MemberBeat(
        member="pod-1",
        incarnation="i1",
        at=START + timedelta(seconds=at),
        interval=3600.0,
        version="1",
        models={name: MemberModel("r1", state, target="r1") for name, state in models.items()},
        overload="no_gpu",
    )


def test_a_heartbeat_is_written_when_due_or_when_it_says_something_new(tmp_path: Path) -> None:
    async def scenario() -> None:
        records = Records(tmp_path)
        heart = HeartbeatWriter(records=records, interval=3600.0, clock=FakeClock())

        await heart.write_if_due(_beat(0, m=MemberState.CONVERGING))  # the first one is due
        for second in range(1, 6):  # passes a second apart, an hour before the next beat
            await heart.write_if_due(_beat(second, m=MemberState.CONVERGING))
        await heart.write_if_due(_beat(6, m=MemberState.SERVING))  # it converged
        stale = dataclasses.replace(_beat(7, m=MemberState.SERVING), stale=True)
        await heart.write_if_due(stale)

        assert [(b.at - START).seconds for b in records.written] == [0, 6, 7]
        assert records.beats()["pod-1"].stale

    asyncio.run(scenario())


def test_a_heartbeat_that_could_not_be_written_is_tried_again_at_the_next_pass(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        records = Records(tmp_path)
        heart = HeartbeatWriter(records=records, interval=3600.0, clock=FakeClock())
        records.failing = True

        await heart.write_if_due(_beat(0))
        failed_with = heart.last_error
        records.failing = False
        await heart.write_if_due(_beat(1))  # nothing new to say, but still due

        assert failed_with is not None
        assert "the store is down" in failed_with
        assert [(b.at - START).seconds for b in records.written] == [1]
        assert heart.last_error is None

    asyncio.run(scenario())


def test_another_daemon_writing_under_this_member_s_name_is_named_until_it_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two daemons given one name write its heartbeat in turns: each sees, at its next look,
    a record it did not write, newer than its own last one, and says so."""

    async def scenario() -> tuple[list[str | None], list[str | None]]:
        records = Records(tmp_path)
        mine = HeartbeatWriter(records=records, interval=1.0, name_check=0.0, clock=FakeClock())
        theirs = HeartbeatWriter(records=records, interval=1.0, name_check=0.0, clock=FakeClock())
        seen_mine: list[str | None] = []
        seen_theirs: list[str | None] = []
        for second in range(0, 6, 2):  # both alive: they write in turns
            await mine.write(_beat(second))
            seen_mine.append(mine.name_conflict)
            await theirs.write(dataclasses.replace(_beat(second + 1), incarnation="i2"))
            seen_theirs.append(theirs.name_conflict)
        for second in range(6, 9):  # the other one is gone
            await mine.write(_beat(second))
            seen_mine.append(mine.name_conflict)
        return seen_mine, seen_theirs

    with caplog.at_level(logging.ERROR):
        seen_mine, seen_theirs = asyncio.run(scenario())

    # Its first write has nothing of its own to compare with; from its second on it sees i2.
    assert seen_mine[0] is None
    assert all(c is not None and "incarnation i2" in c for c in seen_mine[1:3])
    assert seen_mine[3] is not None  # i2's last record is still newer than its own last one
    assert seen_mine[4:] == [None, None]  # its own records only: the conflict is over
    assert all(c is not None and "incarnation i1" in c for c in seen_theirs[1:])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2  # once per daemon, not once per beat
    assert all("CONTROLPLANE_FLEET__MEMBER" in e for e in errors)


def test_a_member_alone_under_its_name_sees_no_conflict_across_a_restart(tmp_path: Path) -> None:
    """A restarted daemon (a new incarnation) finds its predecessor's record, older than
    anything it wrote: that is not another daemon."""

    async def scenario() -> list[str | None]:
        records = Records(tmp_path)
        before = HeartbeatWriter(records=records, interval=1.0, name_check=0.0, clock=FakeClock())
        for second in range(3):
            await before.write(_beat(second))
        after = HeartbeatWriter(records=records, interval=1.0, name_check=0.0, clock=FakeClock())
        seen = []
        for second in range(3, 6):
            await after.write(dataclasses.replace(_beat(second), incarnation="i2"))
            seen.append(after.name_conflict)
        return seen

    assert asyncio.run(scenario()) == [None, None, None]


def test_a_look_at_the_name_that_fails_does_not_cost_the_heartbeat(tmp_path: Path) -> None:
    class Unlookable(Records):
        def beat_of(self, member: str) -> MemberBeat | None:
            raise StoreUnavailable("the read timed out")

    async def scenario() -> list[MemberBeat]:
        records = Unlookable(tmp_path)
        heart = HeartbeatWriter(records=records, interval=1.0, name_check=0.0, clock=FakeClock())
        for second in range(3):
            await heart.write(_beat(second))
        assert heart.name_conflict is None
        assert heart.last_error is None
        return records.written

    assert [(b.at - START).seconds for b in asyncio.run(scenario())] == [0, 1, 2]
