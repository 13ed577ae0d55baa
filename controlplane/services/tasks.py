"""The background tasks the services start: owned here, kept referenced, cancelled and awaited
on shutdown (retire timers, the watcher's follow-ups, the overload action)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskOwner:
    """Owns background tasks: keeps them referenced, cancels and awaits them on close."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[Any]] = {}

    def spawn(self, key: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=key)
        self._tasks[key] = task

        def forget(done: asyncio.Task[Any]) -> None:
            if self._tasks.get(key) is done:  # a newer task under the same key stays
                del self._tasks[key]

        task.add_done_callback(forget)
        return task

    def get(self, key: str) -> asyncio.Task[Any] | None:
        return self._tasks.get(key)

    def cancel(self, key: str) -> bool:
        task = self._tasks.get(key)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    async def close(self, timeout: float = 10.0) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                log.warning("background task %s did not stop within %.0f s", task, timeout)
