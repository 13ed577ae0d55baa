"""Start-up recovery in a fleet: a deploy killed after its record but before it moved the
fleet's desired state is not done.

Found by the stranger test: SIGKILL the moment a deploy's ``publish`` step started, restart,
and the operation said ``succeeded`` while the fleet's sync (rightly) brought the member back
to the release the desired state still named: ``controlplane wait`` answered 0 for a release
that no longer served.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from controlplane.domain.operations import OperationStatus
from controlplane.services.restart import recover
from tests.support.fakes import FakeTriton, deploy_service
from tests.support.service_views import publish
from tests.unit.test_reconcile_service import deploy_and_wait


def test_a_deploy_killed_before_it_published_is_interrupted_in_a_fleet_only(
    tmp_path: Path,
) -> None:
    async def scenario() -> dict[bool, OperationStatus]:
        found: dict[bool, OperationStatus] = {}
        async with deploy_service(tmp_path, FakeTriton()) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            done = await deploy_and_wait(service, "r2")
            assert done.status is OperationStatus.SUCCEEDED, done.error
            # What the database holds when the kill lands as ``publish`` starts: recorded
            # (r2 serves, the record says so), the fleet's desired state not moved yet.
            killed = replace(done, status=OperationStatus.RUNNING, finished_at=None).start_step(
                "publish", done.steps[-1].finished_at or done.created_at
            )
            for fleet in (True, False):
                parts.repos.operations.save(killed)
                await parts.repos.operations.flush()
                await recover(
                    journal=parts.repos.operations,
                    serving=parts.repos.serving,
                    staging=parts.staging,
                    clock=parts.clock,
                    fleet=fleet,
                )
                await parts.repos.operations.flush()
                found[fleet] = (await service.get_operation(done.id)).status
        return found

    found = asyncio.run(scenario())
    assert found == {True: OperationStatus.INTERRUPTED, False: OperationStatus.SUCCEEDED}
