"""The fetch step as a deploy runs it: what it refuses before copying, and how it stops.

A DeployService over the real local store, staging and SQLite on ``tmp_path`` (a fake Triton).
Releases that would fill the disk hold a sparse file: a huge apparent size, no blocks, so
the test costs nothing while a dense copy would cost everything. What a user sees is
asserted: the operation's error and the fetch step's figures, staging's real disk usage.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from controlplane.adapters.stores.local import LocalStore
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest
from controlplane.domain.errors import Interrupted
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.operations import CancelReason, Operation, OperationStatus, Trigger
from controlplane.domain.releases import ReleaseInfo
from controlplane.ports import FetchedRelease, FetchProgress, MarkerFiles, ReleaseListing
from controlplane.services.deploy import DeployService
from tests.support.disk import GIB, PeakUsage, add_sparse_file, too_big_for
from tests.support.fakes import deploy_service, started
from tests.support.polling import until
from tests.support.service_views import publish

MODEL = "scale"
MIB = 1024**2


async def deploy_and_wait(service: DeployService, release: str) -> Operation:
    submitted = await started(service, MODEL, release, trigger=Trigger.API)
    return await service.wait(submitted.id)


def fetch_detail(operation: Operation) -> Mapping[str, object]:
    return next(step.detail for step in operation.steps if step.name == "fetch")


def test_a_listed_file_bigger_than_the_free_space_is_refused_before_anything_is_copied(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            huge = too_big_for(parts.staging_path)
            add_sparse_file(parts.store_path / MODEL / "r1", "1/huge.bin", huge, listed=True)

            with PeakUsage(parts.staging_path) as usage:
                operation = await deploy_and_wait(service, "r1")

            assert operation.status is OperationStatus.FAILED
            assert operation.error is not None
            assert operation.error.code == "insufficient_disk"
            assert "free" in operation.error.message
            detail = fetch_detail(operation)
            assert detail["bytes_needed"] == detail["bytes_total"]
            assert int(str(detail["bytes_needed"])) > huge
            assert int(str(detail["bytes_free"])) < huge
            assert detail["bytes_cached"] == 0
            assert "bytes_fetched" not in detail  # the fetch itself never started
            assert usage.peak < MIB
            assert not (parts.repository / MODEL).exists()

    asyncio.run(scenario())


def test_a_file_sha256sums_does_not_list_is_refused_by_name_before_anything_is_copied(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            huge = too_big_for(parts.staging_path)
            add_sparse_file(parts.store_path / MODEL / "r1", "1/huge.bin", huge, listed=False)

            with PeakUsage(parts.staging_path) as usage:
                operation = await deploy_and_wait(service, "r1")

            assert operation.error is not None
            assert operation.error.code == "invalid_release"
            assert "not listed in SHA256SUMS: 1/huge.bin" in operation.error.message
            assert usage.peak < MIB

    asyncio.run(scenario())


def test_a_release_over_max_release_bytes_is_too_large(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path, max_release_bytes=1000) as (service, parts):
            publish(parts, "r1")

            operation = await deploy_and_wait(service, "r1")

            assert operation.error is not None
            assert operation.error.code == "release_too_large"
            assert "over store.max_release_bytes (1000 B)" in operation.error.message
            assert fetch_detail(operation)["max_release_bytes"] == 1000

    asyncio.run(scenario())


def test_the_fetch_step_records_the_disk_figures(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path, max_release_bytes=10 * GIB) as (service, parts):
            publish(parts, "r1")
            release = parts.store_path / MODEL / "r1"
            size = sum(p.stat().st_size for p in release.rglob("*") if p.is_file())

            operation = await deploy_and_wait(service, "r1")

            assert operation.status is OperationStatus.SUCCEEDED
            detail = fetch_detail(operation)
            assert detail["bytes_total"] == detail["bytes_needed"] == size
            assert detail["max_release_bytes"] == 10 * GIB
            assert int(str(detail["bytes_free"])) > size
            assert (detail["refetched"], detail["retries"]) == (0, 0)

    asyncio.run(scenario())


def test_a_manifest_that_is_not_utf8_is_an_invalid_release(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            sums = parts.store_path / MODEL / "r1" / MANIFEST_NAME
            sums.write_bytes(sums.read_bytes().replace(b"  1/model.py", b"  1/mod\xe9l.py"))

            operation = await deploy_and_wait(service, "r1")

            assert operation.error is not None
            assert operation.error.code == "invalid_release"
            assert "is not UTF-8 text" in operation.error.message

    asyncio.run(scenario())


class StallingStore:
    """The local store, but its fetch stalls like a slow download until told to stop."""

    def __init__(self, inner: LocalStore) -> None:
        self._inner = inner
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.staging_existed_at_stop = False

    @property
    def uri(self) -> str:
        return self._inner.uri

    def close(self) -> None:
        self._inner.close()

    def list_models(self, *, ignored: Callable[[IgnoredName], None] | None = None) -> list[str]:
        return self._inner.list_models(ignored=ignored)

    def list_releases(
        self, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
    ) -> list[ReleaseInfo]:
        return self._inner.list_releases(model, ignored=ignored)

    def list_store(
        self, *, ignored: Callable[[str | None, IgnoredName], None] | None = None
    ) -> dict[str, list[ReleaseInfo]]:
        return self._inner.list_store(ignored=ignored)

    def describe(self, model: str, release: str, *, patient: bool = False) -> ReleaseInfo:
        return self._inner.describe(model, release, patient=patient)

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        return self._inner.read_marker_files(model, release)

    def list_files(self, model: str, release: str) -> ReleaseListing:
        return self._inner.list_files(model, release)

    def confirm(
        self,
        listing: ReleaseListing,
        rel: str,
        sha256: str,
        cancel: threading.Event | None = None,
    ) -> bool:
        return self._inner.confirm(listing, rel, sha256, cancel)

    def fetch(
        self,
        listing: ReleaseListing,
        dest: Path,
        *,
        manifest: Mapping[str, str] | None,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> FetchedRelease:
        partial = dest / ".weights.bin.part"
        partial.write_bytes(b"half a download")
        self.started.set()
        assert cancel is not None, "the prepare step gives every fetch a cancel signal"
        cancel.wait(timeout=30)
        partial.unlink()  # what a real store does when told to stop
        self.staging_existed_at_stop = dest.is_dir()
        self.stopped.set()
        raise Interrupted("the fetch was cancelled")


def test_a_cancelled_deploy_stops_its_fetch_before_staging_is_cleaned(tmp_path: Path) -> None:
    stalling: list[StallingStore] = []

    def wrap(local: LocalStore) -> StallingStore:
        stalling.append(StallingStore(local))
        return stalling[0]

    async def scenario() -> None:
        async with deploy_service(tmp_path, store=wrap) as (service, parts):
            publish(parts, "r1")
            store = stalling[0]
            running = await started(service, MODEL, "r1")
            await until(store.started.is_set, "the fetch started")

            # A rollback's budget ran out: the daemon goes on, so everything is put back.
            cancelled = await parts.runner.cancel(running.id, CancelReason.BUDGET)

            assert store.stopped.is_set()  # the fetch thread had ended when cancel returned
            assert store.staging_existed_at_stop  # and staging was cleaned only after that
            assert cancelled.status is not OperationStatus.SUCCEEDED
            assert sorted(p.name for p in parts.staging_path.iterdir()) == []
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


class RepublishingStore(StallingStore):
    """The local store, but ``SHA256SUMS`` is rewritten (same entries, other bytes: CRLF line
    ends) right after the deploy read it, as a republish between the check and the fetch."""

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        files = self._inner.read_marker_files(model, release)
        assert files.manifest is not None
        sums = Path(self._inner.uri.removeprefix("file://")) / model / release / MANIFEST_NAME
        sums.write_bytes(files.manifest.replace(b"\n", b"\r\n"))
        return files

    def fetch(
        self,
        listing: ReleaseListing,
        dest: Path,
        *,
        manifest: Mapping[str, str] | None,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> FetchedRelease:
        return self._inner.fetch(
            listing, dest, manifest=manifest, have=have, progress=progress, cancel=cancel
        )


def test_a_manifest_rewritten_after_it_was_read_is_release_changed(tmp_path: Path) -> None:
    """The manifest a deploy works from (and a signature was checked over) is the bytes it
    read; a SHA256SUMS that differs by a byte by the time it is fetched is not taken."""

    async def scenario() -> None:
        async with deploy_service(tmp_path, store=RepublishingStore) as (service, parts):
            publish(parts, "r1")
            operation = await deploy_and_wait(service, "r1")
            assert operation.error is not None
            assert operation.error.code == "release_changed"
            assert "SHA256SUMS" in operation.error.message

    asyncio.run(scenario())
