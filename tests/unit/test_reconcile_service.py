"""Start-up reconcile with a fake Triton and the real store, staging and SQLite on ``tmp_path``.

A "restart" is a second :func:`deploy_service` on the same ``tmp_path`` after the first was
closed: same store, repository, staging dir and database, a fresh service. Passing the same
:class:`FakeTriton` means Triton kept running; a new one means Triton restarted too.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from controlplane.adapters.staging.fs import MARKER_NAME
from controlplane.domain.errors import TritonError
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    StepStatus,
    Trigger,
)
from controlplane.domain.slots import SlotState
from controlplane.services.deploy import DeployService
from controlplane.services.reconcile import ReconcileReport, reconcile_until_done
from tests.support.fakes import (
    START,
    FakeTriton,
    LoadBlocks,
    LoadFails,
    Parts,
    deploy_service,
    make_reconciler,
)
from tests.support.polling import until
from tests.support.service_views import marker_release, publish, record, slot
from tests.support.tree import snapshot

MODEL = "scale"
DEADLINE = 5.0


# --- helpers ------------------------------------------------------------------------------


def staging_left(parts: Parts) -> list[str]:
    return sorted(p.name for p in parts.staging_path.iterdir())


def converged(report: ReconcileReport) -> dict[str, object]:
    """The parts of a report that say what reconcile did to models."""
    return {
        "loaded": report.loaded,
        "redeployed": report.redeployed,
        "removed": report.removed,
        "failed": report.failed,
    }


NOTHING_DONE: dict[str, object] = {"loaded": [], "redeployed": [], "removed": [], "failed": {}}


async def deploy_and_wait(service: DeployService, release: str, model: str = MODEL) -> Operation:
    submitted = await service.deploy(model, release, trigger=Trigger.API)
    return await service.wait(submitted.id)


async def deployed(tmp_path: Path, triton: FakeTriton, *releases: str) -> None:
    """A first daemon life: publish and deploy ``releases`` in order, then shut down."""
    async with deploy_service(tmp_path, triton) as (service, parts):
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
        running = await service.deploy(MODEL, release, trigger=Trigger.API)
        async with asyncio.timeout(DEADLINE):
            await blocked.entered.wait()
        last_write = service.get_operation(running.id)
        assert last_write.status is OperationStatus.RUNNING
        await parts.tasks.close()
        if killed:
            parts.repo.save_operation(last_write)
        return running.id


# --- start-up bookkeeping -----------------------------------------------------------------


def test_running_operations_are_interrupted_and_staging_is_emptied(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (_service, parts):
            # What a daemon killed mid-fetch leaves: a running operation and its staging dir.
            parts.repo.save_operation(
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
            report = await make_reconciler(service, parts).run()

            assert report.interrupted == ["deadbeef00000001"]
            assert sorted(report.staging_removed) == ["deadbeef00000001", "removed-0123"]
            assert converged(report) == NOTHING_DONE
            op = service.get_operation("deadbeef00000001")
            assert op.status is OperationStatus.INTERRUPTED
            assert op.error is not None
            assert op.error.code == "interrupted"
            assert op.steps[-1].status is StepStatus.FAILED
            assert parts.repo.unfinished_operations() == []
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
            report = await make_reconciler(service, parts).run()

            assert report.interrupted == []
            assert report.staging_removed == []
            assert converged(report) == NOTHING_DONE
            assert triton.called("load", MODEL) == loads_before
            assert triton.called("unload", MODEL) == 0
            assert snapshot(parts.repository) == before
            assert record(parts).active_release == "r1"
            assert slot(parts).state is SlotState.ACTIVE
            assert slot(parts).release == "r1"

    asyncio.run(scenario())


def test_desired_release_on_disk_is_loaded_after_a_triton_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1")
        restarted = FakeTriton()

        async with deploy_service(tmp_path, restarted) as (service, parts):
            report = await make_reconciler(service, parts).run()

            assert converged(report) == {**NOTHING_DONE, "loaded": [MODEL]}
            assert restarted.called("load", MODEL) == 1
            assert restarted.state(MODEL) == "READY"
            assert marker_release(parts) == "r1"
            assert slot(parts).state is SlotState.ACTIVE
            assert slot(parts).release == "r1"
            # Loading what is on disk is no deploy: no operation was recorded for it.
            assert len(service.list_operations(MODEL, 10)) == 1

    asyncio.run(scenario())


def test_a_load_that_fails_at_start_up_is_reported_per_model(tmp_path: Path) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1")
        restarted = FakeTriton()
        restarted.script_load(MODEL, LoadFails("out of memory"))

        async with deploy_service(tmp_path, restarted) as (service, parts):
            report = await make_reconciler(service, parts).run()

            assert list(report.failed) == [MODEL]
            assert "out of memory" in report.failed[MODEL]
            assert report.loaded == []
            assert marker_release(parts) == "r1"  # the files stay for the next attempt
            assert record(parts).active_release == "r1"
            assert slot(parts).state is SlotState.UNAVAILABLE

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
            report = await make_reconciler(service, parts).run()

            assert converged(report) == {**NOTHING_DONE, "redeployed": [MODEL]}
            assert marker_release(parts) == "r1"
            assert (parts.repository / MODEL / "1" / "model.py").read_bytes() == (
                parts.store_path / MODEL / "r1" / "1" / "model.py"
            ).read_bytes()
            assert record(parts).active_release == "r1"
            assert slot(parts).state is SlotState.ACTIVE
            assert slot(parts).release == "r1"
            assert triton.state(MODEL) == "READY"
            latest, interrupted = service.list_operations(MODEL, 2)
            assert interrupted.id == cut
            assert interrupted.status is OperationStatus.INTERRUPTED
            assert latest.trigger is Trigger.RECONCILE
            assert latest.release == "r1"
            assert latest.status is OperationStatus.SUCCEEDED
            assert staging_left(parts) == []

    asyncio.run(scenario())


def test_a_missing_dir_is_deployed_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1", "r2")
        shutil.rmtree(tmp_path / "repository" / MODEL)

        async with deploy_service(tmp_path) as (service, parts):
            report = await make_reconciler(service, parts).run()

            assert converged(report) == {**NOTHING_DONE, "redeployed": [MODEL]}
            assert marker_release(parts) == "r2"
            assert record(parts).active_release == "r2"
            assert record(parts).previous_release == "r1"
            assert slot(parts).state is SlotState.ACTIVE

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
            report = await make_reconciler(service, parts).run()

            assert report.interrupted == [cut]
            assert converged(report) == {**NOTHING_DONE, "removed": [MODEL]}
            assert list(parts.repository.iterdir()) == []
            assert triton.called("unload", MODEL) == (1 if triton_loaded_it else 0)
            assert triton.state(MODEL) in (None, "UNAVAILABLE")
            assert record(parts).active_release is None
            assert slot(parts).state is SlotState.ABSENT
            assert service.get_operation(cut).status is OperationStatus.INTERRUPTED

    asyncio.run(scenario())


def test_a_first_deploy_cut_by_shutdown_is_taken_back_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        await shut_down_mid_load(tmp_path, triton, "r1", killed=False)

        async with deploy_service(tmp_path, triton) as (service, parts):
            report = await make_reconciler(service, parts).run()

            assert report.removed == [MODEL]
            assert list(parts.repository.iterdir()) == []

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

            report = await make_reconciler(service, parts).run()

            assert converged(report) == NOTHING_DONE
            assert snapshot(parts.repository) == before
            assert [call for call in triton.calls if call[1] == "foreign"] == []
            assert parts.repo.get_model("foreign") is None

    asyncio.run(scenario())


# --- retrying until Triton answers --------------------------------------------------------


def test_reconcile_retries_while_triton_is_unreachable(tmp_path: Path) -> None:
    async def scenario() -> None:
        await deployed(tmp_path, FakeTriton(), "r1")
        restarted = FakeTriton()
        restarted.fail_index(3)

        async with deploy_service(tmp_path, restarted) as (service, parts):
            ready = asyncio.Event()
            async with asyncio.timeout(DEADLINE):
                await reconcile_until_done(
                    make_reconciler(service, parts), ready, retry_interval=0.01
                )

            assert ready.is_set()
            assert restarted.called("index", "") == 4
            assert restarted.called("load", MODEL) == 1
            assert slot(parts).state is SlotState.ACTIVE

    asyncio.run(scenario())


def test_not_ready_while_triton_stays_unreachable(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        triton.fail_index(1_000_000)
        async with deploy_service(tmp_path, triton) as (service, parts):
            ready = asyncio.Event()
            task = asyncio.create_task(
                reconcile_until_done(make_reconciler(service, parts), ready, retry_interval=0.01)
            )
            try:
                await until(
                    lambda: triton.called("index", "") >= 3, "reconcile did not retry 3 times"
                )
                assert not ready.is_set()
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    asyncio.run(scenario())


def test_a_permanent_error_ends_the_retries(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        triton.fail_index(1, TritonError("Triton refused the index request"))
        async with deploy_service(tmp_path, triton) as (service, parts):
            ready = asyncio.Event()
            async with asyncio.timeout(DEADLINE):
                await reconcile_until_done(
                    make_reconciler(service, parts), ready, retry_interval=0.01
                )

            assert ready.is_set()  # the API starts; the error is in the log
            assert triton.called("index", "") == 1

    asyncio.run(scenario())
