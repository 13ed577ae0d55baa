"""Filesystem events for the local store, so the watcher reacts without waiting to poll.

Events only wake the watcher, which then lists the store as usual: a missed or coalesced event
costs at most one poll interval, never a missed release. If inotify is not available (too many
watches, a network filesystem), this returns and polling alone carries on.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from watchfiles import awatch

log = logging.getLogger(__name__)


async def watch_local_store(root: Path, wake: asyncio.Event) -> None:
    if not await asyncio.to_thread(root.is_dir):
        log.warning("store %s does not exist yet; watching it by polling only", root)
        return
    try:
        async for _changes in awatch(root, debounce=200, recursive=True, force_polling=False):
            wake.set()
    except (OSError, RuntimeError) as exc:
        log.warning("filesystem events unavailable for %s (%s); polling only", root, exc)
