"""Records one operation as it runs: each step timed, persisted as it starts and ends.

The persisted operation is the source of truth for ``GET /v1/operations/{id}`` and for the
CLI's step-by-step output, so it is saved at every step boundary. Saving queues the record on
the database's own thread and returns at once (records land in the order they were made), so
neither the event loop nor a download thread waits on the disk. Progress from worker threads
(bytes fetched) is folded in under a lock and saved at most every half second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.operations import CancelReason, Operation, Step
from controlplane.ports import Clock, FetchProgress, OperationLog, Telemetry
from controlplane.services.telemetry import NO_TELEMETRY

log = logging.getLogger(__name__)

# The operation the running task works for: every log line it writes carries its id, whichever
# module writes it (see cli/logs.py). Tasks and threads started from it inherit the context.
current_operation: ContextVar[str | None] = ContextVar("current_operation", default=None)
PROGRESS_SAVE_INTERVAL = 0.5


class OperationTracker:
    def __init__(
        self,
        operation: Operation,
        journal: OperationLog,
        clock: Clock,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self._op = operation
        self._journal = journal
        self._clock = clock
        self._telemetry = telemetry
        self._lock = threading.Lock()
        self._last_progress_save = 0.0
        self._save()

    @property
    def operation(self) -> Operation:
        return self._op

    @asynccontextmanager
    async def step(self, name: str) -> AsyncIterator[None]:
        self._apply(lambda op: op.start_step(name, self._clock.now()))
        log.info("step %s started", name, extra={"operation_id": self._op.id, "step": name})
        try:
            yield
        except BaseException:
            self._apply(lambda op: op.finish_step(self._clock.now(), ok=False))
            raise
        self._apply(lambda op: op.finish_step(self._clock.now(), ok=True))
        step = self._op.steps[-1]
        log.info(
            "step %s done in %.3f s",
            name,
            step.duration_seconds or 0.0,
            extra={"operation_id": self._op.id, "step": name},
        )

    def done_step(self, step: Step) -> None:
        """Record a step that ran before the operation existed (the checks that could refuse
        the request: a refusal before any work is not an operation)."""
        finished = step.finished_at or step.started_at
        self._apply(lambda op: op.with_done_step(step.name, step.started_at, finished, step.detail))

    def detail(self, **detail: object) -> None:
        self._apply(lambda op: op.with_step_detail(detail))

    def operation_detail(self, detail: Mapping[str, object]) -> None:
        self._apply(lambda op: op.with_detail(detail))

    def progress(self, progress: FetchProgress) -> None:
        """Called from the fetching thread."""
        with self._lock:
            self._op = self._op.with_step_detail(
                {
                    "files_done": progress.files_done,
                    "files_total": progress.files_total,
                    "bytes_done": progress.bytes_done,
                    "bytes_total": progress.bytes_total,
                }
            )
            now = self._clock.monotonic()
            if now - self._last_progress_save >= PROGRESS_SAVE_INTERVAL:
                self._last_progress_save = now
                self._journal.save(self._op)

    def succeed(self) -> Operation:
        self._apply(lambda op: op.succeed(self._clock.now()))
        log.info("operation succeeded", extra={"operation_id": self._op.id})
        self._telemetry.operation_finished(self._op)
        return self._op

    def fail(self, error: ControlPlaneError) -> Operation:
        self._apply(lambda op: op.fail(self._clock.now(), error.code, error.message))
        log.warning("operation failed: %s", error, extra={"operation_id": self._op.id})
        self._telemetry.operation_finished(self._op)
        return self._op

    def interrupt(self, reason: CancelReason, note: str = "") -> Operation:
        self._apply(lambda op: op.interrupt(self._clock.now(), reason, note))
        error = self._op.error
        log.warning(
            "operation interrupted (%s): %s",
            reason.value,
            error.message if error else "",
            extra={"operation_id": self._op.id},
        )
        self._telemetry.operation_finished(self._op)
        return self._op

    def _apply(self, change: Callable[[Operation], Operation]) -> None:
        with self._lock:
            self._op = change(self._op)
            self._journal.save(self._op)

    def _save(self) -> None:
        self._journal.save(self._op)
