"""A large object of a download, fetched in ranged parts into one preallocated temp file.

Each part is a task of the download's pool (:class:`~.s3_transfer.Transfer`), ``pwrite``-n at
its offset, never past its span. Once every part of a round is in, the file is hashed by one
sequential read: the right digest puts it in place; a wrong one starts the next round, which
fetches again only the parts :mod:`.s3_parts` names, until each part's fetches agree. Only the
first round counts in the progress: a part fetched again adds nothing to the release's bytes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from controlplane.adapters.stores.retries import Aborted
from controlplane.adapters.stores.s3_parts import PartLedger, Round, part_digests, spans
from controlplane.adapters.stores.s3_transfer import CHUNK, RemoteObject, Transfer, hash_file
from controlplane.domain.errors import StoreError, StoreUnavailable
from controlplane.domain.transfer import RetryCause


class LargeObject:
    """One large object being fetched in ranged parts into one preallocated temp file."""

    def __init__(self, transfer: Transfer, obj: RemoteObject) -> None:
        self._transfer = transfer
        self.obj = obj
        self.parts = spans(obj.size, transfer.policy.part_size)
        self.tmp = transfer.preallocate(obj)
        self.round = Round.FIRST
        self.parts_left = 0  # parts of the current round not yet in
        self.ledger: PartLedger | None = None  # each part's digests, once the first round disagreed

    def start(self) -> None:
        """Submit every part's first fetch."""
        self._start_round(Round.FIRST, range(len(self.parts)))

    def _start_round(self, round_: Round, indices: Sequence[int]) -> None:
        with self._transfer.lock:
            self.round = round_
            self.parts_left = len(indices)
        for index in indices:
            self._transfer.submit(self._part, index)

    def _part(self, index: int) -> None:
        """Fetch part ``index`` (retried as any GET is); the last part of a round ends it."""
        transfer = self._transfer
        length = self.parts[index][1] - self.parts[index][0] + 1
        hashed = self.round is not Round.FIRST  # a first round is hashed whole, once
        transfer.retrier.call(
            lambda: self._fetch_part(index, hashed=hashed),
            what=transfer.what(self.obj),
            abort=transfer.abort,
            on_retry=transfer.retried,
        )
        with transfer.lock:
            self.parts_left -= 1
            last = self.parts_left == 0
            if self.round is Round.FIRST:  # progress counts the first fetch only
                transfer.progressed(length, report=not last)
        if last:
            self._round_done()

    def _fetch_part(self, index: int, *, hashed: bool) -> None:
        """One GET of part ``index``, written at its offset; ``hashed``: hashed as written,
        and judged."""
        transfer = self._transfer
        span = self.parts[index]
        length = span[1] - span[0] + 1
        offset = span[0]
        sha = hashlib.sha256()

        def sink(chunk: bytes) -> None:
            nonlocal offset
            if transfer.abort.is_set():
                raise Aborted
            if offset + len(chunk) > span[1] + 1:
                raise StoreError(
                    f"the store answered more than bytes {span[0]}-{span[1]} of "
                    f"{transfer.what(self.obj)}: it does not honour Range requests"
                )
            _pwrite_all(fd, chunk, offset)
            if hashed:
                sha.update(chunk)
            offset += len(chunk)

        fd = os.open(self.tmp, os.O_WRONLY)
        try:
            transfer.reader.read(self.obj, span, sink)
        finally:
            os.close(fd)
        transfer.check_length(self.obj, offset - span[0], length)
        transfer.fetched(length)
        if hashed:
            self._judge_part(index, sha.hexdigest())

    def _judge_part(self, index: int, digest: str) -> None:
        """Note a part's digest; while settling, one that agrees with no earlier fetch is a
        transient fault (cause ``corrupt``), for the retrier to fetch the part again."""
        assert self.ledger is not None  # made before the parts are fetched again
        with self._transfer.lock:
            earlier = self.ledger.seen(index)
            agrees = self.ledger.record(index, digest)
        if self.round is Round.SETTLE and not agrees:
            span = self.parts[index]
            raise StoreUnavailable(
                f"{self._transfer.what(self.obj)}: bytes {span[0]}-{span[1]} hashed to "
                f"{digest[:12]}, earlier fetches to {', '.join(d[:12] for d in earlier)}: they "
                "were corrupted on the way; fetching them again until two fetches agree",
                details={"cause": RetryCause.CORRUPT.value},
            )

    def _round_done(self) -> None:
        """Every part of a round is in: hash the file; put it in place, or fetch parts again."""
        transfer = self._transfer
        digest = hash_file(self.tmp)
        transfer.check_length(self.obj, digest.size, self.obj.size)
        expected = transfer.expected.get(self.obj.rel)
        matches = expected is None or digest.sha256 == expected.lower()
        again: list[int] = []
        if not matches and self.round is Round.FIRST:
            self.ledger = PartLedger(part_digests(self.tmp, self.parts, CHUNK))
            again = list(range(len(self.parts)))
        elif not matches and self.round is Round.AGAIN:
            assert self.ledger is not None
            again = self.ledger.disagreeing()  # none: the store holds these bytes
        if again:
            transfer.refetching()
            transfer.retrier.refetching_parts(
                transfer.what(self.obj),
                parts=len(again),
                of=len(self.parts),
                got=digest.sha256,
                expected=expected or "",
                on_retry=transfer.retried,
            )
            after = Round.AGAIN if self.round is Round.FIRST else Round.SETTLE
            self._start_round(after, again)
            return
        # The right digest, or parts that each agree twice: verification names a wrong file.
        transfer.place(self.tmp, self.obj, digest, 0)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
