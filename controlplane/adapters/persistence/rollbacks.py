"""Automatic rollback's records in SQLite: rollbacks, the degraded latch, Alertmanager alerts.

An alert is stored, deduped on ``(fingerprint, startsAt)``, in one transaction that also says
whether this receipt is the first: the webhook answers only after it is committed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime

from controlplane.adapters.persistence.database import Database, Job, T, chunks
from controlplane.domain.alerts import Alert, AlertRecord, AlertStatus, Receipt
from controlplane.domain.operations import Trigger
from controlplane.domain.rollback import DegradedRelease, RollbackOutcome, RollbackRecord


class SqliteRollbackBook:
    def __init__(self, database: Database) -> None:
        self._db = database
        self._writes = 0

    @property
    def writes(self) -> int:
        return self._writes

    async def _write(self, job: Job[T]) -> T:
        self._writes += 1  # counted as submitted: a read submitted later sees it
        return await self._db.write(job)

    async def save(self, record: RollbackRecord) -> None:
        row = (
            record.id,
            record.model,
            record.at.isoformat(),
            record.trigger.value,
            record.reason,
            record.from_release,
            record.to_release,
            record.outcome.value,
            json.dumps(list(record.operation_ids)),
            json.dumps(dict(record.detail)),
            record.suppressed,
        )

        def job(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO rollbacks (id, model, at, trigger, reason, from_release, "
                "to_release, outcome, operations, detail, suppressed) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET outcome = excluded.outcome, "
                "to_release = excluded.to_release, operations = excluded.operations, "
                "detail = excluded.detail",
                row,
            )

        await self._write(job)

    async def last(self, model: str) -> RollbackRecord | None:
        def job(db: sqlite3.Connection) -> RollbackRecord | None:
            row = db.execute(
                "SELECT * FROM rollbacks WHERE model = ? ORDER BY at DESC, rowid DESC LIMIT 1",
                (model,),
            ).fetchone()
            return None if row is None else _rollback_from_row(row)

        return await self._db.read(job)

    async def count_suppressed(self, rollback_id: str) -> None:
        def job(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE rollbacks SET suppressed = suppressed + 1 WHERE id = ?", (rollback_id,)
            )

        await self._write(job)

    async def latch(self, latch: DegradedRelease) -> None:
        def job(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO degraded (model, release, at, reason) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(model, release) DO UPDATE SET at = excluded.at, "
                "reason = excluded.reason",
                (latch.model, latch.release, latch.at.isoformat(), latch.reason),
            )

        await self._write(job)

    async def unlatch(self, model: str, release: str) -> bool:
        def job(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "DELETE FROM degraded WHERE model = ? AND release = ?", (model, release)
            )
            return cursor.rowcount > 0

        return await self._write(job)

    async def latched(self, model: str) -> list[DegradedRelease]:
        def job(db: sqlite3.Connection) -> list[DegradedRelease]:
            rows = db.execute("SELECT * FROM degraded WHERE model = ? ORDER BY at", (model,))
            return [_degraded_from_row(row) for row in rows.fetchall()]

        return await self._db.read(job)

    async def last_of(self, models: Sequence[str]) -> dict[str, RollbackRecord]:
        def job(db: sqlite3.Connection) -> dict[str, RollbackRecord]:
            found: dict[str, RollbackRecord] = {}
            for marks, names in chunks(models):
                query = (  # only placeholders are formatted in; the values are bound
                    "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY model "  # noqa: S608
                    "ORDER BY at DESC, rowid DESC) AS newest FROM rollbacks "
                    f"WHERE model IN {marks}) WHERE newest = 1"
                )
                rows = db.execute(query, names)
                found.update((row["model"], _rollback_from_row(row)) for row in rows)
            return found

        return await self._db.read(job)

    async def latched_of(self, models: Sequence[str]) -> dict[str, list[DegradedRelease]]:
        def job(db: sqlite3.Connection) -> dict[str, list[DegradedRelease]]:
            found: dict[str, list[DegradedRelease]] = {}
            for marks, names in chunks(models):
                query = f"SELECT * FROM degraded WHERE model IN {marks} ORDER BY at"  # noqa: S608
                rows = db.execute(query, names)
                for row in rows:
                    found.setdefault(row["model"], []).append(_degraded_from_row(row))
            return found

        return await self._db.read(job)

    async def since(self, at: datetime, limit: int = 500) -> list[RollbackRecord]:
        def job(db: sqlite3.Connection) -> list[RollbackRecord]:
            rows = db.execute(
                "SELECT * FROM rollbacks WHERE at >= ? ORDER BY at DESC, rowid DESC LIMIT ?",
                (at.astimezone(UTC).isoformat(), limit),
            ).fetchall()
            return [_rollback_from_row(row) for row in reversed(rows)]

        return await self._db.read(job)


class SqliteAlertBook:
    def __init__(self, database: Database) -> None:
        self._db = database

    async def record(self, alert: Alert, at: datetime) -> Receipt:
        """Store one receipt of ``alert`` (before the webhook answers) and say what it is."""
        key = (alert.fingerprint, alert.starts_at.isoformat())

        def job(db: sqlite3.Connection) -> bool:
            row = db.execute(
                "SELECT status FROM alerts WHERE fingerprint = ? AND starts_at = ?", key
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO alerts (fingerprint, starts_at, status, labels, annotations, "
                    "first_received, last_received, receipts) VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
                    (
                        *key,
                        alert.status.value,
                        json.dumps(dict(alert.labels)),
                        json.dumps(dict(alert.annotations)),
                        at.isoformat(),
                        at.isoformat(),
                    ),
                )
            else:
                db.execute(
                    "UPDATE alerts SET status = ?, last_received = ?, receipts = receipts + 1 "
                    "WHERE fingerprint = ? AND starts_at = ?",
                    (alert.status.value, at.isoformat(), *key),
                )
            return row is None

        first = await self._db.write(job)
        if alert.status is AlertStatus.RESOLVED:
            return Receipt.RESOLVED
        return Receipt.NEW if first else Receipt.DUPLICATE

    async def recent(self, limit: int = 50) -> list[AlertRecord]:
        def job(db: sqlite3.Connection) -> list[AlertRecord]:
            rows = db.execute(
                "SELECT * FROM alerts ORDER BY last_received DESC LIMIT ?", (limit,)
            ).fetchall()
            return [
                AlertRecord(
                    alert=Alert(
                        fingerprint=row["fingerprint"],
                        starts_at=datetime.fromisoformat(row["starts_at"]),
                        status=AlertStatus(row["status"]),
                        labels=json.loads(row["labels"]),
                        annotations=json.loads(row["annotations"]),
                    ),
                    first_received=datetime.fromisoformat(row["first_received"]),
                    last_received=datetime.fromisoformat(row["last_received"]),
                    receipts=int(row["receipts"]),
                )
                for row in rows
            ]

        return await self._db.read(job)


def _rollback_from_row(row: sqlite3.Row) -> RollbackRecord:
    return RollbackRecord(
        id=row["id"],
        model=row["model"],
        at=datetime.fromisoformat(row["at"]),
        trigger=Trigger(row["trigger"]),
        reason=row["reason"],
        from_release=row["from_release"],
        to_release=row["to_release"],
        outcome=RollbackOutcome(row["outcome"]),
        operation_ids=tuple(json.loads(row["operations"])),
        detail=json.loads(row["detail"]),
        suppressed=int(row["suppressed"]),
    )


def _degraded_from_row(row: sqlite3.Row) -> DegradedRelease:
    return DegradedRelease(
        row["model"], row["release"], datetime.fromisoformat(row["at"]), row["reason"]
    )
