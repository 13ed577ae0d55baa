"""The operation client: the one way to start an operation, wait for it and read its outcome.

Every caller goes through it: the API and the CLI behind it, the fleet sync, the reconcile
loop's repairs, the rollback chain, the release watcher and the retire timers. What differs
between them is said in two values, not in code of their own:

* :class:`Patience`, what to do when another operation holds the model: refuse at once (the
  API, so that a CI job learns who is deploying), wait behind the daemon's own housekeeping (a
  deploy does not fail because an old slot is being freed), or wait for any holder within a
  bound (a rollback within its budget, a retire until the model is free);
* a budget: an operation still running when it runs out is cut short (reason ``budget``),
  and its clean-up has run when the outcome is returned.

:class:`Outcome` says how it ended, in one shape for every caller: succeeded, unchanged (it
served already), failed (with the code and message), interrupted, cut short, busy (another
operation holds the model and patience ran out) or refused (a check failed before anything
was recorded). A caller that wants the refusal as an error (the API) uses :meth:`start`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from controlplane.domain.errors import ControlPlaneError, OperationInProgress
from controlplane.domain.operations import (
    REFUSE,
    CancelReason,
    Cause,
    Operation,
    OperationKind,
    OperationStatus,
    Patience,
    Trigger,
    Unchanged,
)
from controlplane.ports import Clock
from controlplane.services.runner import Body, OperationRunner
from controlplane.timing import within

log = logging.getLogger(__name__)


class Begin(Protocol):
    """What a caller hands the client: a call of one of the deploy service's entry points
    (``partial(deploy.deploy, model, release, trigger=...)``) that claims the model with the
    patience it is given."""

    def __call__(self, *, patience: Patience) -> Awaitable[Operation | Unchanged]: ...


class Ended(StrEnum):
    SUCCEEDED = "succeeded"
    UNCHANGED = "unchanged"  # what it would serve serves already: nothing was done
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # the daemon stopped while it ran
    CUT_SHORT = "cut_short"  # its budget ran out; its clean-up ran
    BUSY = "busy"  # another operation held the model past the caller's patience
    REFUSED = "refused"  # a check refused it before anything was recorded


@dataclass(frozen=True)
class Outcome:
    ended: Ended
    operation: Operation | None = None  # None: nothing was recorded (unchanged, busy, refused)
    code: str | None = None  # the error's code, when it did not succeed
    message: str | None = None
    holder: str | None = None  # busy: the operation that held the model
    unchanged: Unchanged | None = None
    transient: bool = False  # the error is one the store or Triton may not give next time

    @property
    def succeeded(self) -> bool:
        """What the caller asked for serves now (done now, or already)."""
        return self.ended in (Ended.SUCCEEDED, Ended.UNCHANGED)

    @property
    def error(self) -> str:
        """``code: message`` for a log line or a heartbeat; the ended state when neither."""
        if self.code is None:
            return self.ended.value
        return f"{self.code}: {self.message}" if self.message else self.code

    @property
    def retryable(self) -> bool:
        """Worth trying again unchanged: busy, interrupted, cut short, or an error the store or
        Triton may not give next time."""
        return self.transient or self.ended in (Ended.BUSY, Ended.INTERRUPTED, Ended.CUT_SHORT)


# The codes of the transient errors (domain/errors.py), as a finished operation records them.
TRANSIENT_CODES = frozenset(
    {"store_unavailable", "release_changed", "triton_unavailable", "triton_timeout"}
)


class OperationClient:
    def __init__(self, *, runner: OperationRunner, clock: Clock) -> None:
        self._runner = runner
        self._clock = clock

    async def start(self, begin: Begin, *, patience: Patience = REFUSE) -> Operation | Unchanged:
        """Start it and return at once; a refusal (busy included) raises, as the API wants."""
        return await begin(patience=patience)

    async def run(
        self, begin: Begin, *, patience: Patience = REFUSE, budget: float = math.inf
    ) -> Outcome:
        """Start it and wait for its end, within ``budget`` s from now (the wait for the model
        included): the outcome, never an exception but for cancellation."""
        deadline = self._clock.monotonic() + budget
        try:
            started = await begin(patience=patience)
        except OperationInProgress as exc:
            return Outcome(Ended.BUSY, code=exc.code, message=exc.message, holder=_holder_of(exc))
        except ControlPlaneError as exc:
            return Outcome(
                Ended.REFUSED, code=exc.code, message=exc.message, transient=exc.retryable
            )
        if isinstance(started, Unchanged):
            return Outcome(Ended.UNCHANGED, message=started.message, unchanged=started)
        return await self.wait(started.id, budget=max(0.0, deadline - self._clock.monotonic()))

    async def wait(self, operation_id: str, *, budget: float = math.inf) -> Outcome:
        """The outcome of an operation once it has ended; past ``budget`` s it is cut short
        (its clean-up runs, bounded) and the outcome says so. Waiting does not cancel it."""
        try:
            done = await within(self._clock, budget, self._runner.wait(operation_id))
        except TimeoutError:
            cut = await self._runner.cancel(operation_id, CancelReason.BUDGET)
            return Outcome(
                Ended.CUT_SHORT,
                cut,
                code="budget_exceeded",
                message=f"did not finish within {budget:g} s; cut short",
            )
        return outcome_of(done)

    async def housekeeping(
        self,
        kind: OperationKind,
        model: str,
        body: Body,
        *,
        cause: Cause,
        release: str | None = None,
        patience: Patience = REFUSE,
        budget: float = math.inf,
    ) -> Outcome:
        """Run one of the daemon's own operations (retire, repair) through the same door."""

        async def begin(*, patience: Patience) -> Operation:
            return await self._runner.begin(
                kind=kind,
                model=model,
                release=release,
                trigger=Trigger.SCHEDULE if kind is OperationKind.RETIRE else Trigger.RECONCILE,
                from_release=release,
                body=body,
                cause=cause,
                patience=patience,
            )

        return await self.run(begin, patience=patience, budget=budget)

    def holder(self, model: str) -> str | None:
        """The operation holding ``model`` now; None when it is free."""
        return self._runner.holder(model)

    def latest(self, model: str) -> Operation | None:
        """The latest operation on ``model`` in this process, as it stands now."""
        return self._runner.latest(model)

    async def until_free(self, model: str) -> None:
        """Return once no operation holds ``model`` (at once when none does)."""
        await self._runner.until_free(model)


def outcome_of(operation: Operation) -> Outcome:
    """How a finished operation ended, in the client's words."""
    error = operation.error
    code, message = (error.code, error.message) if error is not None else (None, None)
    if operation.status is OperationStatus.SUCCEEDED:
        return Outcome(Ended.SUCCEEDED, operation)
    if operation.status is OperationStatus.INTERRUPTED and code == "budget_exceeded":
        return Outcome(Ended.CUT_SHORT, operation, code, message)
    if operation.status is OperationStatus.INTERRUPTED:
        return Outcome(Ended.INTERRUPTED, operation, code, message)
    code = code or "internal_error"
    return Outcome(Ended.FAILED, operation, code, message, transient=code in TRANSIENT_CODES)


def _holder_of(exc: OperationInProgress) -> str | None:
    holder = exc.details.get("operation_id")
    return holder if isinstance(holder, str) else None
