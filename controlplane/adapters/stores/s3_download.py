"""Parallel, bounded-memory download of a release's objects into a staging dir.

The S3 store lists a release and hands the objects here with an :class:`ObjectReader` that
performs one GET (whole object or one byte range, always ``If-Match`` the listed ETag) and
already speaks the project's errors. This module owns everything after that:

- one thread pool bounded by ``max_concurrency`` runs every unit of work: whole objects below
  ``multipart_threshold`` and the parts of the larger ones, so no task waits on another;
- a whole object streams into a temp file beside its target, hashed while written; a large
  object's parts are ``pwrite``-n into one preallocated temp file, which is hashed by a single
  sequential read once every part is in; then one rename puts the file in place;
- no object grows past its listed size: the sizes were checked against free disk before the
  download began, so a body longer than listed is cut off and fetched again;
- each GET is retried by time (:class:`~.retries.Retrier`) on :class:`StoreUnavailable` only;
  :class:`ReleaseChanged` and permanent errors end the download at once;
- a whole object whose digest differs from ``SHA256SUMS`` is fetched again until
  :func:`~controlplane.domain.transfer.judge_fetches` has a verdict: the right digest, the
  same wrong one twice (returned as it is, for verification to refuse), or a different one
  every time (:class:`StoreUnavailable`); a large object's parts are judged one by one, and
  only those whose fetches disagree are fetched again (:mod:`.s3_parts` says how);
- on any failure, or once the caller's abort event is set, every other task stops at its next
  chunk or backoff and every temp file is deleted.

Memory is bounded by ``max_concurrency`` chunks of :data:`~.s3_transfer.CHUNK` bytes,
whatever the sizes. Workers run in a copy of the caller's context, so their log lines carry
the operation's id. Here: the download and its whole objects; the state every task shares is
:class:`~.s3_transfer.Transfer`, and a large object's parts are :mod:`.s3_large`'s.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from controlplane.adapters.stores.retries import Aborted, Retrier, unstable
from controlplane.adapters.stores.s3_large import LargeObject
from controlplane.adapters.stores.s3_transfer import (
    ObjectReader,
    RemoteObject,
    Transfer,
    TransferPolicy,
)
from controlplane.domain.checksums import FileDigest
from controlplane.domain.errors import StoreUnavailable
from controlplane.domain.transfer import RetryCause, Verdict, judge_fetches
from controlplane.ports import FetchProgress


@dataclass(frozen=True)
class Downloaded:
    files: dict[str, FileDigest]  # every file of the release under dest, ``have`` included
    bytes_fetched: int  # bytes transferred, fetches repeated after a mismatch included
    refetched: int  # fetches repeated because a digest did not match SHA256SUMS
    retries: int  # GETs tried again after a transient fault


def download_objects(
    reader: ObjectReader,
    objects: Sequence[RemoteObject],
    dest: Path,
    *,
    policy: TransferPolicy,
    retrier: Retrier,
    expected: Mapping[str, str] | None = None,
    have: Mapping[str, FileDigest] | None = None,
    label: str = "",
    progress: Callable[[FetchProgress], None] | None = None,
    abort: threading.Event | None = None,
) -> Downloaded:
    """Download ``objects`` (paths already validated) under ``dest``, skipping ``have``.

    ``expected`` maps paths to the SHA256 they must have (the manifest); ``label`` prefixes
    keys in messages (``s3://bucket/``). Setting ``abort`` stops the download with
    :class:`Interrupted`, its temp files deleted; the download also sets it when it fails.
    """
    transfer = Transfer(
        reader,
        dest,
        policy,
        retrier,
        expected=expected or {},
        label=label,
        progress=progress,
        abort=abort or threading.Event(),
    )

    def start(obj: RemoteObject) -> None:
        if obj.size > 0 and obj.size >= policy.multipart_threshold:
            LargeObject(transfer, obj).start()
        else:
            transfer.submit(_whole, transfer, obj)

    transfer.run(objects, have or {}, start)
    return Downloaded(
        files=transfer.files,
        bytes_fetched=transfer.bytes_fetched,
        refetched=transfer.refetched,
        retries=transfer.retries,
    )


# --- whole objects ------------------------------------------------------------------------


def _whole(transfer: Transfer, obj: RemoteObject) -> None:
    """Fetch ``obj`` into a temp file beside its target, again while its digest calls for it,
    then rename it into place."""
    if transfer.abort.is_set():
        raise Aborted
    fd, tmp = transfer.new_temp(transfer.dest / obj.rel)
    digests: list[str] = []
    with os.fdopen(fd, "wb") as out:
        while True:
            digest = transfer.retrier.call(
                lambda: _stream(transfer, obj, out),
                what=transfer.what(obj),
                abort=transfer.abort,
                on_retry=transfer.retried,
            )
            transfer.fetched(digest.size)
            digests.append(digest.sha256)
            if _settled(transfer, obj, digests):
                break
    transfer.place(tmp, obj, digest, obj.size)


def _stream(transfer: Transfer, obj: RemoteObject, out: BinaryIO) -> FileDigest:
    """One GET of ``obj`` over ``out``, at most its listed size, hashed as written."""
    out.seek(0)  # a retry starts the file over
    out.truncate()
    sha = hashlib.sha256()
    size = 0

    def sink(chunk: bytes) -> None:
        nonlocal size
        if transfer.abort.is_set():
            raise Aborted
        if size + len(chunk) > obj.size:  # never past what the disk check allowed
            raise StoreUnavailable(
                f"{transfer.what(obj)}: the body is longer than the {obj.size} bytes listed",
                details={"cause": RetryCause.CORRUPT.value},
            )
        sha.update(chunk)
        out.write(chunk)
        size += len(chunk)

    transfer.reader.read(obj, None, sink)
    transfer.check_length(obj, size, obj.size)
    out.flush()
    return FileDigest(size=size, sha256=sha.hexdigest())


def _settled(transfer: Transfer, obj: RemoteObject, digests: list[str]) -> bool:
    """Whether ``obj`` is done after these fetches; False: fetch it again."""
    expected = transfer.expected.get(obj.rel)
    verdict = judge_fetches(expected, digests)
    if verdict is Verdict.UNSTABLE:
        raise unstable(transfer.what(obj), digests, expected or "")
    if verdict is Verdict.FETCH_AGAIN:
        transfer.refetching()
        transfer.retrier.refetching(
            transfer.what(obj),
            fetches=len(digests),
            got=digests[-1],
            expected=expected or "",
            on_retry=transfer.retried,
        )
        return False
    return True  # MATCH, or STORE_DIFFERS: verification will name the file
