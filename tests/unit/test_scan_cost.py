"""A beat costs what changed: an unchanged store is listed without hashing a marker or writing
a row, a republished release is still seen, and GET /v1/models pages the watcher's catalog."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from controlplane.adapters.stores.local import LocalStore
from controlplane.adapters.stores.markers import RACY_SECONDS, MarkerRevisions
from controlplane.domain.checksums import MANIFEST_NAME
from controlplane.domain.releases import ReleaseInfo
from controlplane.ports import ReleaseBook, Serving
from controlplane.services.catalog import StoreCatalog
from controlplane.services.deploy import DeployService
from controlplane.services.status import StatusService
from controlplane.services.watcher import ReleaseWatcher
from tests.support.fakes import Parts, deploy_service, release_watcher, status_service
from tests.support.models import write_scale_release, write_sha256sums


def later() -> float:
    """A wall clock past the racy window: every marker written so far looks old enough."""
    return time.time() + 10 * RACY_SECONDS


def listing(store: LocalStore) -> dict[str, list[ReleaseInfo]]:
    return {model: store.list_releases(model) for model in store.list_models()}


class CountingBook:
    """The releases book, counting what the watcher asks of it."""

    def __init__(self, inner: ReleaseBook) -> None:
        self._inner = inner
        self.reads = 0
        self.rows: list[ReleaseInfo] = []

    async def record(self, releases: Sequence[ReleaseInfo], at: datetime) -> None:
        self.rows.extend(releases)
        await self._inner.record(releases, at)

    async def seen(self, model: str) -> list[ReleaseInfo]:
        self.reads += 1
        return await self._inner.seen(model)


def _watcher(service: DeployService, parts: Parts, book: ReleaseBook) -> ReleaseWatcher:
    return release_watcher(service, parts, releases=book)


def _status(service: DeployService, parts: Parts, catalog: StoreCatalog) -> StatusService:
    return status_service(service, parts, catalog=catalog)


def test_an_unchanged_store_is_listed_without_hashing_a_marker(tmp_path: Path) -> None:
    for model in ("a", "b"):
        for release in ("r1", "r2"):
            write_scale_release(tmp_path, model, release, k=1.0)
    write_scale_release(tmp_path, "a", "r3", k=1.0, checksums=False)
    markers = MarkerRevisions(wall_clock=later)
    store = LocalStore(tmp_path, markers=markers)

    first = listing(store)
    hashed = markers.hashed
    again = listing(store)

    assert hashed == 4
    assert markers.hashed == hashed  # nothing hashed the second time
    assert again == first
    assert [r.complete for r in again["a"]] == [True, True, False]


def test_a_marker_renamed_over_with_the_same_size_and_times_is_a_new_revision(
    tmp_path: Path,
) -> None:
    release = write_scale_release(tmp_path, "m", "r1", k=1.0)
    store = LocalStore(tmp_path, markers=MarkerRevisions(wall_clock=later))
    marker = release / MANIFEST_NAME
    before = store.describe("m", "r1")
    old = marker.stat()
    text = marker.read_text()
    replacement = release / ".SHA256SUMS.new"
    replacement.write_text(text[::-1])  # same size, other content
    os.utime(replacement, ns=(old.st_atime_ns, old.st_mtime_ns))  # even the same mtime
    os.replace(replacement, marker)  # a new inode

    after = store.describe("m", "r1")

    assert after.revision != before.revision


def test_a_same_size_rewrite_in_place_right_after_a_look_is_seen(tmp_path: Path) -> None:
    release = write_scale_release(tmp_path, "m", "r1", k=1.0)
    store = LocalStore(tmp_path)  # the real clock: the marker is younger than the racy window
    marker = release / MANIFEST_NAME
    before = store.describe("m", "r1")
    stamp = marker.stat()
    with marker.open("r+b") as stream:  # same inode, same size, maybe the same tick
        data = stream.read()
        stream.seek(0)
        stream.write(data[::-1])
    os.utime(marker, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))

    after = store.describe("m", "r1")

    assert after.revision != before.revision


def test_a_scan_of_an_unchanged_store_reads_and_writes_no_release_row(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            for model in ("a", "b", "c"):
                write_scale_release(parts.store_path, model, "r1", k=1.0)
            book = CountingBook(parts.repos.releases)
            watcher = _watcher(service, parts, book)
            await watcher.scan()
            assert len(book.rows) == 3

            book.reads, book.rows = 0, []
            quiet = await watcher.scan()

            assert (book.reads, book.rows, quiet.new) == (0, [], [])

            write_scale_release(parts.store_path, "b", "r2", k=2.0)
            changed = await watcher.scan()

            assert [(r.model, r.name) for r in changed.new] == [("b", "r2")]
            assert book.reads == 1  # only the model that changed
            assert [(r.model, r.name) for r in book.rows] == [("b", "r2")]

    asyncio.run(scenario())


def test_a_republished_release_is_seen_and_recorded_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            release = write_scale_release(parts.store_path, "m", "r1", k=1.0)
            book = CountingBook(parts.repos.releases)
            watcher = _watcher(service, parts, book)
            await watcher.scan()
            await watcher.scan()

            (release / "1" / "model.py").write_text("# republished\n")
            write_sha256sums(release)  # the publisher writes the marker last, by rename
            republished = await watcher.scan()

            assert [r.name for r in republished.new] == ["r1"]
            [row] = await parts.repos.releases.seen("m")
            assert row.revision == republished.new[0].revision

    asyncio.run(scenario())


def test_pages_return_every_model_exactly_once(tmp_path: Path) -> None:
    names = ["m1", "m2", "m10", "v01", "v1", "A", "a", "b7", "b07", "z"]

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            for name in names:
                write_scale_release(parts.store_path, name, "r1", k=1.0)
            watcher = _watcher(service, parts, parts.repos.releases)
            status = _status(service, parts, watcher.catalog)
            await watcher.scan()
            for limit in (1, 3, 4, 10, 11):
                seen: list[str] = []
                after: str | None = None
                while True:
                    page = await status.list_models(limit=limit, after=after)
                    assert len(page.models) <= limit
                    seen += [view.name for view in page.models]
                    if page.next_after is None:
                        break
                    after = page.next_after
                assert sorted(seen) == sorted(names), limit
                assert len(seen) == len(set(seen)), limit
            everything = await status.list_models()
            assert [v.name for v in everything.models][:3] == ["A", "a", "b07"]
            assert everything.next_after is None
            assert [r.name for r in everything.models[0].releases] == ["r1"]

    asyncio.run(scenario())


def test_a_managed_model_is_listed_before_and_without_the_store(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "instore", "r1", k=1.0)
            await parts.repos.serving.commit(
                "managed", parts.clock.now(), serving=Serving("r1", None)
            )
            watcher = _watcher(service, parts, parts.repos.releases)
            status = _status(service, parts, watcher.catalog)

            before_scan = await status.list_models()  # the watcher has not looked yet
            await watcher.scan()
            write_scale_release(parts.store_path, "later", "r1", k=1.0)  # not scanned yet
            after_scan = await status.list_models()

            assert [v.name for v in before_scan.models] == ["instore", "managed"]
            assert [v.name for v in after_scan.models] == ["instore", "managed"]
            managed = after_scan.models[1]
            assert (managed.active_release, managed.releases) == ("r1", ())

    asyncio.run(scenario())
