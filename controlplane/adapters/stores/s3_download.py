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

Memory is bounded by ``max_concurrency`` chunks of :data:`CHUNK` bytes, whatever the sizes.
Workers run in a copy of the caller's context, so their log lines carry the operation's id.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from controlplane.adapters.stores.retries import Aborted, Retrier, unstable
from controlplane.adapters.stores.s3_parts import PartLedger, Round, Span, part_digests, spans
from controlplane.domain.checksums import FileDigest
from controlplane.domain.errors import Interrupted, StoreError, StoreUnavailable
from controlplane.domain.transfer import RetryCause, Verdict, judge_fetches
from controlplane.ports import FetchProgress

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class RemoteObject:
    """One listed object of a release: its key, its path below the release, size and ETag."""

    key: str
    rel: str
    size: int
    etag: str


@dataclass(frozen=True)
class TransferPolicy:
    max_concurrency: int = 8
    multipart_threshold: int = 64 * 1024 * 1024
    part_size: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_concurrency < 1 or self.part_size < 1:
            raise ValueError("max_concurrency and part_size must be at least 1")
        if self.multipart_threshold < 0:
            raise ValueError("multipart_threshold must not be negative")


class ObjectReader(Protocol):
    def read(
        self, obj: RemoteObject, span: tuple[int, int] | None, sink: Callable[[bytes], None]
    ) -> None:
        """GET ``obj`` (``span`` = inclusive byte range, or None for all of it) and pass
        every chunk to ``sink``. Raises the project's errors only (and whatever ``sink``
        raises)."""
        ...


@dataclass(frozen=True)
class Downloaded:
    files: dict[str, FileDigest]  # every file of the release under dest, ``have`` included
    bytes_fetched: int  # bytes transferred, fetches repeated after a mismatch included
    refetched: int  # fetches repeated because a digest did not match SHA256SUMS
    retries: int  # GETs tried again after a transient fault


@dataclass
class _Large:
    """A large object being fetched in ranged parts into one preallocated temp file."""

    obj: RemoteObject
    tmp: Path
    parts: list[Span]
    round: Round = Round.FIRST
    parts_left: int = 0  # parts of the current round not yet in
    ledger: PartLedger | None = None  # each part's digests, once the first round disagreed


def _hash_file(path: Path) -> FileDigest:
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return FileDigest(size=size, sha256=sha.hexdigest())


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class _Download:
    """The state of one release download: counters, temp files, tasks and the abort flag."""

    def __init__(
        self,
        reader: ObjectReader,
        dest: Path,
        policy: TransferPolicy,
        retrier: Retrier,
        *,
        expected: Mapping[str, str],
        label: str,
        progress: Callable[[FetchProgress], None] | None,
        abort: threading.Event,
    ) -> None:
        self._reader = reader
        self._dest = dest
        self._policy = policy
        self._retrier = retrier
        self._expected = expected
        self._label = label
        self._progress = progress
        self._abort = abort
        self._lock = threading.Lock()
        self._temps: set[Path] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._submitted: list[Future[Any]] = []
        self.files: dict[str, FileDigest] = {}
        self.bytes_fetched = 0
        self.refetched = 0
        self.retries = 0
        self._files_done = 0
        self._files_total = 0
        self._bytes_done = 0
        self._bytes_total = 0

    def run(self, objects: Sequence[RemoteObject], have: Mapping[str, FileDigest]) -> None:
        todo = [obj for obj in objects if obj.rel not in have]
        self.files.update(have)
        self._files_total = len(objects)
        self._bytes_total = sum(obj.size for obj in objects)
        self._files_done = len(objects) - len(todo)
        self._bytes_done = sum(obj.size for obj in objects if obj.rel in have)
        self._report()
        self._pool = ThreadPoolExecutor(
            max_workers=self._policy.max_concurrency, thread_name_prefix="s3-fetch"
        )
        try:
            for obj in todo:
                if obj.size > 0 and obj.size >= self._policy.multipart_threshold:
                    parts = spans(obj.size, self._policy.part_size)
                    large = _Large(obj, self._preallocate(obj), parts)
                    self._start_round(large, Round.FIRST, range(len(large.parts)))
                else:
                    self._submit(self._whole, obj)
            self._wait_all()
        except Aborted:  # cancelled before every task was started
            self._abort.set()
            raise Interrupted(f"the download from {self._label} was cancelled") from None
        except BaseException:
            self._abort.set()
            raise
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            if self._abort.is_set():
                for tmp in self._temps:
                    tmp.unlink(missing_ok=True)

    # --- tasks ----------------------------------------------------------------------------

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in the pool, in a copy of the current context (the operation id)."""
        if self._abort.is_set() or self._pool is None:
            raise Aborted
        future = self._pool.submit(contextvars.copy_context().run, fn, *args)
        with self._lock:
            self._submitted.append(future)

    def _wait_all(self) -> None:
        """Wait for every task, including those tasks start (a file fetched again)."""
        pending: set[Future[Any]] = set()
        while True:
            with self._lock:
                pending.update(self._submitted)
                self._submitted.clear()
            if not pending:
                return
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            errors = [exc for f in done if (exc := f.exception()) is not None]
            real = [exc for exc in errors if not isinstance(exc, Aborted)]
            if real:
                raise real[0]
            if errors:  # only aborts: the caller's cancel event was set
                raise Interrupted(f"the download from {self._label} was cancelled")

    # --- whole objects --------------------------------------------------------------------

    def _whole(self, obj: RemoteObject) -> None:
        if self._abort.is_set():
            raise Aborted
        target = self._dest / obj.rel
        fd, tmp = self._new_temp(target)
        digests: list[str] = []
        with os.fdopen(fd, "wb") as out:
            while True:
                digest = self._retrier.call(
                    lambda: self._stream(obj, out),
                    what=self._what(obj),
                    abort=self._abort,
                    on_retry=self._retried,
                )
                with self._lock:
                    self.bytes_fetched += digest.size
                digests.append(digest.sha256)
                if self._settled(obj, digests):
                    break
        os.replace(tmp, target)
        with self._lock:
            self._temps.discard(tmp)
            self._finished(obj, digest, obj.size)

    def _stream(self, obj: RemoteObject, out: BinaryIO) -> FileDigest:
        out.seek(0)  # a retry starts the file over
        out.truncate()
        sha = hashlib.sha256()
        size = 0

        def sink(chunk: bytes) -> None:
            nonlocal size
            if self._abort.is_set():
                raise Aborted
            if size + len(chunk) > obj.size:  # never past what the disk check allowed
                raise StoreUnavailable(
                    f"{self._what(obj)}: the body is longer than the {obj.size} bytes listed",
                    details={"cause": RetryCause.CORRUPT.value},
                )
            sha.update(chunk)
            out.write(chunk)
            size += len(chunk)

        self._reader.read(obj, None, sink)
        self._check_length(obj, size, obj.size)
        out.flush()
        return FileDigest(size=size, sha256=sha.hexdigest())

    # --- large objects, in ranged parts ---------------------------------------------------

    def _start_round(self, large: _Large, round_: Round, indices: Sequence[int]) -> None:
        with self._lock:
            large.round = round_
            large.parts_left = len(indices)
        for index in indices:
            self._submit(self._part, large, index)

    def _part(self, large: _Large, index: int) -> None:
        obj = large.obj
        span = large.parts[index]
        length = span[1] - span[0] + 1
        hashed = large.round is not Round.FIRST  # a first round is hashed whole, once

        def once() -> None:
            offset = span[0]
            sha = hashlib.sha256()

            def sink(chunk: bytes) -> None:
                nonlocal offset
                if self._abort.is_set():
                    raise Aborted
                if offset + len(chunk) > span[1] + 1:
                    raise StoreError(
                        f"the store answered more than bytes {span[0]}-{span[1]} of "
                        f"{self._what(obj)}: it does not honour Range requests"
                    )
                _pwrite_all(fd, chunk, offset)
                if hashed:
                    sha.update(chunk)
                offset += len(chunk)

            fd = os.open(large.tmp, os.O_WRONLY)
            try:
                self._reader.read(obj, span, sink)
            finally:
                os.close(fd)
            self._check_length(obj, offset - span[0], length)
            with self._lock:
                self.bytes_fetched += length
            if hashed:
                self._judge_part(large, index, sha.hexdigest())

        self._retrier.call(once, what=self._what(obj), abort=self._abort, on_retry=self._retried)
        with self._lock:
            large.parts_left -= 1
            last = large.parts_left == 0
            if large.round is Round.FIRST:  # progress counts the first fetch only
                self._bytes_done += length
                if not last:
                    self._report()
        if last:
            self._round_done(large)

    def _judge_part(self, large: _Large, index: int, digest: str) -> None:
        """Note a part's digest; while settling, one that agrees with no earlier fetch is a
        transient fault (cause ``corrupt``), for the retrier to fetch the part again."""
        assert large.ledger is not None  # made before the parts are fetched again
        with self._lock:
            earlier = large.ledger.seen(index)
            agrees = large.ledger.record(index, digest)
        if large.round is Round.SETTLE and not agrees:
            span = large.parts[index]
            raise StoreUnavailable(
                f"{self._what(large.obj)}: bytes {span[0]}-{span[1]} hashed to {digest[:12]}, "
                f"earlier fetches to {', '.join(d[:12] for d in earlier)}: they were "
                "corrupted on the way; fetching them again until two fetches agree",
                details={"cause": RetryCause.CORRUPT.value},
            )

    def _round_done(self, large: _Large) -> None:
        """Every part of a round is in: hash the file; put it in place, or fetch parts again."""
        obj = large.obj
        digest = _hash_file(large.tmp)
        self._check_length(obj, digest.size, obj.size)
        expected = self._expected.get(obj.rel)
        matches = expected is None or digest.sha256 == expected.lower()
        again: list[int] = []
        if not matches and large.round is Round.FIRST:
            large.ledger = PartLedger(part_digests(large.tmp, large.parts, CHUNK))
            again = list(range(len(large.parts)))
        elif not matches and large.round is Round.AGAIN:
            assert large.ledger is not None
            again = large.ledger.disagreeing()  # none: the store holds these bytes
        if again:
            with self._lock:
                self.refetched += 1
            self._retrier.refetching_parts(
                self._what(obj),
                parts=len(again),
                of=len(large.parts),
                got=digest.sha256,
                expected=expected or "",
                on_retry=self._retried,
            )
            after = Round.AGAIN if large.round is Round.FIRST else Round.SETTLE
            self._start_round(large, after, again)
            return
        # The right digest, or parts that each agree twice: verification names a wrong file.
        os.replace(large.tmp, self._dest / obj.rel)
        with self._lock:
            self._temps.discard(large.tmp)
            self._finished(obj, digest, 0)

    # --- bookkeeping ----------------------------------------------------------------------

    def _settled(self, obj: RemoteObject, digests: list[str]) -> bool:
        """Whether ``obj`` is done after these fetches; False: fetch it again."""
        expected = self._expected.get(obj.rel)
        verdict = judge_fetches(expected, digests)
        if verdict is Verdict.UNSTABLE:
            raise unstable(self._what(obj), digests, expected or "")
        if verdict is Verdict.FETCH_AGAIN:
            with self._lock:
                self.refetched += 1
            self._retrier.refetching(
                self._what(obj),
                fetches=len(digests),
                got=digests[-1],
                expected=expected or "",
                on_retry=self._retried,
            )
            return False
        return True  # MATCH, or STORE_DIFFERS: verification will name the file

    def _retried(self) -> None:
        with self._lock:
            self.retries += 1

    def _new_temp(self, target: Path) -> tuple[int, Path]:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        with self._lock:
            self._temps.add(Path(name))
        return fd, Path(name)

    def _preallocate(self, obj: RemoteObject) -> Path:
        fd, tmp = self._new_temp(self._dest / obj.rel)
        try:
            os.ftruncate(fd, obj.size)
        finally:
            os.close(fd)
        return tmp

    def _check_length(self, obj: RemoteObject, got: int, expected: int) -> None:
        if got != expected:
            raise StoreUnavailable(
                f"{self._what(obj)}: the body held {got} bytes, {expected} were expected",
                details={"cause": RetryCause.CONNECTION.value},
            )

    def _finished(self, obj: RemoteObject, digest: FileDigest, new_bytes: int) -> None:
        """Record a file in place; the caller holds the lock."""
        self.files[obj.rel] = digest
        self._files_done += 1
        self._bytes_done += new_bytes
        self._report()

    def _report(self) -> None:
        if self._progress is not None:
            self._progress(
                FetchProgress(
                    self._files_done, self._files_total, self._bytes_done, self._bytes_total
                )
            )

    def _what(self, obj: RemoteObject) -> str:
        return f"{self._label}{obj.key}"


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
    download = _Download(
        reader,
        dest,
        policy,
        retrier,
        expected=expected or {},
        label=label,
        progress=progress,
        abort=abort or threading.Event(),
    )
    download.run(objects, have or {})
    return Downloaded(
        files=download.files,
        bytes_fetched=download.bytes_fetched,
        refetched=download.refetched,
        retries=download.retries,
    )
