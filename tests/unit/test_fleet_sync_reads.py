"""When the fleet sync reads the desired state from the store: at every pass, unless the
bucket's events, heard on this member's own queue, vouch that it did not change. Then a pass
reuses what it read last, and reads again when an event (or a peer's wake) names a change,
when the queue was away since the last read, and every ``check_every`` s whatever the events
say. Over real operations on a fake Triton and records in memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.fakes import FakeDesiredStates
from tests.unit.test_fleet_refusals import KEPT, OTHER, pass_and_wait, rig

CHECK_EVERY = 300.0


class Ear:
    """The events' side of :class:`~controlplane.ports.DesiredStateEvents`."""

    def __init__(self) -> None:
        self.token: int | None = None

    def vouch(self) -> int | None:
        return self.token


def reads(records: FakeDesiredStates) -> int:
    return len(records.reads)


def test_a_vouched_member_reads_only_when_told_of_a_change(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            ear = Ear()
            r.sync.hear_from(ear)
            r.want(KEPT, "r1")
            r.want(OTHER, "r1")

            await pass_and_wait(r)
            await pass_and_wait(r)
            assert reads(r.records) == 2  # no queue live yet: every pass reads

            ear.token = 1  # the queue is live
            await pass_and_wait(r)  # the first pass under it reads (and takes the token)
            before = reads(r.records)
            for _ in range(5):
                await pass_and_wait(r)
            assert reads(r.records) == before  # quiet: nothing read

            r.want(KEPT, "r2", generation=2)  # changed in the store; its event comes next
            assert (await pass_and_wait(r)).started == {}
            r.sync.poke({KEPT})
            report = await pass_and_wait(r)
            assert r.records.reads[-1] == frozenset({KEPT})  # read, told which record moved
            assert report.started == {KEPT: "r2"}
            assert await r.serving(KEPT) == "r2"
            assert r.sync.last_read == report.at

            before = reads(r.records)
            ear.token = None  # the queue is away: every pass reads again
            await pass_and_wait(r)
            await pass_and_wait(r)
            assert reads(r.records) == before + 2
            ear.token = 2  # back, after an outage in which events may have been lost
            await pass_and_wait(r)
            assert reads(r.records) == before + 3
            await pass_and_wait(r)
            assert reads(r.records) == before + 3

            r.parts.clock.advance(CHECK_EVERY)  # the safety net: read whatever events say
            await pass_and_wait(r)
            assert reads(r.records) == before + 4

    asyncio.run(scenario())


def test_a_failed_read_is_made_again_with_the_models_it_was_told_of(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            ear = Ear()
            ear.token = 1
            r.sync.hear_from(ear)
            r.want(KEPT, "r1")
            await pass_and_wait(r)
            r.records.failing = 1  # the next read fails (the store away)
            r.sync.poke({KEPT})
            assert (await pass_and_wait(r)).error is not None
            r.want(KEPT, "r2", generation=2)
            report = await pass_and_wait(r)
            assert r.records.reads[-1] == frozenset({KEPT})
            assert report.started == {KEPT: "r2"}

    asyncio.run(scenario())
