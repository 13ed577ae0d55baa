"""The reconcile loop with a fake Triton and the real store, staging and SQLite on ``tmp_path``.

A "restart" is a second :func:`deploy_service` on the same ``tmp_path`` after the first was
closed: same store, repository, staging dir and database, a fresh service. Passing the same
:class:`FakeTriton` means Triton kept running; a new one (or :meth:`FakeTriton.restart`) means
Triton restarted too. Each test asserts what an operator would see afterwards: what serves,
the repository, the slots, and the operations recorded (a repair is an operation of kind
``repair``, trigger ``reconcile``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from controlplane.adapters.staging.fs import MARKER_NAME
from controlplane.domain.drift import Action
from controlplane.domain.operations import (
    CancelReason,
    Operation,
    OperationKind,
    OperationStatus,
    StepStatus,
    Trigger,
)
from controlplane.domain.slots import SlotState
from controlplane.domain.traffic import TrafficPolicy
from controlplane.ports import Serving
from controlplane.services.deploy import DeployService
from controlplane.services.reconcile import INDEX_LOOK, PassReport, Reconciler
from controlplane.services.supervisor import Supervisor
from controlplane.timing import Backoff
from tests.support.fakes import (
    START,
    FakeClock,
    FakeTriton,
    LoadBlocks,
    LoadFails,
    Parts,
    deploy_service,
    make_reconciler,
    started,
)
from tests.support.polling import until
from tests.support.service_views import marker_release, publish, record, slot
from tests.support.tree import snapshot
from tests.unit.test_bluegreen_service import BLUE, GREEN, blue_green

MODEL = "scale"
DEADLINE = 5.0


# --- helpers ------------------------------------------------------------------------------


def staging_left(parts: Parts) -> list[str]:
    return sorted(p.name for p in parts.staging_path.iterdir())


def actions(report: PassReport) -> dict[str, str]:
    """What the pass found to do for each model (``none`` when it serves as it should)."""
    return {model: a.action.value for model, a in report.assessments.items()}


async def deploy_and_wait(service: DeployService, release: str, model: str = MODEL) -> Operation:
    submitted = await started(service, model, release)
    return await service.wait(submitted.id)


async def deployed(
    tmp_path: Path, triton: FakeTriton, *releases: str, traffic: TrafficPolicy | None = None
) -> None:
    """A first daemon life: publish and deploy ``releases`` in order, then shut down."""
    async with deploy_service(tmp_path, triton, traffic=traffic) as (service, parts):
        publish(parts, *releases)
        for release in releases:
            op = await deploy_and_wait(service, release)
            assert op.status is OperationStatus.SUCCEEDED, op.error


async def shut_down_mid_load(
    tmp_path: Path, triton: FakeTriton, release: str, *, killed: bool
) -> str:
    """Start deploying ``release``, stop the daemon while Triton loads it; the op's id.

    ``killed`` leaves the database as SIGKILL would: the operation still ``running`` (the last
    write before death), instead of the ``interrupted`` a graceful shutdown records.
    """
    async with deploy_service(tmp_path, triton) as (service, parts):
        publish(parts, release)
        blocked = LoadBlocks()
        triton.script_load(MODEL, blocked)
        running = await started(service, MODEL, release)
        async with asyncio.timeout(DEADLINE):
            await blocked.entered.wait()
        last_write = await service.get_operation(running.id)
        assert last_write.status is OperationStatus.RUNNING
        await parts.runner.close()
        if killed:
            parts.repos.operations.save(last_write)
        return running.id


async def repairs(service: DeployService) -> list[Operation]:
    return [
        op for op in await service.list_operations(MODEL, 20) if op.kind is OperationKind.REPAIR
    ]


# --- start-up bookkeeping -----------------------------------------------------------------


def test_an_operation_killed_after_its_record_is_finished_as_succeeded(tmp_path: Path) -> None:
    """SIGKILL between the record's transaction and the operation's last write: the release
    serves and the database says so; a CI job following the operation must not read
    ``interrupted``. One killed before its record stays interrupted."""

    async def scenario() -> None:
        triton = FakeTriton()
        async with deploy_service(tmp_path, triton) as (service, parts):
            publish(parts, "r1", "r2", "r3")
            for release in ("r1", "r2"):
                done = await deploy_and_wait(service, release)
                assert done.status is OperationStatus.SUCCEEDED, done.error
            last = done.steps[-1]
            assert last.name == "record"
            # What the database holds when the kill lands inside the record step, after
            # its transaction: the operation still running, the record written.
            parts.repos.operations.save(
                replace(
                    done,
                    status=OperationStatus.RUNNING,
                    finished_at=None,
                    steps=(
                        *done.steps[:-1],
                        replace(last, status=StepStatus.RUNNING, finished_at=None),
                    ),
                )
            )
            before_record = Operation(
                id="deadbeef00000003",
                kind=OperationKind.DEPLOY,
                model=MODEL,
                release="r3",
                from_release="r2",
                trigger=Trigger.API,
                status=OperationStatus.RUNNING,
                created_at=START,
            ).start_step("load", START)
            parts.repos.operations.save(before_record)

        async with deploy_service(tmp_path, triton) as (service, parts):
            report = await make_reconciler(service, parts).startup()

            assert (report.recorded, report.interrupted) == ([done.id], [before_record.id])
            finished = await service.get_operation(done.id)
            assert finished.status is OperationStatus.SUCCEEDED
            assert finished.error is None
            assert [(s.name, s.status) for s in finished.steps][-1] == (
                "record",
                StepStatus.SUCCEEDED,
            )
            assert "record was written" in str(finished.detail["recovered"])
            cut = await service.get_operation(before_record.id)
            assert cut.status is OperationStatus.INTERRUPTED
            assert await parts.repos.operations.unfinished() == []

    asyncio.run(scenario())


def test_running_operations_are_interrupted_and_staging_is_emptied(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (_service, parts):
            # What a daemon killed mid-fetch leaves: a running operation and its staging dir.
            parts.repos.operations.save(
                Operation(
                    id="deadbeef00000001",
                    kind=OperationKind.DEPLOY,
                    model=MODEL,
                    release="r1",
                    trigger=Trigger.API,
                    status=OperationStatus.RUNNING,
                    created_at=START,
                ).start_step("fetch", START)
            )
            half = parts.staging_path / "deadbeef00000001" / "model" / "1"
            half.mkdir(parents=True)
            (half / "model.py").write_text("K = 1.0\n", encoding="utf-8")
            (parts.staging_path / "removed-0123").mkdir()

        async with deploy_service(tmp_path) as (service, parts):
            report = await make_reconciler(service, parts).startup()

            assert report.interrupted == ["deadbeef00000001"]
            assert sorted(report.staging_removed) == ["deadbeef00000001", "removed-0123"]
            op = await service.get_operation("deadbeef00000001")
            assert op.status is OperationStatus.INTERRUPTED
            assert op.error is not None
            assert op.error.code == "interrupted"
            assert op.steps[-1].status is StepStatus.FAILED
            assert await parts.repos.operations.unfinished() == []
            assert staging_left(parts) == []

    asyncio.run(scenario())


# --- converging each model ----------------------------------------------------------------


def test_nothing_to_do_when_the_desired_release_serves(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        await deployed(tmp_path, triton, "r1")
        loads_before = triton.called("load", MODEL)

        async with deploy_service(tmp_path, triton) as (service, parts):
            before = snapshot(parts.repository)
            report = await make_reconciler(service, parts).run_pass()

            assert actions(report) == {MODEL: "none"}
            assert report.repairs == {}
            assert triton.called("load", MODEL) == loads_before
            assert triton.called("unload", MODEL) == 0
            assert snapshot(parts.repository) == before
            assert (await record(parts)).active_release == "r1"
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert await repairs(service) == []

    asyncio.run(scenario())


@pytest.mark.parametrize("how", ["triton-restarted", "unloaded-behind-our-back"])
def test_the_desired_release_on_disk_is_loaded_again(tmp_path: Path, how: str) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        await deployed(tmp_path, triton, "r1")
        if how == "triton-restarted":
            triton.restart()
        else:
            await triton.unload(MODEL)  # someone used Triton's own API

        async with deploy_service(tmp_path, triton) as (service, parts):
            report = await make_reconciler(service, parts).run_pass()

            assert list(report.repairs) == [MODEL]
            assert report.not_serving == {}  # the pass repaired what it found
            assert triton.state(MODEL) == "READY"
            assert marker_release(parts) == "r1"
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert (await slot(parts)).release == "r1"
            [repair] = await repairs(service)
            assert (repair.trigger, repair.status) == (Trigger.RECONCILE, OperationStatus.SUCCEEDED)
            assert [s.name for s in repair.steps] == ["load", "record"]
            assert repair.detail["action"] == "load"

    asyncio.run(scenario())


def test_a_repair_that_fails_is_reported_and_tried_again_after_a_growing_pause(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1")
        restarted = FakeTriton()
        restarted.script_load(MODEL, LoadFails("out of memory"))

        async with deploy_service(tmp_path, restarted) as (service, parts):
            reconciler = make_reconciler(service, parts)
            report = await reconciler.run_pass()

            assert list(report.failed) == [MODEL]
            assert "out of memory" in report.failed[MODEL]
            assert report.not_serving == {MODEL: report.assessments[MODEL].why}
            assert marker_release(parts) == "r1"  # the files stay for the next attempt
            assert (await record(parts)).active_release == "r1"
            assert (await slot(parts)).state is SlotState.UNAVAILABLE

            soon = await reconciler.run_pass()  # at once: no hammering of what just failed
            assert soon.repairs == {}
            assert soon.deferred[MODEL] == pytest.approx(0.5)
            parts.clock.advance(0.5)
            again = await reconciler.run_pass()  # the next load succeeds

            assert list(again.repairs) == [MODEL]
            assert again.failed == {}
            assert restarted.state(MODEL) == "READY"
            assert (await slot(parts)).state is SlotState.ACTIVE

    asyncio.run(scenario())


@pytest.mark.parametrize("triton_restarted", [False, True], ids=["triton-kept", "triton-restarted"])
def test_another_release_on_disk_is_replaced_by_the_desired_one(
    tmp_path: Path, triton_restarted: bool
) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        await deployed(tmp_path, triton, "r1")
        cut = await shut_down_mid_load(tmp_path, triton, "r2", killed=False)
        if triton_restarted:
            triton = FakeTriton()

        async with deploy_service(tmp_path, triton) as (service, parts):
            assert marker_release(parts) == "r2"
            reconciler = make_reconciler(service, parts)
            await reconciler.startup()
            report = await reconciler.run_pass()

            assert actions(report) == {MODEL: "none"}  # repaired: redeployed
            assert list(report.repairs) == [MODEL]
            assert marker_release(parts) == "r1"
            assert (parts.repository / MODEL / "1" / "model.py").read_bytes() == (
                parts.store_path / MODEL / "r1" / "1" / "model.py"
            ).read_bytes()
            assert (await record(parts)).active_release == "r1"
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert (await slot(parts)).release == "r1"
            assert triton.state(MODEL) == "READY"
            latest, interrupted = await service.list_operations(MODEL, 2)
            assert interrupted.id == cut
            assert interrupted.status is OperationStatus.INTERRUPTED
            assert (latest.kind, latest.trigger) == (OperationKind.REPAIR, Trigger.RECONCILE)
            assert latest.release == "r1"
            assert latest.status is OperationStatus.SUCCEEDED
            assert staging_left(parts) == []

    asyncio.run(scenario())


def test_a_missing_dir_is_deployed_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1", "r2")
        shutil.rmtree(tmp_path / "repository" / MODEL)

        async with deploy_service(tmp_path) as (service, parts):
            report = await make_reconciler(service, parts).run_pass()

            assert list(report.repairs) == [MODEL]
            assert marker_release(parts) == "r2"
            assert (await record(parts)).active_release == "r2"
            assert (await record(parts)).previous_release == "r1"
            assert (await slot(parts)).state is SlotState.ACTIVE

    asyncio.run(scenario())


@pytest.mark.parametrize("triton_loaded_it", [False, True], ids=["not-loaded", "loaded"])
def test_a_killed_first_deploy_is_taken_back_out(tmp_path: Path, triton_loaded_it: bool) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        cut = await shut_down_mid_load(tmp_path, triton, "r1", killed=True)
        if triton_loaded_it:
            triton.set_state(MODEL, "READY")  # Triton finished the load on its own

        async with deploy_service(tmp_path, triton) as (service, parts):
            assert marker_release(parts) == "r1"
            reconciler = make_reconciler(service, parts)
            startup = await reconciler.startup()
            report = await reconciler.run_pass()

            assert startup.interrupted == [cut]
            [repair] = await repairs(service)
            assert repair.detail["action"] == Action.REMOVE.value
            assert report.repairs == {MODEL: repair.id}
            assert list(parts.repository.iterdir()) == []
            assert triton.called("unload", MODEL) == 1
            assert triton.state(MODEL) in (None, "UNAVAILABLE")
            assert (await record(parts)).active_release is None
            assert (await slot(parts)).state is SlotState.ABSENT
            assert (await service.get_operation(cut)).status is OperationStatus.INTERRUPTED

    asyncio.run(scenario())


def test_a_model_the_database_does_not_know_is_left_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        async with deploy_service(tmp_path, triton) as (service, parts):
            foreign = parts.repository / "foreign"
            (foreign / "1").mkdir(parents=True)
            (foreign / "config.pbtxt").write_text('name: "foreign"\n', encoding="utf-8")
            (foreign / MARKER_NAME).write_text(
                '{"model": "foreign", "release": "x1", "operation_id": "elsewhere"}',
                encoding="utf-8",
            )
            before = snapshot(parts.repository)

            report = await make_reconciler(service, parts).run_pass()

            assert report.assessments == {}
            assert snapshot(parts.repository) == before
            assert [call for call in triton.calls if call[1] == "foreign"] == []
            assert await parts.repos.serving.get("foreign") is None

    asyncio.run(scenario())


def test_a_model_with_an_operation_running_is_left_to_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        async with deploy_service(tmp_path, triton) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            blocked = LoadBlocks()
            triton.script_load(MODEL, blocked)
            running = await started(service, MODEL, "r2")
            async with asyncio.timeout(DEADLINE):
                await blocked.entered.wait()
            await triton.unload(MODEL)  # and Triton lost it meanwhile

            report = await make_reconciler(service, parts).run_pass()

            assert report.busy == [MODEL]
            assert report.repairs == {}
            blocked.release.set()
            done = await service.wait(running.id)
            assert done.status is OperationStatus.SUCCEEDED

    asyncio.run(scenario())


def test_a_reload_cut_short_is_reloaded_from_disk_once_triton_is_idle(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        async with deploy_service(tmp_path, triton) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            blocked = LoadBlocks()
            triton.script_load(MODEL, blocked)
            running = await started(service, MODEL, "r2")
            async with asyncio.timeout(DEADLINE):
                await blocked.entered.wait()
            cut = await parts.runner.cancel(running.id, CancelReason.BUDGET)
            assert cut.error is not None
            assert cut.error.code == "budget_exceeded"
            assert marker_release(parts) == "r1"  # the placement went back at once
            assert (await slot(parts)).state is SlotState.STALE
            loads = triton.called("load", MODEL)

            report = await make_reconciler(service, parts).run_pass()

            assert list(report.repairs) == [MODEL]
            assert triton.called("load", MODEL) == loads + 1
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert (await slot(parts)).release == "r1"
            assert (await record(parts)).active_release == "r1"

    asyncio.run(scenario())


def test_repairs_of_several_models_run_at_once_and_a_wait_for_a_load_slot_shows(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        models = [f"m{i}" for i in range(3)]
        triton = FakeTriton()
        async with deploy_service(tmp_path, triton, load_slots=2) as (service, parts):
            for name in models:
                publish(parts, "r1", model=name)
                op = await deploy_and_wait(service, "r1", model=name)
                assert op.status is OperationStatus.SUCCEEDED
            triton.restart()
            gates = {name: LoadBlocks() for name in models}
            for name, gate in gates.items():
                triton.script_load(name, gate)
            reconciler = make_reconciler(service, parts)

            running = asyncio.create_task(reconciler.run_pass())

            # Two loads at once (the bound), the third waits for a slot.
            async def third_queued() -> bool:
                await parts.repos.operations.flush()
                ops = await parts.repos.operations.unfinished()
                return any(op.steps and op.steps[-1].name == "queue" for op in ops)

            await until(third_queued, "the third repair waits for a load slot")
            assert sum(g.entered.is_set() for g in gates.values()) == 2
            for gate in gates.values():
                gate.release.set()
            report = await running

            assert sorted(report.repairs) == models
            assert all(triton.state(name) == "READY" for name in models)
            steps = {
                name: [s.name for s in (await service.get_operation(report.repairs[name])).steps]
                for name in models
            }
            assert sorted(steps.values()) == [
                ["load", "record"],
                ["load", "record"],
                ["queue", "load", "record"],
            ]

    asyncio.run(scenario())


# --- blue-green -------------------------------------------------------------------------------


def test_after_a_triton_restart_the_slot_is_loaded_and_the_alias_pointed_at_it(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        policy = blue_green()
        await deployed(tmp_path, triton, "r1", "r2", traffic=policy)
        triton.restart()

        async with deploy_service(tmp_path, triton, traffic=policy) as (service, parts):
            report = await make_reconciler(service, parts).run_pass()

            assert list(report.repairs) == [MODEL]
            assert triton.state(GREEN) == "READY"
            assert await triton.alias_target(MODEL) == GREEN
            assert triton.state(BLUE) is None  # the warm r1 is not loaded again
            assert not (parts.repository / BLUE).exists()  # its dir is taken down
            [repair] = await repairs(service)
            assert [s.name for s in repair.steps] == ["load", "switch", "record", "unload"]
            slots = {s.name: s.state for s in (await record(parts)).slots}
            assert slots == {BLUE: SlotState.ABSENT, GREEN: SlotState.ACTIVE}

    asyncio.run(scenario())


def test_an_alias_pointed_elsewhere_is_pointed_back_at_the_desired_slot(tmp_path: Path) -> None:
    """A crash between Triton's switch and its record: the alias serves r2 from green, the
    database (one transaction, not written) still says r1 on blue. r1 wins."""

    async def scenario() -> None:
        triton = FakeTriton()
        policy = blue_green()
        await deployed(tmp_path, triton, "r1", traffic=policy)
        async with deploy_service(tmp_path, triton, traffic=policy) as (service, parts):
            publish(parts, "r2")
            op = await deploy_and_wait(service, "r2")
            assert op.status is OperationStatus.SUCCEEDED
            # What the database held before the switch's record: r1 on blue, green loading.
            blue = next(s for s in (await record(parts)).slots if s.name == BLUE)
            green = next(s for s in (await record(parts)).slots if s.name == GREEN)
            await parts.repos.serving.commit(
                MODEL,
                START,
                serving=Serving(active="r1", previous=None),
                slots=[
                    replace(blue, state=SlotState.ACTIVE),
                    replace(green, state=SlotState.LOADING),
                ],
            )

            report = await make_reconciler(service, parts).run_pass()

            assert report.assessments[MODEL].serving
            assert await triton.alias_target(MODEL) == BLUE
            assert triton.state(GREEN) == "UNAVAILABLE"
            assert not (parts.repository / GREEN).exists()
            assert (await record(parts)).active_release == "r1"

    asyncio.run(scenario())


# --- the loop -------------------------------------------------------------------------------


def test_the_loop_is_not_ready_while_triton_is_down_and_repairs_once_it_is_back(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1")
        restarted = FakeTriton()
        restarted.live = False

        async with deploy_service(tmp_path, restarted) as (service, parts):
            ready = asyncio.Event()
            reconciler = make_reconciler(service, parts)
            loop = asyncio.create_task(reconciler.run(0.01, ready))
            try:
                await parts.clock.run_for(0.3)  # the liveness check, every 0.1 s
                assert restarted.called("is_live", "") >= 3
                assert not ready.is_set()
                assert reconciler.last is not None
                assert not reconciler.last.triton_live

                restarted.live = True
                async with parts.clock.autojump():
                    await until(ready.is_set, "ready once Triton answers")
                    await until(lambda: restarted.state(MODEL) == "READY", "the model repaired")
            finally:
                loop.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await loop

    asyncio.run(scenario())


class SlowToAnswer(FakeTriton):
    """A Triton whose liveness check hangs until :attr:`answer` is set (a host that holds the
    connection), then says it is down, in words that alternate once :attr:`wavering` is set
    (as gRPC words one cause in several ways)."""

    WORDS = (
        "Triton at fake:8001 cannot be reached (no answer)",
        "Triton at fake:8001 cannot be reached (other words)",
    )

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()
        self.wavering = False
        self.problem = self.WORDS[0]

    async def liveness(self) -> str | None:
        self.calls.append(("is_live", ""))
        await self.answer.wait()
        if self.wavering:
            self.problem = self.WORDS[1] if self.problem == self.WORDS[0] else self.WORDS[0]
        return self.problem


def test_while_triton_is_down_the_loop_says_how_long_a_check_waits_and_logs_the_cause_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        triton, clock = SlowToAnswer(), FakeClock()
        async with deploy_service(tmp_path, triton, clock) as (service, parts):
            reconciler = make_reconciler(service, parts)
            assert reconciler.waiting_for_triton() is None
            loop = asyncio.create_task(reconciler.run(0.01, asyncio.Event()))
            try:
                await until(lambda: reconciler.waiting_for_triton() is not None, "a check")
                clock.advance(3.0)
                assert reconciler.waiting_for_triton() == 3.0
                triton.answer.set()  # from now on every check answers at once: down
                await clock.run_for(0.5)
                assert triton.called("is_live", "") >= 5  # checks again and again
                triton.wavering = True
                await clock.run_for(0.5)
                assert triton.called("is_live", "") >= 10  # in new words
                await clock.run_for(61.0)  # new words are said again, at most once a minute
                assert triton.called("is_live", "") >= 600
            finally:
                loop.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await loop
            assert reconciler.last is not None
            assert reconciler.last.triton_problem in SlowToAnswer.WORDS

    with caplog.at_level(logging.ERROR, logger="controlplane.services.reconcile"):
        asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert said == [
        "Triton at fake:8001 cannot be reached (no answer) (looking again every 0.1 s)",
        "Triton at fake:8001 cannot be reached (other words) (looking again every 0.1 s)",
    ]


def test_a_failing_pass_does_not_stop_the_loop(tmp_path: Path) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1")
        restarted = FakeTriton()
        restarted.fail_index(3)

        async with deploy_service(tmp_path, restarted) as (service, parts):
            ready = asyncio.Event()
            loop = asyncio.create_task(make_reconciler(service, parts).run(0.01, ready))
            try:
                async with parts.clock.autojump(), asyncio.timeout(DEADLINE):
                    await ready.wait()
                    await until(lambda: restarted.state(MODEL) == "READY", "the model repaired")
                assert restarted.called("index", "") >= 4
            finally:
                loop.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await loop

    asyncio.run(scenario())


def test_the_loop_stops_when_cancelled_just_as_it_is_woken(tmp_path: Path) -> None:
    """A repair that ends wakes the loop; a shutdown at that moment must still stop it (on
    Python 3.11, ``asyncio.wait_for`` dropped such a cancellation and the daemon hung).
    The cancellation comes 0 to 3 event-loop steps after the wake-up, to hit the moment."""

    async def scenario(steps: int) -> None:
        async with deploy_service(tmp_path, FakeTriton()) as (service, parts):
            reconciler = make_reconciler(service, parts)
            ready = asyncio.Event()
            loop = asyncio.create_task(reconciler.run(60.0, ready))
            async with asyncio.timeout(DEADLINE):
                await ready.wait()
            await asyncio.sleep(0.05)  # the loop waits out its beat
            reconciler.wake.set()
            for _ in range(steps):
                await asyncio.sleep(0)
            loop.cancel()
            await asyncio.wait({loop}, timeout=DEADLINE)  # not `await`: that would cancel it
            assert loop.cancelled(), f"the loop still runs {DEADLINE} s after its cancellation"

    for steps in range(4):
        asyncio.run(scenario(steps))


class FlakyStaging:
    """The real staging area, whose first start-up clean-up fails as a full or read-only
    disk would."""

    def __init__(self, real: object) -> None:
        self._real = real
        self.failures = 1

    def clean_all(self) -> list[str]:
        if self.failures:
            self.failures -= 1
            raise OSError(30, "Read-only file system")
        return self._real.clean_all()  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


def test_a_start_up_that_fails_is_logged_retried_and_then_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1")
        restarted = FakeTriton()
        async with deploy_service(tmp_path, restarted) as (service, parts):
            staging = FlakyStaging(parts.staging)
            reconciler = Reconciler(
                deploy=service,
                runner=parts.runner,
                client=parts.client,
                staging=staging,  # type: ignore[arg-type]
                triton=restarted,
                slots=parts.slots,
                serving=parts.repos.serving,
                journal=parts.repos.operations,
                clock=parts.clock,
            )
            ready = asyncio.Event()
            supervisor = Supervisor(parts.clock, backoff=Backoff(0.01, 30.0))
            supervisor.add("reconcile", lambda: reconciler.run(0.01, ready))
            jobs = asyncio.create_task(supervisor.run())
            try:
                async with parts.clock.autojump(), asyncio.timeout(DEADLINE):
                    await ready.wait()
                    await until(lambda: restarted.state(MODEL) == "READY", "repaired")
                [status] = supervisor.statuses()
                assert status.restarts == 1
                assert status.last_error == "OSError: [Errno 30] Read-only file system"
            finally:
                jobs.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await jobs

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert any("job reconcile failed" in r.getMessage() for r in caplog.records)


# --- what the fault campaign found -----------------------------------------------------------


def test_an_inplace_record_left_updating_by_a_dead_daemon_is_settled_and_deployable(
    tmp_path: Path,
) -> None:
    """Killed during a reload of the release that should serve: the record stays UPDATING with
    no operation running. It is reloaded from disk and recorded ACTIVE; deploys work again."""

    async def scenario() -> None:
        triton = FakeTriton()
        await deployed(tmp_path, triton, "r1")
        async with deploy_service(tmp_path, triton) as (service, parts):
            publish(parts, "r2")
            stuck = replace(await slot(parts), state=SlotState.UPDATING, reason="reloading as r1")
            await parts.repos.serving.commit(MODEL, START, slots=[stuck])

            report = await make_reconciler(service, parts).run_pass()

            assert list(report.repairs) == [MODEL]
            assert (await slot(parts)).state is SlotState.ACTIVE
            op = await deploy_and_wait(service, "r2")
            assert op.status is OperationStatus.SUCCEEDED, op.error

    asyncio.run(scenario())


def test_an_alias_whose_dir_is_gone_is_put_back_dir_and_all(tmp_path: Path) -> None:
    """An unload killed after it removed the alias's dir, before its record: the record still
    says r1 serves, so r1 serves again (Triton loads even an overridden model from its dir)."""

    async def scenario() -> None:
        triton = FakeTriton()
        policy = blue_green()
        await deployed(tmp_path, triton, "r1", traffic=policy)
        await triton.unload(MODEL)
        shutil.rmtree(tmp_path / "repository" / MODEL)
        async with deploy_service(tmp_path, triton, traffic=policy) as (service, parts):
            report = await make_reconciler(service, parts).run_pass()

            assert list(report.repairs) == [MODEL]
            assert parts.staging.is_alias_dir(MODEL)
            assert await triton.alias_target(MODEL) == BLUE

    asyncio.run(scenario())


def test_an_alias_dir_left_by_a_first_deploy_that_never_finished_is_removed(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        policy = blue_green()
        async with deploy_service(tmp_path, triton, traffic=policy) as (service, parts):
            publish(parts, "r1")
            blocked = LoadBlocks()
            triton.script_load(BLUE, blocked)
            await started(service, MODEL, "r1")
            async with asyncio.timeout(DEADLINE):
                await blocked.entered.wait()
            await parts.runner.close()  # the daemon stops mid-way through its first deploy
        async with deploy_service(tmp_path, triton, traffic=policy) as (service, parts):
            assert parts.staging.is_alias_dir(MODEL)

            await make_reconciler(service, parts).run_pass()

            assert sorted(p.name for p in parts.repository.iterdir()) == []
            assert (await record(parts)).active_release is None

    asyncio.run(scenario())


def test_a_slow_repair_does_not_hold_back_another_model_s(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        async with deploy_service(tmp_path, triton) as (service, parts):
            for name in ("slow", "fast"):
                publish(parts, "r1", model=name)
                assert (await deploy_and_wait(service, "r1", model=name)).status is (
                    OperationStatus.SUCCEEDED
                )
            slow = LoadBlocks()
            triton.script_load("slow", slow)
            await triton.unload("slow")
            reconciler = make_reconciler(service, parts)
            first = await reconciler.run_pass(wait=False)
            async with asyncio.timeout(DEADLINE):
                await slow.entered.wait()

            await triton.unload("fast")  # while slow's repair still loads
            second = await reconciler.run_pass(wait=False)

            assert second.busy == ["slow"]
            await until(lambda: triton.state("fast") == "READY", "fast repaired")
            assert triton.state("slow") != "READY"
            slow.release.set()
            await until(lambda: list(first.repairs) == ["slow"], "slow repaired")
            assert triton.state("slow") == "READY"

    asyncio.run(scenario())


def test_a_model_unloaded_between_beats_is_repaired_within_a_look_not_at_the_next_beat(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        await deployed(tmp_path, triton, "r1")
        async with deploy_service(tmp_path, triton) as (service, parts):
            ready = asyncio.Event()
            loop = asyncio.create_task(make_reconciler(service, parts).run(3600.0, ready))
            try:
                async with asyncio.timeout(DEADLINE):
                    await ready.wait()
                loads = triton.called("load", MODEL)

                await triton.unload(MODEL)  # an hour before the next beat
                await parts.clock.sleeping()
                parts.clock.advance(INDEX_LOOK)  # the next look at the index, not the beat

                await until(lambda: triton.state(MODEL) == "READY", "repaired at once")
                assert triton.called("load", MODEL) == loads + 1
            finally:
                loop.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await loop

    asyncio.run(scenario())


def test_a_triton_restart_between_beats_is_met_by_the_broken_connection_at_once(
    tmp_path: Path,
) -> None:
    """No look at the index finds it: the pass right after the restart is the first call."""

    async def scenario() -> None:
        triton = FakeTriton()
        await deployed(tmp_path, triton, "r1")
        async with deploy_service(tmp_path, triton) as (service, parts):
            ready = asyncio.Event()
            loop = asyncio.create_task(make_reconciler(service, parts).run(3600.0, ready))
            try:
                async with asyncio.timeout(DEADLINE):
                    await ready.wait()
                await until(lambda: triton.watched, "the connection watched")
                loads, calls = triton.called("load", MODEL), len(triton.calls)

                triton.restart()  # EXPLICIT mode: the new Triton loads nothing

                # Time stands still (the fake clock): no look at the index can have found it.
                await until(lambda: triton.state(MODEL) == "READY", "repaired at once")
                assert triton.called("load", MODEL) == loads + 1
                assert triton.calls[calls] == ("is_live", "")  # a pass began, not a look
            finally:
                loop.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await loop

    asyncio.run(scenario())


def test_with_nothing_managed_ready_the_loop_calls_triton_only_on_its_beat(
    tmp_path: Path,
) -> None:
    """Nothing a look at the index could find: between beats the loop asks Triton nothing,
    and a restart still starts a pass at once."""

    async def scenario() -> None:
        triton = FakeTriton()
        async with deploy_service(tmp_path, triton) as (service, parts):
            ready = asyncio.Event()
            loop = asyncio.create_task(make_reconciler(service, parts).run(3600.0, ready))
            try:
                async with asyncio.timeout(DEADLINE):
                    await ready.wait()
                await until(lambda: triton.watched, "the connection watched")
                calls = len(triton.calls)

                triton.restart()

                await until(lambda: len(triton.calls) > calls, "a pass after the restart")
                await until(lambda: triton.watched, "watching again after the pass")
                assert triton.calls[calls:] == [("is_live", ""), ("index", "")]
            finally:
                loop.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await loop

    asyncio.run(scenario())
