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
