"""The local-directory model store: ``<root>/<model>/<release>/`` on a filesystem.

Fetching copies the files of a listing (what the service chose, with the sizes it checked
against free disk) one by one into the staging dir: each into a temp file beside its target,
hashed while written, never past its listed size, holding at most one chunk in memory, then
renamed into place. A file whose digest differs from ``SHA256SUMS`` is copied again, as the
S3 store fetches it again (an NFS mount or a failing disk can return bad bytes once), and
judged by :func:`~controlplane.domain.transfer.judge_fetches`. A file's version is its
device, inode, size and mtime (:func:`file_version`): a copy insists on the listed one, and
the content cache keeps the versions its entries were verified against; for a version it has
not seen, :meth:`LocalStore.confirm` reads the file and says whether it holds the entry's
bytes. Symlinks and special files are refused rather than followed: a release is plain files
and dirs, nothing that could point outside it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from controlplane.adapters.release_tree import regular_files
from controlplane.adapters.stores.markers import MarkerRevisions, read_at_most
from controlplane.adapters.stores.retries import report_refetch, unstable
from controlplane.domain.checksums import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SIGNATURE_NAME,
    FileDigest,
    decode_manifest,
    manifest_too_large,
    safe_relpath,
)
from controlplane.domain.errors import (
    ControlPlaneError,
    Interrupted,
    InvalidName,
    ModelNotFound,
    ReleaseChanged,
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
from controlplane.domain.transfer import Verdict, judge_fetches
from controlplane.ports import (
    FetchedRelease,
    FetchProgress,
    MarkerFiles,
    ReleaseListing,
    StoredFile,
    Telemetry,
)

CHUNK = 1024 * 1024


class LocalStore:
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

    def describe(self, model: str, release: str, *, patient: bool = False) -> ReleaseInfo:
        # A directory answers at once or not at all: nothing to wait for, patient or not.
        path = self._release_dir(model, release)
        if not path.is_dir() or path.is_symlink():
            self._require_root()
            raise ReleaseNotFound(
                f"release {release!r} of model {model!r} is not in the store {self.uri}"
            )
        return self._markers.info(model, release, os.fspath(path / MANIFEST_NAME))

    def read_manifest(self, model: str, release: str) -> dict[str, str] | None:
        path = self._release_dir(model, release) / MANIFEST_NAME
        if path.is_symlink():
            raise UnsafeRelease(f"{MANIFEST_NAME} of {model}/{release} is a symlink")
        try:
            with path.open("rb") as stream:
                data = read_at_most(stream, MAX_MANIFEST_BYTES)  # never more, whatever its size
        except (FileNotFoundError, IsADirectoryError):
            return None
        if len(data) > MAX_MANIFEST_BYTES:
            raise manifest_too_large(path.stat().st_size, f"{model}/{release}")
        return decode_manifest(data, f"{model}/{release}")

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
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except (ControlPlaneError, OSError):
            return False  # the fetch tells what is wrong
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or file_version(info) != stored.version:
                return False  # changed since it was listed: fetch it, and let the fetch judge
            digest = _hash_fd(fd, cancel or threading.Event(), f"{listing.model}/{rel}")
            return digest == sha256 and file_version(os.fstat(fd)) == stored.version
        finally:
            os.close(fd)

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
        source = self._source(listing.model, listing.release)
        stop = cancel or threading.Event()
        plan = sorted(listing.files.items())
        total = sum(stored.size for _, stored in plan)
        files: dict[str, FileDigest] = {rel: have[rel] for rel, _ in plan if have and rel in have}
        done_bytes = sum(digest.size for digest in files.values())
        fetched_bytes = 0
        refetched = 0
        for rel, stored in plan:
            if rel in files:
                continue
            if stop.is_set():
                raise Interrupted(f"the fetch of {listing.model}/{listing.release} was cancelled")
            expected = manifest.get(rel) if manifest is not None else None
            copy = _FileCopy(
                source / safe_relpath(rel),
                dest / safe_relpath(rel),
                size=stored.size,
                version=stored.version,
                what=f"{listing.model}/{listing.release}/{rel}",
                stop=stop,
            )
            digest = copy.run(expected, self._telemetry)
            files[rel] = digest
            done_bytes += digest.size
            fetched_bytes += copy.copied
            refetched += copy.fetches - 1
            if progress is not None:
                progress(FetchProgress(len(files), len(plan), done_bytes, total))
        fetched_manifest = None
        if MANIFEST_NAME in listing.files:
            fetched_manifest = decode_manifest(
                (dest / MANIFEST_NAME).read_bytes(), f"{listing.model}/{listing.release}"
            )
        return FetchedRelease(
            manifest=fetched_manifest,
            files=files,
            bytes_total=total,
            bytes_fetched=fetched_bytes,
            refetched=refetched,
            retries=refetched,
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


def file_version(info: os.stat_result) -> str:
    """A directory store's version of a file: its device, inode, size and mtime. Not ctime:
    hardlinking the file into a new release dir (``cp -al``) changes it, not the bytes."""
    return f"file:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"


def _hash_fd(fd: int, stop: threading.Event, what: str) -> str:
    sha = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        if stop.is_set():
            raise Interrupted(f"reading {what} was cancelled")
        sha.update(chunk)
        offset += len(chunk)
    return sha.hexdigest()


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


class _FileCopy:
    """One file copied into a temp file beside its target, again while its digest calls for
    it; renamed into place when done, deleted when not."""

    def __init__(
        self,
        source: Path,
        target: Path,
        *,
        size: int,
        version: str | None,
        what: str,
        stop: threading.Event,
    ):
        self._source = source
        self._target = target
        self._size = size
        self._version = version
        self._what = what
        self._stop = stop
        self.fetches = 0
        self.copied = 0  # bytes read from the store, every copy counted

    def run(self, expected: str | None, telemetry: Telemetry | None) -> FileDigest:
        self._target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(
            prefix=f".{self._target.name}.", suffix=".part", dir=self._target.parent
        )
        tmp = Path(name)
        digests: list[str] = []
        try:
            with os.fdopen(fd, "wb") as out:
                while True:
                    digest = self._copy(out)
                    digests.append(digest.sha256)
                    verdict = judge_fetches(expected, digests)
                    if verdict is Verdict.UNSTABLE:
                        raise unstable(self._what, digests, expected or "")
                    if verdict is not Verdict.FETCH_AGAIN:
                        break  # MATCH, or STORE_DIFFERS: verification will name the file
                    report_refetch(
                        telemetry,
                        self._what,
                        fetches=len(digests),
                        got=digest.sha256,
                        expected=expected or "",
                    )
            os.replace(tmp, self._target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return digest

    def _copy(self, out: BinaryIO) -> FileDigest:
        """One copy of the source over ``out``, at most its listed size, hashed as written."""
        out.seek(0)
        out.truncate()
        self.fetches += 1
        sha = hashlib.sha256()
        copied = 0
        try:
            fd = os.open(self._source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise ReleaseChanged(
                f"{self._what} disappeared from the store during the fetch; it will be "
                "fetched again"
            ) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeRelease(f"{self._what} became a symlink; ship plain files") from None
            raise
        with os.fdopen(fd, "rb") as reader:
            if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
                raise UnsafeRelease(f"{self._what} is not a regular file")
            # One byte past the listed size tells a file that grew since it was listed.
            while chunk := reader.read(min(CHUNK, self._size - copied + 1)):
                if self._stop.is_set():
                    raise Interrupted(f"the copy of {self._what} was cancelled")
                copied += len(chunk)
                self.copied += len(chunk)
                if copied > self._size:
                    raise ReleaseChanged(
                        f"{self._what} grew past its listed {self._size} bytes during the "
                        "fetch; it will be fetched again"
                    )
                sha.update(chunk)
                out.write(chunk)
            if copied != self._size:
                raise ReleaseChanged(
                    f"{self._what} shrank from {self._size} to {copied} bytes during the "
                    "fetch; it will be fetched again"
                )
            if self._version is not None and file_version(os.fstat(reader.fileno())) != (
                self._version
            ):
                raise ReleaseChanged(
                    f"{self._what} was changed or replaced since it was listed (same size); "
                    "it will be fetched again"
                )
        out.flush()
        return FileDigest(size=copied, sha256=sha.hexdigest())
