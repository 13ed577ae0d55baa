"""The operation runner: the one place that starts, tracks, cancels and ends operations.

It owns, for every operation: the model's lock (taken before anything is recorded, released
after everything is cleaned), the task that runs the body, the tracker that records it, the
reason it may be cut short, and the clean-up of its staging dir. All operations on one model
are serialized: a second one waits as its :class:`Patience` allows, then is refused with
``operation_in_progress`` naming the one that runs. Loads across models are bounded
(:class:`LoadSlots`); an operation that has to wait for a load slot records the wait as its own
step, ``queue``, so that the time shows. Bodies (the blue-green and
inplace pipelines, the CPU-only reload, retire, repair) receive a :class:`Run` and nothing else
of the runner's.

Cancellation always has a reason (:class:`~controlplane.domain.operations.CancelReason`),
set on the :class:`Run` before the task is cancelled, because the right clean-up depends on
it: at shutdown a load cut short is left for start-up reconcile (Triton may still read the
placed files, and the daemon is going away); when a rollback budget runs out the daemon goes
on, so the body puts placement and slot state back at once and leaves to reconcile only what
has to wait for Triton. A body's clean-up on cancellation must be quick (no waiting on Triton):
:meth:`OperationRunner.cancel` returns within :data:`CANCEL_GRACE` either way.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

from controlplane.domain.errors import ControlPlaneError, OperationInProgress, OperationNotFound
from controlplane.domain.operations import (
    NO_CAUSE,
    CancelReason,
    Cause,
    Operation,
    OperationKind,
    OperationStatus,
    Patience,
    Step,
    Trigger,
)
from controlplane.ports import Clock, OperationLog, Staging, Telemetry
from controlplane.services.telemetry import NO_TELEMETRY
from controlplane.services.tracker import OperationTracker, current_operation
from controlplane.timing import first_of, seconds_left

log = logging.getLogger(__name__)
CANCEL_GRACE = 1.0  # what a cut-short operation may take to put things back


@dataclass
class Run:
    """What an operation's body works with: its record, and why it may be stopped."""

    tracker: OperationTracker
    cancel_reason: CancelReason | None = None

    @property
    def operation(self) -> Operation:
        return self.tracker.operation

    @property
    def model(self) -> str:
        return self.tracker.operation.model

    @property
    def trigger(self) -> Trigger:
        return self.tracker.operation.trigger

    @property
    def stopping(self) -> bool:
        """Cut short because the daemon stops: leave what Triton still works on to start-up
        reconcile."""
        return self.cancel_reason in (None, CancelReason.SHUTDOWN)


Body = Callable[[Run], Awaitable[None]]
AfterSuccess = Callable[[Operation], Awaitable[None]]


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


@dataclass
class Claim:
    """A model held for an operation that is not recorded yet (see
    :meth:`OperationRunner.claimed`)."""

    runner: OperationRunner
    model: str
    operation_id: str
    started: bool = False

    async def start(
        self,
        kind: OperationKind,
        release: str | None,
        trigger: Trigger,
        body: Body,
        *,
        from_release: str | None,
        done_steps: Sequence[Step] = (),
        after: AfterSuccess | None = None,
        cause: Cause = NO_CAUSE,
    ) -> Operation:
        self.started = True  # the lock is the operation's from here, whatever happens
        return await self.runner.start(
            self.operation_id,
            kind=kind,
            model=self.model,
            release=release,
            trigger=trigger,
            from_release=from_release,
            body=body,
            done_steps=done_steps,
            after=after,
            cause=cause,
        )


class OperationRunner:
    def __init__(
        self,
        *,
        journal: OperationLog,
        staging: Staging,
        clock: Clock,
        locks: ModelLocks,
        telemetry: Telemetry = NO_TELEMETRY,
        member: str | None = None,
    ) -> None:
        self._journal = journal
        self._member = member  # recorded on every operation: which daemon ran it
        self._staging = staging
        self._clock = clock
        self._locks = locks
        self._telemetry = telemetry
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._runs: dict[str, Run] = {}
        self._latest: dict[str, OperationTracker] = {}  # model -> its latest operation

    # --- starting -------------------------------------------------------------------------

    async def claim(self, model: str, patience: Patience) -> str:
        """Take ``model``'s lock for a new operation; its id. While another operation holds
        it, wait as ``patience`` allows (for holders of its kinds, up to its seconds), then
        :class:`OperationInProgress` naming the holder."""
        deadline = self._clock.monotonic() + patience.seconds
        while (holder := self._locks.holder(model)) is not None:
            run = self._runs.get(holder)
            kind = run.operation.kind if run is not None else None
            left = seconds_left(self._clock, deadline)
            if not patience.waits_for(kind) or left <= 0:
                break
            log.info(
                "model %s: waiting up to %g s for the %s operation %s to end first",
                model,
                left,
                kind.value if kind is not None else "starting",
                holder,
                extra={"model": model},
            )
            released = asyncio.ensure_future(self._locks.released(model))
            try:
                await first_of(self._clock, left, [released])
            finally:
                released.cancel()
        operation_id = uuid.uuid4().hex[:16]
        self._locks.claim(model, operation_id)  # refuses (naming the holder) if still held
        return operation_id

    def release(self, model: str, operation_id: str) -> None:
        """Give back a lock taken by :meth:`claim` for an operation that was never started."""
        self._locks.release(model, operation_id)

    async def start(
        self,
        operation_id: str,
        *,
        kind: OperationKind,
        model: str,
        release: str | None,
        trigger: Trigger,
        from_release: str | None,
        body: Body,
        done_steps: Sequence[Step] = (),
        after: AfterSuccess | None = None,
        cause: Cause = NO_CAUSE,
    ) -> Operation:
        """Record the operation (with the checks already made) and run ``body`` in a task.

        The record is on disk before this returns: whoever is told the operation's id (a 202
        answer) finds it after a crash. The lock taken by :meth:`claim` passes to the task,
        which releases it at its end."""
        try:
            tracker = OperationTracker(
                Operation(
                    id=operation_id,
                    kind=kind,
                    model=model,
                    release=release,
                    trigger=trigger,
                    status=OperationStatus.RUNNING,
                    created_at=done_steps[0].started_at if done_steps else self._clock.now(),
                    from_release=from_release,
                    member=self._member,
                    cause=cause,
                ),
                self._journal,
                self._clock,
                self._telemetry,
            )
            for step in done_steps:
                tracker.done_step(step)
            await self._journal.flush()
        except BaseException:
            self._locks.release(model, operation_id)
            raise
        run = Run(tracker)
        self._runs[operation_id] = run
        self._latest[model] = tracker
        task = asyncio.get_running_loop().create_task(
            self._run(run, body, after), name=f"operation-{operation_id}"
        )
        self._tasks[operation_id] = task
        task.add_done_callback(lambda _done: self._forget(operation_id))
        return tracker.operation

    @asynccontextmanager
    async def claimed(self, model: str, patience: Patience) -> AsyncIterator[Claim]:
        """Hold ``model`` (claimed with ``patience``) while the checks before an operation
        run; :meth:`Claim.start` hands the lock to the operation, else it is let go on exit."""
        claim = Claim(self, model, await self.claim(model, patience))
        try:
            yield claim
        finally:
            if not claim.started:
                self._locks.release(model, claim.operation_id)

    async def begin(
        self,
        *,
        kind: OperationKind,
        model: str,
        release: str | None,
        trigger: Trigger,
        from_release: str | None,
        body: Body,
        cause: Cause = NO_CAUSE,
        patience: Patience,
    ) -> Operation:
        """Claim (with ``patience``) and start: the daemon's own operations (retire, repair)."""
        operation_id = await self.claim(model, patience)
        return await self.start(
            operation_id,
            kind=kind,
            model=model,
            release=release,
            trigger=trigger,
            from_release=from_release,
            body=body,
            cause=cause,
        )

    # --- following ------------------------------------------------------------------------

    def holder(self, model: str) -> str | None:
        return self._locks.holder(model)

    def latest(self, model: str) -> Operation | None:
        """The latest operation on ``model`` this process ran, as it stands (its steps so far
        while it runs): what the heartbeat says of a rolling update, with no journal read."""
        tracker = self._latest.get(model)
        return tracker.operation if tracker is not None else None

    async def until_free(self, model: str) -> None:
        await self._locks.released(model)

    async def wait(self, operation_id: str) -> Operation:
        """The operation once it has ended (waiting does not cancel it)."""
        task = self._tasks.get(operation_id)
        if task is not None:
            await asyncio.wait([task])
        return await self.get(operation_id)

    async def get(self, operation_id: str) -> Operation:
        operation = await self._journal.get(operation_id)
        if operation is None:
            raise OperationNotFound(f"no operation with id {operation_id!r}")
        return operation

    async def cancel(self, operation_id: str, reason: CancelReason) -> Operation:
        """Cut an operation short for ``reason``; its own clean-up runs (bounded by
        :data:`CANCEL_GRACE`); return its record."""
        task = self._tasks.get(operation_id)
        run = self._runs.get(operation_id)
        if task is not None and run is not None and not task.done():
            run.cancel_reason = reason
            task.cancel(f"cancelled: {reason.value}")
            if await first_of(self._clock, CANCEL_GRACE, [task]) < 0:
                log.error(
                    "operation %s did not end within %.1f s of being cut short (%s)",
                    operation_id,
                    CANCEL_GRACE,
                    reason.value,
                )
        return await self.get(operation_id)

    async def close(self, timeout: float = 10.0) -> None:
        """Shutdown: cut every running operation short and wait for their clean-up."""
        tasks = list(self._tasks.items())
        for operation_id, task in tasks:
            run = self._runs.get(operation_id)
            if run is not None:
                run.cancel_reason = CancelReason.SHUTDOWN
            task.cancel("cancelled: shutdown")
        deadline = self._clock.monotonic() + timeout
        for operation_id, task in tasks:
            if await first_of(self._clock, seconds_left(self._clock, deadline), [task]) < 0:
                log.warning("operation %s did not stop within %.0f s", operation_id, timeout)

    # --- running --------------------------------------------------------------------------

    async def _run(self, run: Run, body: Body, after: AfterSuccess | None) -> None:
        """Run ``body``; then clean up, let go of the model, and only then record the outcome,
        so that whoever sees the operation finished can start the next one at once."""
        tracker = run.tracker
        operation = tracker.operation
        current_operation.set(operation.id)  # this task's own context: every log line names it
        finish: Callable[[], object]
        cancelled: asyncio.CancelledError | None = None
        try:
            await body(run)
            finish = tracker.succeed
            if after is not None:
                try:
                    await after(tracker.operation)
                except Exception:  # the work is done; a follow-up must not say otherwise
                    log.exception("follow-up of %s failed", operation.id)
        except ControlPlaneError as exc:
            finish = partial(tracker.fail, exc)
        except asyncio.CancelledError as exc:
            finish = partial(tracker.interrupt, run.cancel_reason or CancelReason.SHUTDOWN)
            cancelled = exc
        except Exception as exc:
            log.exception("operation %s failed unexpectedly", operation.id)
            finish = partial(tracker.fail, ControlPlaneError(f"unexpected error: {exc!r}"))
        try:
            await asyncio.shield(asyncio.to_thread(self._staging.cleanup, operation.id))
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
        finally:
            self._locks.release(operation.model, operation.id)
            finish()
        try:  # the outcome is on disk before anyone is told (a kill now loses nothing)
            await asyncio.shield(self._journal.flush())
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
        if cancelled is not None:
            raise cancelled

    def _forget(self, operation_id: str) -> None:
        self._tasks.pop(operation_id, None)
        self._runs.pop(operation_id, None)
