"""This member's writes to the fleet's desired state: publish, claim, claim_failed, roll_back.

The records are :class:`FakeDesiredStates` (in memory, compare-and-swap as the stores do it),
so a test can land another member's write inside a swap; the operation is recorded by the real
tracker in a real SQLite journal, and each test reads what an operator would: the record the
fleet now follows, the operation's ``publish`` step, the answer a claim got.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controlplane.adapters.persistence import SqliteRepos
from controlplane.domain.errors import DesiredStateConflict
from controlplane.domain.fleet import (
    Claim,
    Degraded,
    DesiredModel,
    MemberBeat,
    Rollout,
    RolloutPhase,
    desired_for_storage,
    desired_from_storage,
    first_generation,
)
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    StepStatus,
    Trigger,
)
from controlplane.domain.publish import FleetBase
from controlplane.domain.rollout import RolloutPolicy
from controlplane.services.fleet_ledger import (
    ROLL_BACK_ATTEMPTS,
    FleetLedger,
    Member,
    Publication,
)
from controlplane.services.runner import Run
from controlplane.services.tracker import OperationTracker
from tests.support.fakes import FakeClock, FakeDesiredStates

MODEL = "m"
ME = Member("a", "a-inc-1", "1.0")
T = TypeVar("T")


@dataclass
class Rig:
    records: FakeDesiredStates
    clock: FakeClock
    repos: SqliteRepos
    ledger: FleetLedger
    policy: RolloutPolicy = field(default_factory=RolloutPolicy)
    woken: int = 0

    def record(self, release: str | None, *, generation: int = 1, by: str = "b") -> DesiredModel:
        """Put a record of ``release`` at ``generation`` straight into the store."""
        now = self.clock.now()
        desired = replace(
            first_generation(MODEL, by=by, at=now, trigger="api", reason=""),
            generation=generation,
            release=release,
            reason=f"set by {by}",
        )
        self.records.desired[MODEL] = desired
        return desired

    def alive(self, *members: str) -> None:
        for member in members:
            self.records.heartbeats[member] = beat(member, self.clock)

    def run(
        self,
        kind: OperationKind,
        release: str | None,
        trigger: Trigger = Trigger.API,
        *,
        from_release: str | None = None,
    ) -> Run:
        operation = Operation(
            id=f"op-{kind.value}-{release}",
            kind=kind,
            model=MODEL,
            release=release,
            trigger=trigger,
            status=OperationStatus.RUNNING,
            created_at=self.clock.now(),
            from_release=from_release,
        )
        return Run(OperationTracker(operation, self.repos.operations, self.clock))

    async def journal(self, run: Run) -> Operation:
        await self.repos.operations.flush()
        found = await self.repos.operations.get(run.operation.id)
        assert found is not None
        return found


def beat(member: str, clock: FakeClock, *, incarnation: str | None = None) -> MemberBeat:
    return MemberBeat(
        member=member,
        incarnation=incarnation or f"{member}-inc-1",
        at=clock.now(),
        interval=5.0,
        version="1.0",
    )


@asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    records, clock = FakeDesiredStates(), FakeClock()
    repos = SqliteRepos.open(tmp_path / "state.db")
    holder: list[Rig] = []

    def woken() -> None:
        holder[0].woken += 1

    ledger = FleetLedger(
        records=records,
        member=ME,
        clock=clock,
        rollout_for=lambda _model: holder[0].policy,
        wake=woken,
    )
    holder.append(Rig(records, clock, repos, ledger))
    try:
        yield holder[0]
    finally:
        repos.close()


def scenario(tmp_path: Path, body: Callable[[Rig], Coroutine[Any, Any, T]]) -> T:
    async def main() -> T:
        async with rig(tmp_path) as r:
            return await body(r)

    return asyncio.run(main())


def other(rig: Rig, release: str | None, *, by: str = "b", **fields: Any) -> DesiredModel:
    """Another member's next write over what the store holds now."""
    current = rig.records.desired.get(MODEL) or first_generation(
        MODEL, by=by, at=rig.clock.now(), trigger="api", reason=""
    )
    return current.changed(
        by=by, at=rig.clock.now(), trigger="api", reason=f"{by} set it", release=release, **fields
    )


# --- publish ---------------------------------------------------------------------------------


def test_a_deploy_that_serves_here_publishes_the_first_record(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[DesiredModel, Operation]:
        run = r.run(OperationKind.DEPLOY, "r1")
        new = await r.ledger.publish(run, Publication(base=None, release="r1"))
        return new, await r.journal(run)

    new, operation = scenario(tmp_path, body)

    assert new.generation == 1
    assert (new.release, new.previous, new.set_by, new.trigger) == ("r1", None, "a", "api")
    assert "operation op-deploy-r1" in new.reason
    assert new.rollout.phase is RolloutPhase.COMPLETE
    step = operation.steps[-1]
    assert (step.name, step.status) == ("publish", StepStatus.SUCCEEDED)
    assert step.detail == {"generation": 1, "phase": "complete"}


def test_an_unload_publishes_a_null_release_naming_what_it_unloaded(tmp_path: Path) -> None:
    """Members unload only for a record that says which release an unload left; the record
    the API's unload writes says it, and reads back as one."""

    async def body(r: Rig) -> DesiredModel:
        base = r.record("r2", generation=3)
        return await r.ledger.publish(
            r.run(OperationKind.UNLOAD, None), Publication(base=base, release=None)
        )

    new = scenario(tmp_path, body)

    assert (new.generation, new.release, new.previous, new.unloaded) == (4, None, "r2", "r2")
    assert desired_from_storage(json.loads(json.dumps(desired_for_storage(new)))) == new
    assert new.unloads("any member")


def test_a_deploy_publishes_over_the_record_it_read_and_wakes_the_sync(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[DesiredModel, DesiredModel | None, int]:
        base = r.record("r1", generation=3)
        new = await r.ledger.publish(
            r.run(OperationKind.DEPLOY, "r2"), Publication(base=base, release="r2")
        )
        return new, r.records.read(MODEL), r.woken

    new, stored, woken = scenario(tmp_path, body)

    assert stored == new
    assert (new.generation, new.release, new.previous) == (4, "r2", "r1")
    assert woken == 1


def test_deploying_a_degraded_release_by_name_clears_its_latch(tmp_path: Path) -> None:
    async def body(r: Rig) -> DesiredModel:
        base = replace(
            r.record("r1"),
            degraded=(
                Degraded("r2", r.clock.now(), "rolled back"),
                Degraded("r0", r.clock.now(), ""),
            ),
        )
        r.records.desired[MODEL] = base
        return await r.ledger.publish(
            r.run(OperationKind.DEPLOY, "r2"), Publication(base=base, release="r2")
        )

    new = scenario(tmp_path, body)

    assert [d.release for d in new.degraded] == ["r0"]


def test_a_rollback_publication_latches_the_release_it_left(tmp_path: Path) -> None:
    async def body(r: Rig) -> DesiredModel:
        base = r.record("r2")
        return await r.ledger.publish(
            r.run(OperationKind.ROLLBACK, "r1", Trigger.ALERT),
            Publication(base=base, release="r1", latch="r2"),
        )

    new = scenario(tmp_path, body)

    assert (new.release, new.previous, new.trigger) == ("r1", "r2", "alert")
    assert new.is_degraded("r2")
    assert "alert" in new.degraded[0].reason


def test_with_canaries_a_new_release_starts_on_this_member_and_live_others(
    tmp_path: Path,
) -> None:
    async def body(r: Rig) -> tuple[DesiredModel, Operation]:
        r.policy = RolloutPolicy(canary_members=3, bake_seconds=30)
        base = r.record("r1", generation=4)
        r.records.heartbeats["c"] = beat("c", r.clock)
        r.clock.advance(16)  # c's last beat is more than 3 intervals old now
        r.alive("a", "d", "b")
        run = r.run(OperationKind.DEPLOY, "r2")
        new = await r.ledger.publish(run, Publication(base=base, release="r2"))
        return new, await r.journal(run)

    new, operation = scenario(tmp_path, body)

    assert new.release == "r2"
    assert new.rollout == Rollout(
        phase=RolloutPhase.CANARY,
        stable="r1",
        canaries=("a", "b", "d"),
        bake_seconds=30,
        since_generation=5,
    )
    assert new.target_for("c") == "r1"
    assert operation.steps[-1].detail["canaries"] == ["a", "b", "d"]


def test_with_canaries_the_first_release_of_a_model_goes_everywhere(tmp_path: Path) -> None:
    async def body(r: Rig) -> DesiredModel:
        r.policy = RolloutPolicy(canary_members=1, bake_seconds=30)
        r.alive("a", "b")
        return await r.ledger.publish(
            r.run(OperationKind.DEPLOY, "r1"), Publication(base=None, release="r1")
        )

    assert scenario(tmp_path, body).rollout.phase is RolloutPhase.COMPLETE


def test_rolling_back_the_canary_release_stops_the_rollout(tmp_path: Path) -> None:
    async def body(r: Rig) -> DesiredModel:
        base = replace(
            r.record("r2", generation=6),
            rollout=Rollout(RolloutPhase.CANARY, stable="r1", canaries=("a",), since_generation=6),
        )
        r.records.desired[MODEL] = base
        return await r.ledger.publish(
            r.run(OperationKind.ROLLBACK, "r1", Trigger.ALERT),
            Publication(base=base, release="r1", latch="r2"),
        )

    new = scenario(tmp_path, body)

    assert new.rollout.phase is RolloutPhase.ROLLED_BACK
    assert "a" in new.rollout.note
    assert [new.target_for(m) for m in ("a", "b")] == ["r1", "r1"]
    assert new.is_degraded("r2")


BAKING = Rollout(RolloutPhase.BAKING, stable="r1", canaries=("b",), since_generation=6)


@pytest.mark.parametrize("served", ["r1", "r2"], ids=["no canary, on the stable", "the canary"])
def test_a_rollback_during_a_bake_through_any_member_latches_the_canary_s_release(
    tmp_path: Path, served: str
) -> None:
    async def body(r: Rig) -> tuple[DesiredModel, Operation]:
        base = replace(r.record("r2", generation=7), previous="r1", rollout=BAKING)
        r.records.desired[MODEL] = base
        run = r.run(OperationKind.ROLLBACK, "r1", from_release=served)
        await r.ledger.publish_result(run, FleetBase(base), "r1")
        stored = r.records.read(MODEL)
        assert stored is not None
        return stored, await r.journal(run)

    new, operation = scenario(tmp_path, body)

    said = "rolled back the canary r2 to the stable r1 during its bake"
    assert (new.release, new.previous) == ("r1", "r2")
    assert new.rollout.phase is RolloutPhase.ROLLED_BACK
    assert [d.release for d in new.degraded] == ["r2"]  # never the stable r1
    assert new.rollout.note == f"{said}, by api on a"
    assert said in new.reason
    assert operation.detail == {"rollout": said}
    assert [new.target_for(m) for m in ("a", "b")] == ["r1", "r1"]


def test_a_publish_that_lost_the_race_fails_naming_the_winner(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[DesiredStateConflict, DesiredModel | None, Operation, int]:
        base = r.record("r1")
        r.records.meanwhile(lambda: other(r, "r3", by="b"))
        run = r.run(OperationKind.DEPLOY, "r2")
        with pytest.raises(DesiredStateConflict) as caught:
            await r.ledger.publish(run, Publication(base=base, release="r2"))
        return caught.value, r.records.read(MODEL), await r.journal(run), r.woken

    error, stored, operation, woken = scenario(tmp_path, body)

    assert error.details["set_by"] == "b"
    assert error.details["release"] == "r3"
    assert stored is not None
    assert (stored.release, stored.set_by) == ("r3", "b")
    assert (operation.steps[-1].name, operation.steps[-1].status) == ("publish", StepStatus.FAILED)
    assert woken == 0


def test_a_publish_that_lost_to_the_same_release_succeeds_with_the_winner(
    tmp_path: Path,
) -> None:
    async def body(r: Rig) -> tuple[DesiredModel, Operation]:
        base = r.record("r2")
        r.records.meanwhile(lambda: other(r, "r1", by="b"))
        run = r.run(OperationKind.ROLLBACK, "r1", Trigger.ALERT)
        answer = await r.ledger.publish(run, Publication(base=base, release="r1", latch="r2"))
        return answer, await r.journal(run)

    answer, operation = scenario(tmp_path, body)

    assert (answer.release, answer.set_by, answer.generation) == ("r1", "b", 2)
    step = operation.steps[-1]
    assert (step.name, step.status) == ("publish", StepStatus.SUCCEEDED)
    assert step.detail == {"generation": 2, "already": "b"}


def test_publishing_the_claimed_release_ends_the_claim(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[DesiredModel, DesiredModel]:
        claim = Claim("r2", '"e1"', "a", ME.incarnation, r.clock.now())
        base = replace(r.record("r1"), claim=claim)
        ends = await r.ledger.publish(
            r.run(OperationKind.DEPLOY, "r2"), Publication(base=base, release="r2")
        )
        other_claim = replace(claim, release="r3")
        base = replace(ends, claim=other_claim)
        r.records.desired[MODEL] = base
        keeps = await r.ledger.publish(
            r.run(OperationKind.ROLLBACK, "r1"), Publication(base=base, release="r1")
        )
        return ends, keeps

    ends, keeps = scenario(tmp_path, body)

    assert ends.claim is None
    assert keeps.claim is not None
    assert keeps.claim.release == "r3"


# --- claim -----------------------------------------------------------------------------------


def test_a_claim_on_a_new_release_is_won_and_recorded(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[bool, DesiredModel | None]:
        r.record("r1", generation=2)
        answer = await r.ledger.claim(MODEL, "r2", '"e2"')
        return answer.won, r.records.read(MODEL)

    won, stored = scenario(tmp_path, body)

    assert won
    assert stored is not None
    assert (stored.generation, stored.release, stored.trigger) == (3, "r1", "watcher")
    assert stored.claim == Claim("r2", '"e2"', "a", ME.incarnation, stored.set_at)


@pytest.mark.parametrize(
    ("arrange", "why"),
    [
        ("desired", "the fleet's desired state is r2 already"),
        ("degraded", "r2 is latched degraded for the fleet"),
        ("failed", "it failed on b, which claimed it: preflight_failed"),
    ],
)
def test_a_claim_is_refused_for_a_release_the_fleet_has_latched_or_saw_fail(
    tmp_path: Path, arrange: str, why: str
) -> None:
    async def body(r: Rig) -> tuple[bool, str, bool, int]:
        current = r.record("r2" if arrange == "desired" else "r1")
        now = r.clock.now()
        if arrange == "degraded":
            current = replace(current, degraded=(Degraded("r2", now, "rolled back"),))
        if arrange == "failed":
            failed = Claim("r2", '"e2"', "b", "b-inc-1", now, failed="preflight_failed: boom")
            current = replace(current, claim=failed)
        r.records.desired[MODEL] = current
        answer = await r.ledger.claim(MODEL, "r2", '"e2"')
        return answer.won, answer.why, answer.look_again, len(r.records.written)

    won, answer_why, look_again, written = scenario(tmp_path, body)

    assert not won
    assert why in answer_why
    assert not look_again
    assert written == 0


def test_a_live_member_s_claim_is_left_to_it_and_looked_at_again_later(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[bool, str, bool, int]:
        r.alive("b")
        claim = Claim("r2", '"e2"', "b", "b-inc-1", r.clock.now())
        r.records.desired[MODEL] = replace(r.record("r1"), claim=claim)
        answer = await r.ledger.claim(MODEL, "r2", '"e2"')
        return answer.won, answer.why, answer.look_again, len(r.records.written)

    won, why, look_again, written = scenario(tmp_path, body)

    assert (won, look_again, written) == (False, True, 0)
    assert why == "b claimed it and deploys it first"


@pytest.mark.parametrize("claimer", ["dead", "restarted", "silent"])
def test_a_claim_whose_claimer_is_gone_is_taken_over(tmp_path: Path, claimer: str) -> None:
    async def body(r: Rig) -> tuple[bool, DesiredModel | None]:
        claim = Claim("r2", '"e2"', "b", "b-inc-1", r.clock.now())
        r.records.desired[MODEL] = replace(r.record("r1"), claim=claim)
        if claimer == "dead":
            r.alive("b")
            r.clock.advance(16)
        if claimer == "restarted":
            r.records.heartbeats["b"] = beat("b", r.clock, incarnation="b-inc-2")
        answer = await r.ledger.claim(MODEL, "r2", '"e2"')
        return answer.won, r.records.read(MODEL)

    won, stored = scenario(tmp_path, body)

    assert won
    assert stored is not None
    assert stored.claim is not None
    assert (stored.claim.member, stored.claim.incarnation) == ("a", ME.incarnation)


def test_a_claim_that_loses_the_race_says_to_look_again(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[bool, bool, DesiredModel | None]:
        r.record("r1")
        claim = Claim("r2", '"e2"', "b", "b-inc-1", r.clock.now())
        r.records.meanwhile(lambda: other(r, "r1", by="b", claim=claim))
        answer = await r.ledger.claim(MODEL, "r2", '"e2"')
        return answer.won, answer.look_again, r.records.read(MODEL)

    won, look_again, stored = scenario(tmp_path, body)

    assert (won, look_again) == (False, True)
    assert stored is not None
    assert stored.claim is not None
    assert stored.claim.member == "b"


def test_a_failed_claim_is_recorded_so_no_other_member_tries_it(tmp_path: Path) -> None:
    async def body(r: Rig) -> DesiredModel | None:
        claim = Claim("r2", '"e2"', "a", ME.incarnation, r.clock.now())
        r.records.desired[MODEL] = replace(r.record("r1", generation=3), claim=claim)
        r.records.meanwhile(lambda: other(r, "r1", by="b", claim=claim))  # one lost race
        await r.ledger.claim_failed(MODEL, "r2", "load_failed: " + "x" * 600)
        return r.records.read(MODEL)

    stored = scenario(tmp_path, body)

    assert stored is not None
    assert stored.generation == 5
    assert stored.set_by == "a"
    assert stored.claim is not None
    assert stored.claim.failed is not None
    assert stored.claim.failed.startswith("load_failed: ")
    assert len(stored.claim.failed) == 500


def test_a_claim_that_is_not_this_member_s_is_not_marked_failed(tmp_path: Path) -> None:
    async def body(r: Rig) -> int:
        claim = Claim("r2", '"e2"', "b", "b-inc-1", r.clock.now())
        r.records.desired[MODEL] = replace(r.record("r1"), claim=claim)
        await r.ledger.claim_failed(MODEL, "r2", "boom")
        await r.ledger.claim_failed(MODEL, "r9", "boom")
        await r.ledger.claim_failed("other", "r2", "boom")
        return len(r.records.written)

    assert scenario(tmp_path, body) == 0


# --- roll_back -------------------------------------------------------------------------------


def test_an_automatic_rollback_moves_the_fleet_and_latches_the_release(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[DesiredModel | None, DesiredModel | None, int]:
        r.record("r2", generation=4)
        new = await r.ledger.roll_back(
            MODEL, away_from="r2", to="r1", trigger="alert", reason="GPU overload"
        )
        return new, r.records.read(MODEL), r.woken

    new, stored, woken = scenario(tmp_path, body)

    assert new is not None
    assert stored == new
    assert (new.generation, new.release, new.previous, new.trigger) == (5, "r1", "r2", "alert")
    assert new.is_degraded("r2")
    assert "GPU overload" in new.reason
    assert woken == 1


def test_with_no_record_an_automatic_rollback_writes_the_first_one(tmp_path: Path) -> None:
    async def body(r: Rig) -> DesiredModel | None:
        return await r.ledger.roll_back(
            MODEL, away_from="r2", to="r1", trigger="alert", reason="overload"
        )

    new = scenario(tmp_path, body)

    assert new is not None
    assert (new.generation, new.release) == (1, "r1")
    assert new.is_degraded("r2")


def test_an_automatic_rollback_during_a_canary_stops_the_rollout(tmp_path: Path) -> None:
    async def body(r: Rig) -> DesiredModel | None:
        rollout = Rollout(RolloutPhase.CANARY, stable="r1", canaries=("a",), since_generation=1)
        r.records.desired[MODEL] = replace(r.record("r2"), rollout=rollout)
        return await r.ledger.roll_back(
            MODEL, away_from="r2", to="r1", trigger="alert", reason="overload"
        )

    new = scenario(tmp_path, body)

    assert new is not None
    assert new.rollout.phase is RolloutPhase.ROLLED_BACK
    assert new.rollout.note == (
        "a: overload; rolled back the canary r2 to the stable r1 before its bake, while its "
        "canaries took it on"
    )


@pytest.mark.parametrize(
    "now",
    ["done already", "moved elsewhere", "unloaded on purpose"],
)
def test_an_automatic_rollback_leaves_a_desired_state_it_would_not_improve(
    tmp_path: Path, now: str
) -> None:
    async def body(r: Rig) -> tuple[DesiredModel | None, int]:
        if now == "done already":
            latched = (Degraded("r2", r.clock.now(), "b rolled it back"),)
            r.records.desired[MODEL] = replace(r.record("r1"), degraded=latched)
        if now == "moved elsewhere":
            r.record("r3")
        if now == "unloaded on purpose":
            r.record(None, generation=2)
        new = await r.ledger.roll_back(
            MODEL, away_from="r2", to="r1", trigger="alert", reason="overload"
        )
        return new, len(r.records.written)

    assert scenario(tmp_path, body) == (None, 0)


def test_an_automatic_rollback_that_lost_to_the_same_move_writes_nothing(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[DesiredModel | None, DesiredModel | None]:
        r.record("r2")
        now = r.clock.now()
        r.records.meanwhile(
            lambda: other(r, "r1", by="b", degraded=(Degraded("r2", now, "b: overload"),))
        )
        new = await r.ledger.roll_back(
            MODEL, away_from="r2", to="r1", trigger="alert", reason="overload"
        )
        return new, r.records.read(MODEL)

    new, stored = scenario(tmp_path, body)

    assert new is None
    assert stored is not None
    assert stored.set_by == "b"


def test_an_automatic_rollback_that_keeps_losing_gives_up_with_a_conflict(tmp_path: Path) -> None:
    async def body(r: Rig) -> tuple[str, int]:
        r.record("r2")
        for _ in range(ROLL_BACK_ATTEMPTS):
            r.records.meanwhile(lambda: other(r, "r2", by="b"))
        with pytest.raises(DesiredStateConflict) as caught:
            await r.ledger.roll_back(
                MODEL, away_from="r2", to="r1", trigger="alert", reason="overload"
            )
        current = r.records.read(MODEL)
        assert current is not None
        return str(caught.value), current.generation

    message, generation = scenario(tmp_path, body)

    assert f"kept changing under {ROLL_BACK_ATTEMPTS} attempts" in message
    assert generation == 1 + ROLL_BACK_ATTEMPTS


def test_a_later_attempt_of_an_automatic_rollback_wins(tmp_path: Path) -> None:
    async def body(r: Rig) -> DesiredModel | None:
        r.record("r2")
        r.records.meanwhile(lambda: other(r, "r2", by="b"))
        return await r.ledger.roll_back(
            MODEL, away_from="r2", to="r1", trigger="alert", reason="overload"
        )

    new = scenario(tmp_path, body)

    assert new is not None
    assert (new.generation, new.release, new.set_by) == (3, "r1", "a")
