"""Operations: one deploy, rollback or unload, with ordered, timed steps and an outcome.

Operations are frozen values; every change returns a new one, so the copy persisted after each
step is exactly what a reader sees. An operation that was running when the daemon died is
marked ``interrupted`` at the next start-up, never silently dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class OperationKind(StrEnum):
    """What an operation does. Two families, which status keeps apart (:data:`CHANGES`,
    :data:`HOUSEKEEPING`):

    * changes of what serves, asked for by a person, a script or the daemon's watchers: deploy,
      rollback, unload, and cpu-fallback (the rollback chain's last step reloads the serving
      release on CPU only, so what serves, and how, changes). Status's "last operation" is the
      newest of these: what an operator asked for, or what was done to the model on its behalf.
    * housekeeping, the daemon's own upkeep that leaves what serves as it was meant to be:
      retire (freeing the old blue-green slot once its keep-warm time is over) and repair
      (putting back what Triton lost), by kind, even a repair that redeploys. Shown apart, so a
      retire half a minute after a deploy never hides that deploy's outcome.
    """

    DEPLOY = "deploy"
    ROLLBACK = "rollback"
    UNLOAD = "unload"
    RETIRE = "retire"
    CPU_FALLBACK = "cpu-fallback"  # the serving release reloaded on CPU-only instances
    REPAIR = "repair"  # put back what should serve after Triton lost it (restart, drift)


CHANGES = frozenset(
    {OperationKind.DEPLOY, OperationKind.ROLLBACK, OperationKind.UNLOAD, OperationKind.CPU_FALLBACK}
)
HOUSEKEEPING = frozenset({OperationKind.RETIRE, OperationKind.REPAIR})


class Trigger(StrEnum):
    """Why an operation started."""

    API = "api"
    CLI = "cli"
    WATCHER = "watcher"
    ALERT = "alert"
    RECONCILE = "reconcile"
    SCHEDULE = "schedule"  # a timer the daemon set itself (retiring an old slot)
    FLEET = "fleet"  # the fleet's desired state moved (another member went first)


class CancelReason(StrEnum):
    """Why an operation stopped before its end: its record and its clean-up depend on it."""

    SHUTDOWN = "shutdown"  # the daemon is stopping; start-up reconcile finishes the job
    BUDGET = "budget"  # a rollback budget ran out; the daemon goes on, so it puts things back
    CRASH = "crash"  # found running at start-up: the daemon died while it ran


_CANCELLED = {
    CancelReason.SHUTDOWN: (
        "interrupted",
        "the daemon stopped while this operation ran; start-up reconcile brings back the last "
        "release that succeeded",
    ),
    CancelReason.BUDGET: (
        "budget_exceeded",
        "cut short because it did not finish within its rollback budget; what served before "
        "was put back",
    ),
    CancelReason.CRASH: (
        "interrupted",
        "the daemon stopped while this operation ran; start-up reconcile brings back the last "
        "release that succeeded",
    ),
}


class OperationStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        return self in (self.SUCCEEDED, self.FAILED, self.INTERRUPTED)


class StepStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class Step:
    name: str
    status: StepStatus
    started_at: datetime
    finished_at: datetime | None = None
    detail: Mapping[str, object] = field(default_factory=dict)

    @property
    def duration_seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class OperationError:
    code: str
    message: str


@dataclass(frozen=True)
class Cause:
    """Why an operation started, beyond its trigger (what ``controlplane history`` shows):
    ``reason`` in words (a rollback's reason, the repair's finding, what a person wrote), and,
    for trigger ``fleet``, ``set_by``: the member that moved the fleet's desired state."""

    reason: str | None = None
    set_by: str | None = None


NO_CAUSE = Cause()


@dataclass(frozen=True)
class Patience:
    """What a new operation does while another holds its model: wait for holders of the
    ``behind`` kinds (None: any holder) up to ``seconds``, then refuse (``operation_in_progress``,
    naming the holder). The default refuses at once."""

    behind: frozenset[OperationKind] | None = frozenset()
    seconds: float = 0.0

    def waits_for(self, kind: OperationKind | None) -> bool:
        if self.behind is None:
            return True
        return kind is not None and kind in self.behind


REFUSE = Patience()  # another operation holds the model: say so at once (the API)


def housekeeping(seconds: float) -> Patience:
    """Behind the daemon's own freeing of an old slot (a retire, bounded by its drain and its
    unload: ``seconds``): a deploy must not fail for it."""
    return Patience(behind=frozenset({OperationKind.RETIRE}), seconds=seconds)


def any_holder(seconds: float) -> Patience:
    """Wait up to ``seconds`` for whatever holds the model to end, then refuse."""
    return Patience(behind=None, seconds=seconds)


@dataclass(frozen=True)
class Unchanged:
    """A request for what serves already (the same release, unchanged in the store): nothing
    to do, and no operation is recorded."""

    model: str
    release: str
    message: str


@dataclass(frozen=True)
class Operation:
    """``member`` is the daemon that ran it (``fleet.member``); each member's journal holds
    only its own operations."""

    id: str
    kind: OperationKind
    model: str
    release: str | None
    trigger: Trigger
    status: OperationStatus
    created_at: datetime
    from_release: str | None = None
    finished_at: datetime | None = None
    steps: tuple[Step, ...] = ()
    error: OperationError | None = None
    detail: Mapping[str, object] = field(default_factory=dict)
    member: str | None = None
    cause: Cause = NO_CAUSE

    @property
    def duration_seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.created_at).total_seconds()

    def running(self) -> Operation:
        return dataclasses.replace(self, status=OperationStatus.RUNNING)

    def start_step(self, name: str, at: datetime) -> Operation:
        step = Step(name=name, status=StepStatus.RUNNING, started_at=at)
        return dataclasses.replace(self, steps=(*self.steps, step))

    def finish_step(
        self, at: datetime, *, ok: bool, detail: Mapping[str, object] | None = None
    ) -> Operation:
        if not self.steps or self.steps[-1].status is not StepStatus.RUNNING:
            raise ValueError(f"operation {self.id} has no running step to finish")
        last = self.steps[-1]
        done = dataclasses.replace(
            last,
            status=StepStatus.SUCCEEDED if ok else StepStatus.FAILED,
            finished_at=at,
            detail={**last.detail, **(detail or {})},
        )
        return dataclasses.replace(self, steps=(*self.steps[:-1], done))

    def with_done_step(
        self, name: str, started_at: datetime, finished_at: datetime, detail: Mapping[str, object]
    ) -> Operation:
        """Append a step that already ran (checks made before the operation was recorded)."""
        step = Step(
            name=name,
            status=StepStatus.SUCCEEDED,
            started_at=started_at,
            finished_at=finished_at,
            detail=dict(detail),
        )
        return dataclasses.replace(self, steps=(*self.steps, step))

    def with_step_detail(self, detail: Mapping[str, object]) -> Operation:
        if not self.steps:
            return self
        last = self.steps[-1]
        updated = dataclasses.replace(last, detail={**last.detail, **detail})
        return dataclasses.replace(self, steps=(*self.steps[:-1], updated))

    def with_detail(self, detail: Mapping[str, object]) -> Operation:
        return dataclasses.replace(self, detail={**self.detail, **detail})

    def succeed(self, at: datetime) -> Operation:
        return dataclasses.replace(self, status=OperationStatus.SUCCEEDED, finished_at=at)

    def fail(self, at: datetime, code: str, message: str) -> Operation:
        return dataclasses.replace(
            self,
            status=OperationStatus.FAILED,
            finished_at=at,
            error=OperationError(code=code, message=message),
        )

    def recorded_before_stop(self, at: datetime) -> Operation:
        """It had written its record (the release serves, the database says so) when the
        daemon stopped, before it could say it succeeded: it did. A step still open is closed
        as succeeded if it was the record, as failed otherwise (cleanup that reconcile does)."""
        steps = tuple(
            dataclasses.replace(
                s,
                status=StepStatus.SUCCEEDED if s.name == "record" else StepStatus.FAILED,
                finished_at=at,
            )
            if s.status is StepStatus.RUNNING
            else s
            for s in self.steps
        )
        return dataclasses.replace(
            self,
            status=OperationStatus.SUCCEEDED,
            finished_at=at,
            steps=steps,
            detail={
                **self.detail,
                "recovered": "the daemon stopped after this operation's record was written; "
                "start-up found its release recorded as serving and finished it",
            },
        )

    def interrupt(
        self, at: datetime, reason: CancelReason = CancelReason.CRASH, note: str = ""
    ) -> Operation:
        """Mark an operation stopped in the middle (``reason``: a crash, a shutdown, a budget);
        ``note`` adds what was done about it."""
        steps = tuple(
            dataclasses.replace(s, status=StepStatus.FAILED, finished_at=at)
            if s.status is StepStatus.RUNNING
            else s
            for s in self.steps
        )
        code, message = _CANCELLED[reason]
        return dataclasses.replace(
            self,
            status=OperationStatus.INTERRUPTED,
            finished_at=at,
            steps=steps,
            error=OperationError(code=code, message=f"{message}{'; ' + note if note else ''}"),
        )
