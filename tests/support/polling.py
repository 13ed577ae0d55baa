"""Waiting for what a test caused to become true: poll with a deadline, never sleep-and-hope."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


def eventually(check: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> float:
    """Poll ``check`` until it holds; return how long that took, or fail naming ``what``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(every)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def throughout(check: Callable[[], bool], seconds: float, what: str, every: float = 0.2) -> int:
    """Poll ``check`` until ``seconds`` have passed, failing naming ``what`` the first time it
    does not hold (the opposite of :func:`eventually`: something that must *not* happen); how
    many looks it took."""
    deadline = time.monotonic() + seconds
    looks = 0
    while True:
        looks += 1
        assert check(), f"{what} stopped holding after {looks} look(s), before {seconds} s"
        if time.monotonic() >= deadline:
            return looks
        time.sleep(every)


async def until(
    check: Callable[[], bool | Awaitable[bool]],
    what: str,
    timeout: float = 5.0,
    *,
    fail: bool = True,
) -> bool:
    """:func:`eventually` on the event loop, for tests whose operations run in tasks on it;
    ``check`` may be a coroutine function (a read of the database). ``fail=False``: return
    whether it held instead of failing."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        held = check()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return True
        if loop.time() >= deadline:
            if not fail:
                return False
            raise AssertionError(f"{what} did not happen within {timeout} s")
        await asyncio.sleep(0.005)
