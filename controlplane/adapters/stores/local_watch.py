"""Filesystem events for the local store, so the watcher reacts without waiting to poll.

Events only wake the watcher, which then lists the store as usual: a missed or coalesced event
costs at most one poll interval, never a missed release. If inotify is not available (too many
watches, a network filesystem), polling alone carries on.

This runs as a supervised job, which must not end before shutdown: a store that does not exist
yet is looked for every few seconds (and watched once it appears), and a store whose events are
unavailable leaves the job idle rather than ended.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from watchfiles import Change, DefaultFilter, awatch

from controlplane.domain.fleet import RESERVED_PREFIX

log = logging.getLogger(__name__)
APPEAR_POLL = 2.0  # s between looks for a store dir that does not exist (yet)


async def watch_local_store(
    root: Path, wake: asyncio.Event, appear_poll: float = APPEAR_POLL
) -> None:
    while True:
        if not await asyncio.to_thread(root.is_dir):
            log.warning(
                "store %s does not exist; no release can be found until it does (create it, "
                "or fix store.uri); looking for it every %g s",
                root,
                appear_poll,
            )
            while True:  # a dir has no event to wait for before it exists: look again
                await asyncio.sleep(appear_poll)
                if await asyncio.to_thread(root.is_dir):
                    break
            log.info("store %s is there now; watching it for new releases", root)
            wake.set()
        try:
            releases = _ReleasesOnly(root)
            async for _changes in awatch(
                root, watch_filter=releases, debounce=200, recursive=True, force_polling=False
            ):
                wake.set()
        except (OSError, RuntimeError) as exc:
            log.warning("filesystem events unavailable for %s (%s); polling only", root, exc)
            await asyncio.Event().wait()  # nothing left to do, but a job runs until shutdown
        # The watch ended (the store dir went away): look for it again, after a pause, so a
        # watch that keeps ending at once cannot spin.
        wake.set()
        await asyncio.sleep(appear_poll)


class _ReleasesOnly(DefaultFilter):
    """Changes to releases, not to the fleet's records: every member's heartbeat is written
    under ``_controlplane/`` every few seconds, and must not wake the release watcher."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self._reserved = str(root / RESERVED_PREFIX)

    def __call__(self, change: Change, path: str) -> bool:
        if path == self._reserved or path.startswith(self._reserved + "/"):
            return False
        return super().__call__(change, path)
