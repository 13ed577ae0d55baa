"""What one download of a release shares: its tasks, its temp files, its counters and its
progress; and the shapes the download speaks (:class:`RemoteObject`, :class:`TransferPolicy`,
:class:`ObjectReader`).

Every unit of work (a whole object, one part of a large one: :mod:`.s3_download`,
:mod:`.s3_large`) runs as a task of one :class:`Transfer`'s pool, so a failure or an abort
stops them all at once. Every temp file is known here from its creation until it is renamed
into place, so a download that fails or is cancelled deletes them all. Counters and progress
change only under :attr:`Transfer.lock`.
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
from typing import Any, Protocol

from controlplane.adapters.stores.retries import Aborted, Retrier
from controlplane.domain.checksums import FileDigest
from controlplane.domain.errors import Interrupted, StoreUnavailable
from controlplane.domain.transfer import RetryCause
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


def hash_file(path: Path) -> FileDigest:
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return FileDigest(size=size, sha256=sha.hexdigest())


class Transfer:
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
        self.reader = reader
        self.dest = dest
        self.policy = policy
        self.retrier = retrier
        self.expected = expected  # path -> the SHA256 SHA256SUMS lists
        self.abort = abort
        self.lock = threading.Lock()
        self._label = label
        self._progress = progress
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

    def run(
        self,
        objects: Sequence[RemoteObject],
        have: Mapping[str, FileDigest],
        start: Callable[[RemoteObject], None],
    ) -> None:
        """Count ``objects`` (``have`` is already there), ``start`` each of the others (it
        submits its tasks), and wait for every task. On any failure, or once aborted, every
        other task stops at its next chunk or backoff and every temp file is deleted."""
        todo = [obj for obj in objects if obj.rel not in have]
        self.files.update(have)
        self._files_total = len(objects)
        self._bytes_total = sum(obj.size for obj in objects)
        self._files_done = len(objects) - len(todo)
        self._bytes_done = sum(obj.size for obj in objects if obj.rel in have)
        self._report()
        self._pool = ThreadPoolExecutor(
            max_workers=self.policy.max_concurrency, thread_name_prefix="s3-fetch"
        )
        try:
            for obj in todo:
                start(obj)
            self._wait_all()
        except Aborted:  # cancelled before every task was started
            self.abort.set()
            raise Interrupted(f"the download from {self._label} was cancelled") from None
        except BaseException:
            self.abort.set()
            raise
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            if self.abort.is_set():
                for tmp in self._temps:
                    tmp.unlink(missing_ok=True)

    # --- tasks ----------------------------------------------------------------------------

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in the pool, in a copy of the current context (the operation id)."""
        if self.abort.is_set() or self._pool is None:
            raise Aborted
        future = self._pool.submit(contextvars.copy_context().run, fn, *args)
        with self.lock:
            self._submitted.append(future)

    def _wait_all(self) -> None:
        """Wait for every task, including those tasks start (a file fetched again)."""
        pending: set[Future[Any]] = set()
        while True:
            with self.lock:
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

    # --- temp files -----------------------------------------------------------------------

    def new_temp(self, target: Path) -> tuple[int, Path]:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        with self.lock:
            self._temps.add(Path(name))
        return fd, Path(name)

    def preallocate(self, obj: RemoteObject) -> Path:
        fd, tmp = self.new_temp(self.dest / obj.rel)
        try:
            os.ftruncate(fd, obj.size)
        finally:
            os.close(fd)
        return tmp

    def place(self, tmp: Path, obj: RemoteObject, digest: FileDigest, new_bytes: int) -> None:
        """Rename ``tmp`` into place as ``obj``'s file and count it done, ``new_bytes`` more
        of the release's bytes in."""
        os.replace(tmp, self.dest / obj.rel)
        with self.lock:
            self._temps.discard(tmp)
            self.files[obj.rel] = digest
            self._files_done += 1
            self._bytes_done += new_bytes
            self._report()

    # --- counters -------------------------------------------------------------------------

    def check_length(self, obj: RemoteObject, got: int, expected: int) -> None:
        if got != expected:
            raise StoreUnavailable(
                f"{self.what(obj)}: the body held {got} bytes, {expected} were expected",
                details={"cause": RetryCause.CONNECTION.value},
            )

    def fetched(self, size: int) -> None:
        """``size`` more bytes transferred."""
        with self.lock:
            self.bytes_fetched += size

    def refetching(self) -> None:
        """One more fetch repeated because a digest did not match SHA256SUMS."""
        with self.lock:
            self.refetched += 1

    def retried(self) -> None:
        with self.lock:
            self.retries += 1

    def progressed(self, new_bytes: int, *, report: bool) -> None:
        """``new_bytes`` more of the release's bytes in; the caller holds :attr:`lock`."""
        self._bytes_done += new_bytes
        if report:
            self._report()

    def _report(self) -> None:
        if self._progress is not None:
            self._progress(
                FetchProgress(
                    self._files_done, self._files_total, self._bytes_done, self._bytes_total
                )
            )

    def what(self, obj: RemoteObject) -> str:
        return f"{self._label}{obj.key}"
