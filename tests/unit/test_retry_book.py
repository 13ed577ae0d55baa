"""A failed attempt waits longer each time it fails again; a cap given with a failure (an
outage, retried often) bounds that wait, and a failure of another kind starts again."""

from __future__ import annotations

from controlplane.timing import Backoff, RetryBook
from tests.support.fake_clock import FakeClock


def test_a_failure_waits_longer_each_time_and_a_cap_bounds_the_wait() -> None:
    book: RetryBook[str, str] = RetryBook(Backoff(first=2.0, limit=300.0), FakeClock())
    delays = [book.failed("m", "away").delay for _ in range(4)]
    assert delays == [2.0, 4.0, 8.0, 16.0]
    capped = [book.failed("m", "away", most=10.0).delay for _ in range(3)]
    assert capped == [10.0, 10.0, 10.0]
    assert book.left("m") == 10.0
    book.succeeded("m")
    assert book.left("m") == 0.0
    assert "m" not in book


def test_a_failure_of_another_kind_starts_from_the_first_delay() -> None:
    book: RetryBook[str, str] = RetryBook(
        Backoff(first=2.0, limit=300.0), FakeClock(), same=lambda a, b: a == b
    )
    assert [book.failed("m", "away").delay for _ in range(3)] == [2.0, 4.0, 8.0]
    assert book.failed("m", "refused").delay == 2.0
