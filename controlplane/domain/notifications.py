"""How a store's event notifications stand (an SQS queue of S3 events), for status and metrics,
and the name of the queue a member makes for itself in a fan-out (an SNS topic, a queue each).

The watcher never depends on them: it lists the whole store every poll interval anyway. They
only make a release arrive sooner, so their health is shown, never acted on. Pure: stdlib only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class NotificationState(StrEnum):
    STARTING = "starting"  # the first receive has not answered yet
    LIVE = "live"  # the queue answers: a release is listed as soon as its event arrives
    UNREACHABLE = "unreachable"  # it does not (missing, denied, no connection): polling only


@dataclass(frozen=True)
class NotificationHealth:
    source: str  # the queue's URL (its name while this member sets it up)
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


QUEUE_NAME_PREFIX = "controlplane-"
MAX_QUEUE_NAME = 80  # SQS: 1 to 80 letters, digits, hyphens and underscores
_QUEUE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def queue_name_problem(name: str) -> str | None:
    """What makes ``name`` no SQS queue name of a standard queue; None when it is one."""
    if not 1 <= len(name) <= MAX_QUEUE_NAME:
        return f"an SQS queue's name has 1 to {MAX_QUEUE_NAME} characters, not {len(name)}"
    if not set(name) <= _QUEUE_NAME_CHARS:
        return "an SQS queue's name holds letters, digits, hyphens and underscores only"
    return None


def member_queue_name(member: str) -> str:
    """The SQS queue a member makes for itself on the fleet's SNS topic:
    ``controlplane-<member>``, its dots made hyphens (a pod name may hold them; a queue name
    may not); a name too long is cut and ends with a hash of the whole one, so two members
    whose names share a long beginning still get two queues."""
    name = QUEUE_NAME_PREFIX + "".join(c if c in _QUEUE_NAME_CHARS else "-" for c in member)
    if len(name) <= MAX_QUEUE_NAME:
        return name
    digest = hashlib.sha256(member.encode()).hexdigest()[:10]
    return f"{name[: MAX_QUEUE_NAME - len(digest) - 1]}-{digest}"
