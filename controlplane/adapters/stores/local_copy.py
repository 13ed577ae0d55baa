"""Copying a release out of a directory store into a staging dir, and reading a file of it to
vouch for its bytes.

A fetch copies the files of a listing (what the service chose, with the sizes it checked
against free disk) one by one into the staging dir: each into a temp file beside its target,
hashed while written, never past its listed size, holding at most one chunk in memory, then
renamed into place. A file whose digest differs from ``SHA256SUMS`` is copied again, as the
S3 store fetches it again (an NFS mount or a failing disk can return bad bytes once), and
judged by :func:`~controlplane.domain.transfer.judge_fetches`. A file's version is its
device, inode, size and mtime (:func:`file_version`): a copy insists on the listed one, and
:func:`holds` says whether a file still at its listed version holds given bytes. Nothing here
follows a symlink or reads a special file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from controlplane.adapters.stores.retries import report_refetch, unstable
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest, decode_manifest, safe_relpath
from controlplane.domain.errors import Interrupted, ReleaseChanged, UnsafeRelease
from controlplane.domain.transfer import Verdict, judge_fetches
from controlplane.ports import FetchedRelease, FetchProgress, ReleaseListing, Telemetry

CHUNK = 1024 * 1024


def copy_release(
    source: Path,
    listing: ReleaseListing,
    dest: Path,
    *,
    manifest: Mapping[str, str] | None,
    have: Mapping[str, FileDigest] | None,
    progress: Callable[[FetchProgress], None] | None,
    cancel: threading.Event | None,
    telemetry: Telemetry | None,
) -> FetchedRelease:
    """Copy the files of ``listing`` from the release dir ``source`` under ``dest``, skipping
    ``have`` (:meth:`~controlplane.ports.ModelStore.fetch` says the rest)."""
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
        digest = copy.run(expected, telemetry)
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


def holds(
    path: Path, version: str | None, sha256: str, cancel: threading.Event | None, what: str
) -> bool:
    """Whether the plain file at ``path``, at ``version`` before and after the read, hashes to
    ``sha256``; False for anything else (the fetch tells what is wrong)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or file_version(info) != version:
            return False  # changed since it was listed: fetch it, and let the fetch judge
        digest = _hash_fd(fd, cancel or threading.Event(), what)
        return digest == sha256 and file_version(os.fstat(fd)) == version
    finally:
        os.close(fd)


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
