"""Blocking calls that cannot be interrupted (an SQS long poll), each in a daemon thread.

A worker thread of the event loop's default executor would hold the process's exit until the
call returns (up to 20 s for a long poll); a daemon thread of its own never does. Cancelling
the wait leaves the thread to end on its own; what it returns then is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[[], T], *, name: str = "sqs") -> T:
    """``fn()`` in a daemon thread of its own; cancelling the wait leaves the thread to end
    on its own and never holds the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], T]) -> None:
        if future.done():  # the wait was cancelled
            return
        try:
            future.set_result(outcome())
        except BaseException as exc:  # handed to the awaiting task, whatever it is
            future.set_exception(exc)

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:
            error = exc

            def outcome() -> T:
                raise error

        else:

            def outcome() -> T:
                return result

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await future
