"""One release dir on a publisher's disk, seen as a store that holds that one release: what
``controlplane release check`` runs a deploy's own fetch and verification against.

It is the local store (:class:`~.local.LocalStore`) with the release found at the dir given
rather than at ``<root>/<model>/<release>``, so the listing, the refusal of symlinks and
special files, the reading of ``SHA256SUMS`` and the copy into staging are the daemon's own.
A release about to be published has no ``SHA256SUMS`` yet: the one the publisher will upload
(``manifest``) is then shown as if it were in the dir, and written into staging by the fetch
beside the copied files, so the check sees the release exactly as a member will. Nothing is
ever written into the dir itself.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from controlplane.adapters.stores.local import LocalStore
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest, decode_manifest
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.ports import (
    FetchedRelease,
    FetchProgress,
    MarkerFiles,
    ReleaseListing,
    StoredFile,
)


class ReleaseDirStore(LocalStore):
    """The release ``release`` of ``model`` at ``path``, and nothing else."""

    def __init__(self, path: Path, model: str, release: str, *, manifest: bytes | None) -> None:
        super().__init__(path.parent)
        self._path = path
        self._model = validate_model_name(model)
        self._release = validate_release_name(release)
        # The SHA256SUMS the publisher will write, when the dir has none of its own.
        self._manifest = manifest

    @property
    def uri(self) -> str:
        return self._path.as_uri()

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        files = super().read_marker_files(model, release)
        if self._manifest is None:
            return files
        return replace(files, manifest=self._manifest)

    def list_files(self, model: str, release: str) -> ReleaseListing:
        listing = super().list_files(model, release)
        if self._manifest is None:
            return listing
        files = {**listing.files, MANIFEST_NAME: StoredFile(size=len(self._manifest))}
        return replace(listing, files=files)

    def fetch(
        self,
        listing: ReleaseListing,
        dest: Path,
        *,
        manifest: Mapping[str, str] | None,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> FetchedRelease:
        if self._manifest is None or MANIFEST_NAME not in listing.files:
            return super().fetch(
                listing, dest, manifest=manifest, have=have, progress=progress, cancel=cancel
            )
        files = {rel: stored for rel, stored in listing.files.items() if rel != MANIFEST_NAME}
        fetched = super().fetch(
            replace(listing, files=files),
            dest,
            manifest=manifest,
            have=have,
            progress=progress,
            cancel=cancel,
        )
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / MANIFEST_NAME
        target.write_bytes(self._manifest)
        os.chmod(target, 0o644)
        written = FileDigest(len(self._manifest), hashlib.sha256(self._manifest).hexdigest())
        return replace(
            fetched,
            manifest=decode_manifest(target.read_bytes(), f"{listing.model}/{listing.release}"),
            files={**fetched.files, MANIFEST_NAME: written},
            bytes_total=fetched.bytes_total + written.size,
        )

    def _release_dir(self, model: str, release: str) -> Path:
        if (validate_model_name(model), validate_release_name(release)) != (
            self._model,
            self._release,
        ):
            return super()._release_dir(model, release)  # not this one: not in the store
        return self._path
