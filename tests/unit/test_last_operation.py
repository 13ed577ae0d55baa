"""A model's "last operation" is the newest change of what serves (deploy, rollback, unload,
cpu-fallback); the daemon's housekeeping (retire, repair) is shown apart, so the retire of the
old slot half a minute after a deploy never hides how that deploy ended (issue 24)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from controlplane.adapters.persistence import SqliteRepos
from controlplane.api.schemas.model import model_json
from controlplane.cli.status import model_lines
from controlplane.domain.operations import (
    CHANGES,
    HOUSEKEEPING,
    NO_CAUSE,
    Cause,
    Operation,
    OperationKind,
    OperationStatus,
    Trigger,
)
from tests.support.fakes import START, deploy_service, status_service
from tests.support.models import write_scale_release


def _op(
    op_id: str,
    kind: OperationKind,
    seconds: float,
    *,
    model: str = "m",
    status: OperationStatus = OperationStatus.SUCCEEDED,
) -> Operation:
    created = START + timedelta(seconds=seconds)
    upkeep = kind in HOUSEKEEPING
    op = Operation(
        id=op_id,
        kind=kind,
        model=model,
        release=None if upkeep else "r2",
        trigger=Trigger.SCHEDULE if upkeep else Trigger.CLI,
        status=OperationStatus.RUNNING,
        created_at=created,
        cause=Cause(reason="m__blue no longer serves: freed") if upkeep else NO_CAUSE,
    )
    if status is OperationStatus.FAILED:
        return op.fail(created + timedelta(seconds=1), "checksum_mismatch", "1/model.py differs")
    return op.succeed(created + timedelta(seconds=1))


def test_every_kind_is_either_a_change_of_what_serves_or_housekeeping() -> None:
    assert set(OperationKind) == CHANGES | HOUSEKEEPING
    assert not CHANGES & HOUSEKEEPING
    assert OperationKind.CPU_FALLBACK in CHANGES  # it changes how the release serves
    assert OperationKind.REPAIR in HOUSEKEEPING  # even one that redeploys


def test_the_journal_gives_the_newest_of_the_kinds_asked_for_each_model(tmp_path: Path) -> None:
    repos = SqliteRepos.open(tmp_path / "state.db")
    try:
        for op in (
            _op("a-deploy", OperationKind.DEPLOY, 1),
            _op("a-retire-1", OperationKind.RETIRE, 2),
            _op("a-failed", OperationKind.DEPLOY, 3, status=OperationStatus.FAILED),
            _op("a-retire-2", OperationKind.RETIRE, 4),
            _op("b-repair", OperationKind.REPAIR, 5, model="b"),
            _op("c-unload", OperationKind.UNLOAD, 1, model="c"),
            _op("c-fallback", OperationKind.CPU_FALLBACK, 2, model="c"),
        ):
            repos.operations.save(op)

        def latest(kinds: frozenset[OperationKind] | None) -> dict[str, str]:
            found = asyncio.run(repos.operations.latest(["m", "b", "c", "ghost"], kinds))
            return {model: op.id for model, op in found.items()}

        def recent(kinds: frozenset[OperationKind] | None) -> list[str]:
            return [op.id for op in asyncio.run(repos.operations.recent("m", 3, kinds))]

        assert latest(CHANGES) == {"m": "a-failed", "c": "c-fallback"}
        assert latest(HOUSEKEEPING) == {"m": "a-retire-2", "b": "b-repair"}
        assert latest(None) == {"m": "a-retire-2", "b": "b-repair", "c": "c-fallback"}
        assert recent(CHANGES) == ["a-failed", "a-deploy"]
        assert recent(None) == ["a-retire-2", "a-failed", "a-retire-1"]
    finally:
        repos.close()


def test_status_shows_the_failed_deploy_as_last_op_and_the_retire_after_it_as_upkeep(
    tmp_path: Path,
) -> None:
    """The trial's case: r2's deploy succeeded, r3's failed, then the daemon retired r1's slot."""

    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            for op in (
                _op("deploy-r2", OperationKind.DEPLOY, 1),
                _op("deploy-r3", OperationKind.DEPLOY, 2, status=OperationStatus.FAILED),
                _op("retire-r1", OperationKind.RETIRE, 3),
            ):
                parts.repos.operations.save(op)
            status = status_service(service, parts)

            view = await status.get_model("m")
            [listed] = (await status.list_models()).models

            assert view.last_operation is not None
            assert view.last_operation.id == "deploy-r3"
            assert view.last_housekeeping is not None
            assert view.last_housekeeping.id == "retire-r1"
            assert (listed.last_operation, listed.last_housekeeping) == (
                view.last_operation,
                view.last_housekeeping,
            )
            document = model_json(view)
            assert document["last_operation"]["id"] == "deploy-r3"
            assert document["last_housekeeping"]["id"] == "retire-r1"
            lines = model_lines(document)
            assert "  last op:   deploy r2 failed (checksum_mismatch) [deploy-r3]" in lines
            retired = START + timedelta(seconds=3)
            assert (
                f"  upkeep:    retire succeeded at {retired.isoformat()}: "
                "m__blue no longer serves: freed [retire-r1]"
            ) in lines

    asyncio.run(scenario())


def test_without_housekeeping_status_has_no_upkeep_line(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            parts.repos.operations.save(_op("deploy-r2", OperationKind.DEPLOY, 1))

            document = model_json(await status_service(service, parts).get_model("m"))

            assert document["last_housekeeping"] is None
            lines = model_lines(document)
            assert any(line.startswith("  last op:   deploy") for line in lines)
            assert not any(line.startswith("  upkeep:") for line in lines)

    asyncio.run(scenario())
