"""The operation runner's promises to whoever starts an operation.

Found by the fault campaign: a daemon killed a few milliseconds after it answered 202 for a
warm rollback came back with no record of that operation (its first save was still queued for
the database thread), and ``GET /v1/operations/{id}`` answered 404 for an id the API had given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from controlplane.adapters.staging.fs import StagingArea
from controlplane.domain.operations import REFUSE, Operation, OperationKind, Trigger
from controlplane.services.runner import ModelLocks, OperationRunner, Run
from tests.support.fake_clock import FakeClock


class QueuedJournal:
    """A journal whose saves land only at :meth:`flush`, as the database thread's queue does
    at a moment the caller does not choose: what a kill would leave is what landed."""

    def __init__(self) -> None:
        self.queued: list[Operation] = []
        self.landed: dict[str, Operation] = {}

    @property
    def writes(self) -> int:
        return len(self.landed)

    def save(self, operation: Operation) -> None:
        self.queued.append(operation)

    async def flush(self) -> None:
        for operation in self.queued:
            self.landed[operation.id] = operation
        self.queued.clear()

    async def get(self, operation_id: str) -> Operation | None:
        return self.landed.get(operation_id)

    async def recent(
        self,
        model: str | None = None,
        limit: int = 20,
        kinds: Collection[OperationKind] | None = None,
    ) -> list[Operation]:
        return list(self.landed.values())[:limit]

    async def unfinished(self) -> list[Operation]:
        return [op for op in self.landed.values() if not op.status.finished]

    async def latest(
        self, models: Sequence[str], kinds: Collection[OperationKind] | None = None
    ) -> dict[str, Operation]:
        return {}

    async def last_deploys(self, releases: Mapping[str, str]) -> dict[str, Operation]:
        return {}


def test_an_operation_is_on_disk_before_its_id_is_given_to_anyone(tmp_path: Path) -> None:
    async def scenario() -> tuple[str, list[str]]:
        staging = StagingArea(tmp_path / "repository", tmp_path / "staging")
        staging.check()
        journal = QueuedJournal()
        runner = OperationRunner(
            journal=journal, staging=staging, clock=FakeClock(), locks=ModelLocks()
        )
        hold = asyncio.Event()

        async def body(run: Run) -> None:
            await hold.wait()  # the operation runs on; the daemon could die any moment now

        try:
            async with runner.claimed("m", REFUSE) as claim:
                started = await claim.start(
                    OperationKind.DEPLOY, "r1", Trigger.API, body, from_release=None
                )
            landed = list(journal.landed)
            hold.set()
            await runner.wait(started.id)
            return started.id, landed
        finally:
            await runner.close()

    operation_id, landed = asyncio.run(scenario())
    assert landed == [operation_id]
