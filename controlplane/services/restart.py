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

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.operations import CancelReason, Operation, OperationKind, StepStatus
from controlplane.domain.publish import publishes
from controlplane.ports import Clock, ModelRecord, OperationLog, ServingRepo, Staging
from controlplane.services.fleet_ledger import FleetLedger

log = logging.getLogger(__name__)


@dataclass
class StartupReport:
    interrupted: list[str] = field(default_factory=list)
    recorded: list[str] = field(default_factory=list)  # had written their record: succeeded
    staging_removed: list[str] = field(default_factory=list)


def _was_recorded(operation: Operation, record: ModelRecord | None) -> bool:
    """Whether ``operation`` (found running at start-up) had committed the change it was
    for here: a deploy or rollback whose release the model's record names as serving, written
    after the operation began. The record and its slots are one transaction, so this is what
    serves; only the operation's own last write was lost."""
    return (
        operation.kind in (OperationKind.DEPLOY, OperationKind.ROLLBACK)
        and record is not None
        and operation.release is not None
        and operation.release != operation.from_release
        and record.active_release == operation.release
        and record.updated_at >= operation.created_at
    )


async def _was_published(operation: Operation, fleet: FleetLedger) -> bool:
    """In a fleet, an operation that publishes had also to move the fleet's desired state: its
    ``publish`` step ended, or (killed between the swap and the step's record) the desired
    state names its release, set by this member since it began. One stopped before that is not
    done (the fleet's sync brings this member back to what the fleet wants): interrupted. A
    store that cannot be read says nothing, so the journal's word stands."""
    if not publishes(operation.kind, operation.trigger):
        return True
    if any(s.name == "publish" and s.status is StepStatus.SUCCEEDED for s in operation.steps):
        return True
    try:
        wanted = await fleet.read(operation.model)
    except ControlPlaneError as exc:
        log.warning("start-up: cannot read %s's desired state (%s)", operation.model, exc)
        return False
    return (
        wanted is not None
        and wanted.release == operation.release
        and wanted.set_by == fleet.member.name
        and wanted.set_at >= operation.created_at
    )


async def recover(
    *,
    journal: OperationLog,
    serving: ServingRepo,
    staging: Staging,
    clock: Clock,
    fleet: FleetLedger | None,
) -> StartupReport:
    """``fleet``: the ledger of the fleet this daemon is a member of (its operations publish
    what they serve)."""
    report = StartupReport()
    records = {record.name: record for record in await serving.all()}
    for operation in await journal.unfinished():
        done = _was_recorded(operation, records.get(operation.model))
        if done and fleet is not None:
            done = await _was_published(operation, fleet)
        if done:
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
