"""A clock for unit tests whose time moves only when the test says so.

Every wait of the daemon goes through :meth:`controlplane.ports.Clock.sleep` (the time kit in
:mod:`controlplane.timing` builds on it), so with this clock a five-minute backoff or a
three-second budget passes in an instant, when the test calls :meth:`FakeClock.advance`, and
never by accident: a test that does not advance the clock sees no beat, no retry and no
timeout. :meth:`FakeClock.sleeping` lets a test wait (with a real deadline) until the code
under test has come to rest in a sleep, the moment to look at what it did or to move time on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import linecache
import os
import sys
import threading
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

from tests.support.polling import until

START = datetime(2025, 3, 1, 8, 0, 0, tzinfo=UTC)


class FakeClock:
    """Time that moves only when a test says so: fixed start, :meth:`advance`."""

    def __init__(self, start: datetime = START) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start")
        self._start = start.astimezone(UTC)
        self._elapsed = 0.0
        self._order = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        return self._elapsed

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._elapsed + seconds, next(self._order), future))
        await future

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` and wake every sleep that is due by then (the tasks
        run at the event loop's next turn)."""
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._elapsed += seconds
        while self._sleepers and self._sleepers[0][0] <= self._elapsed:
            _due, _order, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def next_wake(self) -> float | None:
        """Seconds until the earliest sleep is due; None when nothing sleeps."""
        self._forget_cancelled()
        return self._sleepers[0][0] - self._elapsed if self._sleepers else None

    async def step(self) -> float:
        """Move time on to the earliest sleep that is due and wake it; the seconds moved."""
        left = self.next_wake()
        if left is None:
            raise AssertionError("nothing sleeps on this clock: there is no time to move to")
        self.advance(max(0.0, left))
        await asyncio.sleep(0)
        return left

    def sleepers(self) -> int:
        self._forget_cancelled()
        return len(self._sleepers)

    async def sleeping(self, count: int = 1, timeout: float = 5.0) -> None:
        """Return once at least ``count`` tasks sleep on this clock (real-time bound)."""

        await until(
            lambda: self.sleepers() >= count, f"{count} task(s) asleep on the fake clock", timeout
        )

    async def run_for(self, seconds: float, idle: float = 0.2) -> None:
        """Let ``seconds`` pass in steps, from sleep to sleep, waking each sleep in turn (a
        loop that sleeps one second ten times makes ten passes in ``run_for(10)``). Each step
        waits (real time, at most ``idle`` s) until something sleeps, so that work in threads
        comes to rest first; with nothing asleep by then, the rest of the time just passes."""
        end = self._elapsed + seconds
        while True:
            await until(lambda: self.sleepers() > 0, "a sleep", idle, fail=False)
            await _settle()
            left = self.next_wake()
            if left is None or self._elapsed + left > end:
                break
            self.advance(max(0.0, left))
        self.advance(max(0.0, end - self._elapsed))
        await _settle()

    @asynccontextmanager
    async def autojump(self) -> AsyncIterator[None]:
        """While inside: whenever the event loop has nothing left to run and no worker thread
        is busy, move time on to the earliest sleep, as if the time had passed."""

        async def jump() -> None:
            while True:
                await _settle()
                left = self.next_wake()
                if left is None:
                    await asyncio.sleep(0.001)  # nothing sleeps yet: let real work go on
                else:
                    self.advance(max(0.0, left))

        jumper = asyncio.create_task(jump(), name="fake-clock-autojump")
        try:
            yield
        finally:
            jumper.cancel()
            await asyncio.gather(jumper, return_exceptions=True)

    def _forget_cancelled(self) -> None:
        self._sleepers = [entry for entry in self._sleepers if not entry[2].done()]
        heapq.heapify(self._sleepers)


async def _settle(turns: int = 20) -> None:
    """Let the tasks that can run, run (a few turns of the event loop), and wait (real time)
    for the jobs worker threads are running: a database read, a file copy. Time must not
    jump while the code under test waits on a thread, or a bound would expire that no real
    time could have exhausted."""
    quiet = 0
    while quiet < 2:  # two looks a little apart: a job handed over between them is seen
        for _ in range(turns):
            await asyncio.sleep(0)
        quiet = 0 if _workers_busy() else quiet + 1
        await asyncio.sleep(0.0005)


def _workers_busy() -> bool:
    """Whether a thread-pool worker (``asyncio.to_thread``'s, the database's) runs a job now
    or has one queued: an idle worker's innermost Python frame is the pool's own loop, waiting
    on an empty queue."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident) if thread.ident is not None else None
        if frame is None or thread is threading.current_thread():
            continue
        innermost: types.FrameType = frame
        found: types.FrameType | None = frame
        while found is not None and not _pool_loop(found):
            found = found.f_back
        if found is None:
            continue  # not a pool's worker
        if found is not innermost or "work_queue.get(" not in linecache.getline(
            found.f_code.co_filename, found.f_lineno
        ):
            return True  # inside a job, or just given one
        queue = found.f_locals.get("work_queue")
        if queue is not None and not queue.empty():
            return True  # a job submitted that no worker has taken yet
    return False


def _pool_loop(frame: types.FrameType) -> bool:
    code = frame.f_code
    return code.co_name == "_worker" and code.co_filename.endswith(
        os.path.join("concurrent", "futures", "thread.py")
    )
