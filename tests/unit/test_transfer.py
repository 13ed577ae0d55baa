"""The fetch path's rules: what a wrong digest means, room in staging, retries bounded by time.

The retrier runs on a fake clock that its own sleeps advance, so minutes of backoff take
microseconds and the bounds are exact.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

import pytest

from controlplane.adapters.stores.retries import Aborted, Retrier
from controlplane.adapters.stores.s3_parts import PartLedger, part_digests, spans
from controlplane.domain.disk import MARGIN_BYTES, room_for, size_text
from controlplane.domain.errors import (
    InsufficientDisk,
    ReleaseNotFound,
    ReleaseTooLarge,
    StoreUnavailable,
)
from controlplane.domain.transfer import RetryCause, Verdict, judge_fetches, retry_cause
from controlplane.services.telemetry import NoTelemetry

GIB = 1024**3
A, B, C, RIGHT = "a" * 64, "b" * 64, "c" * 64, "f" * 64

# --- digests ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("digests", "verdict"),
    [
        ([RIGHT], Verdict.MATCH),
        ([A], Verdict.FETCH_AGAIN),
        ([A, RIGHT], Verdict.MATCH),  # the wire's fault, repaired
        ([A, A], Verdict.STORE_DIFFERS),  # the store holds these bytes
        ([A, B], Verdict.FETCH_AGAIN),
        ([A, B, A], Verdict.STORE_DIFFERS),
        ([A, B, RIGHT], Verdict.MATCH),
        ([A, B, C], Verdict.UNSTABLE),  # a different digest every time: the path corrupts
    ],
)
def test_a_wrong_digest_is_the_release_s_fault_only_when_it_repeats(
    digests: list[str], verdict: Verdict
) -> None:
    assert judge_fetches(RIGHT, digests) is verdict


def test_without_a_manifest_every_digest_matches() -> None:
    assert judge_fetches(None, [A]) is Verdict.MATCH


def test_unknown_causes_are_counted_as_other() -> None:
    assert retry_cause("throttled") is RetryCause.THROTTLED
    assert retry_cause("cosmic rays") is RetryCause.OTHER
    assert retry_cause(None) is RetryCause.OTHER


def test_a_part_is_settled_once_a_fetch_agrees_with_an_earlier_one() -> None:
    ledger = PartLedger([A, B, C])  # the first round, read back from the file
    assert ledger.record(0, A)  # the store's bytes, twice
    assert not ledger.record(1, C)  # corrupted on the way in one fetch or the other
    assert not ledger.record(2, B)
    assert ledger.disagreeing() == [1, 2]
    assert not ledger.record(1, RIGHT)
    assert ledger.record(1, C)  # agrees with its second fetch, not its first
    assert ledger.seen(1) == [B, C, RIGHT, C]
    assert ledger.disagreeing() == [2]


def test_parts_cover_the_object_and_their_digests_are_read_back_by_span(
    tmp_path: Path,
) -> None:
    assert spans(10, 4) == [(0, 3), (4, 7), (8, 9)]
    assert spans(8, 4) == [(0, 3), (4, 7)]
    data = bytes(range(10))
    (tmp_path / "object").write_bytes(data)
    digests = part_digests(tmp_path / "object", spans(10, 4), chunk=3)
    assert digests == [hashlib.sha256(data[i : i + 4]).hexdigest() for i in (0, 4, 8)]


# --- room in staging ----------------------------------------------------------------------


def test_only_bytes_the_cache_does_not_hold_count_against_free_space() -> None:
    sizes = {"1/weights.bin": 30 * GIB, "1/model.py": 1000, "SHA256SUMS": 200}

    figures = room_for(sizes, {"1/weights.bin"}, free=1 * GIB, max_release_bytes=None)
    figures.check()

    assert figures.bytes_total == 30 * GIB + 1200
    assert figures.bytes_cached == 30 * GIB
    assert figures.bytes_needed == 1200
    assert figures.detail()["bytes_free"] == 1 * GIB


def test_a_release_that_does_not_fit_is_insufficient_disk_with_the_figures() -> None:
    sizes = {"1/huge.bin": 100 * GIB, "1/model.py": 1000}

    with pytest.raises(InsufficientDisk) as caught:
        room_for(sizes, {"1/model.py"}, free=78 * GIB, max_release_bytes=None).check()

    error = caught.value
    assert error.code == "insufficient_disk"
    assert "needs 100.0 GiB in staging" in error.message
    assert "has 78.0 GiB free" in error.message
    assert "1000 B of the release's 100.0 GiB are in the content cache" in error.message
    assert error.details == {
        "bytes_total": 100 * GIB + 1000,
        "bytes_cached": 1000,
        "bytes_needed": 100 * GIB,
        "bytes_free": 78 * GIB,
        "margin_bytes": MARGIN_BYTES,
        "max_release_bytes": None,
    }


def test_the_margin_stays_free() -> None:
    room_for({"a": GIB}, (), free=GIB + MARGIN_BYTES, max_release_bytes=None).check()
    with pytest.raises(InsufficientDisk, match="none of it is in the content cache"):
        room_for({"a": GIB}, (), free=GIB + MARGIN_BYTES - 1, max_release_bytes=None).check()


def test_a_release_over_the_bound_is_too_large_even_when_cached() -> None:
    sizes = {"1/weights.bin": 2 * GIB, "1/model.py": 10}

    with pytest.raises(ReleaseTooLarge) as caught:
        room_for(sizes, {"1/weights.bin"}, free=100 * GIB, max_release_bytes=GIB).check()

    assert caught.value.code == "release_too_large"
    assert "the release is 2.0 GiB, over store.max_release_bytes (1.0 GiB)" in (
        caught.value.message
    )
    assert caught.value.details["max_release_bytes"] == GIB
    room_for(sizes, (), free=100 * GIB, max_release_bytes=2 * GIB + 10).check()  # at the bound


def test_sizes_read_well_in_messages() -> None:
    assert [size_text(n) for n in (512, 3 * 1024**2 + 1, 3 * 1024**4 // 2)] == [
        "512 B",
        "3.0 MiB",
        "1.5 TiB",
    ]


# --- retries bounded by time --------------------------------------------------------------


class FakeTime:
    """A monotonic clock that only sleeps move."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now


class TimedAbort(threading.Event):
    """An abort event whose waits advance the fake clock instead of blocking."""

    def __init__(self, clock: FakeTime) -> None:
        super().__init__()
        self._clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        if timeout:
            self._clock.slept.append(timeout)
            self._clock.now += timeout
        return self.is_set()


class Counted(NoTelemetry):
    def __init__(self) -> None:
        self.causes: list[RetryCause] = []

    def store_retried(self, cause: RetryCause) -> None:
        self.causes.append(cause)


def _throttled() -> StoreUnavailable:
    return StoreUnavailable("SlowDown: reduce your request rate", details={"cause": "throttled"})


def test_retries_go_on_until_the_call_has_failed_for_the_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeTime()
    telemetry = Counted()
    retrier = Retrier(budget=120.0, backoff_max=4.0, telemetry=telemetry, clock=clock)
    calls: list[float] = []

    def always_throttled() -> None:
        calls.append(clock.now)
        raise _throttled()

    with pytest.raises(StoreUnavailable) as caught:
        retrier.call(always_throttled, what="s3://b/k", abort=TimedAbort(clock))

    assert calls[-1] - calls[0] == pytest.approx(120.0)  # the last try is at the deadline
    assert all(0 <= pause <= 4.0 for pause in clock.slept)  # capped, with jitter
    assert len(calls) > 120 / 4.0  # so at least this many tries
    assert telemetry.causes == [RetryCause.THROTTLED] * (len(calls) - 1)
    message = caught.value.message
    assert f"gave up on s3://b/k after {len(calls)} attempt(s) over 120.0 s" in message
    assert "last error (throttled): SlowDown" in message
    assert caught.value.details["attempts"] == len(calls)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(calls)  # one per retry, and the one that gives up


def test_a_call_that_recovers_inside_the_budget_returns_its_answer() -> None:
    clock = FakeTime()
    retrier = Retrier(budget=120.0, clock=clock)
    failures = [_throttled(), _throttled()]

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "listed"

    assert retrier.call(flaky, what="s3://b/k", abort=TimedAbort(clock)) == "listed"
    assert len(clock.slept) == 2


def test_the_budget_counts_from_the_first_failure_not_from_the_start() -> None:
    clock = FakeTime()
    retrier = Retrier(budget=10.0, backoff_max=1.0, clock=clock)
    calls = 0

    def long_transfer_then_one_failure() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            clock.now += 600.0  # ten minutes of download, then the connection drops
            raise StoreUnavailable("connection reset", details={"cause": "connection"})
        return "done"

    assert retrier.call(long_transfer_then_one_failure, what="k", abort=TimedAbort(clock)) == "done"


def test_permanent_errors_are_not_retried() -> None:
    clock = FakeTime()
    calls = 0

    def missing() -> None:
        nonlocal calls
        calls += 1
        raise ReleaseNotFound("gone")

    with pytest.raises(ReleaseNotFound):
        Retrier(budget=60.0, clock=clock).call(missing, what="k", abort=TimedAbort(clock))
    assert calls == 1


def test_an_abort_cuts_the_backoff_short() -> None:
    clock = FakeTime()
    abort = TimedAbort(clock)
    calls = 0

    def throttled_then_aborted() -> None:
        nonlocal calls
        calls += 1
        abort.set()  # e.g. the fetch was cancelled while this request failed
        raise _throttled()

    with pytest.raises(Aborted):
        Retrier(budget=60.0, clock=clock).call(throttled_then_aborted, what="k", abort=abort)
    assert calls == 1
