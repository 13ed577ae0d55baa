"""Store entries left out for their names: the watcher logs each once, whatever the number of
scans, keeps them for the answers, and finds them at no cost beyond the listings it makes."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from controlplane.adapters.stores.local import LocalStore
from controlplane.domain.errors import ModelNotFound
from controlplane.domain.ignored import IgnoredName
from controlplane.ports import ModelStore, StoreChanges
from controlplane.services.catalog import KEPT_IGNORED
from controlplane.services.deploy import DeployService
from controlplane.services.status import StatusService
from controlplane.services.watcher import ReleaseWatcher
from tests.support.fakes import Parts, deploy_service, release_watcher, status_service
from tests.support.models import write_scale_release

IMG = "<img src=x onerror=alert(7)>"


class Events:
    """Scripted store events: the models named, and whether an entry that is no model's
    changed at the top."""

    def __init__(self) -> None:
        self.models: set[str] = set()
        self.others = False

    def take(self) -> StoreChanges:
        changes = StoreChanges(frozenset(self.models), complete=True, others=self.others)
        self.models, self.others = set(), False
        return changes

    def handled(self, models: frozenset[str]) -> None:
        """Nothing to acknowledge: these events are not kept anywhere."""


class CountingStore(LocalStore):
    """The local store, its listings of the models counted."""

    model_listings = 0

    def list_models(self, *, ignored: Callable[[IgnoredName], None] | None = None) -> list[str]:
        self.model_listings += 1
        return super().list_models(ignored=ignored)


def _watcher(
    service: DeployService,
    parts: Parts,
    *,
    store: ModelStore | None = None,
    events: Events | None = None,
) -> ReleaseWatcher:
    return release_watcher(service, parts, store=store or parts.store, interval=1.0, events=events)


def _status(service: DeployService, parts: Parts, watcher: ReleaseWatcher) -> StatusService:
    return status_service(service, parts, catalog=watcher.catalog)


def _misnamed(store: Path) -> None:
    write_scale_release(store, "m", "r1", k=1.0)
    write_scale_release(store, "m", "r 5", k=5.0)
    write_scale_release(store, "m", IMG, k=7.0)
    write_scale_release(store, "evil<b>x", "r1", k=1.0)
    (store / "only-misnamed" / "Release 1").mkdir(parents=True)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_each_ignored_entry_is_logged_once_across_scans_and_kept_for_the_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane")

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            _misnamed(parts.store_path)
            watcher = _watcher(service, parts)
            for _ in range(3):
                result = await watcher.scan()
                assert result.full

            store = parts.store_path
            assert sorted(_warnings(caplog)) == sorted(
                [
                    f"ignoring {store}/evil<b>x in the store: model name 'evil<b>x' is not "
                    "allowed: use letters, digits, '.', '_' and '-', start with a letter or "
                    "digit, and do not use '..'; rename it to be seen as a model (the naming "
                    "rules are in docs/store.md); this is logged once",
                    *(
                        f"ignoring {store}/{model}/{name} in the store: release name {name!r} "
                        "is not allowed: use letters, digits, '.', '_' and '-', start with a "
                        "letter or digit, and do not use '..'; rename it to be seen as a "
                        f"release of {model} (the naming rules are in docs/store.md); this is "
                        "logged once"
                        for model, name in (
                            ("m", "r 5"),
                            ("m", IMG),
                            ("only-misnamed", "Release 1"),
                        )
                    ),
                ]
            )
            status = _status(service, parts, watcher)
            page = await status.list_models()
            assert [e.name for e in page.ignored_models] == ["evil<b>x"]
            views = {view.name: view for view in page.models}
            assert [r.name for r in views["m"].releases] == ["r1"]
            assert [e.name for e in views["m"].ignored_releases] == [IMG, "r 5"]
            only = await status.get_model("only-misnamed")  # found: it has a release dir
            assert [e.name for e in only.ignored_releases] == ["Release 1"]
            assert not only.releases

            shutil.rmtree(store / "evil<b>x")
            shutil.rmtree(store / "m" / "r 5")
            await watcher.scan()
            page = await status.list_models()
            assert page.ignored_models == ()
            assert [e.name for e in {v.name: v for v in page.models}["m"].ignored_releases] == [IMG]
            assert len(_warnings(caplog)) == 4  # nothing new to say

    asyncio.run(scenario())


def test_a_model_with_nothing_but_stray_files_is_still_not_found(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            (parts.store_path / "m" / ".partial").mkdir(parents=True)
            watcher = _watcher(service, parts)
            await watcher.scan()
            with pytest.raises(ModelNotFound):
                await _status(service, parts, watcher).get_model("m")

    asyncio.run(scenario())


def test_the_answers_hold_at_most_the_first_entries_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane")

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            for i in range(KEPT_IGNORED + 20):
                (parts.store_path / f"Model {i:03d}").mkdir()
            watcher = _watcher(service, parts)
            await watcher.scan()

            page = await _status(service, parts, watcher).list_models()
            assert [e.name for e in page.ignored_models] == [
                f"Model {i:03d}" for i in range(KEPT_IGNORED)
            ]
            assert len(_warnings(caplog)) == KEPT_IGNORED + 20  # the log names each one

    asyncio.run(scenario())


def test_with_events_the_models_are_listed_only_when_a_stray_entry_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane")

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            events = Events()
            store = CountingStore(parts.store_path)
            watcher = _watcher(service, parts, store=store, events=events)
            await watcher.scan()  # the first beat is a full scan
            assert store.model_listings == 1

            write_scale_release(parts.store_path, "m", "r 2", k=2.0)
            events.models.add("m")
            beat = await watcher.scan()
            assert (beat.full, beat.listed, store.model_listings) == (False, ["m"], 1)
            listing = watcher.catalog.get("m")
            assert listing is not None
            assert [e.name for e in listing.ignored] == ["r 2"]

            (parts.store_path / "Bad Model").mkdir()
            events.others = True
            beat = await watcher.scan()
            assert (beat.full, beat.listed, store.model_listings) == (False, [], 2)
            assert [e.name for e in watcher.catalog.ignored_models] == ["Bad Model"]
            assert len(_warnings(caplog)) == 2

    asyncio.run(scenario())
