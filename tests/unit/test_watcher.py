"""The release watcher: what it deploys by itself, and what it leaves alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from controlplane.domain.operations import OperationStatus, Trigger
from controlplane.domain.rollback import DegradedRelease
from controlplane.services.deploy import DeployService
from controlplane.services.watcher import ReleaseWatcher
from tests.support.fakes import (
    LoadBlocks,
    LoadFails,
    Parts,
    deploy_service,
    release_watcher,
    started,
    started_rollback,
)
from tests.support.models import write_scale_release, write_sha256sums
from tests.support.polling import until

Policy = Callable[[str], bool]


def _watcher(service: DeployService, parts: Parts, auto_deploy: Policy) -> ReleaseWatcher:
    return release_watcher(service, parts, auto_deploy=auto_deploy)


async def _settle(operation_ids: list[str], service: DeployService) -> list[OperationStatus]:
    return [(await service.wait(op)).status for op in operation_ids]


def test_without_auto_deploy_new_releases_are_only_recorded(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            watcher = _watcher(service, parts, lambda _model: False)
            result = await watcher.scan()
            assert [r.name for r in result.new] == ["r1"]
            assert result.deploys == []
            assert parts.triton.calls == []
            assert [r.name for r in await parts.repos.releases.seen("m")] == ["r1"]
            again = await watcher.scan()
            assert again.new == []  # seen once is not new again

    asyncio.run(scenario())


def test_auto_deploy_waits_for_sha256sums_then_deploys_the_newest(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            watcher = _watcher(service, parts, lambda model: model == "m")
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            first = await watcher.scan()
            assert await _settle([op.id for op in first.deploys], service) == [
                OperationStatus.SUCCEEDED
            ]
            assert first.deploys[0].trigger is Trigger.WATCHER

            unpublished = write_scale_release(parts.store_path, "m", "r2", k=2.0, checksums=False)
            nothing = await watcher.scan()
            assert nothing.deploys == []  # files without SHA256SUMS: still being published

            write_sha256sums(unpublished)
            second = await watcher.scan()
            assert [op.release for op in second.deploys] == ["r2"]
            await _settle([op.id for op in second.deploys], service)
            record = await parts.repos.serving.get("m")
            assert record is not None
            assert (record.active_release, record.previous_release) == ("r2", "r1")

    asyncio.run(scenario())


def test_a_rollback_by_a_person_is_not_undone(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            watcher = _watcher(service, parts, lambda _model: True)
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            write_scale_release(parts.store_path, "m", "r2", k=2.0)
            result = await watcher.scan()
            assert [op.release for op in result.deploys] == ["r2"]
            await _settle([op.id for op in result.deploys], service)
            rollback = await started_rollback(service, "m", to="r1", trigger=Trigger.API)
            await service.wait(rollback.id)

            after = await watcher.scan()
            restarted = await _watcher(service, parts, lambda _model: True).scan()

            assert after.deploys == []
            assert restarted.deploys == []  # nor by the watcher of a restarted daemon
            record = await parts.repos.serving.get("m")
            assert record is not None
            assert record.active_release == "r1"

    asyncio.run(scenario())


def test_a_release_seen_by_a_daemon_that_died_before_deploying_it_is_deployed_after_a_restart(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            await _settle(
                [
                    op.id
                    for op in (await _watcher(service, parts, lambda _model: True).scan()).deploys
                ],
                service,
            )
            write_scale_release(parts.store_path, "m", "r2", k=2.0)
            seen = await _watcher(service, parts, lambda _model: False).scan()  # then it died
            assert [r.name for r in seen.new] == ["r2"]

            restarted = await _watcher(service, parts, lambda _model: True).scan()

            assert [op.release for op in restarted.deploys] == ["r2"]

    asyncio.run(scenario())


def test_a_release_that_fails_is_not_retried_until_republished(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            watcher = _watcher(service, parts, lambda _model: True)
            release_dir = write_scale_release(parts.store_path, "m", "r1", k=1.0)
            parts.triton.script_load("m", LoadFails("initialize failed on purpose"))
            failed = await watcher.scan()
            assert await _settle([op.id for op in failed.deploys], service) == [
                OperationStatus.FAILED
            ]
            assert (await watcher.scan()).deploys == []  # a bad release is not hammered

            marker = release_dir / "SHA256SUMS"
            marker.write_text(marker.read_text() + "\n")  # republished: new marker content
            retried = await watcher.scan()
            assert [op.release for op in retried.deploys] == ["r1"]
            assert await _settle([op.id for op in retried.deploys], service) == [
                OperationStatus.SUCCEEDED
            ]

    asyncio.run(scenario())


def test_a_release_latched_degraded_is_not_pushed_even_when_republished(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            watcher = _watcher(service, parts, lambda _model: True)
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            first = await watcher.scan()
            await _settle([op.id for op in first.deploys], service)
            await parts.repos.rollbacks.latch(
                DegradedRelease("m", "r2", parts.clock.now(), "GPU overload")
            )
            release_dir = write_scale_release(parts.store_path, "m", "r2", k=2.0)

            assert (await watcher.scan()).deploys == []
            marker = release_dir / "SHA256SUMS"
            marker.write_text(marker.read_text() + "\n")  # republished
            assert (await watcher.scan()).deploys == []
            record = await parts.repos.serving.get("m")
            assert record is not None
            assert record.active_release == "r1"

    asyncio.run(scenario())


def test_a_release_seen_while_its_model_is_busy_is_deployed_as_soon_as_that_ends(
    tmp_path: Path,
) -> None:
    """Not a poll later: with notifications the poll may be minutes away, and a model is busy
    after every blue-green deploy while its old slot retires."""

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            blocked = LoadBlocks()
            parts.triton.script_load("m", blocked)
            busy = await started(service, "m", "r1", trigger=Trigger.API)
            async with asyncio.timeout(5.0):
                await blocked.entered.wait()
            write_scale_release(parts.store_path, "m", "r2", k=2.0)
            watcher = release_watcher(service, parts, auto_deploy=lambda _m: True, interval=300.0)
            watching = asyncio.create_task(watcher.run())
            try:
                await until(lambda: _seen(parts, "r2"), "the watcher seeing r2")
                assert [op.release for op in await service.list_operations("m", 10)] == ["r1"]

                blocked.release.set()
                assert (await service.wait(busy.id)).status is OperationStatus.SUCCEEDED
                await until(lambda: _serving(parts, "r2"), "r2 deployed after r1's operation")
            finally:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching

    asyncio.run(scenario())


async def _seen(parts: Parts, release: str) -> bool:
    return release in {r.name for r in await parts.repos.releases.seen("m")}


async def _serving(parts: Parts, release: str) -> bool:
    record = await parts.repos.serving.get("m")
    return record is not None and record.active_release == release
