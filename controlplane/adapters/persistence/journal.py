"""The journal in SQLite: operations (table ``operations``) and releases seen (``releases``).

Operations are saved at every step boundary and as downloads progress; :meth:`save` queues the
write and returns at once, so a download thread never waits on the disk, and the single
database thread keeps the records in the order they were made.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from controlplane.adapters.persistence.database import Database, chunks
from controlplane.domain.operations import (
    Cause,
    Operation,
    OperationError,
    OperationKind,
    OperationStatus,
    Step,
    StepStatus,
    Trigger,
)
from controlplane.domain.releases import ReleaseInfo


class SqliteOperationLog:
    def __init__(self, database: Database) -> None:
        self._db = database
        self._writes = 0

    @property
    def writes(self) -> int:
        return self._writes

    def save(self, operation: Operation) -> None:
        # From any thread: two saves racing may count one, but the count still moves, which
        # is all a reader of it asks.
        self._writes += 1
        row = _operation_to_row(operation)

        def job(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO operations (id, kind, model, release, from_release, trigger, "
                "status, created_at, finished_at, error_code, error_message, steps, detail, "
                "member, reason, set_by) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET "
                "status = excluded.status, from_release = excluded.from_release, "
                "finished_at = excluded.finished_at, error_code = excluded.error_code, "
                "error_message = excluded.error_message, steps = excluded.steps, "
                "detail = excluded.detail",
                row,
            )

        self._db.enqueue(job, f"operation {operation.id}")

    async def get(self, operation_id: str) -> Operation | None:
        def job(db: sqlite3.Connection) -> Operation | None:
            row = db.execute("SELECT * FROM operations WHERE id = ?", (operation_id,)).fetchone()
            return None if row is None else _operation_from_row(row)

        return await self._db.read(job)

    async def recent(
        self,
        model: str | None = None,
        limit: int = 20,
        kinds: Collection[OperationKind] | None = None,
    ) -> list[Operation]:
        where: list[str] = []
        params: list[object] = []
        if model is not None:
            where.append("model = ?")
            params.append(model)
        if kinds is not None:
            where.append(f"kind IN ({', '.join('?' * len(kinds))})")
            params.extend(sorted(kind.value for kind in kinds))
        # By model, the walk goes back through the model's history in time and stops at
        # ``limit`` rows of the kinds (housekeeping is at most one in two of them).
        indexed = "INDEXED BY operations_by_model " if model is not None else ""
        query = (  # only placeholders are formatted in; the values are bound
            f"SELECT * FROM operations {indexed}"  # noqa: S608
            f"{'WHERE ' + ' AND '.join(where) + ' ' if where else ''}"
            "ORDER BY created_at DESC, rowid DESC LIMIT ?"
        )

        def job(db: sqlite3.Connection) -> list[Operation]:
            rows = db.execute(query, [*params, limit])
            return [_operation_from_row(row) for row in rows.fetchall()]

        return await self._db.read(job)

    async def unfinished(self) -> list[Operation]:
        def job(db: sqlite3.Connection) -> list[Operation]:
            rows = db.execute(
                "SELECT * FROM operations WHERE status IN (?, ?) ORDER BY created_at",
                (OperationStatus.PENDING.value, OperationStatus.RUNNING.value),
            )
            return [_operation_from_row(row) for row in rows.fetchall()]

        return await self._db.read(job)

    async def latest(
        self, models: Sequence[str], kinds: Collection[OperationKind] | None = None
    ) -> dict[str, Operation]:
        if kinds is not None:
            return await self._latest_of_kinds(models, kinds)

        def job(db: sqlite3.Connection) -> dict[str, Operation]:
            found: dict[str, Operation] = {}
            for marks, names in chunks(models):
                query = (  # only placeholders are formatted in; the values are bound
                    "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY model "  # noqa: S608
                    "ORDER BY created_at DESC, rowid DESC) AS newest FROM operations "
                    f"WHERE model IN {marks}) WHERE newest = 1"
                )
                rows = db.execute(query, names)
                found.update((row["model"], _operation_from_row(row)) for row in rows)
            return found

        return await self._db.read(job)

    async def _latest_of_kinds(
        self, models: Sequence[str], kinds: Collection[OperationKind]
    ) -> dict[str, Operation]:
        """The newest of each (model, kind) is one look in ``operations_by_model_kind``; the
        newest of those few per model is the answer. Nothing reads a model's history."""
        wanted = json.dumps(sorted(kind.value for kind in kinds))
        query = (
            "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY model "
            "ORDER BY created_at DESC, rowid DESC) AS newest FROM operations WHERE rowid IN ("
            "SELECT (SELECT rowid FROM operations INDEXED BY operations_by_model_kind "
            "WHERE model = m.value AND kind = k.value "
            "ORDER BY created_at DESC, rowid DESC LIMIT 1) "
            "FROM json_each(?) AS m, json_each(?) AS k)) WHERE newest = 1"
        )

        def job(db: sqlite3.Connection) -> dict[str, Operation]:
            rows = db.execute(query, (json.dumps(list(models)), wanted))
            return {row["model"]: _operation_from_row(row) for row in rows}

        return await self._db.read(job)

    async def last_deploys(self, releases: Mapping[str, str]) -> dict[str, Operation]:
        models = list(releases)

        def job(db: sqlite3.Connection) -> dict[str, Operation]:
            found: dict[str, Operation] = {}
            for marks, names in chunks(models):
                query = (  # only placeholders are formatted in; the values are bound
                    "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY model, release "  # noqa: S608
                    "ORDER BY created_at DESC, rowid DESC) AS newest FROM operations "
                    f"WHERE model IN {marks} AND kind = ? AND status = ?) WHERE newest = 1"
                )
                params = [*names, OperationKind.DEPLOY.value, OperationStatus.SUCCEEDED.value]
                for row in db.execute(query, params):
                    if releases.get(row["model"]) == row["release"]:
                        found[row["model"]] = _operation_from_row(row)
            return found

        return await self._db.read(job)

    async def flush(self) -> None:
        # The database thread takes jobs in order: a read queued now runs after every write.
        await self._db.read(lambda _db: None)


class SqliteReleaseBook:
    def __init__(self, database: Database) -> None:
        self._db = database

    async def record(self, releases: Sequence[ReleaseInfo], at: datetime) -> None:
        stamp = at.isoformat()
        rows = [(r.model, r.name, int(r.complete), stamp, stamp, r.revision) for r in releases]

        def job(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT INTO releases (model, release, complete, first_seen, last_seen, revision) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(model, release) DO UPDATE SET "
                "complete = excluded.complete, last_seen = excluded.last_seen, "
                "revision = excluded.revision",
                rows,
            )

        await self._db.write(job)

    async def seen(self, model: str) -> list[ReleaseInfo]:
        def job(db: sqlite3.Connection) -> list[ReleaseInfo]:
            rows = db.execute("SELECT * FROM releases WHERE model = ?", (model,)).fetchall()
            return [
                ReleaseInfo(row["model"], row["release"], bool(row["complete"]), row["revision"])
                for row in rows
            ]

        return await self._db.read(job)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _operation_to_row(op: Operation) -> tuple[Any, ...]:
    steps = [
        {
            "name": s.name,
            "status": s.status.value,
            "started_at": s.started_at.isoformat(),
            "finished_at": _iso(s.finished_at),
            "detail": dict(s.detail),
        }
        for s in op.steps
    ]
    return (
        op.id,
        op.kind.value,
        op.model,
        op.release,
        op.from_release,
        op.trigger.value,
        op.status.value,
        op.created_at.isoformat(),
        _iso(op.finished_at),
        op.error.code if op.error else None,
        op.error.message if op.error else None,
        json.dumps(steps),
        json.dumps(dict(op.detail)),
        op.member,
        op.cause.reason,
        op.cause.set_by,
    )


def _operation_from_row(row: sqlite3.Row) -> Operation:
    steps = tuple(
        Step(
            name=s["name"],
            status=StepStatus(s["status"]),
            started_at=datetime.fromisoformat(s["started_at"]),
            finished_at=_parse(s["finished_at"]),
            detail=s["detail"],
        )
        for s in json.loads(row["steps"])
    )
    error = (
        OperationError(code=row["error_code"], message=row["error_message"] or "")
        if row["error_code"]
        else None
    )
    return Operation(
        id=row["id"],
        kind=OperationKind(row["kind"]),
        model=row["model"],
        release=row["release"],
        from_release=row["from_release"],
        trigger=Trigger(row["trigger"]),
        status=OperationStatus(row["status"]),
        created_at=datetime.fromisoformat(row["created_at"]),
        finished_at=_parse(row["finished_at"]),
        steps=steps,
        error=error,
        detail=json.loads(row["detail"]),
        member=row["member"],
        cause=Cause(reason=row["reason"], set_by=row["set_by"]),
    )
