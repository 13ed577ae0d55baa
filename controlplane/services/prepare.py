"""Getting a release ready to place: fetch it into staging, verify it, finalize it.

Shared by every strategy: the result is a complete, verified, fsynced model dir in staging
whose ``config.pbtxt`` names ``target`` (the model itself, or a blue-green slot), which nothing
else has seen yet. Steps ``fetch`` and ``verify`` are recorded on the operation, after
``signature`` when a keyring is set or a signature required (below): then nothing but
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

The ``signature`` step (:mod:`.signature_step`) checks the release's ``SHA256SUMS.sig`` and
its ``model.sig`` (OpenSSF Model Signing) before anything else of the release is fetched, and
hands over the manifest the fetch works from: ``SHA256SUMS`` as read, or, for a release signed
with Model Signing alone, the files its ``model.sig`` lists (such a release needs no
``SHA256SUMS``; ``model.sig`` is never copied, like ``SHA256SUMS.sig``).
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

from controlplane.domain.checksums import MANIFEST_NAME, select_files
from controlplane.domain.disk import room_for
from controlplane.domain.errors import (
    ReleaseChanged,
    ReleaseIncomplete,
    StoreUnavailable,
)
from controlplane.domain.operations import Step, StepStatus
from controlplane.domain.releases import ReleaseInfo
from controlplane.ports import (
    Clock,
    FetchedRelease,
    ModelConfigEditor,
    ModelStore,
    ModelSummary,
    ReleaseBook,
    ReleaseListing,
    ReleaseMarker,
    Staging,
)
from controlplane.services.signature_step import (
    CheckedManifest,
    check_signature,
    read_unchecked,
)
from controlplane.services.signature_step import (  # re-exported: callers build it with a Preparer
    SignaturePolicy as SignaturePolicy,
)
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
        dest = staging.release_dir(await asyncio.to_thread(staging.create, op.id))
        if checked is None:
            checked = await read_unchecked(store, model, release)
        manifest = checked.files(f"{model}/{release}")
        if manifest is None and require_checksums:
            raise ReleaseIncomplete(
                f"release {release!r} lost its SHA256SUMS (or model.sig) before the fetch"
            )
        fetched, plan = await _fetch(
            tracker, store, staging, dest, model, release, manifest, checked, max_release_bytes
        )

    async with tracker.step("verify"):
        sums = checked.manifest is not None  # else the manifest is model.sig's, or none
        if fetched.manifest is None and require_checksums and sums:
            raise ReleaseIncomplete(f"release {release!r} lost its SHA256SUMS during fetch")
        if sums and (
            fetched.manifest != manifest or _digest(fetched, MANIFEST_NAME) != checked.digest
        ):
            raise ReleaseChanged(
                f"SHA256SUMS of release {release!r} changed during the download; "
                "it will be fetched again"
            )
        expected = fetched.manifest if sums or manifest is None else manifest
        await asyncio.to_thread(
            partial(staging.verify, named=checked.named), dest, expected, fetched.files
        )
        # Cache before the config is rewritten: the cache holds the published bytes.
        await asyncio.to_thread(staging.remember, dest, fetched.files, plan)
        summary = await asyncio.to_thread(editor.prepare, dest / "config.pbtxt", target)
        marker = ReleaseMarker(model=model, release=release, operation_id=op.id, revision=revision)
        await asyncio.to_thread(staging.finalize, dest, marker)
        tracker.detail(backend=summary.backend, checksums=fetched.manifest is not None)
    return PreparedRelease(path=dest, summary=summary, size_bytes=fetched.bytes_total)


async def _fetch(
    tracker: OperationTracker,
    store: ModelStore,
    staging: Staging,
    dest: Path,
    model: str,
    release: str,
    manifest: dict[str, str] | None,
    checked: CheckedManifest,
    max_release_bytes: int | None,
) -> tuple[FetchedRelease, ReleaseListing]:
    """The ``fetch`` step's work: the files the manifest lists, what the cache holds linked,
    the rest fetched once the room for it is checked; the figures in the step's detail."""
    listing = await asyncio.to_thread(store.list_files, model, release)
    with_sums = checked.manifest is not None or manifest is None
    chosen = select_files(manifest, listing.sizes, with_sums=with_sums, named=checked.named)
    plan = listing.only(chosen)
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
        partial(store.fetch, plan, dest, manifest=manifest, have=have, progress=tracker.progress)
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
    return fetched, plan


@dataclass(frozen=True)
class Preparer:
    """The prepare step with what it needs (the store, staging, Triton's config schema)."""

    store: ModelStore
    staging: Staging
    editor: ModelConfigEditor
    require_checksums: bool = True
    max_release_bytes: int | None = None  # store.max_release_bytes; None: unbounded
    signatures: SignaturePolicy | None = None  # None: no keyring, no signature required

    async def resolve(
        self, model: str, release: str, book: ReleaseBook, clock: Clock, *, patient: bool
    ) -> tuple[Step, ReleaseInfo]:
        """The ``resolve`` check, made before an operation is recorded: the release exists and
        is complete; else a refusal, and no operation.

        A store that does not answer is tried again by the store's own retry policy: for a
        few seconds, then a refusal that says to retry; ``patient``, for as long as a fetch
        would be (``store.retry_seconds``), since the caller waits for the operation anyway."""
        started = clock.now()
        try:
            info = await asyncio.to_thread(self.store.describe, model, release, patient=patient)
        except StoreUnavailable as exc:
            if patient:
                raise
            raise store_away(self.store.uri, exc) from exc
        await book.record([info], clock.now())
        if not info.complete and self.require_checksums:
            raise ReleaseIncomplete(
                f"release {release!r} of model {model!r} has no SHA256SUMS (nor model.sig) "
                "yet; the publisher writes it last, so the release is still being published "
                "(or set store.require_checksums: false to deploy releases without one)"
            )
        step = Step(
            name="resolve",
            status=StepStatus.SUCCEEDED,
            started_at=started,
            finished_at=clock.now(),
            detail={"store": self.store.uri, "complete": info.complete},
        )
        return step, info

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


def store_away(where: str, exc: StoreUnavailable) -> StoreUnavailable:
    """The refusal of a request that does not wait, when the store did not answer a check
    made before its operation is recorded (within the scans' few seconds)."""
    named = exc.message.startswith(f"the store {where}")  # it says so itself
    said = exc.message if named else f"the store {where} is away: {exc.message}"
    return StoreUnavailable(
        f"{said}; nothing was started. Retry in a few seconds; asked with wait, a deploy "
        "rides out an S3 outage of up to store.retry_seconds",
        details=exc.details,
    )
