"""Trying store requests again, bounded by time, and saying so every time.

A store that throttles (S3 ``SlowDown``), restarts (a MinIO pod) or drops connections recovers
in seconds to minutes, not in a number of attempts. So a request that fails transiently
(:class:`StoreUnavailable`) is tried again until it has been failing for ``budget`` seconds,
counted from its first failure, so a long transfer that fails once still gets the whole
budget. The wait before each new try grows exponentially from ``first_backoff`` with full
jitter, at most ``backoff_max``, and never runs past the budget. Nothing else is retried:
permanent errors and :class:`ReleaseChanged` end the request at once.

Every retry is a WARNING in the log (the key, the attempt, the cause, the wait before the next
try and how long until it gives up) and one count in ``controlplane_store_retries_total``
through the :class:`~controlplane.ports.Telemetry` port. A file fetched again because its
digest did not match ``SHA256SUMS`` is reported the same way, with cause ``corrupt``, and so
is each part of a large object fetched again because its fetches disagree (:mod:`.s3_parts`):
those are retried as any transient fault is, within the same budget.

An abort event (a cancelled fetch, a closing store) cuts a backoff short and stops further
tries with :class:`Aborted`; the caller decides what that means.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import tenacity

from controlplane.domain.errors import StoreUnavailable
from controlplane.domain.transfer import MAX_FETCHES, RetryCause, retry_cause
from controlplane.ports import Telemetry

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_BACKOFF = 0.1  # seconds before the first retry; doubles up to backoff_max, jittered


class Aborted(Exception):
    """The abort event was set: stop without another try."""


class Retrier:
    """Runs store requests, trying them again on :class:`StoreUnavailable` for ``budget`` s."""

    def __init__(
        self,
        *,
        budget: float,
        backoff_max: float = 5.0,
        first_backoff: float = FIRST_BACKOFF,
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] = time.monotonic,
        budget_name: str = "store.retry_seconds",
    ) -> None:
        if budget < 0 or backoff_max < 0 or first_backoff < 0:
            raise ValueError("budget, backoff_max and first_backoff must not be negative")
        self.budget = budget
        self.budget_name = budget_name  # what the budget is called in messages
        self.backoff_max = backoff_max
        self.first_backoff = first_backoff
        self._telemetry = telemetry
        self.clock = clock

    def call(
        self,
        fn: Callable[[], T],
        *,
        what: str,
        abort: threading.Event,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """``fn()``, tried again while it raises :class:`StoreUnavailable` and the budget
        lasts; then :class:`StoreUnavailable` saying how long it tried and the last cause."""
        attempts = _Attempts(self, what=what, abort=abort, on_retry=on_retry)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(StoreUnavailable),
            after=attempts.failed,
            wait=attempts.wait,
            stop=attempts.stop,
            before_sleep=attempts.before_sleep,
            sleep=attempts.sleep,
            reraise=True,
        )
        try:
            return retrying(lambda: attempts.attempt(fn))
        except StoreUnavailable as exc:
            raise attempts.given_up(exc) from exc

    def refetching(
        self,
        what: str,
        *,
        fetches: int,
        got: str,
        expected: str,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        """Report that ``what`` hashed to ``got``, not ``expected``, and is fetched again."""
        report_refetch(self._telemetry, what, fetches=fetches, got=got, expected=expected)
        if on_retry is not None:
            on_retry()

    def refetching_parts(
        self,
        what: str,
        *,
        parts: int,
        of: int,
        got: str,
        expected: str,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        """Report that the large object ``what`` hashed to ``got``, not ``expected``, and that
        ``parts`` of its ``of`` parts are fetched again (:mod:`.s3_parts`)."""
        log.warning(
            "%s: its SHA256 is %s but SHA256SUMS lists %s; fetching %s again and comparing "
            "each part's fetches, to tell bytes corrupted on the way from a wrong file in the "
            "store",
            what,
            got,
            expected,
            f"all {of} of its parts"
            if parts == of
            else f"the {parts} of its {of} parts whose fetches disagree",
            extra={"key": what, "parts": parts, "cause": RetryCause.CORRUPT.value},
        )
        self.count(RetryCause.CORRUPT, on_retry)

    def count(self, cause: RetryCause, on_retry: Callable[[], None] | None) -> None:
        """One retry for ``cause``: in the metric, and to ``on_retry``."""
        if self._telemetry is not None:
            self._telemetry.store_retried(cause)
        if on_retry is not None:
            on_retry()


class _Attempts:
    """The tries of one :meth:`Retrier.call`: when the first failed, how many were made, the
    wait before the next (jittered, never past the budget), and what each retry says."""

    def __init__(
        self,
        retrier: Retrier,
        *,
        what: str,
        abort: threading.Event,
        on_retry: Callable[[], None] | None,
    ) -> None:
        self._retrier = retrier
        self._what = what
        self._abort = abort
        self._on_retry = on_retry
        self._first_failure: float | None = None
        self.tries = 0
        self._jitter = tenacity.wait_random_exponential(
            multiplier=retrier.first_backoff, max=retrier.backoff_max
        )

    def elapsed(self) -> float:
        """Seconds since the first failure (0 before it): what the budget counts."""
        if self._first_failure is None:
            return 0.0
        return self._retrier.clock() - self._first_failure

    def attempt(self, fn: Callable[[], T]) -> T:
        if self._abort.is_set():
            raise Aborted
        self.tries += 1
        return fn()

    def failed(self, state: tenacity.RetryCallState) -> None:
        if self._first_failure is None:
            self._first_failure = self._retrier.clock()

    def wait(self, state: tenacity.RetryCallState) -> float:
        return max(0.0, min(self._jitter(state), self._retrier.budget - self.elapsed()))

    def stop(self, state: tenacity.RetryCallState) -> bool:
        return self.elapsed() >= self._retrier.budget

    def sleep(self, seconds: float) -> None:
        if self._abort.wait(seconds):  # an abort cuts the backoff short
            raise Aborted

    def before_sleep(self, state: tenacity.RetryCallState) -> None:
        """Log the failed try and the wait before the next one, and count the retry."""
        error = _error_of(state)
        cause = retry_cause(error.details.get("cause"))
        pause = state.upcoming_sleep
        budget = self._retrier.budget
        log.warning(
            "%s: attempt %d failed (%s: %s); trying again in %.1f s, giving up in %.0f s",
            self._what,
            state.attempt_number,
            cause.value,
            error.message,
            pause,
            max(0.0, budget - self.elapsed()),
            extra={
                "key": self._what,
                "attempt": state.attempt_number,
                "cause": cause.value,
                "retry_in_seconds": round(pause, 3),
                "gives_up_in_seconds": round(max(0.0, budget - self.elapsed()), 3),
            },
        )
        self._retrier.count(cause, self._on_retry)

    def given_up(self, exc: StoreUnavailable) -> StoreUnavailable:
        """Log that the budget ran out on ``exc``; the error that says so."""
        cause = retry_cause(exc.details.get("cause"))
        log.warning(
            "%s: giving up after %d attempt(s) over %.1f s; last error (%s): %s",
            self._what,
            self.tries,
            self.elapsed(),
            cause.value,
            exc.message,
            extra={"key": self._what, "attempt": self.tries, "cause": cause.value},
        )
        return StoreUnavailable(
            f"gave up on {self._what} after {self.tries} attempt(s) over {self.elapsed():.1f} s "
            f"({self._retrier.budget_name} is {self._retrier.budget:g} s); last error "
            f"({cause.value}): {exc.message}",
            details={
                "key": self._what,
                "attempts": self.tries,
                "seconds": round(self.elapsed(), 3),
                "cause": cause.value,
            },
        )


def report_refetch(
    telemetry: Telemetry | None, what: str, *, fetches: int, got: str, expected: str
) -> None:
    """Log and count that ``what`` hashed to ``got``, not ``expected``, and is fetched again
    (``fetches`` fetches so far)."""
    log.warning(
        "%s: its SHA256 is %s but SHA256SUMS lists %s; fetching it again (fetch %d of at "
        "most %d) to tell a fault on the way from a wrong file in the store",
        what,
        got,
        expected,
        fetches + 1,
        MAX_FETCHES,
        extra={"key": what, "attempt": fetches, "cause": RetryCause.CORRUPT.value},
    )
    if telemetry is not None:
        telemetry.store_retried(RetryCause.CORRUPT)


def _error_of(state: tenacity.RetryCallState) -> StoreUnavailable:
    outcome = state.outcome
    error = outcome.exception() if outcome is not None else None
    if isinstance(error, StoreUnavailable):
        return error
    return StoreUnavailable(repr(error))


def unstable(what: str, digests: list[str], expected: str) -> StoreUnavailable:
    """The error for a file whose digest differed on every fetch (none of them ``expected``)."""
    seen = ", ".join(d[:12] for d in digests)
    return StoreUnavailable(
        f"{what}: {len(digests)} fetches gave {len(digests)} different SHA256s ({seen}), none "
        f"the {expected[:12]} SHA256SUMS lists: something between here and the store corrupts "
        "data; the deploy can be tried again",
        details={"key": what, "cause": RetryCause.CORRUPT.value, "digests": digests},
    )
