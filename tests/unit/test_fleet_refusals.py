"""Records of the fleet a member refuses: each said when found, again once a minute while it
stays refused, and once when fixed; and the fleet sync, over real operations on a fake Triton
and records in memory, refusing a record for its own model only: a desired release the store
does not hold (tried once per generation of the record), a record that cannot be read, a
generation that went back. The other model converges all along, and no pass raises.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import pytest

from controlplane.domain.fleet import MemberState, first_generation
from controlplane.domain.refusals import RecordKind, Refusal, RefusalReason
from controlplane.domain.rollout import RolloutPolicy
from controlplane.services.deploy import DeployService
from controlplane.services.fleet_ledger import FleetLedger, Member
from controlplane.services.fleet_refusals import SAY_AGAIN, RefusedRecords
from controlplane.services.fleet_sync import FleetSync, SyncReport
from tests.support.fake_clock import FakeClock
from tests.support.fakes import FakeDesiredStates, FakeTriton, Parts, deploy_service
from tests.support.service_views import publish
from tests.unit.test_reconcile_service import deploy_and_wait

ME = Member("a", "a-inc-1", "1.0")
KEPT, OTHER = "kept", "other"  # the model whose record is refused, and one that converges
BROKEN = Refusal(RecordKind.DESIRED, KEPT, RefusalReason.NOT_JSON, "not JSON")


# --- the log: once a minute per record ----------------------------------------------------


def refusing_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if "record" in r.getMessage()]
    caplog.clear()
    return lines


def test_a_refused_record_is_said_when_found_once_a_minute_after_and_once_fixed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    book = RefusedRecords(clock)
    caplog.set_level(logging.INFO)
    where = "/store/_controlplane/desired/kept.json"

    book.update({where: BROKEN})
    assert refusing_lines(caplog) == [
        f"refusing the fleet's record {where} (not_json): not JSON",
    ]
    for _ in range(5):  # a pass a second: not a line a pass
        clock.advance(1.0)
        book.update({where: BROKEN})
    assert refusing_lines(caplog) == []

    clock.advance(SAY_AGAIN)
    book.update({where: BROKEN})
    assert len(refusing_lines(caplog)) == 1  # still refused: said again

    other_field = replace(BROKEN, reason=RefusalReason.TIME_WITHOUT_ZONE, field="set_at")
    book.update({where: other_field})  # refused for another reason now: said at once
    assert refusing_lines(caplog) == [
        f"refusing the fleet's record {where} (time_without_zone in set_at): not JSON"
    ]
    assert book.counts() == {(RecordKind.DESIRED, RefusalReason.TIME_WITHOUT_ZONE): 1}

    book.update({})
    assert refusing_lines(caplog) == [
        f"the fleet's record {where} is no longer refused (it was: time_without_zone)"
    ]
    assert book.now == {}
    assert book.counts() == {}


def test_a_refused_desired_state_is_an_error_and_a_refused_heartbeat_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = RefusedRecords(FakeClock())
    caplog.set_level(logging.INFO)
    beat = Refusal(RecordKind.MEMBER, "b", RefusalReason.MISNAMED, "holds a's")

    book.update({"d": BROKEN, "m": beat})

    assert {r.getMessage().split(" ")[4]: r.levelno for r in caplog.records} == {
        "d": logging.ERROR,
        "m": logging.WARNING,
    }


# --- the fleet sync -----------------------------------------------------------------------


@dataclass
class Rig:
    service: DeployService
    parts: Parts
    records: FakeDesiredStates
    sync: FleetSync

    def want(
        self, model: str, release: str, *, generation: int = 1, set_at: datetime | None = None
    ) -> None:
        """Put a record of ``release`` straight into the store (as a person's deploy would,
        set now unless ``set_at`` says when)."""
        at = set_at or self.parts.clock.now()
        self.records.desired[model] = replace(
            first_generation(model, by="b", at=at, trigger="api", reason=""),
            generation=generation,
            release=release,
            reason=f"deploy of {release}",
        )

    async def serving(self, model: str) -> str | None:
        record = await self.parts.repos.serving.get(model)
        return record.active_release if record is not None else None


@asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with deploy_service(tmp_path, FakeTriton()) as (service, parts):
        publish(parts, "r1", "r2", model=KEPT)
        publish(parts, "r1", "r2", model=OTHER)
        for model in (KEPT, OTHER):
            done = await deploy_and_wait(service, "r1", model)
            assert done.error is None, done.error
        records = FakeDesiredStates()
        ledger = FleetLedger(
            records=records, member=ME, clock=parts.clock, rollout_for=lambda _m: RolloutPolicy()
        )
        sync = FleetSync(
            ledger=ledger,
            deploy=service,
            client=parts.client,
            serving=parts.repos.serving,
            rollbacks=parts.repos.rollbacks,
            clock=parts.clock,
            poll_interval=1.0,
            beat_interval=1.0,
        )
        yield Rig(service, parts, records, sync)


async def pass_and_wait(rig: Rig) -> SyncReport:
    return await rig.sync.sync_pass(wait=True)


def refused(rig: Rig) -> dict[str, tuple[str, RefusalReason, str | None]]:
    return {w: (r.name, r.reason, r.field) for w, r in rig.sync.refusals.book.now.items()}


WHERE = f"{FakeDesiredStates.where}/desired/{KEPT}.json"


def test_a_desired_release_the_store_does_not_hold_is_refused_once_per_record(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            r.want(KEPT, "r9")  # no such release in the store
            r.want(OTHER, "r2")

            first = await pass_and_wait(r)
            assert first.started == {KEPT: "r9", OTHER: "r2"}
            assert (await r.serving(KEPT), await r.serving(OTHER)) == ("r1", "r2")
            second = await pass_and_wait(r)  # the refusal said; the member keeps r1

            assert refused(r) == {WHERE: (KEPT, RefusalReason.RELEASE_NOT_FOUND, "release")}
            state = second.states[KEPT]
            assert (state.release, state.state) == ("r1", MemberState.FAILED)
            assert state.error is not None
            assert "release_not_found" in state.error
            assert r.sync.model_status(KEPT)["refused"] == [
                {
                    "record": WHERE,
                    "kind": "desired",
                    "name": KEPT,
                    "reason": "release_not_found",
                    "field": "release",
                    "error": state.error,
                }
            ]
            for _ in range(3):  # minutes later, not tried again: the record did not change
                r.parts.clock.advance(300.0)
                assert (await pass_and_wait(r)).started == {}

            r.want(KEPT, "r2", generation=2)  # a new generation: looked at anew
            assert (await pass_and_wait(r)).started == {KEPT: "r2"}
            assert await r.serving(KEPT) == "r2"
            await pass_and_wait(r)
            assert refused(r) == {}

    asyncio.run(scenario())


def test_a_record_that_cannot_be_read_stops_its_own_model_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            r.records.refused = {"/store/kept.json": BROKEN}
            r.want(OTHER, "r2")

            report = await pass_and_wait(r)

            assert report.started == {OTHER: "r2"}
            assert (await r.serving(KEPT), await r.serving(OTHER)) == ("r1", "r2")
            assert report.states[KEPT].state is MemberState.SERVING  # as it serves, untouched
            assert refused(r) == {"/store/kept.json": (KEPT, RefusalReason.NOT_JSON, None)}

    asyncio.run(scenario())


def test_a_generation_put_back_is_refused_until_a_person_deploys_over_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            older: datetime = r.parts.clock.now()
            r.parts.clock.advance(60.0)
            r.want(KEPT, "r2", generation=10)
            await pass_and_wait(r)
            assert await r.serving(KEPT) == "r2"

            r.want(KEPT, "r1", generation=5, set_at=older)  # a backup put back
            r.want(OTHER, "r2")
            report = await pass_and_wait(r)

            assert report.started == {OTHER: "r2"}
            assert await r.serving(KEPT) == "r2"  # not moved back
            assert refused(r) == {WHERE: (KEPT, RefusalReason.GENERATION_WENT_BACK, "generation")}

            r.parts.clock.advance(60.0)
            r.want(KEPT, "r1", generation=6)  # a deploy over the copy, set now: followed
            assert (await pass_and_wait(r)).started == {KEPT: "r1"}
            assert await r.serving(KEPT) == "r1"

    asyncio.run(scenario())
