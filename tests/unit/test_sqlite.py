"""SQLite state on a tmp file: WAL, round trips of every value, ordering, one transaction per
change, the schema's upgrade path, and the database's own thread."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest

from controlplane.adapters.persistence import SqliteRepos
from controlplane.adapters.persistence.migrations import MIGRATIONS, SCHEMA_VERSION, SchemaTooNew
from controlplane.domain.operations import (
    NO_CAUSE,
    Cause,
    Operation,
    OperationKind,
    OperationStatus,
    Trigger,
)
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.slots import Slot, SlotState
from controlplane.ports import Serving

T0 = datetime(2025, 3, 1, 8, 30, 15, 123456, tzinfo=UTC)
T = TypeVar("T")
# The schema controlplane shipped at version 4 (before this file's migrations list existed),
# as that code created it: the upgrade path starts from files like this one.
SHIPPED_V4 = Path(__file__).parent / "data" / "schema_v4.sql"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(step: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(_call(step))


async def _call(step: Callable[[], Awaitable[T]]) -> T:
    return await step()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "controlplane.db"


@pytest.fixture
def repos(db_path: Path) -> Iterator[SqliteRepos]:
    opened = SqliteRepos.open(db_path)
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
    op = dataclasses.replace(op, member="m1", cause=Cause(reason="ticket 42", set_by="m2"))
    return op.fail(at(4), "checksum_mismatch", "1/model.py does not match SHA256SUMS")


def slot(name: str, state: SlotState, since: float, release: str | None = "r1") -> Slot:
    return Slot(
        name=name, state=state, release=release, trigger=Trigger.API, reason="op-1", since=at(since)
    )


def test_the_database_is_in_wal_mode(repos: SqliteRepos, db_path: Path) -> None:
    with closing(sqlite3.connect(db_path)) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_an_unknown_model_is_none(repos: SqliteRepos) -> None:
    assert run(lambda: repos.serving.get("ghost")) is None
    assert run(repos.serving.all) == []


def test_what_serves_round_trips(repos: SqliteRepos) -> None:
    run(lambda: repos.serving.commit("resnet", at(1), serving=Serving("r2", "r1")))
    record = run(lambda: repos.serving.get("resnet"))
    assert record is not None
    assert (record.name, record.active_release, record.previous_release) == ("resnet", "r2", "r1")
    assert record.updated_at == at(1)
    assert record.slots == ()

    run(lambda: repos.serving.commit("resnet", at(2), serving=Serving(None, "r2")))
    record = run(lambda: repos.serving.get("resnet"))
    assert record is not None
    assert (record.active_release, record.previous_release, record.updated_at) == (
        None,
        "r2",
        at(2),
    )


def test_slots_round_trip_update_and_leave_what_serves_alone(repos: SqliteRepos) -> None:
    blue = slot("resnet__blue", SlotState.ACTIVE, 1, release="r2")
    green = slot("resnet__green", SlotState.UNAVAILABLE, 2, release=None)
    run(lambda: repos.serving.commit("resnet", at(1), serving=Serving("r2", "r1")))
    run(lambda: repos.serving.commit("resnet", at(2), slots=[green, blue]))
    record = run(lambda: repos.serving.get("resnet"))
    assert record is not None
    assert record.slots == (blue, green)
    assert (record.active_release, record.previous_release) == ("r2", "r1")

    moved = slot("resnet__blue", SlotState.RETIRING, 5, release="r2")
    run(lambda: repos.serving.commit("resnet", at(5), slots=[moved]))
    run(lambda: repos.serving.forget_slots("resnet", ["resnet__green"]))
    record = run(lambda: repos.serving.get("resnet"))
    assert record is not None
    assert record.slots == (moved,)


def test_models_are_listed_by_name(repos: SqliteRepos) -> None:
    run(lambda: repos.serving.commit("zeta", at(0), serving=Serving("r1", None)))
    run(
        lambda: repos.serving.commit(
            "alpha",
            at(0),
            serving=Serving("r1", None),
            slots=[slot("alpha", SlotState.ACTIVE, 1)],
        )
    )
    models = run(repos.serving.all)
    assert [m.name for m in models] == ["alpha", "zeta"]
    assert [len(m.slots) for m in models] == [1, 0]


def test_a_change_that_fails_half_way_writes_nothing(repos: SqliteRepos, db_path: Path) -> None:
    """What serves and every slot of a change land together or not at all."""
    blue = slot("resnet__blue", SlotState.ACTIVE, 1, release="r1")
    run(lambda: repos.serving.commit("resnet", at(1), serving=Serving("r1", None), slots=[blue]))
    with closing(sqlite3.connect(db_path)) as other:  # the second slot row cannot be written
        other.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON slots WHEN NEW.slot = 'resnet__green' "
            "BEGIN SELECT RAISE(ABORT, 'disk gone'); END"
        )
        other.commit()

    with pytest.raises(sqlite3.IntegrityError):
        run(
            lambda: repos.serving.commit(
                "resnet",
                at(2),
                serving=Serving("r2", "r1"),
                slots=[
                    slot("resnet__blue", SlotState.RETIRING, 2, release="r1"),
                    slot("resnet__green", SlotState.ACTIVE, 2, release="r2"),
                ],
            )
        )

    record = run(lambda: repos.serving.get("resnet"))
    assert record is not None
    assert (record.active_release, record.previous_release) == ("r1", None)
    assert record.slots == (blue,)


def test_a_switch_killed_at_any_moment_is_all_there_or_not_at_all(db_path: Path) -> None:
    """SIGKILL a process that records switches back and forth, at random moments: the file
    always says one release serves, from the slot recorded ACTIVE, the other one RETIRING."""
    writer = textwrap.dedent(
        f"""
        import asyncio, sys
        from datetime import UTC, datetime
        from pathlib import Path
        from controlplane.adapters.persistence import SqliteRepos
        from controlplane.domain.operations import Trigger
        from controlplane.domain.slots import Slot, SlotState
        from controlplane.ports import Serving

        async def main() -> None:
            repos = SqliteRepos.open(Path({str(db_path)!r}))
            now = datetime.now(UTC)
            n = 0
            while True:
                active, old = ("r1", "r2") if n % 2 else ("r2", "r1")
                slots = [
                    Slot("m__blue", SlotState.ACTIVE if n % 2 else SlotState.RETIRING,
                         "r1", Trigger.API, "", now),
                    Slot("m__green", SlotState.RETIRING if n % 2 else SlotState.ACTIVE,
                         "r2", Trigger.API, "", now),
                ]
                await repos.serving.commit("m", now, serving=Serving(active, old), slots=slots)
                if n == 0:
                    print("ready", flush=True)  # one switch is in the file
                n += 1

        asyncio.run(main())
        """
    )
    chaos = random.Random(11)
    for _ in range(8):
        process = subprocess.Popen(
            [sys.executable, "-c", writer], stdout=subprocess.PIPE, cwd=Path.cwd()
        )
        try:  # the writer never stops by itself: it is killed, whatever the test finds
            assert process.stdout is not None
            assert process.stdout.readline().strip() == b"ready"
            time.sleep(chaos.uniform(0, 0.05))  # a random moment among the next switches
        finally:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            if process.stdout is not None:
                process.stdout.close()

        with closing(sqlite3.connect(db_path)) as check:
            (active,) = check.execute("SELECT active_release FROM models").fetchone()
            slots = dict(check.execute("SELECT release, state FROM slots").fetchall())
        assert slots[active] == "ACTIVE", (active, slots)
        assert sorted(slots.values()) == ["ACTIVE", "RETIRING"], slots


def test_an_operation_round_trips_every_field(repos: SqliteRepos) -> None:
    op = full_operation()
    repos.operations.save(op)
    assert run(lambda: repos.operations.get("op-full")) == op
    assert run(lambda: repos.operations.get("nope")) is None


def test_saving_again_updates_the_operation(repos: SqliteRepos) -> None:
    op = operation("op-1")
    repos.operations.save(op)
    op = op.running().start_step("fetch", at(1))
    repos.operations.save(op)
    assert run(lambda: repos.operations.get("op-1")) == op
    op = op.finish_step(at(2), ok=True).succeed(at(3))
    repos.operations.save(op)
    assert run(lambda: repos.operations.get("op-1")) == op
    assert len(run(repos.operations.recent)) == 1


def test_interrupted_operations_round_trip(repos: SqliteRepos) -> None:
    op = operation("op-1").running().start_step("load", at(1)).interrupt(at(9))
    repos.operations.save(op)
    assert run(lambda: repos.operations.get("op-1")) == op


def test_operations_are_listed_newest_first_with_limit_and_model(repos: SqliteRepos) -> None:
    repos.operations.save(operation("b1", model="bert", created=5))
    for index in (3, 1, 4, 2):
        repos.operations.save(operation(f"r{index}", created=index))
    repos.operations.save(operation("r2-same-time", created=2))  # ties: the later save first

    def ids(model: str | None = None, limit: int = 20) -> list[str]:
        return [o.id for o in run(lambda: repos.operations.recent(model, limit))]

    assert ids() == ["b1", "r4", "r3", "r2-same-time", "r2", "r1"]
    assert ids(limit=2) == ["b1", "r4"]
    assert ids("resnet", limit=3) == ["r4", "r3", "r2-same-time"]
    assert ids("bert") == ["b1"]
    assert ids("ghost") == []


def test_unfinished_operations_are_pending_and_running_only(repos: SqliteRepos) -> None:
    pending = operation("pending", created=2)
    running = operation("running", created=1).running().start_step("fetch", at(1))
    for op in (
        pending,
        running,
        operation("ok", created=3).succeed(at(4)),
        operation("bad", created=4).fail(at(5), "c", "m"),
        operation("cut", created=5).interrupt(at(6)),
    ):
        repos.operations.save(op)

    assert run(repos.operations.unfinished) == [running, pending]


def test_releases_are_recorded_repeatedly(repos: SqliteRepos, db_path: Path) -> None:
    run(
        lambda: repos.releases.record(
            [ReleaseInfo("m", "r1", False), ReleaseInfo("m", "r2", True)], at(1)
        )
    )
    run(lambda: repos.releases.record([ReleaseInfo("m", "r1", True)], at(2)))
    with closing(sqlite3.connect(db_path)) as other:
        rows = other.execute(
            "SELECT release, complete, first_seen, last_seen FROM releases ORDER BY release"
        ).fetchall()
    assert rows == [
        ("r1", 1, at(1).isoformat(), at(2).isoformat()),
        ("r2", 1, at(1).isoformat(), at(1).isoformat()),
    ]


def test_reopening_the_file_keeps_everything(db_path: Path) -> None:
    first = SqliteRepos.open(db_path)
    op = full_operation()
    blue = slot("resnet__blue", SlotState.ACTIVE, 1, release="r2")
    run(lambda: first.serving.commit("resnet", at(1), serving=Serving("r2", "r1"), slots=[blue]))
    first.operations.save(op)
    first.operations.save(operation("pending", created=9))
    first.close()  # queued writes land before the file closes

    second = SqliteRepos.open(db_path)
    try:
        record = run(lambda: second.serving.get("resnet"))
        assert record is not None
        assert (record.active_release, record.previous_release) == ("r2", "r1")
        assert record.slots == (blue,)
        assert run(lambda: second.operations.get("op-full")) == op
        assert [o.id for o in run(second.operations.unfinished)] == ["pending"]
    finally:
        second.close()


def test_the_event_loop_runs_while_the_database_works(repos: SqliteRepos) -> None:
    """Every statement runs on the database's own thread: a slow one never stalls the loop."""
    gate = asyncio.Event()

    async def scenario() -> int:
        loop = asyncio.get_running_loop()

        def slow(db: sqlite3.Connection) -> None:
            asyncio.run_coroutine_threadsafe(_set(gate), loop).result(timeout=5)
            db.execute("SELECT 1")

        ticks = 0
        reading = asyncio.create_task(repos.database.read(slow))
        while not reading.done():
            ticks += 1
            await asyncio.sleep(0)
        await reading
        return ticks

    assert run(scenario) > 0
    assert gate.is_set()


async def _set(event: asyncio.Event) -> None:
    event.set()


# --- the schema ---------------------------------------------------------------------------


def test_a_newer_schema_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db_path)) as newer:
        newer.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        newer.commit()

    with pytest.raises(SchemaTooNew) as caught:
        SqliteRepos.open(db_path)

    message = str(caught.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "newer than this controlplane" in message
    assert str(db_path) in message
    with closing(sqlite3.connect(db_path)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert check.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_the_schema_that_shipped_is_upgraded_with_its_rows(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db_path)) as shipped:
        shipped.executescript(SHIPPED_V4.read_text(encoding="utf-8"))
        shipped.execute("PRAGMA user_version=4")
        shipped.execute("INSERT INTO models VALUES ('resnet', 'r2', 'r1', ?)", (at(1).isoformat(),))
        shipped.execute(
            "INSERT INTO slots VALUES ('resnet', 'resnet__green', 'ACTIVE', 'r2', 'api', '', ?)",
            (at(1).isoformat(),),
        )
        shipped.execute(
            "INSERT INTO releases VALUES ('resnet', 'r2', 1, ?, ?, 'abc')",
            (at(0).isoformat(), at(1).isoformat()),
        )
        shipped.execute(
            "INSERT INTO operations VALUES "
            "('op-4', 'deploy', 'resnet', 'r2', 'r1', 'cli', 'succeeded', ?, ?, NULL, NULL, "
            "'[]', '{}')",
            (at(1).isoformat(), at(2).isoformat()),
        )
        shipped.commit()

    repos = SqliteRepos.open(db_path)
    try:
        record = run(lambda: repos.serving.get("resnet"))
        assert record is not None
        assert (record.active_release, record.previous_release) == ("r2", "r1")
        assert [(s.name, s.state) for s in record.slots] == [("resnet__green", SlotState.ACTIVE)]
        [seen] = run(lambda: repos.releases.seen("resnet"))
        assert (seen.name, seen.revision) == ("r2", "abc")
        shipped_op = run(lambda: repos.operations.get("op-4"))
        assert shipped_op is not None  # from before operations said who ran them and why
        assert (shipped_op.release, shipped_op.member, shipped_op.cause) == ("r2", None, NO_CAUSE)
    finally:
        repos.close()
    with closing(sqlite3.connect(db_path)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_every_version_upgrades_to_the_same_schema_as_a_new_file(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    SqliteRepos.open(fresh).close()
    for version in range(1, SCHEMA_VERSION):
        old = tmp_path / f"v{version}.db"
        with closing(sqlite3.connect(old)) as start:
            for step in MIGRATIONS[:version]:
                start.executescript(step)
            start.execute(f"PRAGMA user_version={version}")
            start.commit()
        SqliteRepos.open(old).close()
        assert _schema(old) == _schema(fresh), f"upgrading from version {version}"


def test_a_migration_that_fails_leaves_the_file_at_the_version_before(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db_path)) as start:
        start.executescript(MIGRATIONS[0])
        start.execute("PRAGMA user_version=1")
        # Step 2 adds releases.revision; make it fail half way by adding the column first
        # under another case, as a hand-edited file might.
        start.execute("ALTER TABLE releases ADD COLUMN REVISION TEXT")
        start.commit()

    with pytest.raises(sqlite3.OperationalError):
        SqliteRepos.open(db_path)

    with closing(sqlite3.connect(db_path)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == 1
        tables = {row[0] for row in check.execute("SELECT name FROM sqlite_master")}
        assert "rollbacks" not in tables  # nothing of step 3 either


def _schema(path: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute(
            "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name"
        ).fetchall()
    return [(name, " ".join(sql.split())) for name, sql in rows]
