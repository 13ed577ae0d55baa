"""The local-directory model store: ``<root>/<model>/<release>/`` on a filesystem.

What the store holds is read here: its models, their releases (each release's revision from its
``SHA256SUMS``, hashed only when the marker changed: :mod:`.markers`), the markers' bytes and a
release's files with their versions. Copying a release into staging, and reading a file to
vouch for its bytes (:meth:`LocalStore.confirm`), are :mod:`.local_copy`'s. Symlinks and
special files are refused rather than followed: a release is plain files and dirs, nothing
that could point outside it.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from controlplane.adapters.release_tree import regular_files
from controlplane.adapters.stores.local_copy import copy_release, file_version, holds
from controlplane.adapters.stores.markers import MarkerRevisions, read_at_most
from controlplane.domain.checksums import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SIGNATURE_NAME,
    FileDigest,
    manifest_too_large,
    safe_relpath,
)
from controlplane.domain.errors import (
    ControlPlaneError,
    InvalidName,
    ModelNotFound,
    ReleaseNotFound,
    StoreUnavailable,
    UnsafeRelease,
)
from controlplane.domain.ignored import (
    IgnoredName,
    ignored_model,
    ignored_release,
    release_name_problem,
)
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.releases import ReleaseInfo, natural_key
from controlplane.domain.signatures import MAX_SIGNATURE_BYTES
from controlplane.ports import (
    FetchedRelease,
    FetchProgress,
    MarkerFiles,
    ReleaseListing,
    StoredFile,
    Telemetry,
)


class LocalStore:
    """A :class:`~controlplane.ports.ModelStore` over a directory (``file://`` URI)."""

    def __init__(
        self,
        root: Path,
        *,
        telemetry: Telemetry | None = None,
        markers: MarkerRevisions | None = None,
    ) -> None:
        self._root = root
        self._telemetry = telemetry
        self._markers = markers or MarkerRevisions()

    @property
    def uri(self) -> str:
        return self._root.as_uri()

    def close(self) -> None:
        return None

    def list_models(self, *, ignored: Callable[[IgnoredName], None] | None = None) -> list[str]:
        try:
            with os.scandir(self._root) as entries:
                found = [
                    (entry.name, entry.path)
                    for entry in entries
                    if entry.is_dir(follow_symlinks=False)
                ]
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing() from None
        names = []
        for name, path in found:
            if _is_model_name(name):
                names.append(name)
            elif ignored is not None and (left_out := ignored_model(name, path)) is not None:
                ignored(left_out)
        self._markers.forget_models_except(names)
        return sorted(names, key=natural_key)

    def list_releases(
        self, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
    ) -> list[ReleaseInfo]:
        # os.scandir, not Path.iterdir: the entry's type comes with the listing, so a release
        # costs one lstat (its marker's) per beat, and its marker is hashed only when changed.
        # A model dir that is a symlink is no model, as for list_models (a release event names
        # the model, and the watcher then lists it alone).
        model_dir = os.fspath(self._model_dir(model))
        try:
            if os.path.islink(model_dir):
                raise NotADirectoryError(model_dir)
            with os.scandir(model_dir) as entries:
                found = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            self._markers.keep_only(model, ())
            self._require_root()
            raise ModelNotFound(f"model {model!r} is not in the store {self.uri}") from None
        keyed = []
        for name in found:
            key = _release_key(name)
            if isinstance(key, str):  # why the name is no release's: not a release dir
                if ignored is not None:
                    # The listing's own path, as text: nothing is read below an invalid name.
                    where = f"{model_dir}/{name}"
                    if (left_out := ignored_release(name, key, where)) is not None:
                        ignored(left_out)
                continue
            info = self._markers.info(model, name, f"{model_dir}/{name}/{MANIFEST_NAME}")
            keyed.append((key, info))
        keyed.sort(key=lambda pair: pair[0])
        self._markers.keep_only(model, (info.name for _, info in keyed))
        return [info for _, info in keyed]

    def list_store(
        self, *, ignored: Callable[[str | None, IgnoredName], None] | None = None
    ) -> dict[str, list[ReleaseInfo]]:
        """The models, then each model's releases: a directory has no listing of the whole
        tree that would be cheaper (each model dir is read once either way)."""
        store: dict[str, list[ReleaseInfo]] = {}
        top = None if ignored is None else functools.partial(ignored, None)
        for model in self.list_models(ignored=top):
            under = None if ignored is None else functools.partial(ignored, model)
            try:
                store[model] = self.list_releases(model, ignored=under)
            except ModelNotFound:
                continue  # gone since the models were listed: it is not in the store
        return store

    def describe(self, model: str, release: str, *, patient: bool = False) -> ReleaseInfo:
        # A directory answers at once or not at all: nothing to wait for, patient or not.
        path = self._release_dir(model, release)
        if not path.is_dir() or path.is_symlink():
            self._require_root()
            raise ReleaseNotFound(
                f"release {release!r} of model {model!r} is not in the store {self.uri}"
            )
        return self._markers.info(model, release, os.fspath(path / MANIFEST_NAME))

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        where = f"{model}/{release}"
        release_dir = self._release_dir(model, release)
        manifest = _read_plain(release_dir / MANIFEST_NAME, MAX_MANIFEST_BYTES, where)
        if manifest is not None and len(manifest) > MAX_MANIFEST_BYTES:
            raise manifest_too_large((release_dir / MANIFEST_NAME).stat().st_size, where)
        signature = _read_plain(release_dir / SIGNATURE_NAME, MAX_SIGNATURE_BYTES, where)
        return MarkerFiles(manifest=manifest, signature=signature)

    def list_files(self, model: str, release: str) -> ReleaseListing:
        source = self._source(model, release)
        files = {}
        for rel, size in regular_files(source):
            try:
                version: str | None = file_version(os.lstat(source / rel))
            except FileNotFoundError:  # gone since the walk: the fetch says so
                version = None
            files[rel] = StoredFile(size=size, version=version)
        return ReleaseListing(model, release, files)

    def confirm(
        self,
        listing: ReleaseListing,
        rel: str,
        sha256: str,
        cancel: threading.Event | None = None,
    ) -> bool:
        stored = listing.files.get(rel)
        if stored is None:
            return False
        try:
            path = self._source(listing.model, listing.release) / safe_relpath(rel)
        except (ControlPlaneError, OSError):
            return False  # the fetch tells what is wrong
        return holds(path, stored.version, sha256, cancel, f"{listing.model}/{rel}")

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
        return copy_release(
            self._source(listing.model, listing.release),
            listing,
            dest,
            manifest=manifest,
            have=have,
            progress=progress,
            cancel=cancel,
            telemetry=self._telemetry,
        )

    def _source(self, model: str, release: str) -> Path:
        """The release dir, refused if it (or its model dir) is a symlink or is gone."""
        source = self._release_dir(model, release)
        if source.is_symlink() or source.parent.is_symlink():
            raise UnsafeRelease(
                f"release {release!r} of model {model!r} is a symlink in the store; "
                "publish plain directories"
            )
        if not source.is_dir():
            self._require_root()
            raise ReleaseNotFound(f"release {release!r} of model {model!r} is gone from the store")
        return source

    def _require_root(self) -> None:
        """A release or model that is not found because the store itself is not there says
        so: a typo in store.uri, or a share not mounted, is not an empty store."""
        if not self._root.is_dir():
            raise self._missing()

    def _missing(self) -> StoreUnavailable:
        return missing_store(self._root)

    def _model_dir(self, model: str) -> Path:
        return self._root / validate_model_name(model)

    def _release_dir(self, model: str, release: str) -> Path:
        return self._model_dir(model) / validate_release_name(release)


def _read_plain(path: Path, bound: int, where: str) -> bytes | None:
    """At most ``bound`` + 1 bytes of a plain file (never a symlink); None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeRelease(f"{path.name} of {where} is a symlink; ship plain files") from None
        raise
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None
        return read_at_most(stream, bound)


def missing_store(root: Path) -> StoreUnavailable:
    """A store dir that is not there: a typo in store.uri, or a share not mounted (yet), is
    neither an empty store nor a model that is not in it. Transient: a share can come back."""
    what = "is not a directory" if root.exists() else "does not exist"
    return StoreUnavailable(
        f"the store {root.as_uri()} {what} (store.uri): create it or fix the setting (or "
        "mount the share it is on)",
        details={"path": str(root)},
    )


@functools.lru_cache(maxsize=16384)
def _release_key(name: str) -> tuple[tuple[int, int | str], ...] | str:
    """The natural sort key of a valid release name; for a name that is not one, why not.

    Memoised: the watcher lists the same few thousand names on every beat, and validating and
    splitting each of them again was most of a beat's cost once markers were no longer hashed.
    """
    problem = release_name_problem(name)
    return problem if problem is not None else natural_key(name)


@functools.lru_cache(maxsize=4096)
def _is_model_name(name: str) -> bool:
    """Memoised as :func:`_release_key` is: the same names on every beat."""
    try:
        validate_model_name(name)
    except InvalidName:
        return False
    return True
