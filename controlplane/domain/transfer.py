"""What the stores decide about moving bytes, as pure rules both stores share.

- Why a store call is tried again, as a closed set (:class:`RetryCause`). These are the label
  values of ``controlplane_store_retries_total``, so the metric's cardinality is fixed.
- What a file whose SHA256 differs from ``SHA256SUMS`` means (:func:`judge_fetches`). After
  one fetch, a byte flipped on the wire and a file the publisher got wrong look the same.
  After two they do not: the store's own bytes hash the same every time, and the wire's
  accidents do not. So a mismatching file is fetched again, and only a wrong digest seen twice
  is the release's fault (``checksum_mismatch``). A different digest on every fetch is a
  transient fault of the path to the store (``store_unavailable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum, StrEnum

MAX_FETCHES = 3  # fetches of one file before a digest that keeps changing is given up on


class RetryCause(StrEnum):
    THROTTLED = "throttled"  # SlowDown, 429 and the like: the store asks for less
    SERVER_ERROR = "server_error"  # any other 5xx
    CONNECTION = "connection"  # refused, reset, closed, or a body cut short
    TIMEOUT = "timeout"  # connect or read timeout
    CORRUPT = "corrupt"  # bytes that did not hash to what SHA256SUMS lists
    OTHER = "other"  # a transient fault the adapter did not classify


def retry_cause(value: object) -> RetryCause:
    """``value`` as a :class:`RetryCause`; anything unknown is ``other``."""
    try:
        return RetryCause(str(value))
    except ValueError:
        return RetryCause.OTHER


class Verdict(Enum):
    MATCH = "match"  # the file is what SHA256SUMS lists (or there is nothing to compare)
    FETCH_AGAIN = "fetch_again"  # a mismatch not seen before: it may be the wire's
    STORE_DIFFERS = "store_differs"  # the same wrong digest twice: the store holds those bytes
    UNSTABLE = "unstable"  # a different wrong digest every time: the path corrupts data


def judge_fetches(
    expected: str | None, digests: Sequence[str], *, max_fetches: int = MAX_FETCHES
) -> Verdict:
    """The verdict on a file after the fetches that gave ``digests`` (oldest first)."""
    if not digests:
        raise ValueError("judge_fetches needs at least one fetch")
    latest = digests[-1]
    if expected is None or latest == expected.lower():
        return Verdict.MATCH
    if latest in digests[:-1]:
        return Verdict.STORE_DIFFERS
    if len(digests) >= max_fetches:
        return Verdict.UNSTABLE
    return Verdict.FETCH_AGAIN
