"""Getting a release ready to place: fetch it into staging, verify it, finalize it.

Shared by every strategy: the result is a complete, verified, fsynced model dir in staging
whose ``config.pbtxt`` names ``target`` (the model itself, or a blue-green slot), which nothing
else has seen yet. Steps ``fetch`` and ``verify`` are recorded on the operation.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from controlplane.domain.errors import ReleaseChanged, ReleaseIncomplete
from controlplane.ports import ModelConfigEditor, ModelStore, ModelSummary, ReleaseMarker, Staging
from controlplane.services.tracker import OperationTracker


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
) -> PreparedRelease:
    op = tracker.operation
    async with tracker.step("fetch"):
        op_dir = await asyncio.to_thread(staging.create, op.id)
        dest = staging.release_dir(op_dir)
        manifest = await asyncio.to_thread(store.read_manifest, model, release)
        have = await asyncio.to_thread(staging.link_cached, dest, manifest)
        fetched = await asyncio.to_thread(
            partial(store.fetch, have=have, progress=tracker.progress), model, release, dest
        )
        tracker.detail(
            files=len(fetched.files),
            bytes=fetched.bytes_total,
            bytes_fetched=fetched.bytes_fetched,
            files_cached=len(have),
        )

    async with tracker.step("verify"):
        if fetched.manifest is None and require_checksums:
            raise ReleaseIncomplete(f"release {release!r} lost its SHA256SUMS during fetch")
        if manifest is not None and fetched.manifest != manifest:
            raise ReleaseChanged(
                f"SHA256SUMS of release {release!r} changed during the download; "
                "it will be fetched again"
            )
        await asyncio.to_thread(staging.verify, dest, fetched.manifest, fetched.files)
        # Cache before the config is rewritten: the cache holds the published bytes.
        await asyncio.to_thread(staging.remember, dest, fetched.files)
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
        )
