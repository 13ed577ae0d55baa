"""Automatic rollback: what was decided, and the rules that decide it.

A rollback goes down a chain: the fallback release (a re-point when its slot is still warm,
else a load), then the current release on CPU-only instances, then a loud failure. The release
rolled back from is latched *degraded*: nothing automatic promotes it again, only a person or
CI deploying it. After an automatic action a model is in cooldown; triggers during it are
counted on the last record, never acted on, so a signal that stays high cannot make the model
flap. A rollback a person asked for is not held back, and starts no cooldown.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from controlplane.domain.operations import Trigger

AUTOMATIC = frozenset({Trigger.WATCHER, Trigger.ALERT})  # what the cooldown holds back


class RollbackOutcome(StrEnum):
    FALLBACK = "fallback"  # the fallback release serves
    CPU = "cpu"  # the release that was serving now serves on CPU-only instances
    FAILED = "failed"  # every step of the chain failed

    @property
    def acted(self) -> bool:
        return self in (self.FALLBACK, self.CPU)


@dataclass(frozen=True)
class RollbackRecord:
    id: str
    model: str
    at: datetime
    trigger: Trigger
    reason: str
    from_release: str | None
    to_release: str | None
    outcome: RollbackOutcome
    operation_ids: tuple[str, ...] = ()
    detail: Mapping[str, object] = field(default_factory=dict)
    suppressed: int = 0  # triggers ignored during the cooldown that followed


@dataclass(frozen=True)
class DegradedRelease:
    model: str
    release: str
    at: datetime
    reason: str


def choose_fallback(
    *,
    configured: str | None,
    active: str | None,
    previous: str | None,
    degraded: Collection[str],
) -> str | None:
    """The release to fall back to: the configured one, else the previous good one.

    None when there is nothing to go back to: no candidate, the candidate is what serves
    already, or it was itself rolled back from.
    """
    candidate = configured or previous
    if candidate is None or candidate == active or candidate in degraded:
        return None
    return candidate


def cooldown_until(last: RollbackRecord | None, cooldown: float) -> datetime | None:
    """End of the cooldown after the last automatic rollback, whatever its outcome (a chain
    that failed is not retried every second either); None when there was none."""
    if last is None or last.trigger not in AUTOMATIC:
        return None
    return last.at + timedelta(seconds=cooldown)
