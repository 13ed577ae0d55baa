"""A member's heartbeat is written when due and when what it says changes; not on every pass."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

from controlplane.adapters.stores.fleet_local import LocalDesiredStates
from controlplane.domain.errors import StoreUnavailable
from controlplane.domain.fleet import MemberBeat, MemberModel, MemberState
from controlplane.services.heartbeat import HeartbeatWriter

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
        heart = HeartbeatWriter(records=records, interval=3600.0)

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
        heart = HeartbeatWriter(records=records, interval=3600.0)
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
