"""AutoRollback on a fake Triton: the chain (fallback, CPU-only reload, failure), the degraded
latch and the cooldown.

The real store, staging and SQLite run on ``tmp_path``; only Triton is a fake, so these reach
what the real server will not do on cue (a fallback that hangs past its budget, a CPU reload
that fails). Each test asserts what an operator would read: the rollback record, the
operations it ran, what serves, and what is latched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from controlplane.domain.fleet import DesiredModel, Rollout, RolloutPhase
from controlplane.domain.operations import OperationKind, OperationStatus, Trigger
from controlplane.domain.rollback import RollbackOutcome, RollbackRecord
from controlplane.domain.rollout import RolloutPolicy
from controlplane.domain.turns import RollingPolicy
from controlplane.services.deploy import DeployService
from controlplane.services.fleet_ledger import FleetLedger, Member
from controlplane.services.rollback import AutoRollback, RollbackBudgets
from tests.support.fakes import (
    FakeDesiredStates,
    FakeMetrics,
    FakeTriton,
    LoadBlocks,
    LoadFails,
    Parts,
    deploy_service,
    started,
)
from tests.support.service_views import publish, record
from tests.unit.test_bluegreen_service import BLUE, GREEN, MODEL, blue_green

OVERLOAD = "GPU utilisation above 0.95 for 10 s"


@dataclass
class Rig:
    service: DeployService
    parts: Parts
    rollback: AutoRollback
    ledger: FleetLedger | None = None

    async def deploy(self, release: str) -> None:
        operation = await started(self.service, MODEL, release)
        done = await self.service.wait(operation.id)
        assert done.status is OperationStatus.SUCCEEDED, done.error

    async def serving_r2(self, *also: str) -> None:
        """r1 on blue (warm, previous), r2 on green (active); ``also`` only published."""
        publish(self.parts, "r1", "r2", *also)
        await self.deploy("r1")
        await self.deploy("r2")

    async def last(self) -> RollbackRecord:
        found = await self.parts.repos.rollbacks.last(MODEL)
        assert found is not None
        return found

    async def operations(
        self, record: RollbackRecord
    ) -> list[tuple[OperationKind, OperationStatus]]:
        found = [await self.parts.repos.operations.get(i) for i in record.operation_ids]
        return [(op.kind, op.status) for op in found if op is not None]

    async def degraded(self) -> list[str]:
        return [d.release for d in await self.parts.repos.rollbacks.latched(MODEL)]


@asynccontextmanager
async def rig(
    tmp_path: Path,
    *,
    fallback: Mapping[str, str] | None = None,
    budgets: RollbackBudgets | None = None,
    triton: FakeTriton | None = None,
    rolling: RollingPolicy | None = None,
    fleet: FakeDesiredStates | None = None,
) -> AsyncIterator[Rig]:
    """``fleet``: the fleet's records, with ``rollback.scope: fleet`` (this member is ``a``)."""
    async with deploy_service(
        tmp_path, triton or FakeTriton(), traffic=blue_green(), metrics=FakeMetrics()
    ) as (service, parts):
        configured = dict(fallback or {})
        ledger = (
            None
            if fleet is None
            else FleetLedger(
                records=fleet,
                member=Member("a", "a-1", "1.0"),
                clock=parts.clock,
                rollout_for=lambda _model: RolloutPolicy(),
            )
        )
        rollback = AutoRollback(
            deploy=service,
            client=parts.client,
            serving=parts.repos.serving,
            book=parts.repos.rollbacks,
            clock=parts.clock,
            budgets=budgets or RollbackBudgets(fallback=2.0, cpu=2.0, cooldown=300.0),
            configured_fallback=configured.get,
            enabled=lambda _model: True,
            rolling_for=lambda _model: rolling,
            fleet=ledger,
            previous_of=ledger.previous_of if ledger is not None else None,
        )
        yield Rig(service, parts, rollback, ledger)


def test_a_warm_fallback_is_one_re_point_and_the_old_release_is_latched(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            loads_before = r.parts.triton.called("load", BLUE)

            result = await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)

            assert result.acted
            last = await r.last()
            assert (last.outcome, last.from_release, last.to_release) == (
                RollbackOutcome.FALLBACK,
                "r2",
                "r1",
            )
            assert (last.trigger, last.reason) == (Trigger.WATCHER, OVERLOAD)
            assert await r.operations(last) == [(OperationKind.ROLLBACK, OperationStatus.SUCCEEDED)]
            operation = await r.parts.repos.operations.get(last.operation_ids[0])
            assert operation is not None
            assert operation.cause.reason == OVERLOAD  # what `controlplane history` says why
            assert r.parts.triton.called("load", BLUE) == loads_before  # no load: a re-point
            assert (await record(r.parts)).active_release == "r1"
            assert (await r.degraded()) == ["r2"]
            assert await r.rollback.fallback(MODEL) is None  # r2 is no fallback any more
            assert await r.rollback.candidates() == []

    asyncio.run(scenario())


def test_triggers_in_the_cooldown_are_counted_and_a_person_is_not_held_back(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)
            first = await r.last()

            held = [
                await r.rollback.act(MODEL, trigger=trigger, reason="again")
                for trigger in (Trigger.WATCHER, Trigger.ALERT, Trigger.WATCHER)
            ]

            assert [h.acted for h in held] == [False, False, False]
            assert "cooldown" in held[0].note
            assert (await r.last()).id == first.id
            assert (await r.last()).suppressed == 3
            assert await r.rollback.cooldown_until(MODEL) is not None

            # A person acts at once: no fallback is left, so the CPU-only reload.
            by_hand = await r.rollback.act(MODEL, trigger=Trigger.API, reason="runbook")
            assert by_hand.acted
            assert (await r.last()).outcome is RollbackOutcome.CPU
            assert (await r.last()).to_release == "r1"

    asyncio.run(scenario())


def test_after_the_cooldown_an_automatic_trigger_acts_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)

            r.parts.clock.advance(301)
            again = await r.rollback.act(MODEL, trigger=Trigger.ALERT, reason=OVERLOAD)

            assert again.acted
            assert ((await r.last()).trigger, (await r.last()).outcome) == (
                Trigger.ALERT,
                RollbackOutcome.CPU,
            )
            assert await r.rollback.cooldown_until(MODEL) is not None

    asyncio.run(scenario())


def test_a_fallback_that_fails_to_load_leads_to_the_cpu_only_reload(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        async with rig(tmp_path, fallback={MODEL: "r3"}, triton=triton) as r:
            await r.serving_r2("r3")
            triton.script_load(BLUE, LoadFails("r3 does not initialize"))

            result = await r.rollback.act(MODEL, trigger=Trigger.ALERT, reason=OVERLOAD)

            assert result.acted
            last = await r.last()
            assert (last.outcome, last.to_release) == (RollbackOutcome.CPU, "r2")
            assert str(last.detail["fallback"]).startswith("triton_load_failed")
            assert last.detail["cpu"] == "succeeded"
            assert await r.operations(last) == [
                (OperationKind.ROLLBACK, OperationStatus.FAILED),
                (OperationKind.CPU_FALLBACK, OperationStatus.SUCCEEDED),
            ]
            assert triton.configs[GREEN]["instance_group"] == [{"kind": "KIND_CPU", "count": 1}]
            assert triton.configs[GREEN]["name"] == GREEN
            assert (await record(r.parts)).active_release == "r2"
            slots = {s.name: s.state.value for s in (await record(r.parts)).slots}
            assert slots[GREEN] == "ACTIVE"
            assert (await r.degraded()) == ["r2"]

    asyncio.run(scenario())


def test_a_fallback_past_its_budget_is_cut_short_for_the_cpu_only_reload(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        budgets = RollbackBudgets(fallback=0.2, cold_fallback=0.2, cpu=2.0, cooldown=300.0)
        async with rig(tmp_path, fallback={MODEL: "r3"}, budgets=budgets, triton=triton) as r:
            await r.serving_r2("r3")
            hang = LoadBlocks()
            triton.script_load(BLUE, hang)

            async with r.parts.clock.autojump():  # the budget passes while the load hangs
                await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)

            last = await r.last()
            assert last.outcome is RollbackOutcome.CPU
            assert "did not finish within 0.2 s" in str(last.detail["fallback"])
            assert (await r.operations(last))[0] == (
                OperationKind.ROLLBACK,
                OperationStatus.INTERRUPTED,
            )
            assert hang.entered.is_set()
            assert r.parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


def test_a_chain_whose_every_step_hangs_ends_within_its_budgets(tmp_path: Path) -> None:
    """The user (or the overload watcher) waits the budgets, not the loads: both steps are
    cut short, each puts its records back, and the chain ends within its budget plus the
    one-second grace of that clean-up."""

    async def scenario() -> float:
        triton = FakeTriton()
        budgets = RollbackBudgets(fallback=0.3, cold_fallback=0.3, cpu=0.3, cooldown=300.0)
        async with rig(tmp_path, fallback={MODEL: "r3"}, budgets=budgets, triton=triton) as r:
            await r.serving_r2("r3")
            triton.script_load(BLUE, LoadBlocks())  # the fallback's load never ends
            triton.script_load(GREEN, LoadBlocks())  # nor does the CPU-only reload
            clock = r.parts.clock
            started = clock.monotonic()
            async with clock.autojump():  # the budgets pass while the loads hang
                result = await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)
            took = clock.monotonic() - started

            assert not result.acted
            last = await r.last()
            assert last.outcome is RollbackOutcome.FAILED
            assert last.detail["fallback_budget"] == {
                "kind": "cold",
                "seconds": 0.3,
                "why": "r3 must be loaded (rollback.cold_fallback_budget_seconds)",
            }
            assert [code for _, code in await _codes(r, last)] == [
                "budget_exceeded",
                "budget_exceeded",
            ]
            assert (await record(r.parts)).active_release == "r2"
            slots = {s.name: s.state.value for s in (await record(r.parts)).slots}
            assert slots[GREEN] == "ACTIVE"  # the serving slot is put back as it was
            assert r.parts.runner.holder(MODEL) is None
            return took

    took = asyncio.run(scenario())
    assert took <= 0.3 + 0.3 + 1e-9, took  # the budgets on the fake clock: no grace needed


def test_a_cold_fallback_of_a_model_that_may_roll_gets_the_rolling_waits_on_top(
    tmp_path: Path,
) -> None:
    """A model that fits once goes back by a rolling update (out of rotation, drain, unload,
    the GPU memory's return, load): its budget is a load's plus those waits, and says so."""
    policy = RollingPolicy(unready_seconds=5, drain_timeout=60, return_seconds=60)

    async def scenario() -> None:
        async with rig(tmp_path, fallback={MODEL: "r3"}, rolling=policy) as r:
            await r.serving_r2("r3")
            async with r.parts.clock.autojump():
                result = await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)

            assert result.acted
            budget = (await r.last()).detail["fallback_budget"]
            assert isinstance(budget, dict)
            assert budget["kind"] == "rolling"
            assert budget["seconds"] == RollbackBudgets().cold_fallback + 2 * 5 + 60 + 60
            assert "may leave rotation, drain, unload and wait for the memory" in budget["why"]
            assert (await record(r.parts)).active_release == "r3"

    asyncio.run(scenario())


async def _codes(r: Rig, record: RollbackRecord) -> list[tuple[str, str | None]]:
    found = [await r.parts.repos.operations.get(i) for i in record.operation_ids]
    return [(op.kind.value, op.error.code if op.error else None) for op in found if op]


def test_when_every_step_fails_the_serving_release_stays_and_it_says_so(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        async with rig(tmp_path, fallback={MODEL: "r3"}, triton=triton) as r:
            await r.serving_r2("r3")
            triton.script_load(BLUE, LoadFails("r3 does not initialize"))
            triton.script_load(GREEN, LoadFails("no CPU build of this model"))

            result = await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)

            assert not result.acted
            last = await r.last()
            assert (last.outcome, last.to_release) == (RollbackOutcome.FAILED, None)
            assert str(last.detail["cpu"]).startswith("triton_load_failed")
            assert (await record(r.parts)).active_release == "r2"
            slots = {s.name: s.state.value for s in (await record(r.parts)).slots}
            assert slots[GREEN] == "ACTIVE"
            # A failed chain is not retried every second either.
            held = await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)
            assert not held.acted
            assert "cooldown" in held.note

    asyncio.run(scenario())


def test_a_model_that_is_not_serving_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            results = await r.rollback.on_overload(
                ["ghost"], trigger=Trigger.ALERT, reason=OVERLOAD
            )
            assert [(x.model, x.acted) for x in results] == [("ghost", False)]
            assert "not serving here" in results[0].note
            assert await r.parts.repos.rollbacks.last("ghost") is None

    asyncio.run(scenario())


def test_a_deploy_by_a_person_clears_the_latch(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)
            assert (await r.degraded()) == ["r2"]

            await r.deploy("r2")

            assert (await r.degraded()) == []
            assert await r.rollback.fallback(MODEL) == "r1"

    asyncio.run(scenario())


def test_in_a_fleet_an_overload_during_a_bake_on_a_member_that_is_no_canary_stops_the_bake(
    tmp_path: Path,
) -> None:
    """This member serves the stable r2 (its own previous is r1) while r3 bakes on member b:
    the rollback goes back to r2 (it serves already) and latches r3 for the fleet; neither r1
    nor r2 is touched."""

    async def scenario() -> None:
        records = FakeDesiredStates()
        async with rig(tmp_path, fleet=records) as r:
            await r.serving_r2()
            assert r.ledger is not None
            rollout = Rollout(RolloutPhase.BAKING, stable="r2", canaries=("b",), since_generation=4)
            baking = DesiredModel(
                MODEL, 4, "r3", "r2", "b", r.parts.clock.now(), "api", "", rollout=rollout
            )
            records.desired[MODEL] = baking
            r.ledger.remember({MODEL: baking})  # as the fleet sync read it
            assert await r.rollback.fallback(MODEL) == "r2"  # what the model view names

            result = await r.rollback.act(MODEL, trigger=Trigger.WATCHER, reason=OVERLOAD)

            assert result.acted
            last = await r.last()
            said = "rolled back the canary r3 to the stable r2 during its bake"
            assert (last.outcome, last.from_release, last.to_release) == (
                RollbackOutcome.FALLBACK,
                "r3",
                "r2",
            )
            assert last.detail["rollout"] == said
            assert await r.operations(last) == []  # r2 serves here already: nothing to do here
            assert (await record(r.parts)).active_release == "r2"
            assert await r.degraded() == ["r3"]
            fleet = records.desired[MODEL]
            assert (fleet.release, fleet.rollout.phase) == ("r2", RolloutPhase.ROLLED_BACK)
            assert [d.release for d in fleet.degraded] == ["r3"]
            assert said in fleet.rollout.note

    asyncio.run(scenario())
