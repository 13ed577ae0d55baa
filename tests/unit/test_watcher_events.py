"""With a store's events a beat lists only the models that changed; a missed event delays a
release until the next full scan, never loses it; without trusted events every beat is full."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

from controlplane.adapters.stores.local import LocalStore
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.operations import REFUSE
from controlplane.domain.releases import ReleaseInfo
from controlplane.ports import StoreChanges
from controlplane.services.deploy import DeployService
from controlplane.services.watcher import ReleaseWatcher
from tests.support.fakes import Parts, deploy_service, release_watcher, status_service
from tests.support.models import write_scale_release

FULL_SCAN = 300.0


class FakeEvents:
    """A store's events as a test scripts them: the models named, and whether they were
    watched the whole time (``complete``)."""

    def __init__(self, *, complete: bool = True) -> None:
        self.complete = complete
        self.models: set[str] = set()
        self.acted: list[frozenset[str]] = []  # what each scan said it handled

    def name(self, *models: str) -> None:
        self.models.update(models)

    def take(self) -> StoreChanges:
        changes = StoreChanges(frozenset(self.models), self.complete)
        self.models = set()
        return changes

    def handled(self, models: frozenset[str]) -> None:
        self.acted.append(models)


class CountingStore(LocalStore):
    """The local store, saying what the watcher asked of it: ``store`` for a listing of the
    whole store, ``<model>`` for a listing of one model's releases."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked: list[str] = []
        self._whole = False

    def list_store(
        self, *, ignored: Callable[[str | None, IgnoredName], None] | None = None
    ) -> dict[str, list[ReleaseInfo]]:
        self.asked.append("store")
        self._whole = True
        try:
            return super().list_store(ignored=ignored)
        finally:
            self._whole = False

    def list_releases(
        self, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
    ) -> list[ReleaseInfo]:
        if not self._whole:
            self.asked.append(model)
        return super().list_releases(model, ignored=ignored)


def _watcher(
    service: DeployService,
    parts: Parts,
    events: FakeEvents,
    *,
    auto_deploy: bool = False,
    store: LocalStore | None = None,
) -> ReleaseWatcher:
    return release_watcher(
        service,
        parts,
        auto_deploy=lambda _model: auto_deploy,
        interval=1.0,
        events=events,
        full_scan_every=FULL_SCAN,
        store=store or parts.store,
    )


def test_a_beat_lists_only_the_models_the_events_name(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            for model in ("a", "b", "c"):
                write_scale_release(parts.store_path, model, "r1", k=1.0)
            events = FakeEvents()
            watcher = _watcher(service, parts, events)
            first = await watcher.scan()  # the first beat lists everything
            assert (first.full, first.listed) == (True, ["a", "b", "c"])

            write_scale_release(parts.store_path, "b", "r2", k=2.0)
            events.name("b")
            beat = await watcher.scan()
            quiet = await watcher.scan()

            assert (beat.full, beat.listed) == (False, ["b"])
            assert [(r.model, r.name) for r in beat.new] == [("b", "r2")]
            assert (quiet.full, quiet.listed, quiet.new) == (False, [], [])
            assert [r.name for r in await parts.repos.releases.seen("b")] == ["r1", "r2"]

    asyncio.run(scenario())


def test_a_full_scan_is_one_listing_of_the_store_and_a_quiet_beat_lists_nothing(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            for model in ("a", "b", "c"):
                write_scale_release(parts.store_path, model, "r1", k=1.0)
            store = CountingStore(parts.store_path)
            events = FakeEvents()
            watcher = _watcher(service, parts, events, store=store)

            first = await watcher.scan()
            events.name("c")
            await watcher.scan()
            for _ in range(3):
                await watcher.scan()
            parts.clock.advance(FULL_SCAN)
            due = await watcher.scan()

            assert first.listed == due.listed == ["a", "b", "c"]
            assert due.full
            assert store.asked == ["store", "c", "store"]

    asyncio.run(scenario())


def test_a_release_whose_event_was_missed_is_seen_at_the_next_full_scan(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "a", "r1", k=1.0)
            events = FakeEvents()
            watcher = _watcher(service, parts, events)
            await watcher.scan()

            write_scale_release(parts.store_path, "a", "r2", k=2.0)  # the kernel drops its event
            unseen = await watcher.scan()
            parts.clock.advance(FULL_SCAN - 1)
            still = await watcher.scan()
            parts.clock.advance(1)
            full = await watcher.scan()

            assert (unseen.new, still.new) == ([], [])
            assert full.full
            assert [(r.model, r.name) for r in full.new] == [("a", "r2")]

    asyncio.run(scenario())


def test_without_trusted_events_every_beat_lists_the_whole_store(tmp_path: Path) -> None:
    """What a network filesystem, a broken watch or an S3 store gets: full scans, as before."""

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "a", "r1", k=1.0)
            events = FakeEvents(complete=False)
            watcher = _watcher(service, parts, events)
            await watcher.scan()

            write_scale_release(parts.store_path, "a", "r2", k=2.0)  # no event: an NFS peer
            beat = await watcher.scan()

            assert beat.full
            assert [r.name for r in beat.new] == ["r2"]

    asyncio.run(scenario())


def test_models_named_by_events_come_and_go_in_the_list_of_models(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "old", "r1", k=1.0)
            events = FakeEvents()
            watcher = _watcher(service, parts, events)
            status = status_service(service, parts, catalog=watcher.catalog)
            await watcher.scan()

            write_scale_release(parts.store_path, "new", "r1", k=1.0)
            shutil.rmtree(parts.store_path / "old")
            events.name("old", "new", "not..a-model")
            beat = await watcher.scan()
            page = await status.list_models()

            assert not beat.full
            assert [view.name for view in page.models] == ["new"]
            assert [r.name for r in page.models[0].releases] == ["r1"]

    asyncio.run(scenario())


def test_an_auto_deploy_that_waits_for_a_retry_is_looked_at_without_an_event(
    tmp_path: Path,
) -> None:
    """A model busy with another operation when its new release was seen is tried again at
    the next beat, though nothing in its dir changes again."""

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            events = FakeEvents()
            watcher = _watcher(service, parts, events, auto_deploy=True)
            await watcher.scan()
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            events.name("m")
            claim = await parts.runner.claim("m", REFUSE)  # an operation of ours holds it
            try:
                busy = await watcher.scan()
            finally:
                parts.runner.release("m", claim)
            retried = await watcher.scan()  # no event names m this time

            assert (busy.listed, busy.deploys) == (["m"], [])
            assert retried.listed == ["m"]
            assert [op.release for op in retried.deploys] == ["r1"]
            assert (await service.wait(retried.deploys[0].id)).status.value == "succeeded"

    asyncio.run(scenario())
