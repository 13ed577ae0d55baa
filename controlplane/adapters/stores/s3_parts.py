"""Which parts of a large object to fetch again when its digest does not match SHA256SUMS.

A large object comes in ranged parts, written into one file and hashed whole once they are
all in. A wrong digest says that some part is wrong, not which, so fetching the whole object
again until its digest matches fails when bytes are corrupted on the way often enough that a
part is hit in every round (with 30 % of GETs hit, a 96 MiB object in 6 parts comes out
whole in 12 % of the rounds). The parts are judged one by one instead (:class:`Round`):

1. ``FIRST``: every part, nothing hashed per part. The whole digest matches: done, which is
   the common case and costs nothing more than before.
2. ``AGAIN``: each part's digest is read back from the file, then every part is fetched once
   more and hashed while it is written. The whole digest matches now: done.
3. ``SETTLE``: a part whose two fetches agree holds the store's bytes (bytes corrupted at
   random do not come out the same twice), and is left alone. Each part whose fetches
   disagree is fetched again until one of its fetches agrees with an earlier one. Such a
   fetch fails as any transient fault does (cause ``corrupt``), so it is retried, logged and
   counted by the store's one retry policy, for ``store.retry_seconds``
   (:class:`~.retries.Retrier`): only a path that corrupts data for that long is
   ``store_unavailable``.

After ``SETTLE`` every part holds bytes that two fetches agreed on: the whole digest matches,
or the store holds other bytes than ``SHA256SUMS`` lists, and the file is returned as it is
for verification to refuse (``checksum_mismatch``), after two fetches of each part, as a
small object is refused after two fetches. ``AGAIN`` is the same verdict when every part's
two fetches agreed at once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from enum import Enum
from pathlib import Path

Span = tuple[int, int]  # an inclusive byte range, as a Range header gives it


class Round(Enum):
    FIRST = "first"  # every part, not hashed one by one
    AGAIN = "again"  # every part again, each hashed
    SETTLE = "settle"  # the parts whose two fetches disagreed, each until two agree


def spans(size: int, part_size: int) -> list[Span]:
    """The parts of an object of ``size`` bytes, ``part_size`` each (the last one shorter)."""
    return [(start, min(start + part_size, size) - 1) for start in range(0, size, part_size)]


class PartLedger:
    """The digests of each part's fetches, oldest first, from the first one on."""

    def __init__(self, first: Sequence[str]) -> None:
        self._seen = [[digest] for digest in first]

    def record(self, index: int, digest: str) -> bool:
        """Note one more fetch of part ``index``; True when it agrees with an earlier one."""
        seen = self._seen[index]
        agrees = digest in seen
        seen.append(digest)
        return agrees

    def seen(self, index: int) -> list[str]:
        """The digests part ``index``'s fetches gave so far, oldest first."""
        return list(self._seen[index])

    def disagreeing(self) -> list[int]:
        """The parts whose latest fetch agrees with no earlier one, in file order."""
        return [i for i, seen in enumerate(self._seen) if seen[-1] not in seen[:-1]]


def part_digests(path: Path, parts: Sequence[Span], chunk: int) -> list[str]:
    """The SHA256 of each span of the file at ``path``, read ``chunk`` bytes at a time."""
    digests = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for first, last in parts:
            sha = hashlib.sha256()
            offset = first
            while offset <= last:
                data = os.pread(fd, min(chunk, last + 1 - offset), offset)
                if not data:
                    break  # shorter than listed: the length check after the hash says so
                sha.update(data)
                offset += len(data)
            digests.append(sha.hexdigest())
    finally:
        os.close(fd)
    return digests
