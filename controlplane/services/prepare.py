"""Getting a release ready to place: fetch it into staging, verify it, finalize it.

Shared by every strategy: the result is a complete, verified, fsynced model dir in staging
whose ``config.pbtxt`` names ``target`` (the model itself, or a blue-green slot), which nothing
else has seen yet. Steps ``fetch`` and ``verify`` are recorded on the operation, after
``signature`` when a keyring is set or a signature required (:mod:`.signing`): then nothing but
``SHA256SUMS`` and its signature is read before the signature is checked, and the manifest the
fetch works from is parsed from the very bytes that were verified. ``SHA256SUMS`` is read once
before the fetch; the copy the fetch writes must have the same bytes (else ``release_changed``).

Nothing is copied before the store's listing has been checked: only the files ``SHA256SUMS``
lists are fetched (a listing with others is refused, naming them), and their sizes must fit
under ``store.max_release_bytes`` and in the staging filesystem's free space, counting only
what the content cache does not already hold. The figures go into the fetch step's detail.
The cache gives a file only if its entry has the size the listing gives and the bytes its name
says, and the store vouches that its file holds those bytes (a listed version the cache saw
hold them, or :meth:`~controlplane.ports.ModelStore.confirm`; ``adapters/staging/cache.py``);
the others are fetched, so a store whose file differs from ``SHA256SUMS`` is refused on every
host, whatever its cache holds.

The fetch runs in a worker thread with a cancel signal: when this task is cancelled
(shutdown, an operation cut short) the signal is set and the thread is waited for, so no
thread writes into staging after the operation's dir is cleaned up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from controlplane.domain.checksums import MANIFEST_NAME, decode_manifest, select_files
from controlplane.domain.disk import room_for
from controlplane.domain.errors import ReleaseChanged, ReleaseIncomplete
from controlplane.ports import (
    FetchedRelease,
    ModelConfigEditor,
    ModelStore,
    ModelSummary,
    ReleaseMarker,
    Staging,
)
from controlplane.services.signing import CheckedManifest, SignaturePolicy, check_signature
from controlplane.services.tracker import OperationTracker

log = logging.getLogger(__name__)
T = TypeVar("T")
CANCEL_GRACE_SECONDS = 5.0  # for a cancelled fetch to stop (the runner waits 10 s at shutdown)


@dataclass(frozen=True)
class PreparedRelease:
    path: Path
    summary: ModelSummary
    size_bytes: int


async def prepare_release(
    tracker: OperationTracker,
    *,
    store: ModelStore,
    staging: Staging,
    editor: ModelConfigEditor,
    require_checksums: bool,
    model: str,
    release: str,
    target: str,
    revision: str | None = None,
    max_release_bytes: int | None = None,
    signatures: SignaturePolicy | None = None,
) -> PreparedRelease:
    op = tracker.operation
    checked: CheckedManifest | None = None
    if signatures is not None and signatures.applies(model):
        checked = await check_signature(
            tracker, store=store, policy=signatures, model=model, release=release
        )
    async with tracker.step("fetch"):
        op_dir = await asyncio.to_thread(staging.create, op.id)
        dest = staging.release_dir(op_dir)
        if checked is None:
            checked = CheckedManifest(await _manifest_bytes(store, model, release), None)
        manifest = None
        if checked.manifest is not None:
            manifest = decode_manifest(checked.manifest, f"{model}/{release}")
        if manifest is None and require_checksums:
            raise ReleaseIncomplete(f"release {release!r} lost its SHA256SUMS before the fetch")
        listing = await asyncio.to_thread(store.list_files, model, release)
        plan = listing.only(select_files(manifest, listing.sizes))
        # Cancellable: an entry this process has not hashed yet is hashed before it is linked.
        cached = await _stoppable(
            partial(staging.link_cached, dest, manifest, plan, confirm=partial(store.confirm, plan))
        )
        have = cached.linked
        free = await asyncio.to_thread(staging.free_bytes)
        room = room_for(plan.sizes, have, free=free, max_release_bytes=max_release_bytes)
        tracker.detail(**room.detail())
        room.check()
        fetched = await _stoppable(
            partial(
                store.fetch, plan, dest, manifest=manifest, have=have, progress=tracker.progress
            )
        )
        tracker.detail(
            files=len(fetched.files),
            bytes=fetched.bytes_total,
            bytes_fetched=fetched.bytes_fetched,
            files_cached=len(have),
            files_cache_refused=len(cached.refused),
            refetched=fetched.refetched,
            retries=fetched.retries,
        )

    async with tracker.step("verify"):
        if fetched.manifest is None and require_checksums:
            raise ReleaseIncomplete(f"release {release!r} lost its SHA256SUMS during fetch")
        if manifest is not None and (
            fetched.manifest != manifest or _digest(fetched, MANIFEST_NAME) != checked.digest
        ):
            raise ReleaseChanged(
                f"SHA256SUMS of release {release!r} changed during the download; "
                "it will be fetched again"
            )
        await asyncio.to_thread(staging.verify, dest, fetched.manifest, fetched.files)
        # Cache before the config is rewritten: the cache holds the published bytes.
        await asyncio.to_thread(staging.remember, dest, fetched.files, plan)
        summary = await asyncio.to_thread(editor.prepare, dest / "config.pbtxt", target)
        marker = ReleaseMarker(model=model, release=release, operation_id=op.id, revision=revision)
        await asyncio.to_thread(staging.finalize, dest, marker)
        tracker.detail(backend=summary.backend, checksums=fetched.manifest is not None)
    return PreparedRelease(path=dest, summary=summary, size_bytes=fetched.bytes_total)


@dataclass(frozen=True)
class Preparer:
    """The prepare step with what it needs (the store, staging, Triton's config schema)."""

    store: ModelStore
    staging: Staging
    editor: ModelConfigEditor
    require_checksums: bool = True
    max_release_bytes: int | None = None  # store.max_release_bytes; None: unbounded
    signatures: SignaturePolicy | None = None  # None: no keyring, no signature required

    async def prepare(
        self,
        tracker: OperationTracker,
        model: str,
        release: str,
        *,
        target: str,
        revision: str | None,
    ) -> PreparedRelease:
        """Fetch and verify ``release`` into staging, its config naming ``target``."""
        return await prepare_release(
            tracker,
            store=self.store,
            staging=self.staging,
            editor=self.editor,
            require_checksums=self.require_checksums,
            model=model,
            release=release,
            target=target,
            revision=revision,
            max_release_bytes=self.max_release_bytes,
            signatures=self.signatures,
        )


async def _manifest_bytes(store: ModelStore, model: str, release: str) -> bytes | None:
    files = await asyncio.to_thread(store.read_marker_files, model, release)
    return files.manifest


def _digest(fetched: FetchedRelease, rel: str) -> str | None:
    found = fetched.files.get(rel)
    return None if found is None else found.sha256


async def _stoppable(call: Callable[..., T]) -> T:
    """``call(cancel=<event>)`` in a worker thread. If this task is cancelled, set the event
    and give the thread a few seconds to stop before the cancellation goes on."""
    cancel = threading.Event()
    worker = asyncio.ensure_future(asyncio.to_thread(call, cancel=cancel))
    # Whatever the thread ends with once nobody awaits it, it has been seen.
    worker.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        return await asyncio.shield(worker)
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(Exception):
            _done, pending = await asyncio.wait([worker], timeout=CANCEL_GRACE_SECONDS)
            if pending:
                log.warning("a cancelled fetch did not stop within %.0f s", CANCEL_GRACE_SECONDS)
        raise
