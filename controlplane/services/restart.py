"""What a daemon that died left behind, put right before the first reconcile pass.

An operation found running at start-up was cut by the stop. One that had committed the change
it was for (its release recorded as serving, after it began: the record and its slots are one
transaction, and, in a fleet, had moved the fleet's desired state) is marked succeeded; any
other is marked interrupted (``crash``), never dropped.
Staging leftovers are deleted. The reconcile loop then converges what Triton serves to what
the records say.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from controlplane.domain.operations import CancelReason, Operation, OperationKind, StepStatus
from controlplane.domain.publish import publishes
from controlplane.ports import Clock, ModelRecord, OperationLog, ServingRepo, Staging

log = logging.getLogger(__name__)


@dataclass
class StartupReport:
    interrupted: list[str] = field(default_factory=list)
    recorded: list[str] = field(default_factory=list)  # had written their record: succeeded
    staging_removed: list[str] = field(default_factory=list)


def _was_recorded(operation: Operation, record: ModelRecord | None, *, fleet: bool) -> bool:
    """Whether ``operation`` (found running at start-up) had committed the change it was
    for: a deploy or rollback whose release the model's record names as serving, written
    after the operation began. The record and its slots are one transaction, so this is
    what serves; only the operation's own last write was lost. In a fleet, an operation that
    publishes had also to move the fleet's desired state (its ``publish`` step): one stopped
    before that is not done (the fleet's sync brings this member back to what the fleet
    wants), so it is interrupted, not succeeded."""
    recorded = (
        operation.kind in (OperationKind.DEPLOY, OperationKind.ROLLBACK)
        and record is not None
        and operation.release is not None
        and operation.release != operation.from_release
        and record.active_release == operation.release
        and record.updated_at >= operation.created_at
    )
    if not recorded or not fleet or not publishes(operation.kind, operation.trigger):
        return recorded
    return any(s.name == "publish" and s.status is StepStatus.SUCCEEDED for s in operation.steps)


async def recover(
    *, journal: OperationLog, serving: ServingRepo, staging: Staging, clock: Clock, fleet: bool
) -> StartupReport:
    """``fleet``: this daemon is a fleet's member (its operations publish what they serve)."""
    report = StartupReport()
    records = {record.name: record for record in await serving.all()}
    for operation in await journal.unfinished():
        if _was_recorded(operation, records.get(operation.model), fleet=fleet):
            journal.save(operation.recorded_before_stop(clock.now()))
            report.recorded.append(operation.id)
            continue
        journal.save(operation.interrupt(clock.now(), CancelReason.CRASH))
        report.interrupted.append(operation.id)
    report.staging_removed = await asyncio.to_thread(staging.clean_all)
    if report.recorded:
        log.warning(
            "start-up: %d operation(s) had written their record when the daemon stopped, "
            "and are marked succeeded: %s",
            len(report.recorded),
            ", ".join(report.recorded),
        )
    if report.interrupted or report.staging_removed:
        log.warning(
            "start-up: %d operation(s) were interrupted by the last stop (%s); "
            "%d staging leftover(s) removed",
            len(report.interrupted),
            ", ".join(report.interrupted) or "-",
            len(report.staging_removed),
        )
    return report
