"""Publishing a release into a directory store: ``<root>/<model>/<release>/``.

Each file is written as a fetch writes into staging (:func:`~.local_copy.copy_release`: a
temp file beside its target, hashed while written, renamed into place), then fsynced with its
dir, so a cut leaves whole files and temp files, never a half-written file under its name.
``SHA256SUMS`` goes last, written to a temp file and linked to its name (``link(2)`` fails
when the name exists, so a marker already there is never replaced), then the dir fsynced: a
member that sees the marker sees every file it lists.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Collection
from pathlib import Path

from controlplane.adapters.release_tree import regular_files
from controlplane.adapters.stores.local_copy import copy_release, file_version, holds
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest, safe_relpath
from controlplane.domain.errors import ChecksumMismatch, ReleaseExists, StoreError
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.ports import ReleaseListing, StoredFile

FILE_MODE = 0o644  # readable by the daemon, whichever user it runs as (mkstemp makes 0600)
DIR_MODE = 0o755


class LocalReleaseTarget:
    """A :class:`~controlplane.ports.ReleaseTarget` in the directory store at ``root``."""

    def __init__(self, root: Path, model: str, release: str) -> None:
        if not root.is_dir():
            raise StoreError(
                f"the store {root} is not a directory: create it (the daemon's store.uri "
                "points at it) or fix the path"
            )
        self._model = validate_model_name(model)
        self._release = validate_release_name(release)
        self._dir = root / self._model / self._release
        for path in (self._dir.parent, self._dir):
            if path.is_symlink():
                raise StoreError(f"{path} is a symlink; a store holds plain directories")

    @property
    def uri(self) -> str:
        return self._dir.as_uri()

    def committed(self) -> bool:
        return os.path.lexists(self._dir / MANIFEST_NAME)

    def clear_except(self, keep: Collection[str]) -> list[str]:
        if not self._dir.is_dir():
            return []
        removed = [rel for rel, _size in regular_files(self._dir) if rel not in keep]
        for rel in removed:
            (self._dir / rel).unlink()
        return removed

    def holds(self, rel: str, digest: FileDigest) -> bool:
        path = self._dir / safe_relpath(rel)
        try:
            info = os.lstat(path)
        except OSError:
            return False
        if info.st_size != digest.size:
            return False
        return holds(path, file_version(info), digest.sha256, None, rel)

    def put_file(self, rel: str, source: Path, digest: FileDigest) -> None:
        self._make_dirs(rel)
        listing = ReleaseListing(self._model, self._release, {rel: StoredFile(size=digest.size)})
        fetched = copy_release(
            _release_root(source, rel),
            listing,
            self._dir,
            manifest={rel: digest.sha256},
            have=None,
            progress=None,
            cancel=None,
            telemetry=None,
        )
        written = fetched.files[rel]
        target = self._dir / rel
        if written.sha256 != digest.sha256:
            target.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{rel} changed while it was published (its bytes no longer hash to what was "
                "checked); publish again once the release dir is no longer being written",
                details={"files": [rel]},
            )
        os.chmod(target, FILE_MODE)
        _fsync(target)
        _fsync(target.parent)

    def put_side_file(self, name: str, data: bytes) -> None:
        self._make_dirs(name)
        target = self._dir / safe_relpath(name)
        tmp = self._write_temp(target, data)
        os.replace(tmp, target)
        _fsync(self._dir)

    def commit(self, manifest: bytes) -> None:
        self._make_dirs(MANIFEST_NAME)
        target = self._dir / MANIFEST_NAME
        tmp = self._write_temp(target, manifest)
        try:
            os.link(tmp, target)  # fails if a marker is there: never replaced
        except FileExistsError:
            raise ReleaseExists(
                f"release {self._release!r} of model {self._model!r} was published at "
                f"{self.uri} while this publish ran (its {MANIFEST_NAME} appeared): a release "
                "is immutable, so publish this one under a new release name"
            ) from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync(self._dir)

    def _make_dirs(self, rel: str) -> None:
        """The release dir and the dirs of ``rel``, each fsynced into its parent once made."""
        wanted = self._dir.joinpath(*safe_relpath(rel).parts[:-1])
        missing = [p for p in [wanted, *wanted.parents] if p != p.parent and not p.exists()]
        for path in reversed(missing):
            path.mkdir(mode=DIR_MODE, exist_ok=True)
            _fsync(path.parent)

    def _write_temp(self, target: Path, data: bytes) -> Path:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(name, FILE_MODE)
        return Path(name)


def _release_root(source: Path, rel: str) -> Path:
    """The release dir ``source`` (a file of it, at ``rel``) is in."""
    root = source
    for _ in safe_relpath(rel).parts:
        root = root.parent
    return root


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
