"""Who may act on a model now, how many loads run at once, and the background tasks.

All operations on one model are serialized: a second request while one runs is refused with
``operation_in_progress`` (naming the running operation) rather than queued, so a CI job learns
at once that someone else is deploying. Loads across models are bounded (:class:`LoadSlots`);
an operation that has to wait for a load slot records the wait as its own step, ``queue``, so
that the time shows. Every background task is owned here and cancelled on shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from controlplane.domain.errors import OperationInProgress
from controlplane.services.tracker import OperationTracker

log = logging.getLogger(__name__)


class ModelLocks:
    def __init__(self) -> None:
        self._holders: dict[str, str] = {}
        self._freed: dict[str, asyncio.Event] = {}  # set when the model's holder lets go

    def claim(self, model: str, operation_id: str) -> None:
        holder = self._holders.get(model)
        if holder is not None:
            raise OperationInProgress(
                f"operation {holder} is already running on model {model!r}; wait for it "
                f"(GET /v1/operations/{holder}) and try again",
                details={"operation_id": holder},
            )
        self._holders[model] = operation_id

    def release(self, model: str, operation_id: str) -> None:
        if self._holders.get(model) == operation_id:
            del self._holders[model]
            freed = self._freed.pop(model, None)
            if freed is not None:
                freed.set()

    def holder(self, model: str) -> str | None:
        return self._holders.get(model)

    async def released(self, model: str) -> None:
        """Return once the operation holding ``model`` now lets go (at once when none does)."""
        if model not in self._holders:
            return
        await self._freed.setdefault(model, asyncio.Event()).wait()


class LoadSlots:
    """At most ``size`` loads at once across models (Triton's own load threads are the real
    bound: more at once only queue inside Triton, where no one sees them wait)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("at least one load slot is needed")
        self.size = size
        self._slots = asyncio.Semaphore(size)

    @asynccontextmanager
    async def hold(self, tracker: OperationTracker | None = None) -> AsyncIterator[None]:
        """Hold a load slot; a wait for one is recorded as the step ``queue``."""
        if tracker is not None and self._slots.locked():
            async with tracker.step("queue"):
                tracker.detail(load_slots=self.size)
                await self._slots.acquire()
        else:
            await self._slots.acquire()
        try:
            yield
        finally:
            self._slots.release()


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
