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

The ``signature`` step: the release's ``SHA256SUMS`` is checked against the publisher's
signature before anything else of the release is fetched; the signature is over a statement
that names the model and the release too (:mod:`controlplane.domain.signatures`), so a signed
release copied under another name is refused. ``SHA256SUMS`` and
``SHA256SUMS.sig`` are read once, as bytes; the signature is checked over exactly those bytes,
and the manifest the fetch works from is parsed from them, so what was verified is what is
fetched (the fetch compares the ``SHA256SUMS`` it writes with these
bytes: one swapped in between is ``release_changed``). The rules:

* a signature is required for the model (``store.require_signature`` or its own
  ``require_signature``) and there is none: ``signature_missing``;
* there is one and a keyring is set: it must verify, required or not (a signature that does
  not verify is never ignored): ``signature_invalid``, ``signature_unbound`` (signed the old
  way, over ``SHA256SUMS`` alone) or ``unknown_signer`` otherwise;
* no signature and none required: the release deploys as it does without a keyring.

A refusal right after the release was republished (a new ``.sig`` uploaded before its new
``SHA256SUMS``) is told apart by reading both again: bytes that changed make it
``release_changed``, retried, instead of a refusal of the release.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from controlplane.domain.checksums import MANIFEST_NAME, decode_manifest, select_files
from controlplane.domain.disk import room_for
from controlplane.domain.errors import (
    ControlPlaneError,
    ReleaseChanged,
    ReleaseIncomplete,
    StoreUnavailable,
)
from controlplane.domain.operations import Step, StepStatus
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.signatures import missing, release_named
from controlplane.ports import (
    Clock,
    FetchedRelease,
    MarkerFiles,
    ModelConfigEditor,
    ModelStore,
    ModelSummary,
    ReleaseBook,
    ReleaseListing,
    ReleaseMarker,
    SignatureVerifier,
    Staging,
    Telemetry,
)
from controlplane.services.telemetry import NO_TELEMETRY
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
            checked = CheckedManifest(await _manifest_bytes(store, model, release), None)
        manifest = None
        if checked.manifest is not None:
            manifest = decode_manifest(checked.manifest, f"{model}/{release}")
        if manifest is None and require_checksums:
            raise ReleaseIncomplete(f"release {release!r} lost its SHA256SUMS before the fetch")
        fetched, plan = await _fetch(
            tracker, store, staging, dest, model, release, manifest, max_release_bytes
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


async def _fetch(
    tracker: OperationTracker,
    store: ModelStore,
    staging: Staging,
    dest: Path,
    model: str,
    release: str,
    manifest: dict[str, str] | None,
    max_release_bytes: int | None,
) -> tuple[FetchedRelease, ReleaseListing]:
    """The ``fetch`` step's work: the files the manifest lists, what the cache holds linked,
    the rest fetched once the room for it is checked; the figures in the step's detail."""
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
                f"release {release!r} of model {model!r} has no SHA256SUMS yet; the "
                "publisher writes it last, so the release is still being published (or "
                "set store.require_checksums: false to deploy releases without one)"
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


# --- the signature step ------------------------------------------------------------------


@dataclass(frozen=True)
class SignaturePolicy:
    """Whether each model needs a signature, and the keyring that checks them (None: no
    ``store.keyring``; then no model needs one, which the settings guarantee)."""

    verifier: SignatureVerifier | None = None
    required: Callable[[str], bool] = lambda _model: False
    telemetry: Telemetry = NO_TELEMETRY

    def applies(self, model: str) -> bool:
        """Whether a deploy of ``model`` has a signature step at all."""
        return self.verifier is not None or self.required(model)


@dataclass(frozen=True)
class CheckedManifest:
    """The bytes of ``SHA256SUMS`` as read (and verified, when there is a signer)."""

    manifest: bytes | None
    signer: str | None

    @property
    def digest(self) -> str | None:
        return None if self.manifest is None else hashlib.sha256(self.manifest).hexdigest()


async def check_signature(
    tracker: OperationTracker,
    *,
    store: ModelStore,
    policy: SignaturePolicy,
    model: str,
    release: str,
) -> CheckedManifest:
    """The ``signature`` step: read both files once, verify, record the signer."""
    async with tracker.step("signature"):
        files = await asyncio.to_thread(store.read_marker_files, model, release)
        try:
            signer = await _signer(policy, files, model, release)
        except ControlPlaneError as exc:
            again = await asyncio.to_thread(store.read_marker_files, model, release)
            if again != files:
                raise ReleaseChanged(
                    f"SHA256SUMS or SHA256SUMS.sig of {model}/{release} changed while they "
                    "were checked (the release is being republished); it will be checked again"
                ) from exc
            policy.telemetry.signature_refused(model, exc.code)
            raise
        tracker.detail(signed=files.signature is not None, signer=signer)
        if signer is not None:
            tracker.operation_detail({"signer": signer})
    return CheckedManifest(files.manifest, signer)


async def _signer(
    policy: SignaturePolicy, files: MarkerFiles, model: str, release: str
) -> str | None:
    where = release_named(model, release)
    if files.signature is None:
        if policy.required(model):
            raise missing(where)
        return None
    if files.manifest is None:
        if policy.required(model):
            raise ReleaseIncomplete(
                f"{where} has no SHA256SUMS, and a signature over it is required: publish "
                "SHA256SUMS.sig, then SHA256SUMS (the commit marker) last"
            )
        return None  # the fetch step says what it makes of a release without one
    if policy.verifier is None:
        return None  # no keyring (so none is required): nothing to check it with
    return await asyncio.to_thread(
        policy.verifier.verify_release, model, release, files.manifest, files.signature
    )


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
