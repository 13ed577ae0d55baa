"""Filesystem events for the local store: which models changed, so a beat lists only those.

The watch wakes the release watcher as soon as a model's dir changes, and remembers which
models had events until the watcher :meth:`~LocalStoreEvents.take` s them. Only what a listing
shows wakes it: a model dir, a release dir, a release's ``SHA256SUMS`` or its signature; not
the files of a release being copied in, and never the fleet's records under
``_controlplane/``, which every member writes every few seconds.

When are events trusted (``complete``)? Only once the watch is set up (its first answer), and
only for the time it ran without a break: whatever happened before that, while the store dir
was missing, or after the watch failed, is unknown, so the next take says "not complete" and
the watcher lists everything. Events are not trusted at all on a network or FUSE filesystem
(:mod:`.mounts`: a release published from another host raises no event there) nor when inotify
cannot watch the store (too many dirs for ``fs.inotify.max_user_watches``): then every beat is
a full scan, as without events. inotify can still drop events without a word (its queue
overflows; watchfiles passes no overflow on), so the watcher also lists everything every
``store.full_scan_seconds``: a missed event delays a release until then, never loses it.

This runs as a supervised job, which must not end before shutdown: a store that does not exist
yet is looked for every few seconds (and watched once it appears), and a store whose events
cannot be trusted leaves the job idle rather than ended.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from pathlib import Path

from watchfiles import Change, awatch

from controlplane.adapters.stores.mounts import events_miss_remote_changes, filesystem_of
from controlplane.domain.checksums import MANIFEST_NAME, SIGNATURE_NAME
from controlplane.domain.errors import InvalidName
from controlplane.domain.fleet import RESERVED_PREFIX
from controlplane.domain.ignored import ignored_model
from controlplane.domain.names import validate_model_name
from controlplane.ports import Clock, StoreChanges
from controlplane.timing import SystemClock

log = logging.getLogger(__name__)
APPEAR_POLL = 2.0  # s between looks for a store dir that does not exist (yet)
SETTLED_MS = 5_000  # the watch's first answer, events or not, comes at most this late
STEP_MS = 200  # how often the watch thread looks for events (each look takes the GIL)


class WatchState(enum.Enum):
    WAITING = "waiting"  # the store dir is missing, or its watch is being set up
    LIVE = "live"  # events arrive: a beat lists only the models they name
    UNTRUSTED = "untrusted"  # no events to go by: every beat lists the whole store


class LocalStoreEvents:
    """The local store's events, as the release watcher reads them (a
    :class:`~controlplane.ports.ChangeEvents`); :meth:`run` is the job that watches."""

    def __init__(
        self,
        root: Path,
        wake: Callable[[], None],
        *,
        appear_poll: float = APPEAR_POLL,
        settled_ms: int = SETTLED_MS,
        filesystem: Callable[[Path], str | None] = filesystem_of,
        clock: Clock | None = None,
    ) -> None:
        self._clock: Clock = clock or SystemClock()
        self._root = root
        self._wake = wake
        self._appear_poll = appear_poll
        self._settled_ms = settled_ms
        self._filesystem = filesystem
        self._prefix = str(root).rstrip("/") + "/"
        self.state = WatchState.WAITING
        self.why: str | None = None  # why events are not trusted, when they are not
        self._changed: set[str] = set()
        self._others = False  # an entry that is no model's changed at the store's top
        self._missed = True  # events may have been missed since the last take

    def take(self) -> StoreChanges:
        changes = StoreChanges(
            frozenset(self._changed),
            complete=self.state is WatchState.LIVE and not self._missed,
            others=self._others,
        )
        self._changed = set()
        self._others = False
        self._missed = self.state is not WatchState.LIVE
        return changes

    def vouch(self) -> int | None:
        """Never: a directory store's desired state is a stat per model to read, and a fleet
        shares it over a network filesystem, whose changes made elsewhere no inotify hears."""
        return None

    def handled(self, models: frozenset[str]) -> None:
        """Nothing to do: an inotify event is not redelivered."""

    async def run(self) -> None:
        try:
            while True:
                await self._until_the_store_exists()
                fstype = await asyncio.to_thread(self._filesystem, self._root)
                if fstype is not None and events_miss_remote_changes(fstype):
                    await self._idle(
                        f"the store is on a {fstype} filesystem, where a release published from "
                        "another host raises no event"
                    )
                try:
                    await self._watch()
                except (OSError, RuntimeError) as exc:
                    await self._idle(f"its events are unavailable ({exc})")
                # The watch ended (the store dir itself changed): watch it again, after a pause,
                # so a watch that keeps ending at once cannot spin.
                self._lose(WatchState.WAITING)
                self._wake()
                await self._clock.sleep(self._appear_poll)
        finally:
            self._lose(WatchState.WAITING)  # stopped or failed: nothing is watched any more

    async def _watch(self) -> None:
        async for changes in awatch(
            self._root,
            watch_filter=self._shown_by_a_listing,
            debounce=200,
            step=STEP_MS,
            rust_timeout=self._settled_ms,
            yield_on_timeout=True,
            recursive=True,
            force_polling=False,
        ):
            self._set_up()
            if not changes:
                continue  # a timeout: nothing happened
            for _change, path in changes:
                if not path.startswith(self._prefix):
                    # The store dir itself was deleted, moved or changed: inotify watches an
                    # inode, so a store dir made again under the same name would go unseen.
                    return
                top = path[len(self._prefix) :].split("/", 1)[0]
                if _is_model(top):
                    self._changed.add(top)
                elif ignored_model(top, path) is not None:  # a misnamed model, maybe
                    self._others = True
            self._wake()

    async def _until_the_store_exists(self) -> None:
        if await asyncio.to_thread(self._root.is_dir):
            return
        log.warning(
            "store %s does not exist; no release can be found until it does (create it, "
            "or fix store.uri); looking for it every %g s",
            self._root,
            self._appear_poll,
        )
        while True:  # a dir has no event to wait for before it exists: look again
            await self._clock.sleep(self._appear_poll)
            if await asyncio.to_thread(self._root.is_dir):
                break
        log.info("store %s is there now; watching it for new releases", self._root)
        self._wake()

    async def _idle(self, why: str) -> None:
        """No events to trust: every beat lists the whole store, until shutdown."""
        self._lose(WatchState.UNTRUSTED)
        self.why = why
        log.warning(
            "store %s: %s; every beat lists the whole store (store.poll_interval_seconds)",
            self._root,
            why,
        )
        await asyncio.Event().wait()  # nothing left to do, but a job runs until shutdown

    def _set_up(self) -> None:
        """The watch answered (an event, filtered out or not, or a timeout): it is set up.
        What happened before is unknown, so the next take is still not complete (the
        watcher's next beat is a full scan)."""
        if self.state is not WatchState.LIVE:
            self.state = WatchState.LIVE
            self.why = None
            log.info("watching %s: a beat lists only the models that changed", self._root)

    def _lose(self, state: WatchState) -> None:
        self.state = state
        self._missed = True

    def _shown_by_a_listing(self, _change: Change, path: str) -> bool:
        """A change a listing could show: a model or release dir, a release's marker (or the
        store dir itself). Not a release's other files, nor the fleet's records."""
        # Called for every event the watch saw: proof that it is set up, even while events
        # come too often for its timeout to answer (heartbeats every few seconds).
        self._set_up()
        if not path.startswith(self._prefix):
            return path.rstrip("/") == self._prefix.rstrip("/")
        parts = path[len(self._prefix) :].split("/")
        if parts[0] == RESERVED_PREFIX:
            return False
        return len(parts) <= 2 or (len(parts) == 3 and parts[2] in MARKERS)


MARKERS = frozenset({MANIFEST_NAME, SIGNATURE_NAME})  # a release's files a listing shows


def _is_model(name: str) -> bool:
    """Whether a change below the store dir whose first part is ``name`` is a model's. The
    others (a stray file or dir) are not listed as a model: a listing of the models reports
    the dirs among them that look like misnamed ones (:mod:`controlplane.domain.ignored`)."""
    try:
        validate_model_name(name)
    except InvalidName:
        return False
    return True
