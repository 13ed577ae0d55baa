"""Parallel, bounded-memory download of a release's objects into a staging dir.

The S3 store lists a release and hands the objects here with an :class:`ObjectReader` that
performs one GET (whole object or one byte range, always ``If-Match`` the listed ETag) and
already speaks the project's errors. This module owns everything after that:

- one thread pool bounded by ``max_concurrency`` runs every unit of work: whole objects below
  ``multipart_threshold`` and the parts of the larger ones, so no task waits on another;
- a whole object streams into a temp file beside its target, hashed while written; a large
  object's parts are ``pwrite``-n into one preallocated temp file, which is hashed by a single
  sequential read once every part is in; then one rename puts the file in place;
- each GET is retried (tenacity, exponential backoff with jitter) on :class:`StoreUnavailable`
  only; :class:`ReleaseChanged` and permanent errors end the download at once;
- on any failure every other task stops at its next chunk and every temp file is deleted.

Memory is bounded by ``max_concurrency`` chunks of :data:`CHUNK` bytes, whatever the sizes.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

import tenacity

from controlplane.domain.checksums import FileDigest
from controlplane.domain.errors import StoreError, StoreUnavailable
from controlplane.ports import FetchProgress

CHUNK = 1024 * 1024
FIRST_BACKOFF = 0.1  # seconds before the first retry; doubles up to the policy's maximum

T = TypeVar("T")


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
    attempts: int = 5
    backoff_max: float = 5.0

    def __post_init__(self) -> None:
        if self.max_concurrency < 1 or self.part_size < 1 or self.attempts < 1:
            raise ValueError("max_concurrency, part_size and attempts must be at least 1")
        if self.multipart_threshold < 0 or self.backoff_max < 0:
            raise ValueError("multipart_threshold and backoff_max must not be negative")


class ObjectReader(Protocol):
    def read(
        self, obj: RemoteObject, span: tuple[int, int] | None, sink: Callable[[bytes], None]
    ) -> None:
        """GET ``obj`` (``span`` = inclusive byte range, or None for all of it) and pass
        every chunk to ``sink``. Raises the project's errors only (and whatever ``sink``
        raises)."""
        ...


class _Aborted(Exception):
    """Another task failed: this one stops at its next chunk."""


def call_with_retries(
    fn: Callable[[], T], *, what: str, policy: TransferPolicy, abort: threading.Event | None = None
) -> T:
    """Run ``fn``, retrying :class:`StoreUnavailable`; when attempts run out, say so."""
    tries = 0
    stop_event = abort or threading.Event()

    def attempt() -> T:
        nonlocal tries
        if stop_event.is_set():
            raise _Aborted
        tries += 1
        return fn()

    def sleep(seconds: float) -> None:
        stop_event.wait(seconds)  # an abort cuts the backoff short

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=tenacity.wait_random_exponential(multiplier=FIRST_BACKOFF, max=policy.backoff_max),
        retry=tenacity.retry_if_exception_type(StoreUnavailable),
        sleep=sleep,
        reraise=True,
    )
    try:
        return retrying(attempt)
    except StoreUnavailable as exc:
        raise StoreUnavailable(
            f"gave up on {what} after {tries} attempt(s); last error: {exc.message}",
            details={"key": what, "attempts": tries},
        ) from exc


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
    """The state of one release download: counters, temp files and the abort flag."""

    def __init__(
        self,
        reader: ObjectReader,
        dest: Path,
        policy: TransferPolicy,
        *,
        label: str,
        progress: Callable[[FetchProgress], None] | None,
    ) -> None:
        self._reader = reader
        self._dest = dest
        self._policy = policy
        self._label = label
        self._progress = progress
        self._lock = threading.Lock()
        self._abort = threading.Event()
        self._temps: set[Path] = set()
        self._parts_left: dict[str, int] = {}
        self.files: dict[str, FileDigest] = {}
        self.bytes_fetched = 0
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
        pool = ThreadPoolExecutor(
            max_workers=self._policy.max_concurrency, thread_name_prefix="s3-fetch"
        )
        futures: list[Future[None]] = []
        try:
            for obj in todo:
                if obj.size > 0 and obj.size >= self._policy.multipart_threshold:
                    tmp = self._preallocate(obj)
                    spans = self._spans(obj.size)
                    with self._lock:
                        self._parts_left[obj.rel] = len(spans)
                    futures.extend(pool.submit(self._part, obj, tmp, span) for span in spans)
                else:
                    futures.append(pool.submit(self._whole, obj))
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for future in done:
                if (exc := future.exception()) is not None and not isinstance(exc, _Aborted):
                    raise exc
        except BaseException:
            self._abort.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            if self._abort.is_set():
                for tmp in self._temps:
                    tmp.unlink(missing_ok=True)

    def _spans(self, size: int) -> list[tuple[int, int]]:
        step = self._policy.part_size
        return [(start, min(start + step, size) - 1) for start in range(0, size, step)]

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

    def _whole(self, obj: RemoteObject) -> None:
        if self._abort.is_set():
            raise _Aborted
        target = self._dest / obj.rel
        fd, tmp = self._new_temp(target)
        with os.fdopen(fd, "wb") as out:
            digest = call_with_retries(
                lambda: self._stream(obj, out),
                what=self._what(obj),
                policy=self._policy,
                abort=self._abort,
            )
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
                raise _Aborted
            sha.update(chunk)
            out.write(chunk)
            size += len(chunk)

        self._reader.read(obj, None, sink)
        self._check_length(obj, size, obj.size)
        out.flush()
        return FileDigest(size=size, sha256=sha.hexdigest())

    def _part(self, obj: RemoteObject, tmp: Path, span: tuple[int, int]) -> None:
        length = span[1] - span[0] + 1

        def once() -> None:
            offset = span[0]

            def sink(chunk: bytes) -> None:
                nonlocal offset
                if self._abort.is_set():
                    raise _Aborted
                if offset + len(chunk) > span[1] + 1:
                    raise StoreError(
                        f"the store answered more than bytes {span[0]}-{span[1]} of "
                        f"{self._what(obj)}: it does not honour Range requests"
                    )
                _pwrite_all(fd, chunk, offset)
                offset += len(chunk)

            fd = os.open(tmp, os.O_WRONLY)
            try:
                self._reader.read(obj, span, sink)
            finally:
                os.close(fd)
            self._check_length(obj, offset - span[0], length)

        call_with_retries(once, what=self._what(obj), policy=self._policy, abort=self._abort)
        with self._lock:
            self._parts_left[obj.rel] -= 1
            last = self._parts_left[obj.rel] == 0
            self._bytes_done += length
            if not last:
                self._report()
        if last:  # every part is in: one sequential read hashes the file, then it goes live
            digest = _hash_file(tmp)
            self._check_length(obj, digest.size, obj.size)
            os.replace(tmp, self._dest / obj.rel)
            with self._lock:
                self._temps.discard(tmp)
                self._finished(obj, digest, 0)

    def _check_length(self, obj: RemoteObject, got: int, expected: int) -> None:
        if got != expected:
            raise StoreUnavailable(
                f"{self._what(obj)}: the body held {got} bytes, {expected} were expected"
            )

    def _finished(self, obj: RemoteObject, digest: FileDigest, new_bytes: int) -> None:
        """Record a file in place; the caller holds the lock."""
        self.files[obj.rel] = digest
        self.bytes_fetched += obj.size
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
    have: Mapping[str, FileDigest],
    label: str = "",
    progress: Callable[[FetchProgress], None] | None = None,
) -> tuple[dict[str, FileDigest], int]:
    """Download ``objects`` (paths already validated) under ``dest``, skipping ``have``.

    Returns every file under ``dest`` that belongs to the release (``have`` included) with its
    digest, and the bytes transferred. ``label`` prefixes keys in messages (``s3://bucket/``).
    """
    download = _Download(reader, dest, policy, label=label, progress=progress)
    download.run(objects, have)
    return download.files, download.bytes_fetched
