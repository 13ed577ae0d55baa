"""When an operation moves the fleet's desired state, and the record it moves it from.

Pure rules the deploy service applies before an operation is recorded (is this a request that
publishes? does the fleet want this release already?) and the fleet ledger applies when it
publishes the operation's result.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.domain.fleet import DesiredModel
from controlplane.domain.operations import OperationKind, Trigger


@dataclass(frozen=True)
class FleetBase:
    """The fleet's record of a model when a request that publishes arrived (None: none yet)."""

    record: DesiredModel | None


def publishes(kind: OperationKind, trigger: Trigger) -> bool:
    """Whether an operation of ``kind`` for ``trigger`` moves the fleet's desired state: what
    a person or CI asks (but the CPU-only reload, which stays on its member), and the release
    watcher's auto-deploy (this member went first). Not the fleet's own sync, repairs,
    retires, nor automatic rollbacks (they move the fleet after their chain: AutoRollback)."""
    if trigger in (Trigger.API, Trigger.CLI):
        return kind is not OperationKind.CPU_FALLBACK
    return trigger is Trigger.WATCHER and kind is OperationKind.DEPLOY


def fleet_agrees(base: FleetBase | None, release: str) -> bool:
    """Whether the fleet already wants ``release`` everywhere, not degraded (or the request
    publishes nothing): a deploy of what serves here is then ``unchanged``."""
    record = base.record if base is not None else None
    return base is None or (
        record is not None
        and record.release == release
        and not record.rollout.in_progress
        and not record.is_degraded(release)
    )
