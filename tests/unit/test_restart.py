"""Start-up recovery in a fleet: a deploy killed after its record is done only once it moved
the fleet's desired state, whatever its journal had time to say.

Found by the stranger tests: SIGKILL the moment a deploy's ``publish`` step started, restart,
and the operation said ``succeeded`` while the fleet's sync (rightly) brought the member back
to the release the desired state still named; and SIGKILL the moment the desired state had
moved, before the step's end was journaled, and the operation said ``interrupted`` for a
release that served everywhere (``controlplane wait`` exited 1 for a deploy that took effect).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from controlplane.domain.fleet import first_generation
from controlplane.domain.operations import Operation, OperationStatus
from controlplane.domain.rollout import RolloutPolicy
from controlplane.services.fleet_ledger import FleetLedger, Member
from controlplane.services.restart import recover
from tests.support.fakes import FakeDesiredStates, FakeTriton, deploy_service
from tests.support.service_views import MODEL, publish
from tests.unit.test_reconcile_service import deploy_and_wait

ME = Member("a", "a-inc-1", "1.0")


@pytest.mark.parametrize(
    ("fleet", "desired", "expected"),
    [
        (False, None, OperationStatus.SUCCEEDED),  # no fleet: recorded is done
        (True, None, OperationStatus.INTERRUPTED),  # killed before the swap
        (True, "r1", OperationStatus.INTERRUPTED),  # the fleet still wants r1
        (True, "r2", OperationStatus.SUCCEEDED),  # killed between the swap and its journal
        (True, "r2-by-another", OperationStatus.INTERRUPTED),  # not this operation's write
    ],
)
def test_a_deploy_killed_as_it_published_is_done_only_if_the_desired_state_moved(
    tmp_path: Path, fleet: bool, desired: str | None, expected: OperationStatus
) -> None:
    async def scenario() -> OperationStatus:
        async with deploy_service(tmp_path, FakeTriton()) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            done = await deploy_and_wait(service, "r2")
            assert done.status is OperationStatus.SUCCEEDED, done.error
            records = FakeDesiredStates()
            if desired is not None:
                release, _, by = desired.partition("-by-")
                records.desired[MODEL] = first_generation(
                    MODEL, by="b" if by else ME.name, at=parts.clock.now(), trigger="api", reason=""
                ).changed(
                    by="b" if by else ME.name,
                    at=parts.clock.now(),
                    trigger="api",
                    reason="",
                    release=release,
                )
            ledger = FleetLedger(
                records=records,
                member=ME,
                clock=parts.clock,
                rollout_for=lambda _model: RolloutPolicy(),
            )
            parts.repos.operations.save(_killed_as_publish_started(done))
            await parts.repos.operations.flush()
            await recover(
                journal=parts.repos.operations,
                serving=parts.repos.serving,
                staging=parts.staging,
                clock=parts.clock,
                fleet=ledger if fleet else None,
            )
            await parts.repos.operations.flush()
            return (await service.get_operation(done.id)).status

    assert asyncio.run(scenario()) is expected


def _killed_as_publish_started(done: Operation) -> Operation:
    """What the journal holds when the kill lands as ``publish`` starts: recorded (r2 serves,
    the record says so), the step begun, not ended."""
    return replace(done, status=OperationStatus.RUNNING, finished_at=None).start_step(
        "publish", done.steps[-1].finished_at or done.created_at
    )
