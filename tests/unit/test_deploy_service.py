"""DeployService with a fake Triton and the real store, staging and SQLite on ``tmp_path``.

These reach the paths a real Triton cannot be made to take on cue: a reload that fails, a load
cut short by shutdown, a load that raises something unexpected. Each test asserts what a user
would see: the operation and its error code, the repository dir, the persisted record and slot,
and an empty staging area.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controlplane.adapters.staging.fs import MARKER_NAME
from controlplane.domain.errors import (
    ModelNotFound,
    NoPreviousRelease,
    OperationInProgress,
    ReleaseBelowFloor,
    ReleaseNotFound,
    TritonUnavailable,
)
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    StepStatus,
    Trigger,
    Unchanged,
)
from controlplane.domain.slots import SlotState
from controlplane.services.deploy import DeployService
from tests.support.fakes import (
    LoadBlocks,
    LoadFails,
    LoadRaises,
    Parts,
    deploy_service,
    started,
    started_rollback,
)
from tests.support.models import write_scale_release
from tests.support.polling import until
from tests.support.service_views import marker_release, publish, record, slot
from tests.support.tree import snapshot

MODEL = "scale"
OTHER = "other"
DEPLOY_STEPS = ["resolve", "fetch", "verify", "headroom", "place", "load", "record"]
DEADLINE = 5.0


# --- helpers ------------------------------------------------------------------------------


def placed_model_py(parts: Parts, model: str = MODEL) -> bytes:
    return (parts.repository / model / "1" / "model.py").read_bytes()


def store_model_py(parts: Parts, release: str, model: str = MODEL) -> bytes:
    return (parts.store_path / model / release / "1" / "model.py").read_bytes()


def staging_left(parts: Parts) -> list[str]:
    return sorted(p.name for p in parts.staging_path.iterdir())


def step_names(operation: Operation) -> list[str]:
    return [step.name for step in operation.steps]


async def deploy_and_wait(service: DeployService, release: str, model: str = MODEL) -> Operation:
    submitted = await started(service, model, release, trigger=Trigger.API)
    return await service.wait(submitted.id)


async def entered(blocked: LoadBlocks) -> None:
    async with asyncio.timeout(DEADLINE):
        await blocked.entered.wait()


# --- deploy -------------------------------------------------------------------------------


def test_first_deploy_places_loads_and_records(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, MODEL, "r1", k=1.0, config_name="renamed-me")

            op = await deploy_and_wait(service, "r1")

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.kind is OperationKind.DEPLOY
            assert step_names(op) == DEPLOY_STEPS
            assert all(step.status is StepStatus.SUCCEEDED for step in op.steps)
            assert sorted(p.name for p in parts.repository.iterdir()) == [MODEL]
            assert (parts.repository / MODEL / MARKER_NAME).is_file()
            assert marker_release(parts) == "r1"
            assert placed_model_py(parts) == store_model_py(parts, "r1")
            config = (parts.repository / MODEL / "config.pbtxt").read_text(encoding="utf-8")
            assert f'name: "{MODEL}"' in config
            assert "renamed-me" not in config
            assert (await record(parts)).active_release == "r1"
            assert (await record(parts)).previous_release is None
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert (await slot(parts)).release == "r1"
            assert parts.triton.state(MODEL) == "READY"
            assert parts.triton.called("load", MODEL) == 1
            assert staging_left(parts) == []
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


def test_second_deploy_replaces_the_first(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")

            op = await deploy_and_wait(service, "r2")

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.from_release == "r1"
            assert step_names(op) == DEPLOY_STEPS
            assert (await record(parts)).active_release == "r2"
            assert (await record(parts)).previous_release == "r1"
            assert marker_release(parts) == "r2"
            assert placed_model_py(parts) == store_model_py(parts, "r2")
            assert sorted(p.name for p in parts.repository.iterdir()) == [MODEL]
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert (await slot(parts)).release == "r2"
            # The replaced r1 dir went through staging and is gone from there too.
            assert staging_left(parts) == []

    asyncio.run(scenario())


def test_a_release_below_the_floor_is_refused_and_what_serves_keeps_serving(
    tmp_path: Path,
) -> None:
    """min_release: write access to the store can move a fleet back to an older signed
    release; a floor refuses it, by deploy and by rollback (the fleet's sync and automatic
    rollbacks come this way too), before anything is recorded."""

    async def scenario() -> None:
        async with deploy_service(tmp_path, min_release="r10") as (service, parts):
            publish(parts, "r9", "r10", "r11")
            assert (await deploy_and_wait(service, "r10")).status is OperationStatus.SUCCEEDED
            before = snapshot(parts.repository)

            for trigger in (Trigger.API, Trigger.FLEET, Trigger.WATCHER):
                with pytest.raises(ReleaseBelowFloor) as refused:
                    await service.deploy(MODEL, "r9", trigger=trigger)
                assert refused.value.code == "release_below_floor"
                assert "sorts before the model's min_release 'r10'" in refused.value.message
            for trigger in (Trigger.API, Trigger.ALERT, Trigger.FLEET):
                with pytest.raises(ReleaseBelowFloor):
                    await service.rollback(MODEL, to="r9", trigger=trigger)

            assert snapshot(parts.repository) == before
            assert (await record(parts)).active_release == "r10"
            assert [op.release for op in await service.list_operations(MODEL, 10)] == ["r10"]
            assert staging_left(parts) == []
            # At the floor and above it deploys; back at the floor by rollback too.
            assert (await deploy_and_wait(service, "r11")).status is OperationStatus.SUCCEEDED
            back = await started_rollback(service, MODEL, to="r10")
            assert (await service.wait(back.id)).status is OperationStatus.SUCCEEDED

    asyncio.run(scenario())


def test_failed_reload_leaves_everything_as_it_was(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            before = snapshot(parts.repository)
            record_before = await record(parts)
            parts.triton.script_load(MODEL, LoadFails("initialize failed on purpose"))

            op = await deploy_and_wait(service, "r2")

            assert op.status is OperationStatus.FAILED
            assert op.error is not None
            assert op.error.code == "triton_load_failed"
            assert "initialize failed on purpose" in op.error.message
            assert step_names(op) == ["resolve", "fetch", "verify", "headroom", "place", "load"]
            assert op.steps[-1].status is StepStatus.FAILED
            assert snapshot(parts.repository) == before
            assert marker_release(parts) == "r1"
            assert (await record(parts)).active_release == record_before.active_release == "r1"
            assert (await record(parts)).previous_release == record_before.previous_release
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert (await slot(parts)).release == "r1"
            assert "triton_load_failed" in (await slot(parts)).reason
            assert parts.triton.state(MODEL) == "READY"  # Triton kept serving r1
            assert parts.triton.called("unload", MODEL) == 0
            assert staging_left(parts) == []
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


def test_failed_first_load_leaves_no_trace(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            parts.triton.script_load(MODEL, LoadFails())

            op = await deploy_and_wait(service, "r1")

            assert op.status is OperationStatus.FAILED
            assert op.error is not None
            assert op.error.code == "triton_load_failed"
            assert list(parts.repository.iterdir()) == []
            assert parts.triton.called("unload", MODEL) == 1
            assert parts.triton.state(MODEL) == "UNAVAILABLE"
            assert (await slot(parts)).state is SlotState.ABSENT
            assert (await slot(parts)).release is None
            assert (await record(parts)).active_release is None
            assert (await record(parts)).previous_release is None
            assert staging_left(parts) == []

    asyncio.run(scenario())


def test_triton_unreachable_during_reload_is_a_transient_failure(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            before = snapshot(parts.repository)
            parts.triton.script_load(MODEL, LoadRaises(TritonUnavailable("connection refused")))

            op = await deploy_and_wait(service, "r2")

            assert op.status is OperationStatus.FAILED
            assert op.error is not None
            assert op.error.code == "triton_unavailable"
            assert snapshot(parts.repository) == before
            assert (await record(parts)).active_release == "r1"
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert staging_left(parts) == []

    asyncio.run(scenario())


def test_missing_release_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A refusal before any work is an answer, not an operation: nothing is recorded."""

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")

            with pytest.raises(ReleaseNotFound) as caught:
                await started(service, MODEL, "r9", trigger=Trigger.API)

            assert caught.value.code == "release_not_found"
            assert "operation_id" not in caught.value.details
            assert await service.list_operations(MODEL, 10) == []
            assert list(parts.repository.iterdir()) == []
            assert parts.triton.calls == []
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


# --- concurrency and cancellation ---------------------------------------------------------


def test_one_operation_per_model_at_a_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            publish(parts, "r1", model=OTHER)
            blocked = LoadBlocks()
            parts.triton.script_load(MODEL, blocked)
            running = await started(service, MODEL, "r1", trigger=Trigger.API)
            await entered(blocked)

            with pytest.raises(OperationInProgress) as caught:
                await started(service, MODEL, "r2", trigger=Trigger.CLI)
            assert caught.value.code == "operation_in_progress"
            assert caught.value.details["operation_id"] == running.id
            assert running.id in caught.value.message
            with pytest.raises(OperationInProgress):
                await started_rollback(service, MODEL, to="r1", trigger=Trigger.CLI)

            # Another model is not held up by the first one's lock.
            other = await deploy_and_wait(service, "r1", model=OTHER)
            assert other.status is OperationStatus.SUCCEEDED, other.error

            blocked.release.set()
            done = await service.wait(running.id)
            assert done.status is OperationStatus.SUCCEEDED, done.error
            # The refused requests left no operation behind.
            assert [op.id for op in await service.list_operations(MODEL, 10)] == [running.id]
            assert marker_release(parts) == "r1"
            assert marker_release(parts, OTHER) == "r1"

            # Once the first is done the model takes requests again.
            again = await deploy_and_wait(service, "r2")
            assert again.status is OperationStatus.SUCCEEDED, again.error

    asyncio.run(scenario())


def test_shutdown_mid_load_leaves_the_placement_for_reconcile(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            blocked = LoadBlocks()
            parts.triton.script_load(MODEL, blocked)
            running = await started(service, MODEL, "r2", trigger=Trigger.API)
            await entered(blocked)

            await parts.runner.close()

            op = await service.get_operation(running.id)
            assert op.status is OperationStatus.INTERRUPTED
            assert op.error is not None
            assert op.error.code == "interrupted"
            assert step_names(op) == ["resolve", "fetch", "verify", "headroom", "place", "load"]
            assert op.steps[-1].status is StepStatus.FAILED
            # Triton may still be reading r2's files: they stay; reconcile converges later.
            assert marker_release(parts) == "r2"
            assert placed_model_py(parts) == store_model_py(parts, "r2")
            assert (await record(parts)).active_release == "r1"
            assert staging_left(parts) == []
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


def test_shutdown_before_the_load_changes_nothing(tmp_path: Path) -> None:
    """Cut short while waiting for a load slot (after verify, before place)."""

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            before = snapshot(parts.repository)
            slot_before = await slot(parts)
            # Every load slot is taken, as if two other models were loading.
            async with parts.load_slots.hold(), parts.load_slots.hold():
                running = await started(service, MODEL, "r2", trigger=Trigger.API)

                async def queued() -> bool:
                    op = await service.get_operation(running.id)
                    return step_names(op)[-1] == "queue"

                await until(queued, "the deploy waits for a load slot")
                await parts.runner.close()

            op = await service.get_operation(running.id)
            assert op.status is OperationStatus.INTERRUPTED
            # The wait for a load slot shows as a step of its own.
            assert step_names(op) == ["resolve", "fetch", "verify", "headroom", "queue"]
            assert snapshot(parts.repository) == before
            assert (await record(parts)).active_release == "r1"
            assert (await slot(parts)) == slot_before
            assert parts.triton.called("load", MODEL) == 1  # r1's only
            assert staging_left(parts) == []
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


def test_unexpected_error_is_an_internal_error_and_frees_the_model(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            before = snapshot(parts.repository)
            parts.triton.script_load(MODEL, LoadRaises(RuntimeError("bug in the driver")))

            op = await deploy_and_wait(service, "r2")

            assert op.status is OperationStatus.FAILED
            assert op.error is not None
            assert op.error.code == "internal_error"
            assert "bug in the driver" in op.error.message
            assert snapshot(parts.repository) == before
            assert (await record(parts)).active_release == "r1"
            assert staging_left(parts) == []
            assert parts.runner.holder(MODEL) is None
            # The lock is free: the next request is accepted (resolve ran, a task started).
            accepted = await started(service, MODEL, "r2", trigger=Trigger.API)
            assert accepted.status is OperationStatus.RUNNING
            await service.wait(accepted.id)

    asyncio.run(scenario())


def test_model_deploys_again_after_an_unexpected_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            parts.triton.script_load(MODEL, LoadRaises(RuntimeError("bug in the driver")))
            await deploy_and_wait(service, "r2")

            again = await deploy_and_wait(service, "r2")

            assert again.status is OperationStatus.SUCCEEDED, again.error
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert marker_release(parts) == "r2"

    asyncio.run(scenario())


# --- rollback -----------------------------------------------------------------------------


def test_rollback_needs_a_model_and_a_previous_release(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")

            with pytest.raises(ModelNotFound):
                await started_rollback(service, MODEL, to=None, trigger=Trigger.API)

            await deploy_and_wait(service, "r1")
            with pytest.raises(NoPreviousRelease) as caught:
                await started_rollback(service, MODEL, to="previous", trigger=Trigger.API)
            assert caught.value.code == "no_previous_release"
            assert (await record(parts)).active_release == "r1"
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


def test_rollback_to_previous_swaps_active_and_previous(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            await deploy_and_wait(service, "r2")

            submitted = await started_rollback(service, MODEL, to=None, trigger=Trigger.ALERT)
            op = await service.wait(submitted.id)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.kind is OperationKind.ROLLBACK
            assert op.trigger is Trigger.ALERT
            assert (op.from_release, op.release) == ("r2", "r1")
            assert (await record(parts)).active_release == "r1"
            assert (await record(parts)).previous_release == "r2"
            assert marker_release(parts) == "r1"
            assert placed_model_py(parts) == store_model_py(parts, "r1")
            assert (await slot(parts)).state is SlotState.ACTIVE
            assert staging_left(parts) == []

    asyncio.run(scenario())


def test_rollback_to_a_named_release(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2", "r3")
            for release in ("r1", "r2", "r3"):
                await deploy_and_wait(service, release)

            submitted = await started_rollback(service, MODEL, to="r1", trigger=Trigger.CLI)
            op = await service.wait(submitted.id)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.kind is OperationKind.ROLLBACK
            assert (await record(parts)).active_release == "r1"
            assert (await record(parts)).previous_release == "r3"
            assert marker_release(parts) == "r1"

    asyncio.run(scenario())


# --- unload -------------------------------------------------------------------------------


def test_unload_takes_the_model_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            await deploy_and_wait(service, "r1")

            submitted = await service.unload(MODEL, trigger=Trigger.CLI)
            op = await service.wait(submitted.id)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.kind is OperationKind.UNLOAD
            assert step_names(op) == ["unload", "remove", "record"]
            assert parts.triton.called("unload", MODEL) == 1
            assert parts.triton.state(MODEL) == "UNAVAILABLE"
            assert list(parts.repository.iterdir()) == []
            assert (await record(parts)).active_release is None
            assert (await record(parts)).previous_release == "r1"
            assert (await slot(parts)).state is SlotState.ABSENT
            assert staging_left(parts) == []

            with pytest.raises(ModelNotFound):
                await service.unload(MODEL, trigger=Trigger.CLI)
            with pytest.raises(ModelNotFound):
                await service.unload(OTHER, trigger=Trigger.CLI)

    asyncio.run(scenario())


def test_unload_that_times_out_keeps_the_files(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            await deploy_and_wait(service, "r1")
            before = snapshot(parts.repository)
            parts.triton.stick(MODEL)

            submitted = await service.unload(MODEL, trigger=Trigger.CLI)
            op = await service.wait(submitted.id)

            assert op.status is OperationStatus.FAILED
            assert op.error is not None
            assert op.error.code == "triton_timeout"
            assert snapshot(parts.repository) == before
            assert (await record(parts)).active_release == "r1"
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


def test_model_is_usable_after_an_unload_timed_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            parts.triton.stick(MODEL)
            submitted = await service.unload(MODEL, trigger=Trigger.CLI)
            await service.wait(submitted.id)

            again = await deploy_and_wait(service, "r2")

            assert again.status is OperationStatus.SUCCEEDED, again.error

    asyncio.run(scenario())


# --- what a user asks for twice, or rejects ---------------------------------------------------


def test_deploying_the_release_that_serves_is_unchanged_unless_forced(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            await deploy_and_wait(service, "r1")
            loads = parts.triton.called("load", MODEL)

            again = await service.deploy(MODEL, "r1", trigger=Trigger.API)

            assert isinstance(again, Unchanged)
            assert (again.model, again.release) == (MODEL, "r1")
            assert "serves r1 already" in again.message
            assert parts.triton.called("load", MODEL) == loads
            assert len(await service.list_operations(MODEL, 10)) == 1

            forced = await started(service, MODEL, "r1", force=True)
            assert (await service.wait(forced.id)).status is OperationStatus.SUCCEEDED
            assert parts.triton.called("load", MODEL) == loads + 1

    asyncio.run(scenario())


def test_a_republished_release_of_the_same_name_is_deployed_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            await deploy_and_wait(service, "r1")
            write_scale_release(parts.store_path, MODEL, "r1", k=9.0)  # new SHA256SUMS

            op = await deploy_and_wait(service, "r1")

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert "K = 9.0" in placed_model_py(parts).decode()

    asyncio.run(scenario())


@pytest.mark.parametrize("trigger", [Trigger.API, Trigger.CLI])
def test_a_release_a_person_rolled_back_from_is_not_the_fallback(
    tmp_path: Path, trigger: Trigger
) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            await deploy_and_wait(service, "r2")

            op = await service.wait(
                (await started_rollback(service, MODEL, to=None, trigger=trigger)).id
            )

            assert op.status is OperationStatus.SUCCEEDED, op.error
            latched = await parts.repos.rollbacks.latched(MODEL)
            assert [d.release for d in latched] == ["r2"]
            assert f"rolled back from by {trigger.value}" in latched[0].reason
            # Deploying it by name again is a person's choice: the latch goes.
            await deploy_and_wait(service, "r2")
            assert await parts.repos.rollbacks.latched(MODEL) == []

    asyncio.run(scenario())


def test_a_rollback_to_the_release_that_serves_is_unchanged(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            await deploy_and_wait(service, "r2")

            same = await service.rollback(MODEL, to="r2", trigger=Trigger.API)

            assert isinstance(same, Unchanged)
            assert len(await service.list_operations(MODEL, 10)) == 2
            assert await parts.repos.rollbacks.latched(MODEL) == []

    asyncio.run(scenario())
