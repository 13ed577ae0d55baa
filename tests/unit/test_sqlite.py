"""SQLite state on a tmp file: WAL, round trips of every value, ordering, schema version."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.adapters.persistence.sqlite import SCHEMA_VERSION, SqliteStateRepo
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    Trigger,
)
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.slots import Slot, SlotState

T0 = datetime(2025, 3, 1, 8, 30, 15, 123456, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "controlplane.db"


@pytest.fixture
def repo(db_path: Path) -> Iterator[SqliteStateRepo]:
    opened = SqliteStateRepo(db_path)
    yield opened
    opened.close()


def operation(
    op_id: str,
    *,
    model: str = "resnet",
    created: float = 0,
    status: OperationStatus = OperationStatus.PENDING,
) -> Operation:
    return Operation(
        id=op_id,
        kind=OperationKind.DEPLOY,
        model=model,
        release="r2",
        trigger=Trigger.CLI,
        status=status,
        created_at=at(created),
        from_release="r1",
    )


def full_operation() -> Operation:
    """An operation with every field set: finished steps with detail, a failure, detail."""
    op = operation("op-full").running()
    op = op.start_step("fetch", at(1)).finish_step(
        at(2.5), ok=True, detail={"files": 3, "bytes": 1024, "names": ["a", "b"], "ok": True}
    )
    op = op.start_step("verify", at(3)).finish_step(at(3.25), ok=False, detail={"why": "x"})
    op = op.with_detail({"store": "file:///s", "nested": {"k": [1, 2.5, None]}})
    return op.fail(at(4), "checksum_mismatch", "1/model.py does not match SHA256SUMS")


def slot(name: str, state: SlotState, since: float, release: str | None = "r1") -> Slot:
    return Slot(
        name=name, state=state, release=release, trigger="deploy", reason="op-1", since=at(since)
    )


def test_the_database_is_in_wal_mode(repo: SqliteStateRepo, db_path: Path) -> None:
    with closing(sqlite3.connect(db_path)) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_an_unknown_model_is_none(repo: SqliteStateRepo) -> None:
    assert repo.get_model("ghost") is None
    assert repo.list_models() == []


def test_set_serving_round_trips(repo: SqliteStateRepo) -> None:
    repo.set_serving("resnet", active="r2", previous="r1", at=at(1))
    record = repo.get_model("resnet")
    assert record is not None
    assert (record.name, record.active_release, record.previous_release) == ("resnet", "r2", "r1")
    assert record.updated_at == at(1)
    assert record.slots == ()

    repo.set_serving("resnet", active=None, previous="r2", at=at(2))
    record = repo.get_model("resnet")
    assert record is not None
    assert (record.active_release, record.previous_release, record.updated_at) == (
        None,
        "r2",
        at(2),
    )


def test_save_slot_round_trips_and_updates(repo: SqliteStateRepo) -> None:
    blue = slot("resnet__blue", SlotState.ACTIVE, 1, release="r2")
    green = slot("resnet__green", SlotState.UNAVAILABLE, 2, release=None)
    repo.save_slot("resnet", green)
    repo.save_slot("resnet", blue)
    record = repo.get_model("resnet")
    assert record is not None
    assert record.slots == (blue, green)
    assert record.active_release is None  # a slot alone says nothing about what serves

    moved = slot("resnet__blue", SlotState.RETIRING, 5, release="r2")
    repo.save_slot("resnet", moved)
    record = repo.get_model("resnet")
    assert record is not None
    assert record.slots == (moved, green)


def test_saving_a_slot_keeps_serving_state(repo: SqliteStateRepo) -> None:
    repo.set_serving("resnet", active="r2", previous="r1", at=at(1))
    repo.save_slot("resnet", slot("resnet", SlotState.ACTIVE, 3))
    record = repo.get_model("resnet")
    assert record is not None
    assert (record.active_release, record.previous_release) == ("r2", "r1")


def test_list_models_by_name(repo: SqliteStateRepo) -> None:
    repo.set_serving("zeta", active="r1", previous=None, at=at(0))
    repo.set_serving("alpha", active="r1", previous=None, at=at(0))
    repo.save_slot("alpha", slot("alpha", SlotState.ACTIVE, 1))
    models = repo.list_models()
    assert [m.name for m in models] == ["alpha", "zeta"]
    assert [len(m.slots) for m in models] == [1, 0]


def test_an_operation_round_trips_every_field(repo: SqliteStateRepo) -> None:
    op = full_operation()
    repo.save_operation(op)
    assert repo.get_operation("op-full") == op
    assert repo.get_operation("nope") is None


def test_saving_again_updates_the_operation(repo: SqliteStateRepo) -> None:
    op = operation("op-1")
    repo.save_operation(op)
    op = op.running().start_step("fetch", at(1))
    repo.save_operation(op)
    assert repo.get_operation("op-1") == op
    op = op.finish_step(at(2), ok=True).succeed(at(3))
    repo.save_operation(op)
    assert repo.get_operation("op-1") == op
    assert len(repo.list_operations()) == 1


def test_interrupted_operations_round_trip(repo: SqliteStateRepo) -> None:
    op = operation("op-1").running().start_step("load", at(1)).interrupt(at(9))
    repo.save_operation(op)
    assert repo.get_operation("op-1") == op


def test_list_operations_newest_first_with_limit_and_model(repo: SqliteStateRepo) -> None:
    repo.save_operation(operation("b1", model="bert", created=5))
    for index in (3, 1, 4, 2):
        repo.save_operation(operation(f"r{index}", created=index))
    repo.save_operation(operation("r2-same-time", created=2))  # ties: the later save first

    assert [o.id for o in repo.list_operations()] == ["b1", "r4", "r3", "r2-same-time", "r2", "r1"]
    assert [o.id for o in repo.list_operations(limit=2)] == ["b1", "r4"]
    assert [o.id for o in repo.list_operations("resnet", limit=3)] == ["r4", "r3", "r2-same-time"]
    assert [o.id for o in repo.list_operations("bert")] == ["b1"]
    assert repo.list_operations("ghost") == []


def test_unfinished_operations_are_pending_and_running_only(repo: SqliteStateRepo) -> None:
    pending = operation("pending", created=2)
    running = operation("running", created=1).running().start_step("fetch", at(1))
    repo.save_operation(pending)
    repo.save_operation(running)
    repo.save_operation(operation("ok", created=3).succeed(at(4)))
    repo.save_operation(operation("bad", created=4).fail(at(5), "c", "m"))
    repo.save_operation(operation("cut", created=5).interrupt(at(6)))

    assert repo.unfinished_operations() == [running, pending]


def test_record_releases_is_accepted_repeatedly(repo: SqliteStateRepo, db_path: Path) -> None:
    repo.record_releases([ReleaseInfo("m", "r1", False), ReleaseInfo("m", "r2", True)], at(1))
    repo.record_releases([ReleaseInfo("m", "r1", True)], at(2))
    with closing(sqlite3.connect(db_path)) as other:
        rows = other.execute(
            "SELECT release, complete, first_seen, last_seen FROM releases ORDER BY release"
        ).fetchall()
    assert rows == [
        ("r1", 1, at(1).isoformat(), at(2).isoformat()),
        ("r2", 1, at(1).isoformat(), at(1).isoformat()),
    ]


def test_reopening_the_file_keeps_everything(db_path: Path) -> None:
    first = SqliteStateRepo(db_path)
    op = full_operation()
    blue = slot("resnet__blue", SlotState.ACTIVE, 1, release="r2")
    first.set_serving("resnet", active="r2", previous="r1", at=at(1))
    first.save_slot("resnet", blue)
    first.save_operation(op)
    first.save_operation(operation("pending", created=9))
    first.close()

    second = SqliteStateRepo(db_path)
    try:
        record = second.get_model("resnet")
        assert record is not None
        assert (record.active_release, record.previous_release) == ("r2", "r1")
        assert record.slots == (blue,)
        assert second.get_operation("op-full") == op
        assert [o.id for o in second.unfinished_operations()] == ["pending"]
    finally:
        second.close()


def test_a_newer_schema_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db_path)) as newer:
        newer.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        newer.commit()

    with pytest.raises(RuntimeError) as caught:
        SqliteStateRepo(db_path)

    message = str(caught.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "newer than this controlplane" in message
    assert str(db_path) in message
    with closing(sqlite3.connect(db_path)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert check.execute("SELECT name FROM sqlite_master").fetchall() == []
