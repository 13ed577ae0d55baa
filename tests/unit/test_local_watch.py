"""The local store's events: which models changed, when they can be trusted, and a job that runs
until shutdown whatever the store dir does. Real inotify on a temp dir (watchfiles)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from controlplane.adapters.stores.local_watch import LocalStoreEvents, WatchState
from controlplane.adapters.stores.mounts import events_miss_remote_changes, filesystem_of
from controlplane.domain.checksums import MANIFEST_NAME
from tests.support.models import write_scale_release
from tests.support.polling import until

DEADLINE = 10.0
SETTLED_MS = 100  # the watch answers this often with or without events: LIVE soon after start


def _local(_root: Path) -> str:
    return "ext4"


class Wakes:
    """The watcher's wake-up, counted."""

    def __init__(self) -> None:
        self.count = 0
        self.event = asyncio.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()

    async def next(self, what: str) -> None:
        try:
            async with asyncio.timeout(DEADLINE):
                await self.event.wait()
        except TimeoutError:
            raise AssertionError(f"not woken within {DEADLINE} s: {what}") from None
        self.event.clear()


@asynccontextmanager
async def watching(
    root: Path, wakes: Wakes, filesystem: Callable[[Path], str | None] = _local
) -> AsyncIterator[LocalStoreEvents]:
    events = LocalStoreEvents(
        root, wakes, appear_poll=0.05, settled_ms=SETTLED_MS, filesystem=filesystem
    )
    job = asyncio.create_task(events.run())
    try:
        yield events
    finally:
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job


async def _live(events: LocalStoreEvents) -> None:
    await until(lambda: events.state is WatchState.LIVE, "the watch is set up", DEADLINE)
    first = events.take()
    assert not first.complete  # what happened before the watch was set up is unknown
    assert events.take().complete


def test_a_release_names_its_model_alone_once_the_watch_is_set_up(tmp_path: Path) -> None:
    write_scale_release(tmp_path, "a", "r1", k=1.0)
    write_scale_release(tmp_path, "b", "r1", k=1.0)

    async def scenario() -> None:
        wakes = Wakes()
        async with watching(tmp_path, wakes) as events:
            await _live(events)

            write_scale_release(tmp_path, "b", "r2", k=2.0)
            await wakes.next("a release published in b")
            await until(lambda: events.take().models == {"b"}, "b named", DEADLINE)

            changes = events.take()
            assert (changes.models, changes.complete) == (frozenset(), True)

    asyncio.run(scenario())


def test_the_fleet_records_and_a_release_s_files_name_no_model(tmp_path: Path) -> None:
    """Heartbeats are written under _controlplane/ every few seconds by every member, and a
    release's files are copied in one by one: neither says anything a listing would show."""
    write_scale_release(tmp_path, "m", "r1", k=1.0)
    write_scale_release(tmp_path, "z", "r1", k=1.0)

    async def scenario() -> None:
        wakes = Wakes()
        async with watching(tmp_path, wakes) as events:
            await _live(events)
            members = tmp_path / "_controlplane" / "members"
            members.mkdir(parents=True)
            (members / "pod-1.json").write_text("{}")
            (tmp_path / "m" / "r1" / "1" / "model.py").write_text("# copied in\n")
            marker = tmp_path / "z" / "r1" / MANIFEST_NAME
            marker.write_text(marker.read_text() + "\n")  # what does name a model

            await wakes.next("the marker of z/r1 rewritten")
            changes = events.take()

            assert changes.models == {"z"}
            assert changes.complete

    asyncio.run(scenario())


def test_a_misnamed_model_dir_names_no_model_but_asks_for_a_listing_of_the_models(
    tmp_path: Path,
) -> None:
    """A dir at the store's top whose name is no model's may be a misnamed model: the watcher
    lists the models once to report it. A hidden dir is no such thing."""

    async def scenario() -> None:
        wakes = Wakes()
        async with watching(tmp_path, wakes) as events:
            await _live(events)
            (tmp_path / ".staging").mkdir()
            (tmp_path / "m").mkdir()
            await wakes.next("m made")
            await until(lambda: events.take().models == {"m"}, "m named", DEADLINE)
            assert not events.take().others

            (tmp_path / "Bad Name").mkdir()
            await wakes.next("a misnamed model dir made")
            changes = events.take()

            assert (changes.models, changes.complete, changes.others) == (frozenset(), True, True)
            assert not events.take().others  # said once, as the models are

    asyncio.run(scenario())


def test_the_watch_is_trusted_while_heartbeats_keep_its_timeout_from_answering(
    tmp_path: Path,
) -> None:
    """Each member writes its heartbeat every few seconds: the watch then always has events,
    all filtered out, and never times out. It must still count as set up."""
    members = tmp_path / "_controlplane" / "members"
    members.mkdir(parents=True)

    async def scenario() -> None:
        events = LocalStoreEvents(tmp_path, Wakes(), settled_ms=3_600_000, filesystem=_local)
        job = asyncio.create_task(events.run())
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE
            beat = 0
            while events.state is not WatchState.LIVE:
                assert loop.time() < deadline, "never trusted while heartbeats were written"
                (members / "pod-1.json").write_text(f'{{"beat": {beat}}}')
                beat += 1
                await asyncio.sleep(0.05)
        finally:
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                await job

    asyncio.run(scenario())


def test_a_model_removed_and_a_model_moved_in_are_named(tmp_path: Path) -> None:
    write_scale_release(tmp_path, "gone", "r1", k=1.0)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    write_scale_release(elsewhere, "new", "r1", k=1.0)
    store = tmp_path / "store"
    store.mkdir()
    shutil.move(tmp_path / "gone", store / "gone")

    async def scenario() -> None:
        wakes = Wakes()
        async with watching(store, wakes) as events:
            await _live(events)
            shutil.rmtree(store / "gone")
            (elsewhere / "new").rename(store / "new")

            await until(lambda: events.take().models == {"gone", "new"}, "both named", DEADLINE)
            # A dir moved in is watched too: a release published into it later is named.
            write_scale_release(store, "new", "r2", k=2.0)
            await until(lambda: "new" in events.take().models, "new/r2 named", DEADLINE)

    asyncio.run(scenario())


def test_a_store_that_does_not_exist_yet_is_watched_once_it_appears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing store dir used to end the job at once, and the supervisor restarted it
    every few seconds, logging an error each time."""

    async def scenario() -> None:
        root = tmp_path / "store"
        wakes = Wakes()
        async with watching(root, wakes) as events:
            await until(
                lambda: any("looking for it every" in m for m in caplog.messages),
                "the job said it looks for the store dir",
            )
            assert not events.take().complete
            root.mkdir()
            await wakes.next("the store dir appeared")
            await _live(events)
            write_scale_release(root, "m", "r1", k=1.0)
            await until(lambda: "m" in events.take().models, "m named", DEADLINE)

    asyncio.run(scenario())


def test_a_store_dir_made_again_is_watched_again_and_not_trusted_in_between(
    tmp_path: Path,
) -> None:
    """inotify watches the dir's inode: a store dir deleted and made again under the same
    name would raise no event at all if the old watch were kept."""
    root = tmp_path / "store"
    write_scale_release(root, "m", "r1", k=1.0)

    async def scenario() -> None:
        wakes = Wakes()
        async with watching(root, wakes) as events:
            await _live(events)
            shutil.rmtree(root)
            await until(lambda: events.state is not WatchState.LIVE, "the watch ended", DEADLINE)
            assert not events.take().complete

            write_scale_release(root, "m", "r1", k=1.0)
            await until(lambda: events.state is WatchState.LIVE, "watched again", DEADLINE)
            assert not events.take().complete  # the time without a watch is unknown
            write_scale_release(root, "m", "r2", k=2.0)
            await until(lambda: "m" in events.take().models, "m/r2 named", DEADLINE)

    asyncio.run(scenario())


def test_events_on_a_network_filesystem_are_never_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On NFS a release published from another host raises no event here, while every call to
    watch succeeds: every beat must stay a full scan."""
    write_scale_release(tmp_path, "m", "r1", k=1.0)

    async def scenario() -> None:
        wakes = Wakes()
        async with watching(tmp_path, wakes, filesystem=lambda _root: "nfs4") as events:
            await until(lambda: events.state is WatchState.UNTRUSTED, "untrusted", DEADLINE)
            write_scale_release(tmp_path, "m", "r2", k=2.0)
            for _ in range(3):
                assert not events.take().complete
            assert "nfs4" in (events.why or "")
            assert any("every beat lists the whole store" in m for m in caplog.messages)

    asyncio.run(scenario())


MOUNTINFO = "\n".join(
    [
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
        "40 22 0:35 / /mnt/models rw,relatime shared:20 - nfs4 server:/export rw,vers=4.1",
        r"41 40 0:36 / /mnt/models/local\040disk rw shared:21 - xfs /dev/sdb1 rw",
        "42 22 0:37 / /mnt/bucket rw,nosuid - fuse.gcsfuse models rw,user_id=0",
        "43 22 0:38 / /data rw master:3 unbindable - ext4 /dev/sdc1 rw",
    ]
)


@pytest.mark.parametrize(
    ("path", "fstype", "untrusted"),
    [
        ("/srv/store", "ext4", False),
        ("/mnt/models", "nfs4", True),
        ("/mnt/models/prod", "nfs4", True),
        ("/mnt/models/local disk/prod", "xfs", False),
        ("/mnt/modelsx/prod", "ext4", False),  # a sibling that shares a prefix
        ("/mnt/bucket/prod", "fuse.gcsfuse", True),
        ("/data/store", "ext4", False),  # optional fields before the separator
    ],
)
def test_the_filesystem_of_a_path_is_its_deepest_mount(
    path: str, fstype: str, untrusted: bool
) -> None:
    found = filesystem_of(Path(path), MOUNTINFO)

    assert found == fstype
    assert events_miss_remote_changes(found) is untrusted
