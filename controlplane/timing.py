"""The one time kit: every wait of the daemon's loops, on the injected clock.

Services and adapters never read ``loop.time()`` or call ``asyncio.sleep`` with a real
duration: they wait through this module, which waits through the :class:`~controlplane.ports.
Clock` it is given. The daemon gives the system clock; unit tests give a fake one whose time
moves only when the test says so, so a retry after five minutes or a budget of three seconds is
tested in no time and without races. What is here:

* :class:`Backoff` and :class:`RetryBook`: the one doubling backoff (a supervised job, a
  repair, a fleet target, a queue that cannot be read), and its per-key schedule;
* :class:`Wake` and :func:`first_of`: "sleep until the next beat, or until woken", the shape of
  every loop (reconcile, fleet sync, the release watcher);
* :func:`within` and :func:`poll`: a bounded wait for an awaitable, and a check repeated until
  it holds or a deadline passes.

It sits between the ports and the services and adapters that use it (``.importlinter``), and
holds :class:`SystemClock`, the real time behind the port.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from controlplane.ports import Clock

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class SystemClock:
    """The daemon's clock: the wall clock in UTC, the monotonic clock, the event loop's sleep."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


# --- backoff ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Wait ``first`` s after a first failure, ``factor`` times longer after each further one,
    never longer than ``limit``."""

    first: float
    limit: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.limit or self.factor < 1:
            raise ValueError(f"a backoff needs 0 < first <= limit and factor >= 1: {self}")

    def after(self, last: float | None) -> float:
        """The delay that follows ``last`` (None: the first failure)."""
        if last is None:
            return self.first
        return min(self.limit, max(self.first, last * self.factor))


@dataclass(frozen=True)
class Retry(Generic[T]):
    """One key's failure: when it may be tried again, the delay that led there, and what the
    caller keeps with it (the error, the target it failed for)."""

    at: float  # clock.monotonic() of the next try
    delay: float
    note: T


class RetryBook(Generic[K, T]):
    """Per key (a model), when a failed attempt may be tried again, on one :class:`Backoff`.

    A failure of a key that failed before waits longer; :meth:`succeeded` forgets it. With
    ``same`` given, a failure whose note differs from the last one's (another target) starts
    again from the first delay."""

    def __init__(
        self,
        backoff: Backoff,
        clock: Clock,
        *,
        same: Callable[[T, T], bool] = lambda _old, _new: True,
    ) -> None:
        self._backoff = backoff
        self._clock = clock
        self._same = same
        self._retries: dict[K, Retry[T]] = {}

    def failed(self, key: K, note: T, *, most: float | None = None) -> Retry[T]:
        """Record a failure; the next try waits longer, and at most ``most`` s when given."""
        last = self._retries.get(key)
        delay = self._backoff.after(
            last.delay if last is not None and self._same(last.note, note) else None
        )
        if most is not None:
            delay = min(delay, most)
        retry = Retry(self._clock.monotonic() + delay, delay, note)
        self._retries[key] = retry
        return retry

    def succeeded(self, key: K) -> None:
        self._retries.pop(key, None)

    def get(self, key: K) -> Retry[T] | None:
        return self._retries.get(key)

    def left(self, key: K) -> float:
        """Seconds until ``key`` may be tried again; 0 when it may now (or never failed)."""
        retry = self._retries.get(key)
        return 0.0 if retry is None else max(0.0, retry.at - self._clock.monotonic())

    def soonest(self) -> float | None:
        """Seconds until the first retry is due (0 when one is due now); None without any."""
        if not self._retries:
            return None
        return max(0.0, min(r.at for r in self._retries.values()) - self._clock.monotonic())

    def __contains__(self, key: object) -> bool:
        return key in self._retries

    def __len__(self) -> int:
        return len(self._retries)


# --- next beat or wake ----------------------------------------------------------------------


class Woke(StrEnum):
    """Why a wait for the next beat ended."""

    BEAT = "beat"  # the time was up
    WAKE = "wake"  # someone asked for a pass now
    WATCHED = "watched"  # one of the awaitables watched alongside finished


async def first_of(clock: Clock, seconds: float, futures: Sequence[asyncio.Future[Any]]) -> int:
    """Wait until one of ``futures`` (or tasks) finishes or ``seconds`` pass; the index of the
    first that finished, or -1 when the time was up. None is cancelled: the caller owns them."""
    timer = asyncio.ensure_future(clock.sleep(max(0.0, seconds)))
    try:
        # asyncio.wait, not wait_for: on Python 3.11 wait_for can lose a cancellation that
        # arrives as its awaitable finishes, and a loop that waits with it would never stop.
        done, _ = await asyncio.wait([*futures, timer], return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
    for index, future in enumerate(futures):
        if future in done:
            return index
    return -1


class Wake:
    """A loop's wake-up call: :meth:`set` asks for a pass now; :meth:`sleep` waits for the next
    beat, a wake, or anything watched alongside, and forgets the wake it answered."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()

    async def sleep(self, seconds: float, *, watch: Iterable[asyncio.Future[Any]] = ()) -> Woke:
        """Until ``seconds`` pass, :meth:`set` is called, or a ``watch`` future finishes (it
        is not cancelled: the caller owns it). A wake that came before the call ends it at
        once. The wake is cleared when the wait ends for it."""
        if self._event.is_set():
            self._event.clear()
            return Woke.WAKE
        watched = list(watch)
        woken = asyncio.ensure_future(self._event.wait())
        try:
            first = await first_of(self._clock, seconds, [woken, *watched])
        finally:
            woken.cancel()
        if first == 0 or self._event.is_set():
            self._event.clear()
            return Woke.WAKE
        return Woke.BEAT if first < 0 else Woke.WATCHED


class PokeGap:
    """Passes that answer pokes (wakes from other members, which need no token) start at least
    ``gap`` s apart, however many pokes come; a poke is never lost: one that comes during a
    pass, or during the wait, is answered by the next pass, which starts after it."""

    def __init__(self, gap: float, clock: Clock) -> None:
        self.gap = gap
        self.poked = False
        self._clock = clock
        self._last = -math.inf  # clock time of the last pass that answered a poke

    async def spaced(self) -> None:
        """Call just before a pass: wait out the gap if that pass answers a poke."""
        if not self.poked:
            return
        if (left := self._last + self.gap - self._clock.monotonic()) > 0:
            await self._clock.sleep(left)
        self.poked = False  # pokes from now on come after the read this pass makes
        self._last = self._clock.monotonic()


# --- bounded waits ----------------------------------------------------------------------------


async def within(clock: Clock, seconds: float, awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, or :class:`TimeoutError` once ``seconds`` pass on ``clock`` (the
    awaitable is then cancelled and awaited, so its clean-up has run when this raises)."""
    future = asyncio.ensure_future(awaitable)
    try:
        first = await first_of(clock, seconds, [future])
    except BaseException:
        future.cancel()
        await asyncio.gather(future, return_exceptions=True)
        raise
    if first < 0:
        future.cancel()
        await asyncio.gather(future, return_exceptions=True)
        raise TimeoutError(f"not done within {seconds:g} s")
    return future.result()


async def poll(
    clock: Clock,
    check: Callable[[], Awaitable[bool]],
    *,
    every: float,
    timeout: float,
) -> bool:
    """Call ``check`` until it answers True (then True) or ``timeout`` s have passed since the
    first call (then False: the last call was made at or after the deadline)."""
    deadline = clock.monotonic() + timeout
    while True:
        if await check():
            return True
        left = deadline - clock.monotonic()
        if left <= 0:
            return False
        await clock.sleep(min(every, left))


def seconds_left(clock: Clock, deadline: float) -> float:
    """Seconds from now to ``deadline`` (a ``clock.monotonic()`` value), never negative;
    ``math.inf`` stays infinite."""
    if math.isinf(deadline):
        return math.inf
    return max(0.0, deadline - clock.monotonic())
