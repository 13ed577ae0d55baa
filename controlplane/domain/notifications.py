"""How a store's event notifications stand (an SQS queue of S3 events), for status and metrics.

The watcher never depends on them: it lists the whole store every poll interval anyway. They
only make a release arrive sooner, so their health is shown, never acted on. Pure: stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class NotificationState(StrEnum):
    STARTING = "starting"  # the first receive has not answered yet
    LIVE = "live"  # the queue answers: a release is listed as soon as its event arrives
    UNREACHABLE = "unreachable"  # it does not (missing, denied, no connection): polling only


@dataclass(frozen=True)
class NotificationHealth:
    source: str  # the queue's URL
    state: NotificationState
    since: datetime  # when it entered this state
    problem: str | None = None  # why it is unreachable
    retry_at: datetime | None = None  # unreachable: when the queue is tried again

    @property
    def up(self) -> bool:
        return self.state is NotificationState.LIVE

    def problem_line(self) -> str | None:
        """What a person reading status should know, when anything: the queue is unreachable
        and releases are found by polling only."""
        if self.state is not NotificationState.UNREACHABLE:
            return None
        return unreachable_line(self.source, self.problem, self.since.isoformat(timespec="seconds"))


def unreachable_line(queue: str, problem: str | None, since: str | None) -> str:
    """The one wording of an unreachable queue, for the page and the CLI (which reads it from
    ``/healthz``)."""
    why = f": {problem}" if problem else ""
    return (
        f"store notifications: the SQS queue {queue} cannot be reached since {since}{why}; "
        "new releases are found by polling the store until it answers again"
    )
